"""The job kinds a node's agent can run, as objects (:class:`JobKind`), and their registry (:func:`kind`).

A kind has a node side and a console side. On the node, ``agent run JOBDIR`` calls
:meth:`JobKind.run`, which returns the result details after verifying its output (raising =
failed with the message), and :meth:`JobKind.cleanup` removes partial output when the job is
cancelled or found lost. On the console, :meth:`JobKind.on_ended` runs when a console first sees
the job ended, in any state (a pull settles or releases its egress reservation), and again until it
returns without raising; :meth:`JobKind.cleanup_secrets`
supplies a cleanup run for a dead runner with the secrets that runner deleted at start.

Node start-up stays fast: :data:`KINDS` names the module that defines each kind, imported only
when that kind is looked up, so ``agent run`` imports the runner and its own kind, nothing else.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from backend.errors import JobError

if TYPE_CHECKING:
    from backend.agent.context import JobContext
    from backend.config import Config
    from backend.jobs.records import JobRecord
    from backend.state import StateDB


class JobKind:
    """One kind of durable job. Subclasses set :attr:`name` and define :meth:`run`; the other
    hooks default to doing nothing."""

    name: str = ""

    def run(self, ctx: JobContext) -> dict[str, Any]:
        """Node side: do the job and verify its output; the result details."""
        raise NotImplementedError

    def cleanup(self, ctx: JobContext) -> None:
        """Node side: remove the partial output of a cancelled or lost job (none by default)."""

    def on_ended(self, config: Config, db: StateDB, record: JobRecord) -> None:
        """Console side: the job ended (``record.state`` is terminal). Called when a console first
        sees it end, and on later refreshes until it returns (a state database that was down);
        it must be safe to call again, and from several consoles."""

    async def cleanup_secrets(self, config: Config, params: dict[str, Any]) -> dict[str, str]:
        """Console side: the secrets a cleanup of a dead runner needs, resolved again as for the
        launch (none by default)."""
        return {}


class FunctionKind(JobKind):
    """A kind made of plain functions: its runner, its cleanup and, optionally, the console-side
    ``async def cleanup_secrets(config, params) -> dict[str, str]``."""

    def __init__(
        self,
        name: str,
        run: Callable[[JobContext], dict[str, Any]],
        cleanup: Callable[[JobContext], None] | None = None,
        *,
        cleanup_secrets: Callable[[Config, dict[str, Any]], Awaitable[dict[str, str]]] | None = None,
    ) -> None:
        self.name = name
        self._run = run
        self._cleanup = cleanup
        self._cleanup_secrets = cleanup_secrets

    def run(self, ctx: JobContext) -> dict[str, Any]:
        return self._run(ctx)

    def cleanup(self, ctx: JobContext) -> None:
        if self._cleanup is not None:
            self._cleanup(ctx)

    async def cleanup_secrets(self, config: Config, params: dict[str, Any]) -> dict[str, str]:
        if self._cleanup_secrets is None:
            return {}
        return dict(await self._cleanup_secrets(config, params))


#: kind name -> ``"module:attr"`` of its :class:`JobKind` (the module is imported on first lookup).
KINDS: dict[str, str] = {
    "pull": "backend.pulls.job:JOB_KIND",
    "relay": "backend.pulls.relay.job:JOB_KIND",
    "upload": "backend.checkpoints.upload.job:JOB_KIND",
    "strip": "backend.checkpoints.strip.job:JOB_KIND",
    "shard": "backend.shards.job:JOB_KIND",
}

_loaded: dict[str, JobKind] = {}


def check_known(name: str) -> None:
    """Refuse a kind name that is not registered, in one line (nothing is imported)."""
    if name not in KINDS:
        raise JobError(f"unknown job kind {name!r} (known: {', '.join(sorted(KINDS))})")


def kind(name: str) -> JobKind:
    """The job kind called ``name``; its module is imported the first time it is asked for."""
    found = _loaded.get(name)
    if found is not None:
        return found
    check_known(name)
    module_name, _, attr = KINDS[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise JobError(
            f"job kind {name!r}: cannot import {module_name} ({exc}); "
            "is the same loadmaster version installed on the node?"
        ) from None
    obj = getattr(module, attr, None)
    if not isinstance(obj, JobKind):
        raise JobError(f"job kind {name!r}: {module_name} has no {attr} (a JobKind)")
    _loaded[name] = obj
    return obj
