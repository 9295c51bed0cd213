"""From what each node said to a ranked list of suspects, the evidence behind each, and the exact
commands to exclude, drain and resume: pure functions of :class:`NodeHealth` records.

Deny by default applies to accusations: a node or GPU is a suspect only on positive evidence (a
counter, a flag, a reason bit, a clock measurably below its peers, a lost or missing GPU, a node
that does not answer). What could not be read is listed as a note, never held against anyone: a
node whose GPU telemetry is missing (:data:`NO_TELEMETRY`: no series in Prometheus, no nvidia-smi
on it) is "no telemetry", never "GPUs missing".
"""

from __future__ import annotations

import math
import shlex
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from backend.triage.signals import GPU_IDLE, GpuHealth, XidSeen

#: A GPU whose SM clock is below this fraction of its peers' median is a straggler: one GPU at
#: 95% of the others' clock slows a synchronous job by about 5%. Healthy GPUs of one model under
#: one load sit within a percent or two of each other.
STRAGGLER_RATIO = 0.97
#: Fewest busy GPUs for a median to compare against.
MIN_PEERS = 4
#: A GPU below this utilisation (or with the idle reason set) is not compared: it is not working.
BUSY_UTIL_PCT = 10.0

#: PCIe replays or NVLink CRC flit errors in the counter window that make evidence. A healthy link
#: replays now and then; these are loadmaster's thresholds (a burst, not a blip), not NVIDIA's.
PCIE_REPLAYS_EVIDENCE = 100
NVLINK_CRC_EVIDENCE = 100

#: ``gpu_status`` of a node whose GPUs could not be read at all: Prometheus has no series for it
#: (its exporter down or not scraped), nvidia-smi is not installed on it, or its answer has no GPU
#: part. It proves the telemetry is missing, nothing about the GPUs: no ``gpu-missing`` or
#: ``telemetry-missing`` evidence, no drain on that ground, no resume either (nothing was proven).
NO_TELEMETRY = "no-telemetry"

#: How much each kind of evidence weighs in the ranking (higher first).
WEIGHTS = {
    "unreachable": 90,
    "fell-off-bus": 100,
    "gpu-missing": 95,
    "xid": 80,
    "remap-failed": 85,
    "remap-pending": 70,
    "ecc-uncorrected": 60,
    "telemetry-missing": 50,
    "clock-event": 40,
    "nvlink-crc": 45,
    "pcie-replay": 35,
    "straggler": 30,
}


@dataclass(frozen=True)
class NodeHealth:
    """One node as triage read it: reachability, GPUs, Xids, and Slurm's view when enabled."""

    node: str
    reachable: bool
    read_at: float
    error: str | None = None
    #: False: its GPUs were not read (not in the inventory, or :data:`NO_TELEMETRY`); nothing is held
    #: against it but an Xid it was read to log.
    read: bool = True
    gpus: tuple[GpuHealth, ...] = ()
    #: "ok", "absent" (nvidia-smi found no GPU, or a node without GPUs has no nvidia-smi),
    #: :data:`NO_TELEMETRY` (``telemetry`` says why), or nvidia-smi's error line.
    gpu_status: str = "ok"
    #: Why there is no telemetry for the node (with ``gpu_status`` :data:`NO_TELEMETRY`).
    telemetry: str | None = None
    xids: tuple[XidSeen, ...] = ()
    #: Why the kernel log could not be read, if so.
    xid_error: str | None = None
    #: GPUs the node should have (Slurm's GRES), None when unknown.
    expected_gpus: int | None = None
    slurm_state: str | None = None
    slurm_reason: str | None = None
    #: Epoch seconds Slurm's reason was set.
    slurm_reason_at: float | None = None


@dataclass(frozen=True)
class Evidence:
    """One fact against one node (``gpu`` None: the node as a whole)."""

    node: str
    gpu: int | None
    kind: str
    detail: str
    #: When it started, as far as anyone can tell (an Xid's log time; else when triage saw it).
    since: float | None


@dataclass(frozen=True)
class Suspect:
    node: str
    gpus: tuple[int, ...]
    evidence: tuple[Evidence, ...]
    since: float | None
    score: int


