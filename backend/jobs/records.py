"""What the console knows of a job: its record, its latest progress point, and fleet roll-ups.

Pure data (no remote reads, no SQL): built by :mod:`backend.jobs.store` from the local state and
by :mod:`backend.jobs.manager` from what a node's job directory says.
"""

from __future__ import annotations

import secrets as _secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "lost"})
#: The state of a job folder this team's database did not launch (see JobRecord.foreign).
FOREIGN = "foreign"
#: Notes on a team's job that are about what its node wrote, not about reaching the node.
NODE_UNREADABLE = "the node's record is unreadable"
QUARANTINED = "quarantined"
NODE_SAID_NOTES = (NODE_UNREADABLE, QUARANTINED, "the node's copy of this job")
ACTIVE = frozenset({"starting", "running", "cancelling"})


def new_job_id() -> str:
    """A short, sortable, unique job id like ``1129-103200-a1b2``."""
    return time.strftime("%m%d-%H%M%S") + "-" + _secrets.token_hex(2)


def new_launch_id() -> str:
    """The id of one launch (a pull to N nodes): shaped like a job id, ``1129-103200-c3d4``."""
    return new_job_id()


def launch_job_ids(launch_id: str, nodes: Iterable[str]) -> dict[str, str]:
    """node -> the id of its job in the launch: ``<launch>.<n>``, n from 1 in the nodes' order.

    Every job's id starts with its launch's, so the one id on screen names both the job (unique)
    and the launch it belongs to (what ``job cancel LAUNCH`` takes).
    """
    return {node: f"{launch_id}.{i}" for i, node in enumerate(dict.fromkeys(nodes), start=1)}


def retry_job_id(launch_id: str | None) -> str:
    """The id of a job re-run within ``launch_id`` (a relay node fetched again): ``<launch>.r<hex>``."""
    return f"{launch_id}.r{_secrets.token_hex(2)}" if launch_id else new_job_id()


@dataclass(frozen=True)
class JobProgress:
    """The latest progress point of a job, with the throughput derived from recent points."""

    t: float
    bytes_done: int
    bytes_total: int | None = None
    items_done: int = 0
    items_total: int | None = None
    rate_bps: float | None = None  # bytes per second
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fraction(self) -> float | None:
        """Done fraction (0..1) by bytes, else by items; None when the total is unknown."""
        if self.bytes_total:
            return min(1.0, self.bytes_done / self.bytes_total)
        if self.items_total:
            return min(1.0, self.items_done / self.items_total)
        return None

    @property
    def gbps(self) -> float | None:
        return None if self.rate_bps is None else self.rate_bps * 8 / 1e9

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the current rate."""
        if not self.bytes_total or not self.rate_bps or self.rate_bps <= 0:
            return None
        return max(0.0, (self.bytes_total - self.bytes_done) / self.rate_bps)

    def as_dict(self) -> dict[str, Any]:
        d = {
            "t": self.t,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "items_done": self.items_done,
            "items_total": self.items_total,
            "rate_bps": self.rate_bps,
            "gbps": self.gbps,
            "eta_s": self.eta_s,
            "fraction": self.fraction,
        }
        d.update({k: v for k, v in self.extra.items() if k not in d})
        return d


@dataclass(frozen=True)
class JobRecord:
    """One job as the console knows it: local record merged with its remote directory."""

    id: str
    node: str
    kind: str
    state: str
    created: float
    launched_by: str
    launched_from: str
    label: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    job_dir: str | None = None
    pid: int | None = None
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    result: dict[str, Any] | None = None
    progress: JobProgress | None = None
    heartbeat_age: float | None = None
    #: Why the remote state could not be read just now (node unreachable); None when fresh.
    note: str | None = None
    #: False when this is what the node said while the state database was down (not recorded).
    recorded: bool = True
    #: Why this job folder is not one this team's database launched (shown, never acted on):
    #: None for the team's own jobs. Its ``state`` is then ``"foreign"``.
    foreign: str | None = None
    #: Why the job's row cannot be settled (its end is never recorded again); None normally.
    quarantined: str | None = None
    #: The launch this job is one of (a pull to N nodes: N jobs, one launch); None: started alone.
    launch: str | None = None
    #: The Slurm job it was launched for (``loadmaster pull --slurm-job N``); None: not tagged.
    slurm_job: str | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def source(self) -> str:
        return str(self.params.get("src") or self.params.get("source") or "")

    @property
    def destination(self) -> str:
        return str(self.params.get("dest") or self.params.get("destination") or "")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view (``loadmaster jobs --json``)."""
        return {
            "id": self.id,
            "launch": self.launch,
            "slurm_job": self.slurm_job,
            "node": self.node,
            "kind": self.kind,
            "state": self.state,
            "label": self.label,
            "created": self.created,
            "launched_by": self.launched_by,
            "launched_from": self.launched_from,
            "params": _public_params(self.params),
            "job_dir": self.job_dir,
            "pid": self.pid,
            "started": self.started,
            "finished": self.finished,
            "error": self.error,
            "result": self.result,
            "progress": self.progress.as_dict() if self.progress else None,
            "heartbeat_age": self.heartbeat_age,
            "note": self.note,
            "recorded": self.recorded,
            "foreign": self.foreign,
            "quarantined": self.quarantined,
        }


