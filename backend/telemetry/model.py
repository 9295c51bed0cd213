"""Immutable telemetry snapshots the backend hands to front ends (console, CLI, benchmarks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from backend.units import gbps_text

NodeState = Literal["connecting", "up", "stale", "unreachable"]
NicKind = Literal["physical", "bond", "member", "virtual", "loopback"]

#: What the GPU column says for a node without nvidia-smi or without GPUs.
NO_GPU = "no NVIDIA GPU"


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one instant; a field the driver does not report is None."""

    index: int
    uuid: str = ""
    name: str = ""
    util_pct: float | None = None
    mem_util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    #: The GPU fell off the bus ("GPU is lost"); the other fields are None.
    lost: bool = False
    error: str | None = None
    #: The last Xid the driver reported for this GPU (0 or None: none); backend.telemetry.xid.
    xid: int | None = None
    #: Fraction of time the graphics engine was active (DCGM_FI_PROF_GR_ENGINE_ACTIVE, 0-1).
    gr_engine_active: float | None = None


def gpu_row(
    index: int,
    uuid: str,
    name: str,
    util_pct: float | None,
    mem_util_pct: float | None,
    mem_used_mib: float | None,
    mem_total_mib: float | None,
    temp_c: float | None,
    power_w: float | None,
    power_limit_w: float | None,
) -> GpuSample:
    """``GpuSample(...)`` of one nvidia-smi row (equal, same hash and repr), made without the frozen
    dataclass's ``object.__setattr__`` per field: the parser makes one per GPU per block (2,048 a
    second at 256 nodes x 8 GPUs), and that constructor was most of its cost."""
    g = object.__new__(GpuSample)
    g.__dict__.update(
        index=index,
        uuid=uuid,
        name=name,
        util_pct=util_pct,
        mem_util_pct=mem_util_pct,
        mem_used_mib=mem_used_mib,
        mem_total_mib=mem_total_mib,
        temp_c=temp_c,
        power_w=power_w,
        power_limit_w=power_limit_w,
        lost=False,
        error=None,
        xid=None,
        gr_engine_active=None,
    )
    return g


@dataclass(frozen=True)
class NicRate:
    """One network interface's receive/transmit rate (None while unknown, e.g. after a reset)."""

    name: str
    kind: NicKind
    rx_gbps: float | None
    tx_gbps: float | None
    #: Line rate from /sys/class/net/<if>/speed in Mb/s; None when -1 or unreadable.
    speed_mbps: int | None = None

    @property
    def counts(self) -> bool:
        """Whether this interface counts towards the node's NIC totals (physical or bond)."""
        return self.kind in ("physical", "bond")

    @property
    def rx_pct(self) -> float | None:
        """Receive rate as % of line rate, None when either is unknown."""
        return _pct(self.rx_gbps, self.speed_mbps)

    @property
    def tx_pct(self) -> float | None:
        """Transmit rate as % of line rate, None when either is unknown."""
        return _pct(self.tx_gbps, self.speed_mbps)


@dataclass(frozen=True)
class DiskRate:
    """One whole block device's read/write rate in MB/s (10^6 bytes)."""

    name: str
    read_mbps: float | None
    write_mbps: float | None
    #: Backed by hardware (/sys/block/<dev>/device exists), not md/dm/loop.
    physical: bool = True


@dataclass(frozen=True)
class Alert:
    """A "GPU starved" event on one node: raised after the window, cleared by itself."""

    node: str
    gpus: tuple[int, ...]
    started: float
    #: Seconds the condition has held (to now while active, to the clear time once cleared).
    duration: float
    mean_util_pct: float
    mem_used_mib: float
    rx_gbps: float | None
    rx_pct: float | None
    #: "input-bound", "request-bound" or "line rate unknown".
    hint: str
    active: bool = True
    ended: float | None = None
    kind: str = "gpu-starved"
    #: ``started`` as wall-clock epoch seconds (for display and JSON).
    started_wall: float | None = None

    @property
    def message(self) -> str:
        """One line for a list or a log."""
        from backend.textfmt import gpu_ranges

        gpus = gpu_ranges(self.gpus)
        nic = f"rx {gbps_text(self.rx_gbps)}"
        if self.rx_pct is not None:
            nic += f" ({self.rx_pct:.0f}% of line rate)"
        advice = HINT_ADVICE.get(self.hint, "")
        return (
            f"{self.node}: GPU starved (GPUs {gpus}, mean util {self.mean_util_pct:.0f}% "
            f"for {self.duration:.0f}s), {nic}: {self.hint}{advice}"
        )


