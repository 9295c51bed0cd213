"""Checkpoint actions: strip a step to BF16 weights and upload a step folder, here or as a node job.

A reference names a store location: ``s3://bucket/run/step-N``, a local path, or
``STORE/sub/path`` for a configured store. Both front ends pass the step's full reference, so
the audit record names the same target whichever one acted.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict, Unpack

from backend.errors import ConfigError, LoadmasterError
from backend.ops.base import Operation
from backend.ops.exports import lazy_exports

if TYPE_CHECKING:
    from backend.checkpoints.dcp import CheckpointError
    from backend.checkpoints.footprint import BacklogAlert, footprint, footprint_table
    from backend.checkpoints.inspection import StepInspection
    from backend.checkpoints.steps import Catalog, CheckpointStep
    from backend.checkpoints.strip import DEFAULT_MAX_SHARD_BYTES, Progress, StripResult
    from backend.checkpoints.upload import DEFAULT_CONCURRENCY, DEFAULT_PART_SIZE, UploadResult, UploadSettings
    from backend.jobs.records import JobRecord
    from backend.services import Services
    from backend.storage import ObjectStore


#: What the front ends import from here: the operation, its requests and results, and the
#: checkpoint types and footprint arithmetic they render (``ckpt size`` and the screen's panel).
__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_MAX_SHARD_BYTES",
    "DEFAULT_PART_SIZE",
    "BacklogAlert",
    "Catalog",
    "CheckpointError",
    "CheckpointStep",
    "Checkpoints",
    "Done",
    "StepInspection",
    "StripRequest",
    "StripResult",
    "UploadRequest",
    "UploadResult",
    "UploadSettings",
    "footprint",
    "footprint_table",
    "open_step",
    "url_join",
]
if not TYPE_CHECKING:  # mypy reads the imports above; at run time each name loads on first use
    __getattr__ = lazy_exports(
        __name__,
        {
            "CheckpointError": "backend.checkpoints.dcp",
            **dict.fromkeys(("BacklogAlert", "footprint", "footprint_table"), "backend.checkpoints.footprint"),
            "StepInspection": "backend.checkpoints.inspection",
            **dict.fromkeys(("Catalog", "CheckpointStep"), "backend.checkpoints.steps"),
            **dict.fromkeys(("DEFAULT_MAX_SHARD_BYTES", "StripResult"), "backend.checkpoints.strip"),
            **dict.fromkeys(
                ("DEFAULT_CONCURRENCY", "DEFAULT_PART_SIZE", "UploadResult", "UploadSettings"),
                "backend.checkpoints.upload",
            ),
        },
    )


def url_join(url: str, sub: str) -> str:
    """``url`` + ``/sub`` (either may be empty)."""
    from backend.checkpoints.upload import url_join

    return url_join(url, sub)


def resolve_url(services: Services, ref: str) -> str:
    """Expand ``storename/sub/path`` to the store's URL + path; absolutise local paths."""
    if "://" not in ref:
        name, _, rest = ref.partition("/")
        if name in services.config.stores:
            return url_join(services.config.stores[name].url, rest)
        return os.path.abspath(os.path.expanduser(ref))
    return ref.rstrip("/")


def open_prefix(services: Services, ref: str) -> ObjectStore:
    """The store rooted at ``ref`` (store settings come from the longest configured match)."""
    return services.stores.open(resolve_url(services, ref))


def open_step(services: Services, ref: str) -> tuple[ObjectStore, str]:
    """The store holding a step folder (rooted at its parent) and the folder's name."""
    url = resolve_url(services, ref)
    parent, _, leaf = url.rstrip("/").rpartition("/")
    if not leaf or parent in ("s3:/", "s3:"):
        from backend.checkpoints.dcp import CheckpointError

        raise CheckpointError(f"{ref!r} does not name a step folder (expected .../run/step-N)")
    return services.stores.open(parent or "/"), leaf


@dataclass(frozen=True)
class StripRequest:
    """Strip the step at ``src`` (export beside it, or under ``out``), here or on ``node``."""

    src: str
    node: str | None = None
    out: str | None = None
    model_prefix: str = "auto"
    max_shard_bytes: int | None = None
    #: From a store (on a node, or here at [egress] console_site): go over the egress budget under
    #: ``action = "confirm"`` (audited).
    reason: str | None = None


