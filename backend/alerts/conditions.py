"""loadmaster's own alert conditions, evaluated from what the console already knows.

:func:`evaluate` is pure: it takes the fleet snapshot, the job records, the month's egress report,
the unfinished retention applies and the stall tracker's view, and returns one :class:`Condition`
per thing that is wrong now. The same condition always has the same labels (``alertname``,
``node``, ``job_id``, ``store``, ``severity`` and a few more where they identify it), so
Alertmanager deduplicates it however many watchers send it and across restarts; a condition that
is no longer returned is resolved by :mod:`backend.alerts.store`.

Conditions and their labels:

* ``GPUStarved`` {node}: the starvation detector's active alert on that node.
* ``GPUXid`` {node, gpu, xid}: a new Xid, held ``held_for`` after it was seen; critical when the
  catalog says drain.
* ``UploadBacklog`` {node, job_id, store}: a checkpoint upload still running when the next
  checkpoint is due (:func:`backend.checkpoints.footprint.upload_backlog`).
* ``TransferStalled`` {node, job_id, store}: a running transfer whose bytes have not moved for
  ``stall_after`` (:class:`StallTracker`).
* ``JobLost`` {node, job_id}: a job whose runner died without a result, held ``held_for``.
* ``VerificationFailed`` {node, job_id, store}: a pull, upload or strip that failed its check.
* ``EgressBudgetWarning`` / ``EgressBudgetExceeded`` {account}: the month's spend (with transfers
  in flight at their quote) past ``[egress] warn_at`` of a budget, or past the budget.
* ``RetentionApplyInterrupted`` {store}: a retention apply that journalled an action as started
  and was left that way (``stall_after`` without progress): re-run the plan to finish it.
* ``NodeUnreachable`` {node}.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backend.alerts.settings import AlertSettings
from backend.checkpoints.footprint import upload_backlog
from backend.units import bytes_text, duration_text, usd_text

#: The job kinds that move bytes (stall detection, verification).
TRANSFER_KINDS = ("pull", "upload", "strip", "shard")
_VERIFY = re.compile(r"verif", re.IGNORECASE)


@dataclass(frozen=True)
class Condition:
    """One thing wrong now, as an alert: labels that identify it, annotations that explain it."""

    alertname: str
    labels: Mapping[str, str]
    summary: str
    description: str = ""
    severity: str = "warning"
    #: What the alert is about, for a link back: ``job:<id>``, ``node:<name>``, ``run:<url>``.
    ref: str = ""
    #: When it began (epoch seconds), where the source knows; else when first seen.
    since: float | None = None

    @property
    def all_labels(self) -> dict[str, str]:
        return {"alertname": self.alertname, **dict(self.labels), "severity": self.severity}

    @property
    def annotations(self) -> dict[str, str]:
        out = {"summary": self.summary}
        if self.description:
            out["description"] = self.description
        if self.ref:
            out["loadmaster_ref"] = self.ref
        return out


@dataclass(frozen=True)
class Interrupted:
    """A retention apply left unfinished: its plan, run and the newest journal entry's time."""

    plan_hash: str
    paths: int
    last_ts: float
    store: str = ""


@dataclass
class StallTracker:
    """When each running job's bytes last moved, across evaluations (a job's progress lines may
    keep coming with the same byte count while s5cmd waits on a dead connection)."""

    #: job id -> (bytes done, epoch seconds they were first seen at that value)
    seen: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: job id -> when this tracker first saw the job running (a new watcher knows nothing older)
    first: dict[str, float] = field(default_factory=dict)

    def watched_for(self, job_id: str, now: float) -> float:
        """Seconds this tracker has watched ``job_id`` run (0 if it has not)."""
        t = self.first.get(job_id)
        return 0.0 if t is None else now - t

    def observe(self, records: Iterable[Any], now: float) -> dict[str, float]:
        """Update from ``records``; return job id -> seconds its bytes have not moved (running
        transfer jobs only)."""
        out: dict[str, float] = {}
        alive = set()
        for r in records:
            if r.kind not in TRANSFER_KINDS or r.state != "running":
                continue
            alive.add(r.id)
            self.first.setdefault(r.id, now)
            done = r.progress.bytes_done if r.progress is not None else 0
            prev = self.seen.get(r.id)
            if prev is None or prev[0] != done:
                # A job seen for the first time counts from when it started (or now).
                since = now if prev is not None else min(now, r.started or now)
                if r.progress is not None and prev is None:
                    since = min(now, max(since, r.progress.t))
                self.seen[r.id] = (done, since)
            out[r.id] = now - self.seen[r.id][1]
        for gone in set(self.seen) - alive:
            del self.seen[gone]
            self.first.pop(gone, None)
        return out


def store_of(params: Mapping[str, Any]) -> str:
    for key in ("store", "src", "dest", "run", "url"):
        v = params.get(key)
        if isinstance(v, str) and v:
            m = re.match(r"^([a-z0-9]+://[^/]+)", v)
            if m:
                return m.group(1)
    return ""


