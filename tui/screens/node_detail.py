"""Node detail: one row per GPU (util and memory bars, temperature, power), NICs and disks, and
time series of GPU utilisation, NIC rx/tx and disk writes over the history window."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.coordinate import Coordinate
from textual.widgets import DataTable, Static

from backend.errors import LoadmasterError
from backend.ops.types import FleetSnapshot, NodeSnapshot, SlurmSettings
from backend.textfmt import safe_text
from backend.units import bytes_text
from tui.messages import FleetSampled
from tui.screens.base import LoadmasterScreen, PaletteCommand
from tui.widgets.fleet_format import bar, drain_prompt, error_cell, num, rate_pct, slurm_detail, spark, state_cell
from tui.widgets.fleet_plot import TimeSeriesPlot
from tui.widgets.plain import PlainStatic, PlainTable
from tui.widgets.slurm_actions import SlurmKeys, drain_flow, resume_flow

if TYPE_CHECKING:
    from backend.ops.slurm import GpuJob, SlurmNodeRow
    from backend.services import Services

#: (history series, title, unit) of each plot.
PLOTS: tuple[tuple[str, str, str], ...] = (
    ("util_mean", "GPU util", "%"),
    ("rx_gbps", "NIC rx", "Gbps"),
    ("tx_gbps", "NIC tx", "Gbps"),
    ("disk_write_mbps", "Disk write", "MB/s"),
)
GPU_COLUMNS = (
    ("gpu", "GPU", 4),
    ("name", "Name", 22),
    ("util", "Util", 18),
    ("mem", "Memory", 30),
    ("temp", "Temp", 6),
    ("power", "Power", 16),
    ("status", "Status", 12),
    ("trend", "Util trend", 24),
)
BAR = 10
#: The GPU table's Slurm column (with [slurm] enabled): the job on each GPU, after its index.
JOB_COLUMN = ("job", "Slurm job", 10)


def gpu_job_cell(index: int, row: SlurmNodeRow | None, on_node: tuple[GpuJob, ...] | None) -> str:
    """The Slurm job(s) on GPU ``index``: Slurm's GRES indices, else the node's own answer (each
    compute process's cgroup ``job_<id>``); ``pid N`` for a process of no job; ``-``: none."""
    jobs = [j.job_id for j in row.jobs if index in j.gpus] if row is not None else []
    for g in on_node or ():
        if g.gpu == index:
            jobs.append(g.job_id if g.job_id is not None else f"pid {g.pid}")
    return ",".join(safe_text(j, 20) for j in dict.fromkeys(jobs)) or "-"


def gpu_cells(g: Any) -> tuple[str, ...]:
    """One GPU's row in the detail table."""
    if g.lost:
        return (str(g.index), g.uuid or "", "", "", "", "", "GPU is lost")
    mem_pct = 100.0 * g.mem_used_mib / g.mem_total_mib if g.mem_used_mib is not None and g.mem_total_mib else None
    mem = (
        f"{bar(mem_pct, BAR)} {g.mem_used_mib / 1024:.1f}/{g.mem_total_mib / 1024:.0f} GiB"
        if mem_pct is not None and g.mem_used_mib is not None and g.mem_total_mib
        else "-"
    )
    util = f"{bar(g.util_pct, BAR)} {num(g.util_pct, '{:.0f}%')}"
    if g.power_w is None:
        power = "n/a"
    else:
        power = f"{g.power_w:.0f} W" + (f" / {g.power_limit_w:.0f} W" if g.power_limit_w else "")
    return (str(g.index), g.name, util, mem, num(g.temp_c, "{:.0f}°C"), power, "ok")


class NodeDetailScreen(SlurmKeys, LoadmasterScreen):
    """Everything about one node; escape returns to the Fleet screen."""

    SCREEN_TITLE: ClassVar[str] = "Node"
    PALETTE_COMMANDS: ClassVar[list[PaletteCommand]] = [
        ("Drain node in Slurm", "Reason, after the jobs or now, the exact scontrol command, confirm (key d)", "drain"),
        ("Resume node in Slurm", "The evidence checks, the exact scontrol command, confirm (key R)", "resume"),
    ]
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Back"),
        Binding("d", "drain", "Drain"),
        Binding("R", "resume", "Resume", show=False),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | escape | Back to the Fleet screen. |
    | d | Drain this node in Slurm: reason, after the jobs or now, the command, confirm. |
    | R | Resume this node in Slurm: the evidence checks, the command, confirm. |
    """

    def __init__(self, services: Services, node: str, **kwargs: Any) -> None:
        super().__init__(services, **kwargs)
        self.node_name = node
        self._unsubscribe: Any = None
        self._shown: NodeSnapshot | None = None
        self._gpu_rows: list[tuple[str, ...]] = []
        #: Slurm's row for the node and the node's own GPU-to-job answer (with [slurm] enabled).
        self.slurm_row: SlurmNodeRow | None = None
        self.gpu_jobs: tuple[GpuJob, ...] | None = None
        self.slurm_error: str | None = None

    @property
    def hub(self) -> Any:
        return self.services.telemetry

    def compose_body(self) -> ComposeResult:
        with Vertical(classes="screen-body", id="node-body"):
            yield PlainStatic("", id="node-header")
            yield PlainStatic("", id="node-slurm")
            yield PlainTable(id="node-gpus", cursor_type="row", zebra_stripes=True)
            yield PlainStatic("", id="node-io")
            with Vertical(id="node-plots"):
                for key, title, _unit in PLOTS:
                    with Horizontal(classes="node-plot"):
                        yield PlainStatic(title, id=f"plot-label-{key}", classes="plot-label")
                        yield TimeSeriesPlot(id=f"plot-{key}", classes="plot")

    def on_mount(self) -> None:
        table = self.query_one("#node-gpus", DataTable)
        columns = list(GPU_COLUMNS)
        if self.slurm_enabled:
            columns.insert(1, JOB_COLUMN)
        for key, label, width in columns:
            table.add_column(label, key=key, width=width)
        self.query_one("#node-slurm", Static).display = self.slurm_enabled
        self._unsubscribe = self.hub.subscribe(lambda s: self.post_message(FleetSampled(s)))
        self.apply_snapshot(self.hub.snapshot())
        if self.slurm_enabled:
            self.set_interval(self.services.config.section(SlurmSettings).interval, self._read_slurm)
            self._read_slurm()

    # -- Slurm -----------------------------------------------------------------------------------

    @work(exclusive=True, group="node-slurm", exit_on_error=False)
    async def _read_slurm(self, fresh: bool = False) -> None:
        """Slurm's row for the node (shared, once per interval) and, on the node, which job each
        GPU's processes belong to (ops.slurm.gpu_jobs: no Slurm rights needed)."""
        ops = self.ops.slurm
        errors = []
        try:
            rows = await ops.rows(fresh=fresh)
            self.slurm_row = next((r for r in rows if r.name == self.node_name), None)
        except LoadmasterError as exc:
            errors.append(f"Slurm: {exc}")
        if self.node_name in self.services.pool.names:
            try:
                self.gpu_jobs = await ops.gpu_jobs(self.node_name)
            except (LoadmasterError, OSError) as exc:
                self.gpu_jobs = None
                errors.append(f"GPU processes: {exc}")
        self.slurm_error = safe_text("; ".join(errors), 300) if errors else None
        self._show_slurm()

    def _show_slurm(self) -> None:
        row = self.slurm_row
        if row is not None:
            text = slurm_detail(row)
        elif self.slurm_error is None:
            text = f"Slurm: {self.node_name} is not a Slurm node"
        else:
            text = ""
        if self.slurm_error:
            text = (text + " · " if text else "") + self.slurm_error
        self.query_one("#node-slurm", Static).update(text)
        if self._shown is not None:
            self._gpus(self._shown)

    def action_drain(self) -> None:
        """Drain this node in Slurm (reason, after the jobs or now, command, confirm)."""
        self._drain()

    def action_resume(self) -> None:
        """Resume this node in Slurm once the evidence passes (command, confirm)."""
        self._resume()

    @work(exclusive=True, group="slurm-action", exit_on_error=False)
    async def _drain(self) -> None:
        if await drain_flow(self, self.node_name, self.slurm_row, drain_prompt(self._shown)):
            self._read_slurm(fresh=True)

    @work(exclusive=True, group="slurm-action", exit_on_error=False)
    async def _resume(self) -> None:
        if await resume_flow(self, self.node_name):
            self._read_slurm(fresh=True)

    def on_unmount(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def action_close(self) -> None:
        """Back to the Fleet screen."""
        self.dismiss()

    @on(FleetSampled)
    def _fleet_sampled(self, event: FleetSampled) -> None:
        event.stop()
        self.apply_snapshot(event.snapshot)

    def apply_snapshot(self, fleet: FleetSnapshot) -> None:
        """Render the node's part of ``fleet`` (skipped when the node did not change)."""
        node = fleet.node(self.node_name)
        if node is None:
            self.query_one("#node-header", Static).update(f"{self.node_name}: not in the fleet")
            return
        if node is self._shown:
            return
        self._shown = node
        with self.app.batch_update():
            self._header(node)
            self._gpus(node)
            self._io(node)
            self._plots()

    def _header(self, n: NodeSnapshot) -> None:
        state = state_cell(n) + (f": {error_cell(n)}" if error_cell(n) else "")
        link = "local, no SSH" if self._is_local() else f"SSH {num(n.latency_ms, '{:.0f} ms')}"
        parts = [n.name, n.site or "no site", state, link]
        if n.gpu_status != "ok":
            parts.append(n.gpu_status)
        if n.scratch_error:
            parts.append(f"scratch {n.scratch}: {n.scratch_error}")
        elif n.scratch_free_bytes is not None:
            parts.append(f"scratch {n.scratch}: {bytes_text(n.scratch_free_bytes)} free")
        if n.alerts:
            parts.append(n.alerts[0].message)
        self.query_one("#node-header", Static).update(" · ".join(parts))

    def _is_local(self) -> bool:
        """The node is this machine over the local transport (it has no SSH latency)."""
        return any(c.name == self.node_name and c.transport == "local" for c in self.services.config.nodes)

    def _gpus(self, n: NodeSnapshot) -> None:
        table = self.query_one("#node-gpus", DataTable)
        try:
            hist = self.hub.history(self.node_name)
        except KeyError:
            hist = None

        def trend(index: int) -> str:
            if hist is None or index not in hist.gpu_util:
                return ""
            return spark(hist.series(f"gpu{index}", 24), 24)

        rows = [(*gpu_cells(g), trend(g.index)) for g in n.gpus]
        if self.slurm_enabled:
            rows = [
                (r[0], gpu_job_cell(g.index, self.slurm_row, self.gpu_jobs), *r[1:])
                for r, g in zip(rows, n.gpus, strict=True)
            ]
        if len(rows) != len(self._gpu_rows):
            table.clear()
            for row in rows:
                table.add_row(*row, key=row[0])
        else:
            for r, (old, new) in enumerate(zip(self._gpu_rows, rows, strict=True)):
                for c, (a, b) in enumerate(zip(old, new, strict=True)):
                    if a != b:
                        table.update_cell_at(Coordinate(r, c), b)
        self._gpu_rows = rows

    def _io(self, n: NodeSnapshot) -> None:
        lines = []
        for nic in n.nics:
            if nic.kind == "loopback":
                continue
            speed = f"{nic.speed_mbps / 1000:g} Gb/s" if nic.speed_mbps else "speed unknown"
            lines.append(
                f"{nic.name:<12} {nic.kind:<8} rx {rate_pct(nic.rx_gbps, nic.rx_pct):<12}"
                f" tx {rate_pct(nic.tx_gbps, nic.tx_pct):<12} {speed}"
            )
        for d in n.disks:
            kind = "" if d.physical else " (virtual)"
            lines.append(f"{d.name:<12} disk{kind:<10} read {num(d.read_mbps)} MB/s  write {num(d.write_mbps)} MB/s")
        self.query_one("#node-io", Static).update("\n".join(lines) or "no NICs or disks reported")

    def _plots(self) -> None:
        try:
            hist = self.hub.history(self.node_name)
        except KeyError:
            return
        minutes = hist.capacity * self.hub.settings.interval / 60
        node = self._shown
        line_gbps = (node.line_rate_mbps or 0) / 1000 if node is not None else 0.0
        for key, title, unit in PLOTS:
            s = hist.summary(key)
            label = f"{title} ({unit}, {minutes:.0f} min)"
            if s.count:
                label += f"\nmin {s.min:.1f} mean {s.mean:.1f} max {s.max:.1f}"
            # Fixed scales: utilisation 0-100%, NICs up to line rate, disks up to their peak.
            if key == "util_mean":
                hi = 100.0
            elif key in ("rx_gbps", "tx_gbps"):
                hi = max(line_gbps, s.max or 0.0, 1.0)
            else:
                hi = max(s.max or 0.0, 1.0)
            self.query_one(f"#plot-label-{key}", Static).update(label)
            self.query_one(f"#plot-{key}", TimeSeriesPlot).set_series(hist.series(key), lo=0.0, hi=hi)
