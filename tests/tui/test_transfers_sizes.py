"""Transfers at 80x24 and 120x40: each job's whole id (jobs of one launch share its time part),
its node, state and progress stay on screen; a launch with a failed node; the database down said
once in the summary."""

from __future__ import annotations

from typing import Any

import pytest

from tests.firsthour.screen_text import screen_lines
from tests.tui.snapshot_services import frozen_clock, launch_records, services_with_jobs
from tests.tui.test_snapshots import settle
from tui.app import LoadmasterApp

SIZES = {"80x24": (80, 24), "120x40": (120, 40)}


@pytest.fixture(autouse=True)
def _frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    with frozen_clock(monkeypatch):
        yield


async def _show(app: Any, pilot: Any, records: tuple[Any, ...]) -> None:
    await settle(pilot)


@pytest.mark.parametrize("size", list(SIZES))
async def test_every_job_id_is_whole_on_screen(size: str) -> None:
    records = launch_records(nodes=4, failed=3)
    app = LoadmasterApp(services_with_jobs(records), theme="loadmaster-dark", mode="transfers")
    async with app.run_test(size=SIZES[size]) as pilot:
        await _show(app, pilot, records)
        lines = screen_lines(app)
    for r in records:
        row = next((line for line in lines if r.id in line), None)
        assert row is not None, f"{r.id} not whole on screen:\n" + "\n".join(lines)
        assert r.node in row and r.state in row


async def test_the_database_down_is_one_line_for_every_job() -> None:
    records = launch_records(nodes=16, failed=0, recorded=False)
    app = LoadmasterApp(services_with_jobs(records), theme="loadmaster-dark", mode="transfers")
    async with app.run_test(size=SIZES["120x40"]) as pilot:
        await _show(app, pilot, records)
        text = "\n".join(screen_lines(app))
    assert text.count("state database unreachable") == 1, text


@pytest.mark.parametrize("size", list(SIZES))
def test_launch_with_a_failed_node_snapshot(snap_compare: Any, size: str) -> None:
    records = launch_records(nodes=4, failed=3)
    app = LoadmasterApp(services_with_jobs(records), theme="loadmaster-dark", mode="transfers")

    async def before(pilot: Any) -> None:
        await _show(app, pilot, records)

    assert snap_compare(app, terminal_size=SIZES[size], run_before=before)