def evaluate(
    settings: AlertSettings,
    *,
    fleet: Any | None,
    records: Sequence[Any],
    stalled: Mapping[str, float],
    egress: Any | None,
    warn_at: float,
    interrupted: Sequence[Interrupted] = (),
    now: float | None = None,
) -> list[Condition]:
    """Every condition that holds now, for the conditions ``settings`` turns on."""
    now = time.time() if now is None else now
    on = set(settings.conditions)
    out: list[Condition] = []
    if fleet is not None:
        for n in fleet.nodes:
            if "NodeUnreachable" in on and n.state == "unreachable":
                out.append(
                    Condition(
                        "NodeUnreachable",
                        {"node": n.name},
                        f"{n.name} is unreachable",
                        n.error or "",
                        "critical",
                        f"node:{n.name}",
                    )
                )
            if "GPUStarved" in on:
                for a in n.alerts:
                    if a.active and a.kind == "gpu-starved":
                        out.append(
                            Condition(
                                "GPUStarved",
                                {"node": n.name},
                                f"{n.name}: GPU starved ({a.hint})",
                                a.message,
                                "warning",
                                f"node:{n.name}",
                                a.started_wall,
                            )
                        )
                        break
            if "GPUXid" in on:
                for x in n.xids:
                    if now - x.seen <= settings.held_for:
                        out.append(
                            Condition(
                                "GPUXid",
                                {"node": n.name, "gpu": str(x.gpu), "xid": str(x.code)},
                                f"{n.name}: GPU {x.gpu} Xid {x.code} ({x.mnemonic})",
                                x.message,
                                "critical" if x.drain else "warning",
                                f"node:{n.name}",
                                x.seen,
                            )
                        )
    if "UploadBacklog" in on:
        for b in upload_backlog(records, now=now):
            params: Mapping[str, Any] = next((r.params for r in records if r.id == b.job_id), {})
            out.append(
                Condition(
                    "UploadBacklog",
                    {"node": b.node, "job_id": b.job_id, "store": store_of(params)},
                    f"{b.run}: checkpoint uploads are falling behind",
                    b.message,
                    "warning",
                    f"job:{b.job_id}",
                    now - b.running_s,
                )
            )
    by_id = {r.id: r for r in records}
    if "TransferStalled" in on:
        for job_id, still in sorted(stalled.items()):
            r = by_id.get(job_id)
            if r is None or still < settings.stall_after:
                continue
            done = r.progress.bytes_done if r.progress is not None else 0
            out.append(
                Condition(
                    "TransferStalled",
                    {"node": r.node, "job_id": r.id, "store": store_of(r.params)},
                    f"{r.kind} {r.id} on {r.node}: no bytes for {duration_text(still)}",
                    f"{r.source} -> {r.destination}: stuck at {bytes_text(done)}",
                    "warning",
                    f"job:{r.id}",
                    now - still,
                )
            )
    for r in records:
        if r.finished is None or now - r.finished > settings.held_for:
            continue
        if "JobLost" in on and r.state == "lost":
            out.append(
                Condition(
                    "JobLost",
                    {"node": r.node, "job_id": r.id},
                    f"{r.kind} {r.id} on {r.node} was lost",
                    r.error or "its runner died without a result",
                    "warning",
                    f"job:{r.id}",
                    r.finished,
                )
            )
        if "VerificationFailed" in on and r.state == "failed" and r.error and _VERIFY.search(r.error):
            out.append(
                Condition(
                    "VerificationFailed",
                    {"node": r.node, "job_id": r.id, "store": store_of(r.params)},
                    f"{r.kind} {r.id} on {r.node} failed verification",
                    r.error,
                    "critical",
                    f"job:{r.id}",
                    r.finished,
                )
            )
    if egress is not None:
        for b in egress.budgets:
            spent = b.spent_usd
            frac = spent / b.budget_usd if b.budget_usd else (1.0 if spent else 0.0)
            name = None
            if frac > 1.0 and "EgressBudgetExceeded" in on:
                name, sev = "EgressBudgetExceeded", "critical"
            elif frac >= warn_at and "EgressBudgetWarning" in on:
                name, sev = "EgressBudgetWarning", "warning"
            if name:
                out.append(
                    Condition(
                        name,
                        {"account": b.key, "scope": b.scope},
                        f"egress {b.scope} {b.key}: {usd_text(spent)} of {usd_text(b.budget_usd)} "
                        f"({frac:.0%}) in {egress.month}",
                        f"projected {usd_text(b.projected_usd)} by month end",
                        sev,
                        f"egress:{egress.month}",
                    )
                )
    if "RetentionApplyInterrupted" in on:
        for i in interrupted:
            if now - i.last_ts < settings.stall_after:
                continue  # an apply working on a long action journals nothing for a while
            out.append(
                Condition(
                    "RetentionApplyInterrupted",
                    {"store": i.store, "plan": i.plan_hash[:12]},
                    f"a retention apply was interrupted with {i.paths} action(s) unfinished",
                    "re-run the same plan (loadmaster retention apply) to finish it; nothing is redone",
                    "warning",
                    f"plan:{i.plan_hash}",
                    i.last_ts,
                )
            )
    return out
