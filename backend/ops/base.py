"""What every operation shares: the read-only refusal and the audit record."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING

from backend.errors import ReadOnlyRefused

if TYPE_CHECKING:
    from backend.policy.egress import GuardDecision
    from backend.services import Services
    from backend.state import StateDB


class Operation:
    """One family of actions on the services a front end was built with."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def refuse_if_readonly(self, what: str) -> None:
        """Step 1 of every operation that changes something: read-only services refuse it."""
        if self.services.readonly:
            raise ReadOnlyRefused(f"read-only mode: cannot {what} (drop --readonly)")

    def audit(
        self,
        action: str,
        target: str,
        outcome: str,
        *,
        detail: dict[str, object] | None = None,
        reason: str | None = None,
        plan_hash: str | None = None,
        into: StateDB | None = None,
    ) -> int:
        """Append the audit record of what was done (never secrets in ``detail``); its id. The
        record goes into the services' state database, or ``into`` (``state migrate``: the target).

        This is the one writer of audit records outside :mod:`backend.state`
        (``tests/ops/test_audit_in_ops.py`` keeps it so): feature code returns what it did, and the
        operation records it."""
        db = self.services.db if into is None else into
        return db.record_audit(action, target, outcome, detail=detail, reason=reason, plan_hash=plan_hash)

    def audit_override(self, decision: GuardDecision) -> int:
        """Record the over-budget transfer the operator allowed with their reason
        (``egress.override``); PolicyError when it cannot be overridden. Its audit id."""
        facts = self.services.egress.override_facts(decision, decision.override_reason or "")
        return self.audit(
            "egress.override", facts.target, "allowed-over-budget", reason=facts.reason, detail=facts.detail
        )


#: The signals a launch outlives long enough to undo what never started (a closed terminal, a
#: service manager stopping the console).
LAUNCH_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


#: The launches under way on the main thread (their loop and task), the handlers they replaced,
#: and the signal that arrived meanwhile (delivered again when the last one ends).
_launches: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[object]]] = []
_handlers_before: dict[int, Callable[[int, FrameType | None], object] | int | signal.Handlers | None] = {}
_received: list[int] = []


def _on_launch_signal(signum: int, _frame: FrameType | None) -> None:
    if not _received:
        _received.append(signum)
    for loop, task in list(_launches):
        loop.call_soon_threadsafe(task.cancel)


@contextlib.contextmanager
def signals_cancel_launch() -> Iterator[None]:
    """While inside: SIGTERM or SIGHUP cancels the running task instead of ending the process at
    once, so the launch's own cleanup runs (reservations of jobs that never started are
    released); when the last launch under way has ended, the handlers it replaced come back and
    the signal is delivered again to them (by default, the process ends as it would have). Off the
    main thread, or outside a running event loop, it does nothing."""
    try:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    if task is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    if not _launches:
        _handlers_before.update({sig: signal.signal(sig, _on_launch_signal) for sig in LAUNCH_SIGNALS})
    entry = (loop, task)
    _launches.append(entry)
    try:
        yield
    finally:
        _launches.remove(entry)
        if not _launches:
            for sig, handler in _handlers_before.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            _handlers_before.clear()
            if _received:
                os.kill(os.getpid(), _received.pop())
