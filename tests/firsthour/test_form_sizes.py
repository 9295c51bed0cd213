"""Every form field shows its whole value at 80x24 and 120x35, and the Fleet table its sort.

Each screen is run headless (deterministic services, frozen clock) at real terminal sizes, its
fields are filled with values an operator types (a real bucket URL, 256 workers, a hostlist), each
choice of every select is tried, and the rendered screen text is read back at the field's own
cells: a value cut short, scrolled inside its field or pushed off the screen fails.
"""

from __future__ import annotations

from typing import Any

import pytest
from textual.widgets import Input, Select

from tests.firsthour.screen_text import field_problem, screen_lines
from tests.tui.snapshot_services import frozen_clock, record_egress_month, snapshot_services
from tui.app import LoadmasterApp

SIZES = {"80x24": (80, 24), "120x35": (120, 35)}

#: screen -> (keys that open its form, {field id: a value an operator types})
FORMS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "transfers": (
        ("n",),
        {
            "pull-src": "s3://ml-datasets/laion-mini/shards/",
            "pull-dest": "data/laion-mini",
            "pull-nodes": "gpu-a0[1-3],gpu-b01",
            "pull-numworkers": "256",
            "pull-concurrency": "32",
            "pull-part-size": "64",
            "pull-reason": "eval deadline",
        },
    ),
    "egress": (
        (),
        {
            "calc-size": "40TB",
            "calc-runs": "5",
            "calc-nodes": "16",
            "calc-source": "cloudflare-r2:auto",
            "calc-dest": "coreweave:us-east-04",
            "calc-objects": "500e6",
        },
    ),
    "shards": (
        ("n",),
        {
            "shards-src": "s3://ml-datasets/laion-mini/raw",
            "shards-dest": "s3://ml-datasets/laion-mini/wds",
            "shards-shard-size": "512MB",
            "shards-seed": "1234",
        },
    ),
    "retention": (
        (),
        {
            "retention-url": "s3://ml-checkpoints/llama-70b",
            "keep-full": "2",
            "milestone-every": "48000",
            "milestones": "48000,96000",
            "min-age": "2h",
        },
    ),
}


@pytest.fixture(autouse=True)
def _frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    with frozen_clock(monkeypatch):
        yield


async def _settle(pilot: Any) -> None:
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def _cases() -> list[Any]:
    return [pytest.param(screen, size, id=f"{screen}-{size}") for screen in FORMS for size in SIZES]


@pytest.mark.parametrize(("screen", "size"), _cases())
async def test_every_field_shows_its_whole_value(screen: str, size: str) -> None:
    keys, values = FORMS[screen]
    services = snapshot_services()
    if screen == "egress":
        record_egress_month(services)
    app = LoadmasterApp(services, theme="loadmaster-dark", mode=screen)
    problems: list[str] = []
    async with app.run_test(size=SIZES[size]) as pilot:
        await _settle(pilot)
        for key in keys:
            await pilot.press(key)
        await _settle(pilot)
        for field_id, value in values.items():
            app.screen.query_one(f"#{field_id}", Input).value = value
        await _settle(pilot)
        inputs = list(app.screen.query(Input).results())
        assert {i.id for i in inputs} >= set(values), "a field of the form is gone"
        for field in inputs:
            if field.id in values and (p := field_problem(app, field)):
                problems.append(p)
        for select in app.screen.query(Select).results():
            for _label, option in list(select._options):
                select.value = option
                await _settle(pilot)
                if p := field_problem(app, select):
                    problems.append(p)
        screen_text = "\n".join(screen_lines(app))
    assert not problems, f"{screen} at {size}:\n" + "\n".join(problems) + "\n" + screen_text


def _header(app: Any) -> str:
    """The Fleet table's header row (under the summary and the conditions line)."""
    return next(line for line in screen_lines(app) if line.lstrip().startswith(("Node", "Node ▲", "Node ▼")))


@pytest.mark.parametrize("size", list(SIZES))
async def test_fleet_table_shows_the_column_it_sorts_by(size: str) -> None:
    from tui.widgets.fleet_table import FleetTable

    app = LoadmasterApp(snapshot_services(), theme="loadmaster-dark", mode="fleet")
    async with app.run_test(size=SIZES[size]) as pilot:
        await _settle(pilot)
        header = _header(app)
        assert "Node ▲" in header, header
        await pilot.press("s")  # next column: State
        await _settle(pilot)
        header = _header(app)
        assert "State ▲" in header and "Node ▲" not in header, header
        await pilot.press("S")  # reversed
        await _settle(pilot)
        header = _header(app)
        assert "State ▼" in header, header
        table = app.screen.query_one(FleetTable)
        assert (table.sort_column, table.sort_reverse) == ("state", True)
        # The filter box of the Fleet screen shows a typed pattern in full too.
        await pilot.press("slash")
        await _settle(pilot)
        box = app.screen.query_one("#screen-filter", Input)
        box.value = "gpu-a0*"
        await _settle(pilot)
        assert field_problem(app, box) is None
