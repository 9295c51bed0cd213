"""SVG snapshots of every console screen, dark and light, at 80x24 (the smallest supported size).

Deterministic by construction (see tests/tui/snapshot_services.py): synthetic samples fed at fixed
hub times, a frozen clock, a fixed config, no node or store contacted. Regenerate the baselines
after an intended change with ``pytest tests/tui/test_snapshots.py --snapshot-update`` and look
at them before committing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.tui.snapshot_services import frozen_clock, record_egress_month, snapshot_services
from tui.app import LoadmasterApp

SIZE = (80, 24)
THEMES = ("loadmaster-dark", "loadmaster-light")

Step = Callable[[Any], Awaitable[None]]


async def settle(pilot: Any) -> None:
    """Let mount-time workers finish and the screen repaint; then drop transient toasts."""
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def open_node_detail(pilot: Any) -> None:
    await settle(pilot)
    await pilot.press("down", "enter")  # the starved node, second row
    await settle(pilot)


async def open_help(pilot: Any) -> None:
    await settle(pilot)
    await pilot.press("question_mark")
    await settle(pilot)


#: (snapshot name, first screen, what to do before the snapshot)
SCREENS: list[tuple[str, str, Step]] = [
    ("fleet", "fleet", settle),
    ("node_detail", "fleet", open_node_detail),
    ("transfers", "transfers", settle),
    ("checkpoints", "checkpoints", settle),
    ("retention", "retention", settle),
    ("egress", "egress", settle),
    ("shards", "shards", settle),
    ("help", "fleet", open_help),
]


@pytest.fixture(autouse=True)
def _frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    with frozen_clock(monkeypatch):
        yield


@pytest.mark.parametrize("theme", THEMES, ids=["dark", "light"])
@pytest.mark.parametrize(("name", "mode", "before"), SCREENS, ids=[s[0] for s in SCREENS])
def test_screen(snap_compare: Any, name: str, mode: str, before: Step, theme: str) -> None:
    services = snapshot_services()
    if name == "egress":
        record_egress_month(services)
    app = LoadmasterApp(services, theme=theme, mode=mode)
    assert snap_compare(app, terminal_size=SIZE, run_before=before)
