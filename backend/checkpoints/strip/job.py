"""The "strip" node job: a BF16 strip run by the durable job runner on a GPU node, and its launch.

:func:`strip_params` is what the console sends; :func:`run_strip_job` runs :func:`strip_step` on
the node; :func:`cleanup` removes the partial shards a cancelled strip left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.agent.kinds import FunctionKind
from backend.checkpoints.strip import DEFAULT_MAX_SHARD_BYTES, strip_step
from backend.storage import ObjectStore

if TYPE_CHECKING:
    from backend.agent.context import JobContext
    from backend.config import Config
    from backend.jobs.manager import JobManager
    from backend.jobs.records import JobRecord
    from backend.state import StateDB


def strip_params(
    store: ObjectStore,
    step_path: str,
    *,
    out_store: ObjectStore | None = None,
    out_prefix: str | None = None,
    model_prefix: str = "auto",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> dict[str, Any]:
    """The params of a "strip" job (what ``services.jobs.launch`` sends to the node)."""
    from backend.checkpoints.upload import store_params, url_join

    dest = out_store or store
    return {
        "src": url_join(store.url, step_path),
        "dest": url_join(dest.url, out_prefix or step_path),
        "src_store": store_params(store),
        "out_store": store_params(out_store) if out_store else None,
        "step_path": step_path,
        "out_prefix": out_prefix,
        "model_prefix": model_prefix,
        "max_shard_bytes": max_shard_bytes,
    }


async def launch_strip(
    jobs: JobManager,
    node: str,
    store: ObjectStore,
    step_path: str,
    *,
    out_store: ObjectStore | None = None,
    out_prefix: str | None = None,
    model_prefix: str = "auto",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    job_id: str | None = None,
) -> JobRecord:
    """Launch a "strip" job of ``step_path`` in ``store`` on ``node``; returns its job record.
    ``job_id``: the id its egress reservation was made under (``ops.checkpoints.strip``)."""
    from backend.checkpoints.upload import store_secrets

    params = strip_params(
        store,
        step_path,
        out_store=out_store,
        out_prefix=out_prefix,
        model_prefix=model_prefix,
        max_shard_bytes=max_shard_bytes,
    )
    secrets = await store_secrets(store)
    if out_store is not None:
        secrets.update(await store_secrets(out_store))
    return await jobs.launch(node, "strip", params, secrets=secrets, label=f"strip {step_path}", job_id=job_id)


def cleanup(ctx: JobContext) -> None:
    """Remove partial shards a cancelled strip left in a local output directory."""
    p = ctx.params
    target = p.get("out_store") or p.get("src_store") or {}
    url = target.get("url", "")
    if url and not url.startswith("s3://"):
        from backend.errors import StoreError
        from backend.storage import localfs

        # by the folders the walk holds: a link on the way is never followed, a shard is never touched
        with contextlib.suppress(OSError, StoreError):
            localfs.remove_parts(Path(os.path.expanduser(url)), p.get("out_prefix") or p.get("step_path") or "")


def run_strip_job(ctx: JobContext) -> dict[str, Any]:
    """Durable-job runner for kind "strip" (params from :func:`strip_params`)."""
    from backend.checkpoints.upload import open_store_params

    p = ctx.params
    env = ctx.secret_env()

    async def main() -> dict[str, Any]:
        src = open_store_params(p["src_store"], env)
        out = open_store_params(p["out_store"], env) if p.get("out_store") else None
        try:
            res = await strip_step(
                src,
                p["step_path"],
                out_store=out,
                out_prefix=p.get("out_prefix"),
                model_prefix=p.get("model_prefix", "auto"),
                max_shard_bytes=int(p.get("max_shard_bytes", DEFAULT_MAX_SHARD_BYTES)),
                progress=lambda **kw: ctx.progress(**kw),
                cancelled=lambda: ctx.cancelled,
                overwrite=bool(p.get("overwrite", False)),
            )
        finally:
            await src.close()
            if out is not None:
                await out.close()
        ctx.log(
            f"stripped {res.source}: {res.tensor_count} tensors, {res.weight_bytes} bytes in "
            f"{len(res.shards)} shards, verified"
        )
        return res.as_dict()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return asyncio.run(main())


class StripKind(FunctionKind):
    """Kind "strip"; on the console, an ended strip settles its egress reservation to the source
    bytes it read (a step in a store is read from the node like a pull, see ``backend.ops.reserved``)."""

    def on_ended(self, config: Config, db: StateDB, record: JobRecord) -> None:
        # Console side only: the runner never imports the ledger.
        from backend.ledger import reported_bytes, settle_job

        settle_job(config, db, record, reported_bytes(record, "source_bytes_read"))


#: Kind "strip" in the job registry (backend.agent.kinds).
JOB_KIND = StripKind("strip", run_strip_job, cleanup)
