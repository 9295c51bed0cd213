"""What every operation shares: the read-only refusal and the audit record."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from backend.errors import ReadOnlyRefused

if TYPE_CHECKING:
    from backend.services import Services


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
        detail: dict[str, Any] | None = None,
        reason: str | None = None,
        plan_hash: str | None = None,
    ) -> int:
        """Append the audit record of what was done (never secrets in ``detail``); its id."""
        return self.services.db.record_audit(action, target, outcome, detail=detail, reason=reason, plan_hash=plan_hash)


#: The signals a launch outlives long enough to undo what never started (a closed terminal, a
#: service manager stopping the console).
LAUNCH_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_cancel_launch() -> Iterator[None]:
    """While inside: SIGTERM or SIGHUP cancels the running task instead of ending the process at
    once, so the launch's own cleanup runs (reservations of jobs that never started are
    released); on the way out the signal is delivered again to whatever handled it before (by
    default, the process ends as it would have). Off the main thread, or outside a running
    event loop, it does nothing."""
    try:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    if task is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        if not got:
            got.append(signum)
            loop.call_soon_threadsafe(task.cancel)

    before = {sig: signal.signal(sig, on_signal) for sig in LAUNCH_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if got:
            os.kill(os.getpid(), got[0])