HINT_ADVICE = {
    "input-bound": " - the NIC is full: more bandwidth, local NVMe cache or fewer bytes per sample",
    "request-bound": " - NIC far below line rate: many small GETs; pack into WebDataset shards",
    "line rate unknown": "",
}


@dataclass(frozen=True)
class XidEvent:
    """A new Xid on one GPU of one node, with what it means and what to do (backend.telemetry.xid)."""

    node: str
    gpu: int
    code: int
    mnemonic: str
    meaning: str
    action: str
    #: Whether the node should be drained until someone acts.
    drain: bool
    #: Wall-clock epoch seconds the console first saw it.
    seen: float

    @property
    def message(self) -> str:
        return f"{self.node}: GPU {self.gpu} Xid {self.code} ({self.mnemonic}): {self.meaning} - {self.action}"


@dataclass(frozen=True)
class Observed:
    """One node's numbers at one instant as the hub applies them: from a sampler block (rates computed
    from two blocks) or from Prometheus (rates computed there)."""

    gpus: tuple[GpuSample, ...] = ()
    gpu_status: str = "ok"
    nics: tuple[NicRate, ...] = ()
    disks: tuple[DiskRate, ...] = ()
    scratch_free_bytes: int | None = None
    scratch_total_bytes: int | None = None
    scratch_error: str | None = None


#: Where a node's numbers come from.
SourceKind = Literal["ssh", "prometheus"]


@dataclass(frozen=True)
class NodeSnapshot:
    """Everything known about one node at one tick.

    Derived totals are cached properties: a snapshot never changes, so each is computed once.
    """

    name: str
    site: str | None = None
    state: NodeState = "connecting"
    #: The last error (connection refused, stream ended, ...), shown next to the state.
    error: str | None = None
    #: Round trip of a no-op command over the existing connection, in milliseconds.
    latency_ms: float | None = None
    gpus: tuple[GpuSample, ...] = ()
    #: "ok", NO_GPU, or nvidia-smi's error line.
    gpu_status: str = "ok"
    nics: tuple[NicRate, ...] = ()
    disks: tuple[DiskRate, ...] = ()
    scratch: str | None = None
    scratch_free_bytes: int | None = None
    scratch_total_bytes: int | None = None
    scratch_error: str | None = None
    #: Hub clock (monotonic seconds) of the last sample.
    sampled_at: float | None = None
    boot_id: str | None = None
    alerts: tuple[Alert, ...] = ()
    #: Samples ingested from this node so far (rates need two in a row from one boot).
    samples: int = 0
    #: ``ssh`` (the node's own sampler stream) or ``prometheus`` (the site's Prometheus).
    source: SourceKind = "ssh"
    #: Xids seen on this node's GPUs since the console started (newest last).
    xids: tuple[XidEvent, ...] = ()

    @cached_property
    def live_gpus(self) -> tuple[GpuSample, ...]:
        """GPUs still on the bus."""
        return tuple(g for g in self.gpus if not g.lost)

    @cached_property
    def util_mean(self) -> float | None:
        """Mean GPU utilisation over GPUs that report it."""
        vals = [g.util_pct for g in self.gpus if g.util_pct is not None]
        return sum(vals) / len(vals) if vals else None

    @cached_property
    def util_min(self) -> float | None:
        """Lowest GPU utilisation."""
        vals = [g.util_pct for g in self.gpus if g.util_pct is not None]
        return min(vals) if vals else None

    @cached_property
    def mem_used_mib(self) -> float | None:
        """GPU memory used, summed over GPUs (MiB)."""
        vals = [g.mem_used_mib for g in self.gpus if g.mem_used_mib is not None]
        return sum(vals) if vals else None

    @cached_property
    def mem_total_mib(self) -> float | None:
        """GPU memory, summed over GPUs (MiB)."""
        vals = [g.mem_total_mib for g in self.gpus if g.mem_total_mib is not None]
        return sum(vals) if vals else None

    @cached_property
    def rx_gbps(self) -> float | None:
        """Sum over physical NICs and bonds (virtual and bond members excluded)."""
        return _sum(n.rx_gbps for n in self.nics if n.counts)

    @cached_property
    def tx_gbps(self) -> float | None:
        """Transmit over physical NICs and bonds."""
        return _sum(n.tx_gbps for n in self.nics if n.counts)

    @cached_property
    def line_rate_mbps(self) -> int | None:
        """Summed line rate of counted NICs with a known speed."""
        speeds = [n.speed_mbps for n in self.nics if n.counts and n.speed_mbps]
        return sum(speeds) if speeds else None

    @cached_property
    def rx_pct(self) -> float | None:
        """Receive as % of the summed line rate of NICs with a known speed."""
        return _pct(_sum(n.rx_gbps for n in self.nics if n.counts and n.speed_mbps), self.line_rate_mbps)

    @cached_property
    def tx_pct(self) -> float | None:
        """Transmit as % of the summed line rate of NICs with a known speed."""
        return _pct(_sum(n.tx_gbps for n in self.nics if n.counts and n.speed_mbps), self.line_rate_mbps)

    @cached_property
    def disk_write_mbps(self) -> float | None:
        """Writes over hardware-backed whole disks (MB/s)."""
        return _sum(d.write_mbps for d in self.disks if d.physical)

    @cached_property
    def disk_read_mbps(self) -> float | None:
        """Reads over hardware-backed whole disks (MB/s)."""
        return _sum(d.read_mbps for d in self.disks if d.physical)