@dataclass(frozen=True)
class TriageReport:
    """The answer: every node read, the suspects ranked, the commands (shown, never run)."""

    nodes: tuple[NodeHealth, ...]
    suspects: tuple[Suspect, ...]
    commands: tuple[str, ...]
    #: What could not be read (never held against a node).
    notes: tuple[str, ...] = ()
    job: str | None = None
    #: Nodes Slurm has drained or down that pass every check (``loadmaster resume`` is shown).
    passing_drained: tuple[str, ...] = ()
    checkpoint: dict[str, Any] | None = field(default=None)
    #: The busy GPUs furthest below the medians (SM clock, utilisation, power), flagged or not.
    slowest: tuple[SlowGpu, ...] = ()
    #: :class:`backend.triage.goodput.Goodput` of the run (with ``--run``), else None.
    goodput: Any = None

    @property
    def exclude(self) -> str | None:
        """``--exclude=a,b`` for the resubmission, None when nobody is suspect."""
        return f"--exclude={','.join(s.node for s in self.suspects)}" if self.suspects else None

    def as_json(self) -> dict[str, Any]:
        """``{"suspects": [{"node", "gpus", "evidence": [...], "since"}], "commands": [...], ...}``."""
        return {
            "job": self.job,
            "suspects": [
                {
                    "node": s.node,
                    "gpus": list(s.gpus),
                    "since": s.since,
                    "score": s.score,
                    "evidence": [
                        {"gpu": e.gpu, "kind": e.kind, "detail": e.detail, "since": e.since} for e in s.evidence
                    ],
                }
                for s in self.suspects
            ],
            "commands": list(self.commands),
            "exclude": self.exclude,
            "notes": list(self.notes),
            "nodes": [_node_json(n) for n in self.nodes],
            "checkpoint": self.checkpoint,
            "slowest": [asdict(r) for r in self.slowest],
            "goodput": self.goodput.as_json() if self.goodput is not None else None,
        }


def _node_json(n: NodeHealth) -> dict[str, Any]:
    d = asdict(n)
    d["gpus"] = [asdict(g) for g in n.gpus]
    d["xids"] = [asdict(x) for x in n.xids]
    return d


def stragglers(gpus: list[tuple[str, GpuHealth]]) -> list[tuple[str, GpuHealth, float, float]]:
    """GPUs whose SM clock is below :data:`STRAGGLER_RATIO` of the busy GPUs' median, slowest
    first: (node, GPU, its clock as a fraction of the median, the median in MHz). Idle GPUs and
    GPUs without a clock are not compared; fewer than :data:`MIN_PEERS` busy GPUs, none flagged."""
    busy = [(n, g) for n, g in gpus if _busy(g)]
    if len(busy) < MIN_PEERS:
        return []
    median = statistics.median(g.sm_mhz for _, g in busy if g.sm_mhz is not None)
    if median <= 0:
        return []
    out = [(n, g, (g.sm_mhz or 0.0) / median, median) for n, g in busy]
    return sorted((x for x in out if x[2] < STRAGGLER_RATIO), key=lambda x: x[2])


@dataclass(frozen=True)
class SlowGpu:
    """One busy GPU against the busy GPUs' medians (1.0: at the median), slowest SM clock first."""

    node: str
    gpu: int
    sm_ratio: float
    util_ratio: float | None
    power_ratio: float | None
    reasons: tuple[str, ...]


def slowest(gpus: list[tuple[str, GpuHealth]], limit: int = 10) -> list[SlowGpu]:
    """The ``limit`` busy GPUs furthest below the medians on SM clock (then utilisation and power),
    with their evidence-worthy clock event reasons: the straggler ranking, flagged or not."""
    busy = [(n, g) for n, g in gpus if _busy(g)]
    if len(busy) < MIN_PEERS:
        return []

    def med(values: list[float]) -> float | None:
        return statistics.median(values) if len(values) >= MIN_PEERS and statistics.median(values) > 0 else None

    sm = med([g.sm_mhz for _, g in busy if g.sm_mhz is not None])
    util = med([g.util_pct for _, g in busy if g.util_pct is not None])
    power = med([g.power_w for _, g in busy if g.power_w is not None])
    if sm is None:
        return []
    rows = [
        SlowGpu(
            n,
            g.index,
            (g.sm_mhz or 0.0) / sm,
            None if util is None or g.util_pct is None else g.util_pct / util,
            None if power is None or g.power_w is None else g.power_w / power,
            g.reason_names,
        )
        for n, g in busy
    ]
    rows.sort(key=lambda r: (r.sm_ratio, r.util_ratio or 1.0, r.power_ratio or 1.0, r.node, r.gpu))
    return rows[:limit]


