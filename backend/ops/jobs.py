"""Job actions: cancel a running job (its process group proven first; audited ``job.cancel``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from backend.errors import JobError
from backend.ops.base import Operation

if TYPE_CHECKING:
    from backend.jobs.records import JobRecord


class Jobs(Operation):
    """``job cancel`` and the Transfers/Shards screens' cancel keys."""

    async def cancellable(self, job_id: str) -> JobRecord:
        """The job's fresh record, or a JobError saying why it cannot be cancelled."""
        rec = await self.services.jobs.refresh_job(job_id)
        if rec.terminal:
            raise JobError(f"job {rec.id} already ended ({rec.state}); nothing to cancel")
        return rec

    async def cancel(self, job_id: str, *, reason: str | None = None) -> JobRecord:
        """SIGTERM the job's process group, SIGKILL after the grace period, clean up; its final record."""
        self.refuse_if_readonly("cancel a job")
        rec = await self.cancellable(job_id)
        return await self.services.jobs.cancel(rec.id, reason=reason)