@dataclass(frozen=True)
class LaunchCancel:
    """What cancelling a launch did: each running job's final record, the jobs it could not
    cancel (id -> why) and those that had already ended (left alone)."""

    launch: str
    finals: tuple[JobRecord, ...]
    errors: dict[str, str]
    ended: tuple[JobRecord, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors and all(r.state == "cancelled" for r in self.finals)


@dataclass(frozen=True)
class FleetProgress:
    """A roll-up of several jobs (one pull fanned out to many nodes)."""

    jobs: int
    running: int
    succeeded: int
    failed: int
    bytes_done: int
    bytes_total: int | None
    items_done: int
    items_total: int | None
    rate_bps: float

    @property
    def fraction(self) -> float | None:
        return min(1.0, self.bytes_done / self.bytes_total) if self.bytes_total else None

    @property
    def eta_s(self) -> float | None:
        if not self.bytes_total or self.rate_bps <= 0:
            return None
        return max(0.0, (self.bytes_total - self.bytes_done) / self.rate_bps)


def fleet_rollup(records: Iterable[JobRecord]) -> FleetProgress:
    """Sum progress and throughput over jobs (totals unknown if any job's total is)."""
    recs = list(records)
    bd = bt = idn = it = 0
    bt_known = it_known = True
    rate = 0.0
    for r in recs:
        p = r.progress
        if p is None:
            bt_known = it_known = False
            continue
        bd += p.bytes_done
        idn += p.items_done
        if p.bytes_total is None:
            bt_known = False
        else:
            bt += p.bytes_total
        if p.items_total is None:
            it_known = False
        else:
            it += p.items_total
        if r.state == "running" and p.rate_bps:
            rate += p.rate_bps
    return FleetProgress(
        jobs=len(recs),
        running=sum(r.state in ACTIVE for r in recs),
        succeeded=sum(r.state == "succeeded" for r in recs),
        failed=sum(r.state in ("failed", "lost", "cancelled") for r in recs),
        bytes_done=bd,
        bytes_total=bt if bt_known and recs else None,
        items_done=idn,
        items_total=it if it_known and recs else None,
        rate_bps=rate,
    )


def states_text(recs: Iterable[JobRecord]) -> str:
    """``2 succeeded, 1 failed``: how many jobs are in each state."""
    counts: dict[str, int] = {}
    for r in recs:
        counts[r.state] = counts.get(r.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in counts.items())


def progress_from_lines(lines: list[dict[str, Any]]) -> JobProgress | None:
    """The last progress point; throughput from the runner's rate, else the points' slope."""
    if not lines:
        return None
    last = lines[-1]
    rate = last.get("rate_bps")
    if rate is None and len(lines) >= 2:
        first = lines[0]
        dt = float(last.get("t", 0)) - float(first.get("t", 0))
        if dt > 0:
            rate = max(0.0, (int(last.get("bytes_done", 0)) - int(first.get("bytes_done", 0))) / dt)
    known = {"t", "bytes_done", "bytes_total", "items_done", "items_total", "rate_bps"}
    return JobProgress(
        t=float(last.get("t", 0.0)),
        bytes_done=int(last.get("bytes_done", 0)),
        bytes_total=last.get("bytes_total"),
        items_done=int(last.get("items_done", 0)),
        items_total=last.get("items_total"),
        rate_bps=None if rate is None else float(rate),
        extra={k: v for k, v in last.items() if k not in known},
    )


def _public_params(params: dict[str, Any]) -> dict[str, Any]:
    # Long verification lists stay in the spec; views show their size only.
    return {k: (f"<{len(v)} entries>" if isinstance(v, list) and len(v) > 20 else v) for k, v in params.items()}
