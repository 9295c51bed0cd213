"""The job kinds a node's agent can run: kind name -> ``"module:function"`` of its runner.

A runner is ``def run(ctx: JobContext) -> dict`` returning the result details after verifying its
output (raising = failed with the message). The module may define ``def cleanup(ctx) -> None`` to
remove partial output when the job is cancelled or found lost.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from backend.errors import JobError

KINDS: dict[str, str] = {
    "pull": "backend.jobs.pull_runner:run_pull_job",
    "upload": "backend.checkpoints.upload:run_upload_job",
    "strip": "backend.checkpoints.strip:run_strip_job",
    "shard": "backend.shards.job:run_shard_job",
}


def resolve(kind: str) -> tuple[Callable[..., dict[str, Any]], Callable[..., None] | None]:
    """The runner function of ``kind`` and its module's optional ``cleanup``."""
    try:
        target = KINDS[kind]
    except KeyError:
        raise JobError(f"unknown job kind {kind!r} (known: {', '.join(sorted(KINDS))})") from None
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise JobError(f"job kind {kind!r}: cannot import {module_name} ({exc}); "
                       "is the same loadmaster version installed on the node?") from None
    try:
        run = getattr(module, attr)
    except AttributeError:
        raise JobError(f"job kind {kind!r}: {module_name} has no {attr}()") from None
    cleanup = getattr(module, "cleanup", None)
    return run, cleanup if callable(cleanup) else None


#: Kinds whose cleanup needs the job's secrets again (its runner deleted them at start):
#: kind -> ``"module:function"`` of ``async def (config, params) -> dict[str, str]``, resolved
#: on the console the way the launch resolved them.
CLEANUP_SECRETS: dict[str, str] = {
    "upload": "backend.checkpoints.upload:cleanup_secrets",
}


def cleanup_secrets_for(kind: str) -> Callable[..., Any] | None:
    """The console-side function that supplies ``kind``'s cleanup with secrets, or None."""
    target = CLEANUP_SECRETS.get(kind)
    if target is None:
        return None
    module_name, _, attr = target.partition(":")
    fn = getattr(importlib.import_module(module_name), attr, None)
    return fn if callable(fn) else None
