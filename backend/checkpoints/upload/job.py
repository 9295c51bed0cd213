"""The "upload" node job: a checkpoint step directory uploaded by the durable job runner on a node
(:func:`run_upload_job`, with :func:`backend.checkpoints.upload.upload_dir`), and its launch.

:func:`upload_params` is what the console sends; :func:`cleanup` aborts the multipart uploads a
cancelled or lost job started (its journal's ids only), with the credentials
:func:`cleanup_secrets` resolves again on the console.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from backend.agent.kinds import FunctionKind
from backend.checkpoints.upload import (
    JOURNAL_FILE,
    check_destination,
    open_store_params,
    store_params,
    store_secrets,
    upload_dir,
    url_join,
)
from backend.storage import ObjectStore, S3Store
from backend.storage.multipart import (
    DEFAULT_CONCURRENCY,
    DEFAULT_PART_SIZE,
    DEFAULT_RETRIES,
    MultipartJournal,
    UploadSettings,
    abort_recorded,
)
from backend.units import gbps_text

if TYPE_CHECKING:
    from backend.agent.context import JobContext
    from backend.config import Config
    from backend.jobs.manager import JobManager


def upload_params(
    local_dir: str,
    store: ObjectStore,
    prefix: str,
    *,
    settings: UploadSettings | None = None,
    step: int | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """The params of an "upload" job (what ``services.jobs.launch`` sends to the node)."""
    s = settings or UploadSettings()
    return {
        "src": local_dir,
        "dest": url_join(store.url, prefix),
        "store": store_params(store),
        "prefix": prefix,
        "part_size": s.part_size,
        "concurrency": s.concurrency,
        "retries": s.retries,
        "step": step,
        "overwrite": bool(overwrite),
    }


async def launch_upload(
    jobs: JobManager,
    node: str,
    store: ObjectStore,
    local_dir: str,
    prefix: str,
    *,
    settings: UploadSettings | None = None,
    step: int | None = None,
    overwrite: bool = False,
) -> Any:
    """Launch an "upload" job of ``local_dir`` (on ``node``) to ``prefix`` of ``store``; returns its job record.

    A destination that already holds objects is refused here, before launch, unless
    ``overwrite=True`` (and again by the job on the node, right before it uploads).
    """
    await check_destination(store, prefix, overwrite=overwrite)
    params = upload_params(local_dir, store, prefix, settings=settings, step=step, overwrite=overwrite)
    return await jobs.launch(
        node,
        "upload",
        params,
        secrets=await store_secrets(store),
        label=f"upload {os.path.basename(local_dir.rstrip('/'))}",
    )


def _journal(ctx: JobContext) -> MultipartJournal | None:
    """The job directory's journal; None (this machine's journal for the destination) in-process."""
    return MultipartJournal(ctx.job_dir / JOURNAL_FILE) if ctx.job_dir is not None else None


def run_upload_job(ctx: JobContext) -> dict[str, Any]:
    """Durable-job runner for kind "upload": a step directory to a store, verified, markers last."""
    p = ctx.params
    env = ctx.secret_env()
    settings = UploadSettings(
        part_size=int(p.get("part_size", DEFAULT_PART_SIZE)),
        concurrency=int(p.get("concurrency", DEFAULT_CONCURRENCY)),
        retries=int(p.get("retries", DEFAULT_RETRIES)),
    )
    extra = {"step": p["step"]} if p.get("step") is not None else {}

    async def main() -> dict[str, Any]:
        store = open_store_params(p["store"], env)
        try:
            ctx.log(f"uploading {p['src']} to {p['dest']}")
            res = await upload_dir(
                store,
                p["src"],
                p.get("prefix", ""),
                settings=settings,
                progress=lambda done, total, files, nfiles: ctx.progress(
                    bytes_done=done, bytes_total=total, items_done=files, items_total=nfiles, **extra
                ),
                cancelled=lambda: ctx.cancelled,
                overwrite=bool(p.get("overwrite")),
                journal=_journal(ctx),
            )
        finally:
            await store.close()
        for note in res.notes():
            ctx.log(note)
        ctx.log(f"uploaded {len(res.objects)} objects, {res.bytes} bytes, {gbps_text(res.gbps)}, verified")
        return res.as_dict()

    return asyncio.run(main())


async def cleanup_secrets(config: Config, params: dict[str, Any]) -> dict[str, str]:
    """The credentials a lost or killed upload job's cleanup needs, resolved on the console as at launch."""
    sp = params.get("store") or {}
    url = str(sp.get("url") or "")
    if not url.startswith("s3://"):
        return {}
    profile = config.stores.get(sp.get("name") or "") or config.store_for_url(url)
    store = S3Store(url, profile)
    try:
        return await store_secrets(store)
    finally:
        await store.close()


def cleanup(ctx: JobContext) -> None:
    """Abort the multipart uploads this upload job started and never finished (its journal's ids
    only: anyone else's uploads under the destination are left alone)."""
    p = ctx.params
    if "store" not in p or ctx.job_dir is None:
        return
    journal = MultipartJournal(ctx.job_dir / JOURNAL_FILE)
    env = ctx.secret_env()
    with journal.locked(str(p.get("dest", ""))):  # refused while the job's own upload still runs
        pending = journal.open_uploads()
        if not pending:
            ctx.log("no multipart upload of this job is left open")
            return
        if not env and str(p["store"].get("url", "")).startswith("s3://"):
            ctx.log(
                f"cannot abort {len(pending)} multipart upload(s) of this job: no credentials reached the "
                f"cleanup; ids: {', '.join(uid for _b, _k, uid in pending)}"
            )
            return

        async def main() -> list[tuple[str, str]]:
            store = open_store_params(p["store"], env)
            try:
                return await abort_recorded(store, journal)
            finally:
                await store.close()

        aborted = asyncio.run(main())
    ctx.log(
        f"aborted {len(aborted)} multipart upload(s) this job had started"
        + (f": {', '.join(uid for _k, uid in aborted)}" if aborted else "")
    )
    left = journal.open_uploads()
    if left:
        ctx.log(f"could not abort {len(left)}: {', '.join(uid for _b, _k, uid in left)}")


#: Kind "upload" in the job registry (backend.agent.kinds): the runner, its cleanup, and the
#: console-side secrets that cleanup needs again.
JOB_KIND = FunctionKind("upload", run_upload_job, cleanup, cleanup_secrets=cleanup_secrets)
