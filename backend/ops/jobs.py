"""Job actions: cancel a running job, or every job of one launch (a pull to N nodes), its process
groups proven first; audited ``job.cancel`` once per cancel (a launch's is one record)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backend.errors import JobError
from backend.ops.base import Operation

if TYPE_CHECKING:
    from backend.jobs.records import JobRecord, LaunchCancel


@dataclass(frozen=True)
class CancelTarget:
    """What ``job cancel ID`` would stop: one job, or the running jobs of a launch."""

    #: The launch id when ID named a launch; None for one job.
    launch: str | None
    #: The jobs it stops (fresh records, none ended).
    active: tuple[JobRecord, ...]
    #: A launch's jobs that already ended (left alone).
    ended: tuple[JobRecord, ...] = ()

    @property
    def what(self) -> str:
        """``launch 1202-0354-c3d4 (3 running jobs on node-01, node-02, node-03)`` or ``job X on N``."""
        if self.launch is None:
            r = self.active[0]
            return f"{r.kind} job {r.id} on {r.node}"
        from backend.jobs.fmt import nodes_text

        nodes = nodes_text(r.node for r in self.active)
        left = f"; {len(self.ended)} already ended, left alone" if self.ended else ""
        return f"launch {self.launch} ({len(self.active)} running job(s) on {nodes}{left})"


@dataclass(frozen=True)
class JobListing:
    """Every node's job directories read afresh and merged with the local records: what
    ``loadmaster jobs`` and the Transfers screen show."""

    records: tuple[JobRecord, ...]
    #: Nodes whose job directories could not be read just now, with why: their jobs may be missing
    #: or out of date.
    unread: dict[str, str] = field(default_factory=dict)
    #: Records a node wrote that could not be read (skipped), one line each.
    problems: tuple[str, ...] = ()
    #: Why the state database could not be written, when it could not: the records are then as
    #: their nodes report them, not recorded. None when it was.
    state_down: str | None = None


class Jobs(Operation):
    """``jobs`` and ``job cancel``; the Transfers screen's table and the Transfers/Shards screens'
    cancel keys."""

    async def listing(self, nodes: Iterable[str] | None = None) -> JobListing:
        """Read every node's jobs afresh (``nodes``: whose unread state to report, default all)."""
        jobs = self.services.jobs
        records = await jobs.refresh()
        return JobListing(tuple(records), self.services.pool.unread(nodes), tuple(jobs.problems), jobs.state_down)

    def recorded(self, *, limit: int = 500) -> list[JobRecord]:
        """The local records only, newest first (``jobs --local``: no node is read)."""
        return self.services.jobs.records(limit=limit)

    async def cancellable(self, job_id: str) -> JobRecord:
        """The job's fresh record, or a JobError saying why it cannot be cancelled."""
        rec = await self.services.jobs.refresh_job(job_id)
        if rec.terminal:
            raise JobError(f"job {rec.id} already ended ({rec.state}); nothing to cancel")
        return rec

    async def target(self, ident: str) -> CancelTarget:
        """What cancelling ``ident`` stops: the launch of that id (every job still running), else
        the job of that id (or unique prefix); a JobError when nothing of it runs."""
        jobs = self.services.jobs
        if jobs.launch_ids(ident):
            if jobs.store.state_of(ident) is not None:  # never guess which of the two is meant
                raise JobError(f"{ident!r} is both a job and a launch: cancel the launch's jobs by their ids")
            recs = await jobs.launch_records(ident)
            active = tuple(r for r in recs if not r.terminal)
            if not active:
                from backend.jobs.records import states_text

                raise JobError(f"launch {ident} already ended ({states_text(recs)}); nothing to cancel")
            return CancelTarget(ident, active, tuple(r for r in recs if r.terminal))
        return CancelTarget(None, (await self.cancellable(ident),))

    async def cancel(self, job_id: str, *, reason: str | None = None) -> JobRecord:
        """SIGTERM the job's process group, SIGKILL after the grace period, clean up; its final record."""
        self.refuse_if_readonly("cancel a job")
        rec = await self.cancellable(job_id)
        final, detail = await self.services.jobs.cancel(rec.id)
        self.audit("job.cancel", f"{final.node}:{final.id}", final.state, detail=detail, reason=reason)
        return final

    async def cancel_launch(self, launch_id: str, *, reason: str | None = None) -> LaunchCancel:
        """Cancel every running job of the launch at once (one audit record); what became of each."""
        self.refuse_if_readonly("cancel a launch")
        done, detail = await self.services.jobs.cancel_launch(launch_id)
        outcome = "cancelled" if done.ok else "partly cancelled"
        self.audit("job.cancel", f"launch:{launch_id}", outcome, detail=detail, reason=reason)
        return done
