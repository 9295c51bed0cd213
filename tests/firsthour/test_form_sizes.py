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
    # The stores' previews (Shards, Transfers) look for AWS credentials on every change of the
    # form; off EC2 botocore's instance-metadata probe is ~0.15 CPU s of each look (x ~30 here),
    # and this machine has no instance metadata: skipped, as AWS documents for such machines.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with frozen_clock(monkeypatch):
        yield


async def _settle(pilot: Any) -> None:
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


#: screen -> the sizes it is checked at, in order: the console starts at the first and the terminal
#: is then resized to the second (what an operator does too). Half the screens start at each size,
#: so each size is checked both as the size the console starts at and as one resized to.
ORDER: dict[str, tuple[str, str]] = {
    "transfers": ("80x24", "120x35"),
    "egress": ("120x35", "80x24"),
    "shards": ("80x24", "120x35"),
    "retention": ("120x35", "80x24"),
}


async def _problems(app: Any, pilot: Any, values: dict[str, str]) -> list[str]:
    """What of the form is not shown whole at the current size: each typed field, and each select
    at each of its choices."""
    problems: list[str] = []
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
    return problems


@pytest.mark.parametrize("screen", list(FORMS))
async def test_every_field_shows_its_whole_value(screen: str) -> None:
    keys, values = FORMS[screen]
    services = snapshot_services()
    if screen == "egress":
        record_egress_month(services)
    app = LoadmasterApp(services, theme="loadmaster-dark", mode=screen)
    first, second = ORDER[screen]
    problems: list[str] = []
    async with app.run_test(size=SIZES[first]) as pilot:
        await _settle(pilot)
        for key in keys:
            await pilot.press(key)
        await _settle(pilot)
        for field_id, value in values.items():
            app.screen.query_one(f"#{field_id}", Input).value = value
        await _settle(pilot)
        problems += [f"at {first}: {p}" for p in await _problems(app, pilot, values)]
        text = "\n".join(screen_lines(app))
        await pilot.resize_terminal(*SIZES[second])
        await _settle(pilot)
        problems += [f"at {second}: {p}" for p in await _problems(app, pilot, values)]
        text += "\n" + "\n".join(screen_lines(app))
    assert not problems, f"{screen}:\n" + "\n".join(problems) + "\n" + text


def _header(app: Any) -> str:
    """The Fleet table's header row (under the summary and the conditions line)."""
    return next(line for line in screen_lines(app) if line.lstrip().startswith(("Node", "Node ▲", "Node ▼")))


async def test_fleet_table_shows_the_column_it_sorts_by() -> None:
    """At 80x24, then again after the terminal is resized to 120x35."""
    from tui.widgets.fleet_table import FleetTable

    app = LoadmasterApp(snapshot_services(), theme="loadmaster-dark", mode="fleet")
    async with app.run_test(size=SIZES["80x24"]) as pilot:
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
        await pilot.resize_terminal(*SIZES["120x35"])
        await _settle(pilot)
        header = _header(app)
        assert "State ▼" in header and "Node ▲" not in header, header
        await pilot.press("S")  # reversed again, at 120 columns
        await _settle(pilot)
        header = _header(app)
        assert "State ▲" in header and "Node ▲" not in header, header
        # The filter box of the Fleet screen shows a typed pattern in full too.
        await pilot.press("slash")
        await _settle(pilot)
        box = app.screen.query_one("#screen-filter", Input)
        box.value = "gpu-a0*"
        await _settle(pilot)
        assert field_problem(app, box) is None
        await pilot.resize_terminal(*SIZES["80x24"])
        await _settle(pilot)
        assert field_problem(app, box) is None