def _busy(g: GpuHealth) -> bool:
    return (
        not g.lost
        and g.sm_mhz is not None
        and math.isfinite(g.sm_mhz)
        and g.sm_mhz > 0
        and (g.util_pct is None or g.util_pct >= BUSY_UTIL_PCT)
        and not ((g.reasons or 0) & GPU_IDLE)
    )


def _peer_buses(nodes: list[NodeHealth]) -> dict[str, list[str]]:
    """GPU model -> the PCI bus ids its nodes most commonly list (the expected layout)."""
    layouts: dict[str, dict[tuple[str, ...], int]] = {}
    for n in nodes:
        names = {g.name for g in n.gpus if g.name}
        if len(names) != 1 or any(g.lost for g in n.gpus):
            continue
        key = tuple(sorted(g.bus.upper() for g in n.gpus))
        d = layouts.setdefault(names.pop(), {})
        d[key] = d.get(key, 0) + 1
    out = {}
    for model, d in layouts.items():
        best, seen = max(d.items(), key=lambda kv: (kv[1], len(kv[0])))
        if seen >= 2:
            out[model] = list(best)
    return out


def _finite(v: object, lo: float, hi: float) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) and lo <= v <= hi else None


def _nonneg(v: object, hi: int = 2**63) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return v if 0 <= v < hi else None


def _tri(v: object) -> bool | None:
    return v if isinstance(v, bool) else None


def sane_gpu(g: GpuHealth) -> GpuHealth:
    """``g`` with every value that is not a finite number in its range (NaN, negative, huge, the
    wrong type) set to None: a record from any source, not only the range-checked parsers, accuses
    nobody with a value nobody can believe."""
    return replace(
        g,
        util_pct=_finite(g.util_pct, 0, 100),
        power_w=_finite(g.power_w, 0, 5000),
        sm_mhz=_finite(g.sm_mhz, 1, 10000),
        sm_max_mhz=_finite(g.sm_max_mhz, 1, 10000),
        reasons=_nonneg(g.reasons, 2**64),
        ecc_uncorrected=_nonneg(g.ecc_uncorrected),
        remap_pending=_tri(g.remap_pending),
        remap_failed=_tri(g.remap_failed),
        pcie_replays=_nonneg(g.pcie_replays),
        nvlink_crc=_nonneg(g.nvlink_crc),
    )


def sane_node(n: NodeHealth) -> NodeHealth:
    """``n`` with :func:`sane_gpu` GPUs and an ``expected_gpus`` that is a count (else None: unknown)."""
    expected = _nonneg(n.expected_gpus, 4096)
    return replace(n, gpus=tuple(sane_gpu(g) for g in n.gpus), expected_gpus=expected)


