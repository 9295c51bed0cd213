"""The Fleet table at any width: the decisive columns stay, the rest give way in priority order;
the starvation check is named as loadmaster's own, apart from Alertmanager; a silence is shown."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.text import Text

from backend.textfmt import gpu_ranges
from tests.firsthour.screen_text import screen_lines
from tests.tui.snapshot_services import STARVED, frozen_clock, snapshot_services
from tests.tui.table_edges import cut_at_edge, header_on_screen, table_lines
from tests.tui.test_snapshots import settle
from tui.app import LoadmasterApp
from tui.widgets.fleet_alerts import AlertList
from tui.widgets.fleet_table import COLUMN_KEYS, PRIORITY, FleetTable, column_layout
from tui.widgets.table_fit import cut_end


@given(st.integers(min_value=1, max_value=400), st.booleans())
def test_columns_give_way_in_priority_order(width: int, errors: bool) -> None:
    skip = frozenset() if errors else frozenset({"error"})
    layout = column_layout(width, skip=skip)
    shown = [key for key, _w in layout]
    wanted = [k for k in PRIORITY if k not in skip]
    # What is shown is always the first columns by priority, in display order, within the width.
    assert sorted(shown, key=wanted.index) == wanted[: len(shown)]
    assert shown == [k for k in COLUMN_KEYS if k in shown]
    assert shown[0] == "node"
    if len(shown) > 1:
        assert sum(w + 2 for _k, w in layout) <= width


@pytest.mark.parametrize("width", [78, 118, 198])
def test_the_alert_column_is_on_screen_from_80_columns(width: int) -> None:
    shown = dict(column_layout(width))
    assert {"node", "state", "alerts", "util"} <= set(shown)
    assert shown["alerts"] >= len("STARVED line rate unknown")


@pytest.fixture(autouse=True)
def _frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    with frozen_clock(monkeypatch):
        yield


#: The sizes the Fleet is checked at.
SIZES = ((80, 24), (120, 40))


async def _at_each_size(pilot: Any, sizes: tuple[tuple[int, int], ...]) -> Any:
    """Yield each of ``sizes`` once the screen shows it: the console starts at the first, the
    terminal is resized to the others (what an operator does too)."""
    for i, size in enumerate(sizes):
        if i:
            await pilot.resize_terminal(*size)
        await settle(pilot)
        yield size


async def test_the_starved_row_says_starved_and_the_source_is_named() -> None:
    app = LoadmasterApp(snapshot_services(), theme="loadmaster-dark", mode="fleet")
    async with app.run_test(size=SIZES[0]) as pilot:
        async for size in _at_each_size(pilot, SIZES):
            lines = screen_lines(app)
            row = next(line for line in lines if line.lstrip().startswith(STARVED))
            assert "STARVED request-bound" in row, (size, row)
            conditions = next(line for line in lines if "loadmaster check" in line)
            assert "starved 1 (gpu-a02)" in conditions and "Alertmanager: not set" in conditions
            assert not any("alerts 1" in line for line in lines)  # no count mixing both sources
            header = next(line for line in lines if "Node ▲" in line)
            assert header.rstrip().endswith(header.split()[-1])  # the last header is whole
            assert "Alerts" in header, (size, header)


async def test_a_silenced_starvation_page_is_shown_as_silenced() -> None:
    app = LoadmasterApp(snapshot_services(), theme="loadmaster-dark", mode="fleet")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        app.set_site_alerts({"gpu-b01": ["NodeDown"]}, silenced={STARVED: ["GPUStarved"]})
        await settle(pilot)
        table = app.screen.query_one(FleetTable)
        table.flush_all()
        quiet = table.get_cell(STARVED, "alerts")
        # Whole where the column has room, else cut with '…'; never styled as a live alert.
        assert str(quiet) == cut_end("STARVED request-bound (silenced)", dict(table._layout)["alerts"]), quiet
        assert not isinstance(quiet, Text) or not quiet.style, quiet
        assert str(table.get_cell("gpu-b01", "alerts")) == "!1 NodeDown"
        status = [str(c) for c in app.screen.query_one(AlertList).get_row_at(0)]
        assert status[0] == STARVED and status[-1] == "silenced"
        conditions = str(app.screen.query_one("#fleet-conditions").render())
        assert "Alertmanager: 1 firing, 1 silenced" in conditions


async def test_a_state_database_down_is_one_line_on_the_fleet() -> None:
    app = LoadmasterApp(snapshot_services(), theme="loadmaster-dark", mode="fleet")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        app.screen._state_checked("state database oncall@127.0.0.1:1/loadmaster is unreachable")
        await settle(pilot)
        lines = screen_lines(app)
        assert sum("STATE DATABASE DOWN" in line for line in lines) == 1
        assert "STATE DATABASE DOWN: state database" in str(app.screen.query_one("#fleet-conditions").render())


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_starved_node_and_database_down_snapshot(snap_compare: Any, size: tuple[int, int]) -> None:
    app = LoadmasterApp(snapshot_services(), theme="loadmaster-dark", mode="fleet")

    async def before(pilot: Any) -> None:
        await settle(pilot)
        app.screen._state_checked("state database oncall@db.internal:5432/loadmaster is unreachable")
        await settle(pilot)

    assert snap_compare(app, terminal_size=size, run_before=before)


def _parse_ranges(text: str) -> list[int]:
    """``0-2,5`` -> [0, 1, 2, 5], read independently of the formatter."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