@dataclass(frozen=True)
class FleetSnapshot:
    """The whole fleet at one tick, plus the alert list (active first, then recent cleared)."""

    seq: int
    t: float
    nodes: tuple[NodeSnapshot, ...] = ()
    alerts: tuple[Alert, ...] = ()
    #: Names of nodes whose data changed since the previous tick (front ends redraw only these).
    changed: frozenset[str] = field(default_factory=frozenset)
    #: Why the configured telemetry source is not working now (Prometheus unreachable), or None.
    source_note: str | None = None

    def node(self, name: str) -> NodeSnapshot | None:
        """The node called ``name``, or None."""
        for n in self.nodes:
            if n.name == name:
                return n
        return None

    @cached_property
    def nodes_up(self) -> int:
        """Nodes in state "up"."""
        return sum(1 for n in self.nodes if n.state == "up")

    @cached_property
    def gpu_count(self) -> int:
        """GPUs on the bus across the fleet."""
        return sum(len(n.live_gpus) for n in self.nodes)

    @cached_property
    def util_mean(self) -> float | None:
        """Mean utilisation over every GPU of up nodes."""
        vals = [g.util_pct for n in self.nodes if n.state == "up" for g in n.gpus if g.util_pct is not None]
        return sum(vals) / len(vals) if vals else None

    @cached_property
    def rx_gbps(self) -> float:
        """Receive summed over up nodes."""
        return sum(n.rx_gbps or 0.0 for n in self.nodes if n.state == "up")

    @cached_property
    def tx_gbps(self) -> float:
        """Transmit summed over up nodes."""
        return sum(n.tx_gbps or 0.0 for n in self.nodes if n.state == "up")

    @cached_property
    def active_alerts(self) -> tuple[Alert, ...]:
        """Alerts still active."""
        return tuple(a for a in self.alerts if a.active)

    def summary_line(self) -> str:
        """'nodes 3/4 up · GPUs 24 · util 71% · rx 12.3 Gbps · tx 0.40 Gbps · alerts 1'."""
        util = "-" if self.util_mean is None else f"{self.util_mean:.0f}%"
        xids = sum(1 for n in self.nodes if n.xids)
        return (
            f"nodes {self.nodes_up}/{len(self.nodes)} up · GPUs {self.gpu_count} · util {util} · "
            f"rx {gbps_text(self.rx_gbps)} · tx {gbps_text(self.tx_gbps)} · "
            f"alerts {len(self.active_alerts)}"
            + (f" · Xid on {xids} node(s)" if xids else "")
            + (f" · telemetry degraded: {self.source_note}" if self.source_note else "")
        )


def _sum(values) -> float | None:  # type: ignore[no-untyped-def]
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def _pct(gbps: float | None, speed_mbps: int | None) -> float | None:
    if gbps is None or not speed_mbps:
        return None
    return 100.0 * gbps * 1000.0 / speed_mbps