def node_evidence(n: NodeHealth, peer_buses: dict[str, list[str]]) -> list[Evidence]:
    """Everything against one node (the straggler comparison is done across nodes)."""
    ev: list[Evidence] = []
    t = n.read_at
    if n.gpu_status == NO_TELEMETRY:
        # Its GPUs were not read: their absence proves nothing. An Xid its kernel log was read to
        # hold is still evidence.
        return _xid_evidence(n) if n.reachable else []
    if not n.read:
        return []
    if not n.reachable:
        detail = f"does not answer: {n.error or 'no reply'}"
        since = t
        if n.slurm_state and (n.slurm_state.endswith("*") or n.slurm_state.startswith("down")):
            # Slurm lost it too: its reason's time is when it started, as far as anyone knows.
            detail += f" (Slurm: {n.slurm_state}" + (f", {n.slurm_reason})" if n.slurm_reason else ")")
            since = n.slurm_reason_at or t
        return [Evidence(n.node, None, "unreachable", detail, since)]
    if n.gpu_status not in ("ok", "absent") and not n.gpus:
        ev.append(
            Evidence(n.node, None, "telemetry-missing", f"nvidia-smi fails while the node answers: {n.gpu_status}", t)
        )
    for g in n.gpus:
        if g.lost:
            ev.append(Evidence(n.node, g.index, "fell-off-bus", f"GPU {g.index} ({g.bus or 'bus ?'}) is lost", t))
            continue
        if g.remap_failed:
            ev.append(Evidence(n.node, g.index, "remap-failed", f"GPU {g.index}: row remapping failed", t))
        if g.remap_pending:
            ev.append(
                Evidence(n.node, g.index, "remap-pending", f"GPU {g.index}: row remap pending (reset to apply)", t)
            )
        if g.ecc_uncorrected:
            ev.append(
                Evidence(
                    n.node,
                    g.index,
                    "ecc-uncorrected",
                    f"GPU {g.index}: {g.ecc_uncorrected} uncorrectable ECC error(s)",
                    t,
                )
            )
        if g.reason_names:
            ev.append(
                Evidence(
                    n.node, g.index, "clock-event", f"GPU {g.index}: {', '.join(g.reason_names)} ({g.reasons:#x})", t
                )
            )
        if g.pcie_replays is not None and g.pcie_replays >= PCIE_REPLAYS_EVIDENCE:
            ev.append(Evidence(n.node, g.index, "pcie-replay", f"GPU {g.index}: {g.pcie_replays} PCIe replays", t))
        if g.nvlink_crc is not None and g.nvlink_crc >= NVLINK_CRC_EVIDENCE:
            ev.append(
                Evidence(n.node, g.index, "nvlink-crc", f"GPU {g.index}: {g.nvlink_crc} NVLink CRC flit errors", t)
            )
        if (
            g.sm_mhz is None
            and g.util_pct is None
            and g.power_w is None
            and any(h.sm_mhz is not None for h in n.gpus if h is not g)
        ):
            ev.append(
                Evidence(n.node, g.index, "telemetry-missing", f"GPU {g.index}: no clock, utilisation or power", t)
            )
    listed = len(n.gpus)
    if n.expected_gpus is not None and 0 <= listed < n.expected_gpus and n.gpu_status in ("ok", "absent"):
        ev.append(Evidence(n.node, None, "gpu-missing", f"{listed} of {n.expected_gpus} GPUs listed (Slurm's GRES)", t))
    else:
        names = {g.name for g in n.gpus if g.name}
        layout = peer_buses.get(names.pop()) if len(names) == 1 else None
        have = {g.bus.upper() for g in n.gpus}
        # A node a GPU or two short of its peers' layout, every bus it lists being one of theirs:
        # a node built smaller (4 of 8) is a different node, not a sick one.
        if layout and have <= set(layout) and 0 < len(layout) - len(have) <= max(1, len(layout) // 4):
            for pos, bus in enumerate(layout):
                if bus not in have:
                    ev.append(
                        Evidence(n.node, pos, "gpu-missing", f"GPU at {bus} is not listed (its peers list it)", t)
                    )
    ev.extend(_xid_evidence(n))
    return ev


def _xid_evidence(n: NodeHealth) -> list[Evidence]:
    out = []
    for x in n.xids:
        if x.drain:
            where = f"GPU {x.gpu}" if x.gpu >= 0 else "a GPU"
            out.append(
                Evidence(
                    n.node,
                    x.gpu if x.gpu >= 0 else None,
                    "xid",
                    f"Xid {x.code} ({x.mnemonic}) on {where}: {x.action}",
                    x.at,
                )
            )
    return out


def analyze(nodes: list[NodeHealth], *, job: str | None = None) -> TriageReport:
    """The ranked suspects and the commands for ``nodes`` (read together, e.g. one job's).

    What could not be proven is said in ``notes`` (nothing read, too few busy GPUs to compare
    clocks, a kernel log not read), never guessed either way: a resume is proposed only for a node
    whose every check was read and passed, a drain only for a node Slurm has not drained already."""
    nodes = [sane_node(n) for n in nodes]
    peers = _peer_buses(nodes)
    ev: dict[str, list[Evidence]] = {n.node: node_evidence(n, peers) for n in nodes}
    pool = [(n.node, g) for n in nodes if n.reachable and n.read and n.gpu_status != NO_TELEMETRY for g in n.gpus]
    ranking = slowest(pool)
    rel = {(r.node, r.gpu): r for r in ranking}
    for node, g, ratio, median in stragglers(pool):
        detail = f"GPU {g.index}: SM clock {g.sm_mhz:.0f} MHz, {ratio:.1%} of the median {median:.0f} MHz"
        r = rel.get((node, g.index))
        if r is not None and r.util_ratio is not None:
            detail += f"; utilisation {r.util_ratio:.0%} and power " + (
                f"{r.power_ratio:.0%} of theirs" if r.power_ratio is not None else "unknown"
            )
        ev[node].append(Evidence(node, g.index, "straggler", detail, _read_at(nodes, node)))
    suspects = []
    for n in nodes:
        items = ev[n.node]
        if not items:
            continue
        score = sum(WEIGHTS.get(e.kind, 10) for e in items)
        gpus = tuple(sorted({e.gpu for e in items if e.gpu is not None}))
        since = min((e.since for e in items if e.since is not None), default=None)
        suspects.append(Suspect(n.node, gpus, tuple(items), since, score))
    suspects.sort(key=lambda s: (-max(WEIGHTS.get(e.kind, 10) for e in s.evidence), -s.score, s.node))
    notes = []
    if not nodes:
        notes.append("no nodes read: nothing to triage")
    for n in nodes:
        if n.gpu_status == NO_TELEMETRY:
            notes.append(
                f"{n.node}: no telemetry ({n.telemetry or 'no GPU data'}): its GPUs were not read, "
                "nothing is held against it on that ground"
            )
        elif not n.read:
            notes.append(f"{n.node}: {n.gpu_status}")
        elif n.reachable and n.xid_error:
            notes.append(f"{n.node}: kernel log not read ({n.xid_error})")
    busy = sum(1 for _, g in pool if _busy(g))
    if pool and busy < MIN_PEERS:
        notes.append(f"SM clocks not compared (stragglers unknown): {busy} busy GPU(s) read, {MIN_PEERS} needed")
    accused = {s.node for s in suspects}
    passing = tuple(
        n.node
        for n in nodes
        if n.node not in accused
        and _proven_healthy(n)
        and n.slurm_state
        and n.slurm_state.rstrip("*") in ("drained", "draining", "down")
    )
    for n in nodes:
        if n.node in accused or not n.slurm_state or n.slurm_state.rstrip("*") not in ("drained", "draining", "down"):
            continue
        if n.node not in passing:
            notes.append(f"{n.node}: {n.slurm_state} in Slurm, not every check could be read: no resume proposed")
    already = {n.node for n in nodes if n.slurm_state and n.slurm_state.rstrip("*") in ("drained", "draining")}
    notes.extend(
        f"{s.node}: already {_state_of(nodes, s.node)} in Slurm: no drain proposed"
        for s in suspects
        if s.node in already
    )
    return TriageReport(
        nodes=tuple(nodes),
        suspects=tuple(suspects),
        commands=tuple(commands(suspects, passing, already_drained=already)),
        notes=tuple(notes),
        job=job,
        passing_drained=passing,
        slowest=tuple(ranking),
    )


def _proven_healthy(n: NodeHealth) -> bool:
    """Every check triage makes was read on ``n``: it answered, its GPUs were listed (or it has
    none and Slurm expects none) and its kernel log was read."""
    gpus_read = n.gpu_status == "ok" or (n.gpu_status == "absent" and not n.expected_gpus)  # never NO_TELEMETRY
    return n.read and n.reachable and gpus_read and n.xid_error is None


def _state_of(nodes: list[NodeHealth], name: str) -> str:
    return next((n.slurm_state or "?" for n in nodes if n.node == name), "?")


def _read_at(nodes: list[NodeHealth], name: str) -> float | None:
    return next((n.read_at for n in nodes if n.node == name), None)


def commands(
    suspects: list[Suspect], passing: tuple[str, ...], *, already_drained: frozenset[str] | set[str] = frozenset()
) -> list[str]:
    """The exact commands for the operator: exclude the suspects, drain each one Slurm has not
    drained already (a second drain would overwrite who drained it and why), resume what passes."""
    out: list[str] = []
    if suspects:
        out.append(f"--exclude={','.join(s.node for s in suspects)}")
    for s in suspects:
        if s.node in already_drained:
            continue
        top = max(s.evidence, key=lambda e: WEIGHTS.get(e.kind, 10))
        reason = f"triage: {top.detail}"[:150]
        out.append(
            shlex.join(["loadmaster", "drain", s.node, "--reason", reason, "--prompted-by", "loadmaster triage"])
        )
    out.extend(shlex.join(["loadmaster", "resume", n]) for n in passing)
    return out
