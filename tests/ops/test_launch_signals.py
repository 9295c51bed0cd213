"""SIGTERM and SIGHUP during launches cancel them (their cleanup runs), then reach what handled
them before, once, when the last launch has ended; the handlers are put back as they were."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from backend.ops.base import signals_cancel_launch


async def test_a_signal_cancels_every_launch_then_reaches_the_previous_handler_once() -> None:
    seen: list[int] = []

    def previous(signum: int, _frame: Any) -> None:
        seen.append(signum)

    before = signal.signal(signal.SIGHUP, previous)
    cleaned: list[str] = []
    started = asyncio.Event()
    try:

        async def launch(name: str, *, stay: float = 0.0) -> None:
            with signals_cancel_launch():
                try:
                    started.set()
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    cleaned.append(name)  # a launch's release of what never started runs here
                    await asyncio.sleep(stay)  # cleanup may await (the node's secrets file)
                    raise

        tasks = [asyncio.create_task(launch("a")), asyncio.create_task(launch("b", stay=0.05))]
        await started.wait()
        await asyncio.sleep(0)
        os.kill(os.getpid(), signal.SIGHUP)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
        assert sorted(cleaned) == ["a", "b"]
        await asyncio.sleep(0)
        assert seen == [signal.SIGHUP]  # delivered again, once, after the last launch ended
        assert signal.getsignal(signal.SIGHUP) is previous
    finally:
        signal.signal(signal.SIGHUP, before)


async def test_outside_a_signal_nothing_changes() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with signals_cancel_launch():
        assert signal.getsignal(signal.SIGTERM) is not before
        await asyncio.sleep(0)
    assert signal.getsignal(signal.SIGTERM) is before
