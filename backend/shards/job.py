"""A shard conversion as a durable ``shard`` job: started from the console or CLI, run on a node.

:func:`launch_on_node` (console side) starts the job with the store settings as params and the
credentials as job secrets (the operation, ``Shards.start_on_node``, audits it). On the node the agent
runs :func:`run_shard_job` (``backend.agent.kinds``) and, after a cancel or a lost run,
:func:`cleanup`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from backend.agent.kinds import FunctionKind
from backend.config import StoreProfile
from backend.shards.convert import convert_sync
from backend.shards.model import ShardProgress, ShardRequest
from backend.storage import Credentials, S3Store

if TYPE_CHECKING:
    from backend.agent.context import JobContext
    from backend.config import Config
    from backend.jobs.manager import JobManager
    from backend.jobs.records import JobRecord
    from backend.state import StateDB


async def job_secrets(*locations: tuple[str, StoreProfile | None]) -> dict[str, str]:
    """Credentials a node needs for the first ``s3://`` location, as env vars for the job's 0600 file."""
    for url, prof in locations:
        if url.startswith("s3://"):
            return (await S3Store(url, prof).credentials()).as_env()
    return {}


async def launch_on_node(
    jobs: JobManager,
    node: str,
    req: ShardRequest,
    src_profile: StoreProfile | None,
    dest_profile: StoreProfile | None,
    *,
    job_id: str | None = None,
) -> JobRecord:
    """Start the conversion as a durable ``shard`` job on ``node``; returns its JobRecord (the
    operation, ``Shards.start_on_node``, audits it).
    ``job_id``: the id its egress reservation was made under (``Shards.start_on_node``)."""
    node_cfg = jobs.config.node(node)
    req.validate()
    if req.spool_dir is None and req.dest.startswith("s3://"):
        # Spool shards awaiting upload on the node's scratch disk, not its (often small) /tmp.
        req = dataclasses.replace(req, spool_dir=f"{node_cfg.scratch.rstrip('/')}/.loadmaster-shard-spool")
    # The destination's credentials first: it is the side written.
    secrets = await job_secrets((req.dest, dest_profile), (req.src, src_profile))
    rec = await jobs.launch(
        node,
        "shard",
        job_params(req, src_profile, dest_profile),
        secrets=secrets,
        label=f"shard {req.src} -> {req.dest}",
        job_id=job_id,
    )
    return rec


def job_params(
    req: ShardRequest, src_profile: StoreProfile | None, dest_profile: StoreProfile | None
) -> dict[str, Any]:
    """Params of a ``shard`` job: the request plus the store settings (never credentials)."""
    params = req.as_params()
    params["src_profile"] = dataclasses.asdict(src_profile) if src_profile else None
    params["dest_profile"] = dataclasses.asdict(dest_profile) if dest_profile else None
    return params


def _profile(d: dict[str, Any] | None, has_env_creds: bool) -> StoreProfile | None:
    if not d:
        return None
    p = StoreProfile(**d)
    # Credentials delivered as job secrets (env) must win over a profile the node may not have.
    return dataclasses.replace(p, profile=None) if has_env_creds else p


def run_shard_job(ctx: JobContext) -> dict[str, Any]:
    """Job runner for kind ``shard``: convert, verify every shard landed, return the totals."""
    # The job's secrets go to the stores directly: never into os.environ (children would inherit them).
    creds = Credentials.from_env(ctx.secret_env())
    has_creds = creds is not None
    req = ShardRequest.from_params(ctx.params)

    read = [0]

    def report(p: ShardProgress) -> None:
        read[0] = p.source_bytes_read
        ctx.progress(
            bytes_done=p.bytes_done,
            bytes_total=p.bytes_total,
            items_done=p.samples_done,
            items_total=p.samples_total,
            shards_done=p.shards_done,
            shards_total=p.shards_total,
            samples_per_s=round(p.samples_per_s, 1),
            mb_per_s=round(p.mb_per_s, 2),
            phase=p.phase,
            final=p.final,
            source_bytes_read=p.source_bytes_read,
        )

    result = convert_sync(
        req,
        src_profile=_profile(ctx.params.get("src_profile"), has_creds),
        dest_profile=_profile(ctx.params.get("dest_profile"), has_creds),
        on_progress=report,
        on_log=ctx.log,
        cancelled=lambda: bool(ctx.cancelled),
        credentials=creds,
    )
    ctx.log(result.manifest.summary())
    # What this run read from the source (resumed shards were not read again): the bytes its
    # egress reservation settles to.
    return {**result.as_dict(), "source_bytes_read": read[0]}


def cleanup(ctx: JobContext) -> None:
    """After a cancel or a lost run: remove half-written local shards (completed ones stay)."""
    dest = str(ctx.params.get("dest", ""))
    ctx.log("completed shards are kept: continue with 'loadmaster shard SRC DEST --resume'")
    if not dest or dest.startswith("s3://") or not os.path.isdir(dest):
        return
    for name in os.listdir(dest):
        if name.startswith(".") and name.endswith(".partial"):
            try:
                os.unlink(os.path.join(dest, name))
            except OSError:
                pass


class ShardKind(FunctionKind):
    """Kind "shard"; on the console, an ended conversion settles its egress reservation (a
    source in a store is read from the node like a pull, see ``backend.ops.reserved``)."""

    def on_ended(self, config: Config, db: StateDB, record: JobRecord) -> None:
        # Console side only: the runner never imports the ledger.
        from backend.ledger import reported_bytes, settle_job

        settle_job(config, db, record, reported_bytes(record, "source_bytes_read"))


JOB_KIND = ShardKind("shard", run_shard_job, cleanup)
