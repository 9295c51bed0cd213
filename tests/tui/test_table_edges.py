"""No table's column is cut by the screen's edge at 80x24 or 120x40 (#29): the last column on
screen is whole or not shown, both at the size the console starts at and after a resize."""

from __future__ import annotations

from typing import Any

import pytest
from textual.widgets import DataTable

from tests.tui.snapshot_services import (
    frozen_clock,
    launch_records,
    record_egress_month,
    services_with_jobs,
    snapshot_services,
)
from tests.tui.table_edges import cut_at_edge, header_on_screen
from tests.tui.test_snapshots import list_run, settle
from tui.app import LoadmasterApp
from tui.widgets.shard_runs import RUN_COLUMNS, Conversion

SIZES = {"80x24": (80, 24), "120x40": (120, 40)}
pytestmark = pytest.mark.usefixtures("_frozen")


@pytest.fixture
def _frozen(monkeypatch: pytest.MonkeyPatch) -> Any:
    with frozen_clock(monkeypatch):
        yield


def _conversion() -> Conversion:
    from backend.ops.shards import ShardProgress

    progress = ShardProgress(5_000, 10_000, 2 * 10**9, 4 * 10**9, 3, 8, 0.0, 12_345.0, 456.7)
    src, dest = "s3://ml-datasets/laion-mini/raw-images/part-000/", "s3://ml-datasets/laion-mini/shards-512mb/"
    return Conversion("c1", src, dest, "gpu-a01", progress=progress, fraction=0.375)


def _conversions_problems(app: Any) -> list[str]:
    table = app.screen.query_one("#shards-table", DataTable)
    cut = cut_at_edge(app, table)
    assert header_on_screen(app, table) == [label for _key, label in RUN_COLUMNS]
    row = [str(c) for c in table.get_row_at(0)]
    assert row[0] == "running" and row[-2:] == ["12,345", "456.7"], row
    assert "…" in row[2] and row[2].startswith("s3:/") and row[2].endswith("mb/"), row
    assert table.virtual_size.width <= table.scrollable_content_region.width  # no sideways scroll
    return cut


async def test_the_conversions_header_is_whole() -> None:
    """At 120x40 the conversions table beside the form was cut at ``smp/``: the route now gives
    way (cut in the middle) so the rates fit whole; at 80 columns every column fits. Checked at
    120x40, then with the terminal resized to 80x24 (the route fitted again to the new width)."""
    app = LoadmasterApp(snapshot_services(), theme="loadmaster-dark", mode="shards")
    async with app.run_test(size=SIZES["120x40"]) as pilot:
        await settle(pilot)
        app.screen._apply(_conversion())
        await settle(pilot)
        assert _conversions_problems(app) == [], "120x40"
        await pilot.resize_terminal(*SIZES["80x24"])
        await settle(pilot)
        assert _conversions_problems(app) == [], "80x24"


#: Screens whose tables are checked, and how they are brought up.
SCREENS = ("fleet", "transfers", "checkpoints", "retention", "egress", "alerts", "shards")
#: Screens that list the 64-step run (the box its folder is typed in).
RUN_BOX = {"checkpoints": "#ckpt-url", "retention": "#retention-url"}
#: screen -> the sizes it is checked at, in order: the console starts at the first and the terminal
#: is then resized to the second (as an operator's is). The screens alternate, so each size is
#: checked both as the size a console starts at and as one it is resized to.
ORDER = {screen: ("80x24", "120x40") if i % 2 == 0 else ("120x40", "80x24") for i, screen in enumerate(SCREENS)}


def _cut_tables(app: Any) -> tuple[dict[str, list[str]], int]:
    """Each shown table's columns cut by the screen's edge, and how many rows they list."""
    tables = [t for t in app.screen.query(DataTable) if t.display and t.region.width]
    return {str(t.id): cut_at_edge(app, t) for t in tables}, sum(t.row_count for t in tables)


@pytest.mark.parametrize("screen", SCREENS)
async def test_no_table_runs_past_the_edge(screen: str, tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "config"))
    if screen == "transfers":
        services = services_with_jobs(launch_records(nodes=4, failed=3), state_dir=tmp_path / "state")
    else:
        services = snapshot_services(state_dir=tmp_path / "state")
    if screen == "egress":
        record_egress_month(services)
    app = LoadmasterApp(services, theme="loadmaster-dark", mode=screen)
    first, second = ORDER[screen]
    async with app.run_test(size=SIZES[first]) as pilot:
        if screen in RUN_BOX:
            await list_run(RUN_BOX[screen], milestone_every="8000" if screen == "retention" else "")(pilot)
        elif screen == "shards":
            await settle(pilot)
            app.screen._apply(_conversion())
        await settle(pilot)
        problems, rows = _cut_tables(app)
        await pilot.resize_terminal(*SIZES[second])
        await settle(pilot)
        problems_after, rows_after = _cut_tables(app)
    for size, cut, listed in ((first, problems, rows), (second, problems_after, rows_after)):
        assert cut and not any(cut.values()), (size, cut)
        assert listed or screen == "alerts", f"{screen} at {size}: nothing listed to check"  # no Alertmanager here