@given(st.sets(st.integers(min_value=0, max_value=300)))
def test_gpu_ranges_round_trip_sorted_and_whole(gpus: set[int]) -> None:
    text = gpu_ranges(sorted(gpus, reverse=True))
    got = _parse_ranges(text)
    assert set(got) == gpus  # never drops (nor adds) a GPU
    assert got == sorted(gpus)  # sorted, each once
    # Compact: no two parts could have been one range.
    parts = [_parse_ranges(p) for p in text.split(",")] if text else []
    assert all(a[-1] + 1 < b[0] for a, b in zip(parts, parts[1:], strict=False))


def test_gpu_ranges_reads_as_the_operator_would_write_it() -> None:
    assert gpu_ranges(range(8)) == "0-7"
    assert gpu_ranges([5, 0, 1, 2]) == "0-2,5"
    assert gpu_ranges([9, 10, 12]) == "9-10,12"
    assert gpu_ranges([]) == ""


async def test_the_alert_list_says_which_gpus_and_no_column_is_cut() -> None:
    """The starved node's GPUs read as a range (``0-7``, not ``0,1,2,3,4,5,`` cut by the edge);
    both tables' last headers are whole, no column runs past the screen's edge. At 120x40, then
    resized to 80x24."""
    app = LoadmasterApp(snapshot_services(), theme="loadmaster-dark", mode="fleet")
    async with app.run_test(size=SIZES[1]) as pilot:
        async for size in _at_each_size(pilot, SIZES[::-1]):
            alerts = app.screen.query_one(AlertList)
            row = next(line for line in table_lines(app, alerts) if line.lstrip().startswith(STARVED + " "))
            headers = header_on_screen(app, alerts)
            assert headers[-1] == ("GPUs" if size[0] == 80 else "Status"), (size, headers)
            assert row.split()[-1 if size[0] == 80 else -3] == "0-7", (size, row)
            assert cut_at_edge(app, alerts) == [], size
            assert cut_at_edge(app, app.screen.query_one(FleetTable)) == [], size


async def test_a_cell_wider_than_its_column_ends_in_an_ellipsis() -> None:
    # A node without NVIDIA GPUs says so ("no NVIDIA GPU", 13 cells); at 80 columns the GPUs column
    # is 6 wide: the cell must read as cut ("no NV…"), not as a whole word ("no NVI").
    from backend.telemetry.hub import TelemetryHub
    from backend.telemetry.settings import TelemetrySettings
    from backend.telemetry.synthetic import SyntheticNode, SyntheticPool
    from tests.tui.snapshot_services import NODES

    services = snapshot_services(fed=False)
    hub = TelemetryHub(SyntheticPool(NODES), TelemetrySettings(), feed_only=True)  # type: ignore[arg-type]
    gens = [SyntheticNode(n.name, gpus=0 if i == 1 else 8, seed=i) for i, n in enumerate(NODES, start=1)]
    for t in range(3):
        for g in gens:
            hub.ingest(g.name, g.block(float(t)), float(t))
        hub.tick(float(t))
    services.__dict__["telemetry"] = hub
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="fleet")
    # At 120x40, then resized to 80x24: the cells are cut again for the narrower columns.
    async with app.run_test(size=SIZES[1]) as pilot:
        async for size in _at_each_size(pilot, SIZES[::-1]):
            table = app.screen.query_one(FleetTable)
            widths = dict(table._layout)
            for r in range(table.row_count):
                for key, cell in zip(table.shown_columns, table.get_row_at(r), strict=True):
                    assert len(str(cell)) <= widths[key], (size, key, str(cell))
            row = next(line for line in screen_lines(app) if line.lstrip().startswith(NODES[0].name))
            if widths["gpus"] < len("no NVIDIA GPU"):
                assert "no NV" in row and "…" in row, (size, row)
            else:
                assert "no NVIDIA GPU" in row, (size, row)
