"""Fleet screen: every node's GPUs, NICs and disks live, with the "GPU starved" alert list.

Two views of the same ticks, ``v`` switches: the node table (one row per node, the default for
up to 16 nodes) and the heatmap (one cell per GPU, grouped by site, tag or hostlist prefix, with
the nodes that need attention on top: the default above 16 nodes). A tick updates the view on
screen; the other one is brought up to the latest tick when it is switched to.

The backend (``services.telemetry``, a TelemetryHub) samples the nodes; this screen only renders
its FleetSnapshots. Ticks arrive as :class:`FleetSampled` messages that replace each other when
the UI falls behind (``can_replace``) and are applied inside ``batch_update()``, touching only
the cells whose text changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from backend.errors import LoadmasterError
from backend.ops.fleet import unread_nodes
from backend.ops.types import AlertSettings, FleetSnapshot, SlurmSettings
from tui.messages import FleetSampled
from tui.screens.base import LoadmasterScreen, PaletteCommand
from tui.screens.node_detail import NodeDetailScreen
from tui.widgets.fleet_alerts import AlertList
from tui.widgets.fleet_format import conditions_line, drain_prompt, fleet_summary
from tui.widgets.fleet_heatmap import HEATMAP_ABOVE, FleetHeatmap, HeatmapGrid, group_key
from tui.widgets.fleet_table import STARVED_ALERT, TREND_WIDTH, FleetTable
from tui.widgets.plain import PlainStatic
from tui.widgets.slurm_actions import SlurmKeys, drain_flow, resume_flow
from tui.widgets.table_cursor import cursor_row_key

if TYPE_CHECKING:
    from backend.ops.slurm import SlurmNodeRow
    from backend.services import Services

STYLE_NAMES = ("node-up", "node-down", "node-stale", "alert")
#: Seconds between checks that the team's state database answers (only with ``[state] url``).
STATE_CHECK_EVERY = 15.0

View = Literal["table", "heatmap"]
#: The preset filters ``f`` cycles through (None: every node).
PRESETS: tuple[str | None, ...] = (None, "drained/down", "slowest GPUs")
#: How many of the slowest GPUs the "slowest GPUs" filter shows the nodes of.
SLOWEST = 10


class FleetScreen(SlurmKeys, LoadmasterScreen):
    """Nodes, GPUs, NICs, disks and alerts of the whole fleet."""

    SCREEN_TITLE: ClassVar[str] = "Fleet"
    OWN_STATE_LINE: ClassVar[bool] = True  # the conditions line says a state database that is down
    FILTER_HINT: ClassVar[str] = "node name, site or state (glob or substring)"
    PALETTE_COMMANDS: ClassVar[list[PaletteCommand]] = [
        ("Open node detail", "Per-GPU rows and time series of the selected node (key enter)", "open_node"),
        ("Sort by next column", "Cycle the node table's sort column (key s)", "sort"),
        (
            "Switch heatmap / table",
            "One cell per GPU, grouped, problems on top; or one row per node (key v)",
            "toggle_view",
        ),
        (
            "Filter: drained/down, slowest GPUs",
            "Cycle the preset filters: Slurm's drained, draining and down nodes; the nodes of the "
            "slowest GPUs by triage's straggler ranking; every node (key f)",
            "cycle_preset",
        ),
        ("Filter: nodes of a job", "Type job:N in the filter: the nodes Slurm runs job N on (key j)", "filter_job"),
        (
            "Slurm jobs",
            "Running and pending jobs, nodes, GPUs, reasons; enter filters to a job's nodes (key J)",
            "slurm_jobs",
        ),
        ("Drain node in Slurm", "Reason, after the jobs or now, the exact scontrol command, confirm (key d)", "drain"),
        ("Resume node in Slurm", "The evidence checks, the exact scontrol command, confirm (key R)", "resume"),
    ]

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("enter", "open_node", "Node", show=True),
        Binding("v", "toggle_view", "View"),
        Binding("f", "cycle_preset", "Filter: drained/down, slowest GPUs", show=False),
        Binding("j", "filter_job", "Filter: a job's nodes", show=False),
        Binding("J", "slurm_jobs", "Slurm jobs", show=False),
        Binding("d", "drain", "Drain"),
        Binding("R", "resume", "Resume", show=False),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | / | Filter nodes by name, site, state, Slurm state or partition; job:N for the nodes of job N. |
    | f | Preset filter: drained/down (Slurm), the slowest GPUs' nodes (triage's ranking), every node. |
    | j | Filter the nodes of a Slurm job (types job: into the filter). |
    | J | Slurm jobs: running and pending, nodes, GPUs, reasons; enter filters to a job's nodes, T triages it. |
    | d | Drain the selected node in Slurm: reason, after the jobs or now, the command, confirm. |
    | R | Resume the selected node in Slurm: the evidence checks, the command, confirm. |
    | enter | Open the selected node's detail (per-GPU rows and time series). |
    | v | Switch between the heatmap (one cell per GPU) and the node table. |
    | s / S | Table: sort by the next column / reverse (clicking a header also sorts). |
    | arrows | Heatmap: move the cursor over GPUs and nodes (home / end, pageup / pagedown). |
    | escape | Leave / clear the filter. |
    """

    def __init__(self, services: Services, **kwargs: Any) -> None:
        super().__init__(services, **kwargs)
        self._unsubscribe: Any = None
        self.last_snapshot: FleetSnapshot | None = None
        #: Wall and CPU seconds spent applying each tick (the benchmark reads these).
        self.apply_times: list[float] = []
        self.apply_cpu_times: list[float] = []
        self._theme_name: str | None = None
        #: The view on screen; None until mounted (then chosen by the fleet's size).
        self.view: View | None = None
        #: The app's ``site_alerts`` as last applied (the app replaces the dict on a change).
        self._site_alerts: Any = None
        #: Why the state database cannot be reached (one line for the whole fleet), or None.
        self.state_down: str | None = None
        #: Slurm's rows by node (empty until read, or without [slurm] enabled) and why the last
        #: read failed (None: it did not).
        self.slurm_rows: dict[str, SlurmNodeRow] = {}
        self.slurm_error: str | None = None
        #: The preset filter on (one of PRESETS) and the slowest GPUs' (node, GPU, SM ratio).
        self.preset: str | None = None
        self.slowest: list[tuple[str, int, float]] = []

    @property
    def hub(self) -> Any:
        return self.services.telemetry

    def compose_body(self) -> ComposeResult:
        with Vertical(classes="screen-body", id="fleet-body"):
            yield PlainStatic("", id="fleet-summary")
            yield PlainStatic("", id="fleet-conditions")
            local = frozenset(n.name for n in self.services.config.nodes if n.transport == "local")
            yield FleetTable(local_nodes=local, id="fleet-table")
            yield FleetHeatmap(id="fleet-heatmap")
            yield PlainStatic("Alerts", id="fleet-alerts-title")
            yield AlertList(id="fleet-alerts")

    def on_mount(self) -> None:
        self._apply_theme()
        self._unsubscribe = self.hub.subscribe(self._on_tick)
        self._set_groups()
        if self.slurm_enabled:
            self.query_one(FleetTable).set_slurm({}, enabled=True)
            self.set_interval(self.services.config.section(SlurmSettings).interval, self._read_slurm)
            self._read_slurm()
        first = self.hub.snapshot()
        self.show_view("heatmap" if len(first.nodes) > HEATMAP_ABOVE else "table")
        self.apply_snapshot(first)
        if not getattr(self.hub, "running", False):
            self._start_sampling()
        if self.services.config.state.url:
            self.set_interval(STATE_CHECK_EVERY, self._check_state)
            self._check_state()

    def _set_groups(self) -> None:
        """Heatmap groups: a Slurm node's first partition, else its site, tag or hostlist prefix."""
        tags = {n.name: n.tags for n in self.services.config.nodes}
        parts = {name: r.partitions[0] for name, r in self.slurm_rows.items() if r.partitions}
        self._partitions = parts

        def group(n: Any) -> str:
            part = parts.get(n.name)
            return f"partition:{part}" if part else group_key(n.name, n.site, tags.get(n.name, ()))

        self.query_one(FleetHeatmap).grid.groups = group

    # -- Slurm ---------------------------------------------------------------------------------

    @work(exclusive=True, group="fleet-slurm", exit_on_error=False)
    async def _read_slurm(self, fresh: bool = False) -> None:
        """Slurm's nodes (one sinfo and one squeue per [slurm] interval, shared with every reader)."""
        try:
            rows = await self.ops.slurm.rows(fresh=fresh)
        except LoadmasterError as exc:
            self.slurm_error = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        else:
            self.slurm_error = None
            self.slurm_read({r.name: r for r in rows})
            return
        if self.last_snapshot is not None:
            self.apply_snapshot(self.last_snapshot)

    def slurm_read(self, rows: dict[str, SlurmNodeRow]) -> None:
        """Show a read of Slurm: the table's Slurm cells, the heatmap's partitions, the filters."""
        self.slurm_rows = rows
        self.query_one(FleetTable).set_slurm(rows, enabled=True)
        if {n: r.partitions[0] for n, r in rows.items() if r.partitions} != getattr(self, "_partitions", {}):
            self._set_groups()
        if self.last_snapshot is not None:
            self.apply_snapshot(self.last_snapshot)

    def slurm_line(self) -> str:
        """The conditions line's Slurm part: what takes no new work, or why Slurm is unread."""
        if self.slurm_error:
            return f"Slurm: {self.slurm_error}"
        if not self.slurm_rows:
            return "Slurm: not read yet"
        rows = list(self.slurm_rows.values())
        count = {w: sum(1 for r in rows if r.state.rstrip("*") == w) for w in ("drained", "draining", "down")}
        parts = [f"{n} {w}" for w, n in count.items() if n]
        repeat = sum(1 for r in rows if r.repeat_offender)
        if repeat:
            parts.append(f"{repeat} drained 3+ times in 30 days")
        return "Slurm: " + (", ".join(parts) or "none drained or down")

    def selected_node(self) -> str | None:
        """The node under the cursor (table row or heatmap cell): what ``T`` triages from Fleet."""
        return self._selected_node()

    def _selected_node(self) -> str | None:
        if self.view == "heatmap":
            cursor = self.query_one(FleetHeatmap).grid.cursor
            return cursor[0] if cursor is not None else None
        return cursor_row_key(self.query_one(FleetTable))

    def prompted_by(self, name: str) -> str | None:
        """What on the node's row prompts a drain: its newest Xid, else loadmaster's starvation."""
        return drain_prompt(self.last_snapshot.node(name) if self.last_snapshot is not None else None)

    def action_drain(self) -> None:
        """Drain the selected node in Slurm (reason, after the jobs or now, command, confirm)."""
        name = self._selected_node()
        if name is not None:
            self._drain(name)

    def action_resume(self) -> None:
        """Resume the selected node in Slurm once the evidence passes (command, confirm)."""
        name = self._selected_node()
        if name is not None:
            self._resume(name)

    @work(exclusive=True, group="slurm-action", exit_on_error=False)
    async def _drain(self, name: str) -> None:
        if await drain_flow(self, name, self.slurm_rows.get(name), self.prompted_by(name)):
            self._read_slurm(fresh=True)

    @work(exclusive=True, group="slurm-action", exit_on_error=False)
    async def _resume(self, name: str) -> None:
        if await resume_flow(self, name):
            self._read_slurm(fresh=True)

    # -- preset filters ------------------------------------------------------------------------

    def action_cycle_preset(self) -> None:
        """Next preset filter: drained/down, the slowest GPUs' nodes, every node."""
        nxt = PRESETS[(PRESETS.index(self.preset) + 1) % len(PRESETS)]
        if nxt == "drained/down" and not self.slurm_enabled:
            nxt = "slowest GPUs"
        if nxt == "slowest GPUs":
            self.preset = nxt
            self.notify("Ranking the GPUs (triage reads every node)…", timeout=3)
            self._rank_slowest()
            return
        self.set_preset(nxt)

    def set_preset(self, preset: str | None) -> None:
        self.preset = preset
        table = self.query_one(FleetTable)
        if preset == "drained/down":
            table.only = lambda name: name in self.slurm_rows and self.slurm_rows[name].unavailable
        elif preset == "slowest GPUs":
            nodes = {node for node, _gpu, _ratio in self.slowest}
            table.only = lambda name: name in nodes
        else:
            table.only = None
        if self.last_snapshot is not None:
            self.apply_snapshot(self.last_snapshot)

    @work(exclusive=True, group="fleet-slowest", exit_on_error=False)
    async def _rank_slowest(self) -> None:
        """The slowest GPUs by triage's straggler ranking (backend.triage.analyze.slowest)."""
        names = [n.name for n in self.last_snapshot.nodes] if self.last_snapshot is not None else []
        try:
            report = await self.ops.triage.run(nodes=[",".join(names)] if names else [])
        except LoadmasterError as exc:
            self.report_error("Slowest GPUs", exc)
            self.set_preset(None)
            return
        self.slowest = [(r.node, r.gpu, r.sm_ratio) for r in report.slowest[:SLOWEST]]
        if not self.slowest:
            self.notify("No ranking: fewer than 4 busy GPUs with an SM clock", severity="warning")
        self.set_preset("slowest GPUs")

    def preset_line(self) -> str:
        if self.preset == "slowest GPUs":
            ranked = ", ".join(f"{n} GPU {g} {r:.0%}" for n, g, r in self.slowest[:4])
            return f"filter: slowest GPUs (SM clock vs median): {ranked or 'none ranked'} · f: next"
        if self.preset:
            return f"filter: {self.preset} · f: next"
        return ""

    def action_filter_job(self) -> None:
        """Filter the nodes of a Slurm job: ``job:`` in the filter box, the id typed after it."""
        box = self._filter_box()
        if box is None:
            return
        if not box.value.startswith("job:"):
            box.value = "job:"
        self.action_filter()
        # Focusing selects the box's text; the id is typed after "job:", not over it.
        self.call_after_refresh(box.action_end)

    def action_slurm_jobs(self) -> None:
        """Push the Slurm jobs screen; the job chosen there (enter) filters Fleet to its nodes."""
        from tui.screens.slurm_jobs import SlurmJobsScreen

        if not self.slurm_enabled:
            self.notify("Slurm is not enabled: add [slurm] enabled = true to the config", severity="warning")
            return
        self.app.push_screen(SlurmJobsScreen(self.services), callback=self.filter_to_job)

    def filter_to_job(self, job: str | None) -> None:
        """Show only the nodes Slurm runs ``job`` on (``job:N`` in the filter box)."""
        box = self._filter_box()
        if not job or box is None:
            return
        box.value = f"job:{job}"
        box.display = True
        self._set_filter(box.value)
        self.show_view("table")

    @work(exclusive=True, group="fleet-state", thread=True, exit_on_error=False)
    def _check_state(self) -> None:
        """Whether the team's state database answers (in a thread: a connect may take seconds)."""
        available = getattr(self.services.db, "available", None)
        down = available() if available is not None else None
        text = str(down).split(";")[0] if down is not None else None
        self.app.call_from_thread(self._state_checked, text)

    def _state_checked(self, text: str | None) -> None:
        if text != self.state_down:
            self.state_down = text
            if self.last_snapshot is not None:
                self.apply_snapshot(self.last_snapshot)

    def on_unmount(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    @work(exclusive=True, group="telemetry", exit_on_error=False)
    async def _start_sampling(self) -> None:
        await self.hub.start()

    def _on_tick(self, snapshot: FleetSnapshot) -> None:
        # Called by the hub on every tick (same event loop): hand over as a message.
        self.post_message(FleetSampled(snapshot))

    @on(FleetSampled)
    def _fleet_sampled(self, event: FleetSampled) -> None:
        self.apply_snapshot(event.snapshot)

    def _apply_theme(self) -> None:
        variables = getattr(self.app, "theme_variables", {}) or {}
        styles = {k: variables[k] for k in STYLE_NAMES if variables.get(k)}
        self.query_one(FleetTable).set_theme_styles(styles)
        self.query_one(AlertList).set_style(styles.get("alert"))
        self.query_one(FleetHeatmap).restyle()
        self._theme_name = self.app.theme

    def apply_snapshot(self, snapshot: FleetSnapshot) -> None:
        """Render one FleetSnapshot (summary, changed cells, alerts) in one batch."""
        start, cpu = time.perf_counter(), time.thread_time()
        if self._theme_name != self.app.theme:
            self._apply_theme()
        with self.app.batch_update():
            unread = unread_nodes(snapshot)
            # A partial view says so, naming the nodes whose figures are missing from the totals.
            partial = ("   partial view: " + ", ".join(f"{n} ({why})" for n, why in unread.items())) if unread else ""
            self.query_one("#fleet-summary", Static).update(fleet_summary(snapshot) + partial)
            app: Any = self.app
            read = bool(getattr(app, "site_alerts_read", False))
            conditions = self.query_one("#fleet-conditions", Static)
            conditions.update(
                conditions_line(
                    snapshot,
                    alertmanager=read or bool(self.services.config.section(AlertSettings).alertmanager_url),
                    site_alerts=app.site_alerts if read else None,
                    silenced=getattr(app, "site_silenced", None),
                    state_down=self.state_down,
                )
                + (" · " + self.slurm_line() if self.slurm_enabled else "")
                + (" · " + self.preset_line() if self.preset else "")
            )
            conditions.set_class(bool(snapshot.active_alerts or self.state_down), "-active")
            self._sync_site_alerts()
            self._show_nodes(snapshot)
            alerts = self.query_one(AlertList)
            quiet = getattr(self.app, "site_silenced", None) or {}
            alerts.show(snapshot.alerts, silenced={n for n, names in quiet.items() if STARVED_ALERT in names})
            title = self.query_one("#fleet-alerts-title", Static)
            n = len(snapshot.active_alerts)
            # loadmaster's own check, from the samples: not Alertmanager's alerts (key 7).
            title.update(
                f"GPU starved (loadmaster's check): {n} active" if n else "GPU starved (loadmaster's check): none"
            )
            title.set_class(n > 0, "-active")
        self.last_snapshot = snapshot
        self.apply_times.append(time.perf_counter() - start)
        self.apply_cpu_times.append(time.thread_time() - cpu)
        del self.apply_times[:-10000], self.apply_cpu_times[:-10000]

    def _sync_site_alerts(self) -> None:
        """Hand the app's site alerts (node -> alertnames) to both views when they changed."""
        site = getattr(self.app, "site_alerts", None)
        if site is not None and site is not self._site_alerts:
            self._site_alerts = site
            self.query_one(FleetTable).set_site_alerts(site, getattr(self.app, "site_silenced", None))
            self.query_one(FleetHeatmap).grid.set_site_alerts(site)

    def site_alerts_changed(self) -> None:
        """The app read the site's alerts and they changed: mark them now, not at the next tick."""
        if self.last_snapshot is not None:
            self.apply_snapshot(self.last_snapshot)

    def on_screen_resume(self) -> None:
        if self.last_snapshot is not None and getattr(self.app, "site_alerts", None) is not self._site_alerts:
            self.apply_snapshot(self.last_snapshot)

    def _show_nodes(self, snapshot: FleetSnapshot) -> None:
        """Apply the nodes to the view on screen; the other one catches up when it is shown
        (a hidden 256-node table would format every row on every tick)."""
        if self.view == "heatmap":
            table = self.query_one(FleetTable)
            nodes = [n for n in snapshot.nodes if table.passes(n)]
            filtered = self.filter_text or self.preset
            empty = f"no node matches {filtered!r}" if filtered else "no nodes configured"
            self.query_one(FleetHeatmap).show(nodes, empty=empty)
        else:
            self.query_one(FleetTable).show(snapshot.nodes, self._trend)

    def _trend(self, name: str) -> list[float]:
        try:
            return self.hub.history(name).series("util_mean", TREND_WIDTH)
        except KeyError:
            return []

    # -- filter and sort ------------------------------------------------------------------------

    def action_sort(self) -> None:
        """Sort by the next column."""
        self.query_one(FleetTable).action_cycle_sort()

    def apply_filter(self) -> None:
        table = self.query_one(FleetTable)
        if table.filter == self.filter_text:
            return
        table.filter = self.filter_text
        if self.last_snapshot is not None:
            with self.app.batch_update():
                self._show_nodes(self.last_snapshot)

    # -- views ---------------------------------------------------------------------------------

    def show_view(self, view: View) -> None:
        """Show the node table or the heatmap (the alert list goes with the table), as of the
        latest tick."""
        self.view = view
        heatmap = view == "heatmap"
        self.query_one(FleetTable).display = not heatmap
        self.query_one(FleetHeatmap).display = heatmap
        # The heatmap marks starved nodes itself; its rows need the alert list's lines at 120x40.
        self.query_one(AlertList).display = not heatmap
        self.query_one("#fleet-alerts-title").display = not heatmap  # the conditions line says it
        if self.last_snapshot is not None:
            with self.app.batch_update():
                self._show_nodes(self.last_snapshot)
        self._focus_view()

    def _focus_view(self) -> None:
        if self.view == "heatmap":
            self.query_one(FleetHeatmap).grid.focus()
        else:
            self.query_one(FleetTable).focus()

    def action_toggle_view(self) -> None:
        """Switch between the heatmap and the node table."""
        self.show_view("table" if self.view == "heatmap" else "heatmap")

    def action_leave_input(self) -> None:
        """Leave the filter box for the view on screen."""
        self._focus_view()

    def _escape_step(self) -> Callable[[], None] | None:
        # The heatmap is the screen's main view, not a form field: escape clears the filter
        # there, or goes on to the app, as it does from the table.
        if self.focused is self.query_one(FleetHeatmap).grid:
            box = self._filter_box()
            if box is not None and (self.filter_text or box.display):
                return self.action_clear_filter
            return None
        return super()._escape_step()

    # -- detail --------------------------------------------------------------------------------

    def action_open_node(self) -> None:
        """Open the node under the cursor (the table's row or the heatmap's cell)."""
        name = self._selected_node()
        if name is not None:
            self.open_node(name)

    @on(HeatmapGrid.NodeSelected)
    def _cell_selected(self, event: HeatmapGrid.NodeSelected) -> None:
        event.stop()
        self.open_node(event.node)

    @on(DataTable.RowSelected, "#fleet-table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.open_node(str(event.row_key.value))

    def open_node(self, name: str) -> None:
        """Push the detail screen of node ``name``."""
        self.app.push_screen(NodeDetailScreen(self.services, name))
