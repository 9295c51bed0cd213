"""Shard conversions (WebDataset tars): preview, then convert here or start a node job."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from backend.errors import JobError, LoadmasterError
from backend.ops.base import Operation
from backend.ops.exports import lazy_exports

if TYPE_CHECKING:
    from backend.config import StoreProfile
    from backend.jobs.records import JobRecord
    from backend.shards.model import ConvertResult, ShardPreview, ShardProgress, ShardRequest
    from backend.shards.settings import ShardSettings
    from backend.shards.verify import VerifyReport

#: What the front ends import from here: the operation, its request, preview, progress and result.
__all__ = ["ConvertResult", "ShardPreview", "ShardProgress", "ShardRequest", "ShardSettings", "Shards"]
if not TYPE_CHECKING:  # mypy reads the imports above; at run time each name loads on first use
    __getattr__ = lazy_exports(
        __name__,
        {
            **dict.fromkeys(("ConvertResult", "ShardPreview", "ShardProgress", "ShardRequest"), "backend.shards.model"),
            "ShardSettings": "backend.shards.settings",
        },
    )


class Shards(Operation):
    """``shard SRC DEST`` and the Shards screen's form."""

    def location(self, text: str) -> tuple[str, StoreProfile | None]:
        """A source or destination as typed: its URL or directory, and its store's profile (a
        store's name stands for its URL). ``shard`` and the Shards form read locations here."""
        from backend.shards.locations import resolve_location

        return resolve_location(self.services.config, text)

    def _profiles(self, req: ShardRequest) -> tuple[StoreProfile | None, StoreProfile | None]:
        return self.location(req.src)[1], self.location(req.dest)[1]

    async def verify(self, dest: str, *, profile: StoreProfile | None = None) -> VerifyReport:
        """Read every shard at ``dest`` back: sizes, digests and sample counts (read-only)."""
        from backend.shards.verify import verify

        return await verify(dest, profile=profile)

    async def preview(self, req: ShardRequest) -> ShardPreview:
        """List the source and check the destination; nothing is written (read-only services may)."""
        from backend.shards.convert import preview

        sprof, dprof = self._profiles(req)
        return await preview(req, config=self.services.config, src_profile=sprof, dest_profile=dprof)

    async def convert_here(
        self,
        req: ShardRequest,
        *,
        shown: ShardPreview | None = None,
        on_progress: Callable[[ShardProgress], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> ConvertResult:
        """Convert in this process. ``shown`` is the preview the operator saw: what runs is exactly it."""
        from backend.shards.convert import convert

        self.refuse_if_readonly("start a conversion")
        req.validate()
        pv = shown if shown is not None and (shown.src, shown.dest) == (req.src, req.dest) else await self.preview(req)
        if not pv.ok:
            raise JobError(f"cannot shard {req.src}: " + "; ".join(pv.errors))
        sprof, dprof = self._profiles(req)
        detail: dict[str, object] = {"src": req.src, "overwrite": req.overwrite, "resume": req.resume}
        if req.overwrite:  # what the destination held is about to be replaced: on record first
            self.audit("shard.overwrite", req.dest, "started", detail=detail)
        try:
            result = await convert(
                req,
                config=self.services.config,
                src_profile=sprof,
                dest_profile=dprof,
                on_progress=on_progress,
                on_log=lambda _m: None,
                cancelled=cancelled,
                prepared=pv,
            )
        except LoadmasterError as exc:
            outcome = "cancelled" if cancelled is not None and cancelled() else "failed"
            self.audit("shard.convert", req.dest, outcome, detail={**detail, "error": str(exc)})
            raise
        self.audit("shard.convert", req.dest, "ok", detail={**detail, **result.as_dict()})
        return result

    async def start_on_node(self, node: str, req: ShardRequest, *, reason: str | None = None) -> JobRecord:
        """Start the conversion as a durable ``shard`` job on ``node`` (audited ``shard.launch``).

        A source in a store is read by the node like a pull: listed here, quoted, checked against
        the budget and reserved before the job starts (``reason``: an over-budget override), and
        settled when it ends (``backend.ops.reserved``); a source on the node's own disk is not.
        """
        from backend.jobs.records import new_job_id
        from backend.ledger import Reservation
        from backend.ops.reserved import launch_reserved
        from backend.shards.job import launch_on_node
        from backend.storage import bucket_profile

        self.refuse_if_readonly("start a conversion")
        node_cfg = self.services.config.node(node)
        req.validate()
        sprof, dprof = self._profiles(req)
        if not req.src.startswith("s3://"):
            return self._launched(node, req, await launch_on_node(self.services.jobs, node, req, sprof, dprof))
        pv = await self.preview(req)
        if not pv.ok:
            raise JobError(f"not started: cannot shard {req.src}: " + "; ".join(pv.errors))
        job_id = new_job_id()
        rec, _ = await launch_reserved(
            self.services,
            sprof or bucket_profile(req.src),
            [Reservation(job_id, node_cfg.site, pv.source_bytes, pv.files)],
            lambda: launch_on_node(self.services.jobs, node, req, sprof, dprof, job_id=job_id),
            reason=reason,
            what="shard conversion",
        )
        return self._launched(node, req, rec)

    def _launched(self, node: str, req: ShardRequest, rec: JobRecord) -> JobRecord:
        detail = {"src": req.src, "node": node, "job": rec.id, "overwrite": req.overwrite, "resume": req.resume}
        self.audit("shard.launch", req.dest, "started", detail=detail)
        return rec