@dataclass(frozen=True)
class UploadRequest:
    """Upload the local folder ``local_dir`` to the step location ``dest``, here or on ``node``."""

    local_dir: str
    dest: str
    node: str | None = None
    step: int | None = None
    overwrite: bool = False
    settings: UploadSettings | None = None


@dataclass(frozen=True)
class Done:
    """A checkpoint action's outcome: run here (``result``) or launched as a node job (``job``)."""

    target: str
    audit_id: int
    result: StripResult | UploadResult | None = None
    job: JobRecord | None = None


class _StripOptions(TypedDict, total=False):
    """What a node's strip job is told besides its step (``launch_strip``'s keywords)."""

    out_store: ObjectStore | None
    out_prefix: str | None
    model_prefix: str
    max_shard_bytes: int


class Checkpoints(Operation):
    """``ckpt strip|upload`` and the Checkpoints screen's strip and upload keys."""

    async def listing(self, ref: str) -> Catalog:
        """A fresh listing of the run ``ref``: its steps with kind, layout, size and age (read
        without torch: listing a run must not pay its import). ``ckpt list`` and the
        Checkpoints screen both show this."""
        from backend.checkpoints.catalog import list_checkpoints

        async with open_prefix(self.services, ref) as store:
            return await list_checkpoints(store, "")

    def backlog(self, *, interval_s: float | None = None) -> list[BacklogAlert]:
        """Runs whose upload is still running when their next checkpoint is due (from the job
        records; ``interval_s``: the checkpoint interval, else each run's own). ``ckpt backlog``
        and the Checkpoints screen both show these."""
        from backend.checkpoints.footprint import upload_backlog

        return upload_backlog(self.services.jobs.records(), interval_s=interval_s)

    async def inspect(self, ref: str, step: str | None = None) -> StepInspection:
        """A step's tensors: ``ref`` names the step folder (``.../run/step-N``, ``ckpt inspect``),
        or with ``step`` the run's URL and the step's path in it (the Checkpoints screen)."""
        from backend.checkpoints.inspection import inspect_step

        if step is None:
            store, step = open_step(self.services, ref)
        else:
            store = self.services.stores.open(ref)
        async with store:
            return await inspect_step(store, step)

    async def strip(self, req: StripRequest, *, progress: Progress | None = None) -> Done:
        """Strip one step; a failure here is audited too, then raised."""
        from backend.checkpoints.strip import DEFAULT_MAX_SHARD_BYTES, strip_step

        self.refuse_if_readonly("strip a checkpoint")
        if req.node:
            self.services.config.node(req.node)
        store, step = open_step(self.services, req.src)
        out_store = open_prefix(self.services, req.out) if req.out else None
        target = url_join(store.url, step)
        shard = req.max_shard_bytes or DEFAULT_MAX_SHARD_BYTES
        try:
            if req.node:
                rec = await self._launch_strip_reserved(
                    req.node,
                    store,
                    step,
                    reason=req.reason,
                    out_store=out_store,
                    out_prefix="" if out_store else None,
                    model_prefix=req.model_prefix,
                    max_shard_bytes=shard,
                )
                return Done(target, self._launched("ckpt.strip", target, rec, overwrite=False), job=rec)

            async def here() -> StripResult:
                return await strip_step(
                    store,
                    step,
                    out_store=out_store,
                    out_prefix="" if out_store else None,
                    model_prefix=req.model_prefix,
                    max_shard_bytes=shard,
                    progress=progress,
                )

            try:
                res = await self._read_here(store, step, here, reason=req.reason)
            except LoadmasterError as exc:
                self.audit("ckpt.strip", target, "failed", detail={"error": str(exc)})
                raise
            return Done(target, self.audit("ckpt.strip", target, "ok", detail=res.as_dict()), result=res)
        finally:
            await store.close()
            if out_store is not None:
                await out_store.close()

    async def _read_here(
        self, store: ObjectStore, step: str, work: Callable[[], Awaitable[StripResult]], *, reason: str | None
    ) -> StripResult:
        """Run ``work`` (a strip in this process) with the egress its read of a step in an s3://
        store costs: the step's listed bytes quoted at [egress] console_site and reserved first
        (a block budget refuses before a byte is read), then settled to the bytes the strip read;
        a strip that fails counts at its reservation (what it read is not known)."""
        from backend.jobs.records import new_job_id
        from backend.ledger import Reservation
        from backend.ops.reserved import read_here_reserved
        from backend.policy.egress import EgressSettings
        from backend.storage import egress_profile

        if not store.url.startswith("s3://"):
            return await work()
        listed = await store.list(step)
        site = self.services.config.section(EgressSettings).console_site
        profile = getattr(store, "profile", None) or egress_profile(self.services.config, None, store.url)
        item = Reservation(f"strip-{new_job_id()}", site, sum(o.size for o in listed), len(listed))
        return await read_here_reserved(
            self.services, profile, item, work, lambda res: int(res.source_bytes_read), reason=reason, what="strip"
        )

    async def upload(
        self, req: UploadRequest, *, progress: Callable[[int, int, int, int], object] | None = None
    ) -> Done:
        """Upload one step folder; a destination holding objects is refused unless ``overwrite``."""
        from backend.checkpoints.steps import step_number
        from backend.checkpoints.upload import check_destination, upload_dir
        from backend.checkpoints.upload.job import launch_upload

        self.refuse_if_readonly("upload a checkpoint")
        if not req.local_dir.strip():
            raise ConfigError("choose the local step folder to upload")
        if req.node:
            self.services.config.node(req.node)
        settings = req.settings.check() if req.settings is not None else None
        store = open_prefix(self.services, req.dest)
        target = store.url
        async with store:
            if req.node:
                rec = await launch_upload(
                    self.services.jobs,
                    req.node,
                    store,
                    req.local_dir,
                    "",
                    settings=settings,
                    step=req.step if req.step is not None else step_number(target.rsplit("/", 1)[-1]),
                    overwrite=req.overwrite,
                )
                return Done(target, self._launched("ckpt.upload", target, rec, overwrite=req.overwrite), job=rec)
            await check_destination(store, "", overwrite=req.overwrite)
            try:
                res = await upload_dir(
                    store, req.local_dir, "", settings=settings, overwrite=req.overwrite, progress=progress
                )
            except LoadmasterError as exc:
                self.audit("ckpt.upload", target, "failed", detail={"error": str(exc), "overwrite": req.overwrite})
                raise
        audit_id = self.audit("ckpt.upload", target, "ok", detail={**res.as_dict(), "overwrite": req.overwrite})
        return Done(target, audit_id, result=res)

    async def present(self, dest: str) -> int:
        """How many objects the step location ``dest`` holds already (the console asks before overwriting)."""
        from backend.checkpoints.upload import check_destination

        async with open_prefix(self.services, dest) as store:
            return await check_destination(store, "", overwrite=True)

    async def _launch_strip_reserved(
        self,
        node: str,
        store: ObjectStore,
        step_path: str,
        *,
        reason: str | None = None,
        **options: Unpack[_StripOptions],
    ) -> JobRecord:
        """:func:`launch_strip` with the egress a node's read of a step in a store costs: the step
        folder's listed bytes (all a strip can read) quoted, checked against the budget and reserved
        before the job starts (``reason``: an over-budget override), released if it never starts,
        settled when it ends (``backend.ops.reserved``). A step on the node's own disk moves no egress."""
        from backend.checkpoints.strip.job import launch_strip
        from backend.jobs.records import new_job_id
        from backend.ledger import Reservation
        from backend.ops.reserved import launch_reserved
        from backend.storage import egress_profile

        jobs = self.services.jobs
        if not store.url.startswith("s3://"):
            return await launch_strip(jobs, node, store, step_path, **options)
        listed = await store.list(step_path)
        job_id = new_job_id()
        profile = getattr(store, "profile", None) or egress_profile(self.services.config, None, store.url)
        rec, _ = await launch_reserved(
            self.services,
            profile,
            [Reservation(job_id, self.services.config.node(node).site, sum(o.size for o in listed), len(listed))],
            lambda: launch_strip(jobs, node, store, step_path, job_id=job_id, **options),
            reason=reason,
            what="strip",
        )
        return rec

    def _launched(self, action: str, target: str, rec: JobRecord, *, overwrite: bool) -> int:
        return self.audit(action, target, "launched", detail={"job": rec.id, "node": rec.node, "overwrite": overwrite})
