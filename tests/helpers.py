"""Helpers shared by test modules: Pilot message recording and waiting, lab configs for job tests."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web
from textual.message import Message
from textual.notifications import Notify

from lab import Lab

#: Short job timings for tests over the lab (appended to the lab's config text).
JOBS_SECTION = """
[jobs]
lost_after = "3s"
cancel_grace = "2s"
poll_interval = "0.3s"

[pull]
numworkers = 8
concurrency = 4
part_size_mib = 5
nic_gbps = 10.0
"""


def write_lab_config(lab: Lab, path: Path, state_dir: Path, extra: str = "", *, state_url: str | None = None) -> Path:
    """The lab's config with its own state dir and short job timings (the shared file is untouched);
    ``state_url`` puts state in that PostgreSQL database instead."""
    text = lab.config_text(JOBS_SECTION + extra)
    text = re.sub(r'(\[state\]\ndir = )"[^"]*"', lambda m: f'{m.group(1)}"{state_dir}"', text)
    if state_url is not None:
        text = text.replace(f'[state]\ndir = "{state_dir}"', f'[state]\ndir = "{state_dir}"\nurl = "{state_url}"')
    path.write_text(text)
    return path


def lab_bucket_store(lab: Lab, s3: Any, prefix: str) -> Any:
    """An S3Store on a fresh bucket of the lab's SeaweedFS, with the lab store's profile."""
    import dataclasses

    from backend.storage import S3Store

    bucket = s3.new_bucket(prefix)
    return S3Store(f"s3://{bucket}", dataclasses.replace(lab.config.stores["lab"], url=f"s3://{bucket}"))


class Recorder:
    """A run_test message hook keeping every message the app's nodes processed."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    def __call__(self, message: Message) -> None:
        self.messages.append(message)

    def of(self, kind: type[Message]) -> list[Any]:
        # A bubbling message is processed by each node on its way up: count it once.
        return list({id(m): m for m in self.messages if isinstance(m, kind)}.values())

    def notes(self) -> list[tuple[str, str]]:
        """(severity, message) of every notification shown."""
        return [(n.notification.severity, n.notification.message) for n in self.of(Notify)]


async def wait_until(pilot: Any, cond: Any, rounds: int = 400, delay: float | None = None) -> None:
    """Let the app run until ``cond()`` holds (bounded by rounds of the event loop, not by a time limit)."""
    for _ in range(rounds):
        if cond():
            return
        await pilot.pause(delay)
    assert cond(), "condition never became true"


async def type_text(pilot: Any, text: str) -> None:
    """Type ``text`` into the focused widget: the key events ``pilot.press(*text)`` sends, in order,
    then one wait for the screen. ``press`` waits for the process to go idle after every key (up to
    2 s a key while a screen's workers poll the lab): typing a word cost seconds."""
    from textual import events
    from textual.keys import _character_to_key

    for ch in text:
        key = events.Key(ch if ch.isalnum() else _character_to_key(ch), ch)
        key.set_sender(pilot.app)  # as the driver sends a key it read
        pilot.app.post_message(key)
    await pilot.pause()


async def settle_workers(pilot: Any) -> None:
    """Wait for the app's workers to finish, then for the screen to process what they posted."""
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serve the aiohttp ``app`` on a free loopback port for the block; yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
