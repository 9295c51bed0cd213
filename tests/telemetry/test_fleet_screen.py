"""Pilot tests of the Fleet and node-detail screens in the real console (LoadmasterApp).

Samples enter the hub where real ones do (``hub.ingest`` after the transport), with an explicit
clock, so the data on screen is deterministic.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.message import Message

from backend.config import Config
from backend.services import Services
from backend.telemetry.hub import TelemetryHub
from backend.telemetry.settings import TelemetrySettings
from backend.telemetry.synthetic import SyntheticNode, SyntheticPool, synthetic_fleet
from tui.app import LoadmasterApp
from tui.messages import FleetSampled
from tui.screens.fleet import FleetScreen
from tui.screens.node_detail import NodeDetailScreen
from tui.widgets.fleet_alerts import COLUMNS as ALERT_COLUMNS
from tui.widgets.fleet_alerts import AlertList
from tui.widgets.fleet_table import FleetTable

SIZE = (220, 40)


class Fleet:
    """A feed-only hub over synthetic nodes, and the services that carry it."""

    def __init__(self, count: int = 4, starved: tuple[int, ...] = (3,), window: float = 5) -> None:
        self.nodes, self.gens = synthetic_fleet(count, starved=starved)
        self.t = 0.0
        # The fleet's own clock: deterministic times on screen (wall = 2023-11-14 22:13:20 UTC + t).
        self.hub = TelemetryHub(
            SyntheticPool(self.nodes),
            TelemetrySettings(starved_window=window),
            feed_only=True,
            clock=lambda: self.t,
            wall_clock=lambda: 1_700_000_000.0 + self.t,
        )
        self.services = Services(Config(nodes=tuple(self.nodes), stores={}))
        self.services.__dict__["telemetry"] = self.hub  # the composition root's cached service

    def gen(self, name: str) -> SyntheticNode:
        return next(g for g in self.gens if g.name == name)

    def feed(self, ticks: int, *, skip: tuple[str, ...] = ()) -> None:
        for _ in range(ticks):
            for g in self.gens:
                if g.name not in skip:
                    self.hub.ingest(g.name, g.block(self.t), self.t)
            self.hub.tick(self.t)
            self.t += 1.0


class Recorder:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    def __call__(self, message: Message) -> None:
        self.messages.append(message)


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Clock times on screen in UTC, whatever the machine's zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def fleet() -> Fleet:
    return Fleet()


def alert_row(alerts: AlertList, index: int) -> dict[str, str]:
    """One alert-list row by column key (the column order is a layout choice; at this size every
    column is on screen)."""
    keys = [key for key, _label, _width in ALERT_COLUMNS]
    assert list(alerts.shown_columns) == keys
    return dict(zip(keys, (str(c) for c in alerts.get_row_at(index)), strict=True))


def cell(table: FleetTable, node: str, column: str) -> str:
    return str(table.get_cell(node, column))


async def test_fleet_shows_gpus_and_utilisation(fleet):
    rec = Recorder()
    app = LoadmasterApp(fleet.services)
    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        fleet.feed(3)
        await pilot.pause()
        table = app.screen.query_one(FleetTable)
        assert table.row_count == 4
        assert cell(table, "gpu-001", "gpus") == "8"
        assert cell(table, "gpu-001", "state") == "up"
        util = cell(table, "gpu-001", "util")
        mean, low = (int(x.strip(" %")) for x in util.split("/"))
        assert 90 <= low <= mean <= 100
        starved_mean = int(cell(table, "gpu-003", "util").split("%")[0])
        assert 10 <= starved_mean <= 30
        assert cell(table, "gpu-001", "rx") == "20.0 (20%)"
        assert cell(table, "gpu-001", "disk") == "200.0"
        summary = str(app.screen.query_one("#fleet-summary").render())
        assert "nodes 4/4 up" in summary and "GPUs 32" in summary
        assert any(isinstance(m, FleetSampled) for m in rec.messages)


async def test_starved_node_raises_and_clears_alert(fleet):
    app = LoadmasterApp(fleet.services)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        fleet.feed(8)  # window is 5 s
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        alerts = screen.query_one(AlertList)
        assert alerts.row_count == 1
        row = alert_row(alerts, 0)
        assert row["node"] == "gpu-003" and row["gpus"] == "0-7"
        assert row["hint"] == "request-bound" and row["status"] == "active"
        assert row["since"] == "22:13:20"  # started at t=0 (TZ=UTC)
        assert "STARVED" in cell(screen.query_one(FleetTable), "gpu-003", "alerts")
        assert "starved 1 (gpu-003)" in str(screen.query_one("#fleet-conditions").render())
        # The input pipeline is fixed: utilisation recovers and the alert clears by itself.
        fleet.gen("gpu-003").pattern = "training"
        fleet.feed(3)
        await pilot.pause()
        row = alert_row(alerts, 0)
        assert row["node"] == "gpu-003" and row["status"] == "cleared"
        assert cell(screen.query_one(FleetTable), "gpu-003", "alerts") == ""
        assert "none starved" in str(screen.query_one("#fleet-conditions").render())


async def test_stale_and_unreachable_states_shown(fleet):
    app = LoadmasterApp(fleet.services)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        fleet.feed(2)
        fleet.feed(5, skip=("gpu-002",))  # gpu-002 misses 5 samples
        fleet.hub.mark_unreachable("gpu-004", "connection refused")
        fleet.feed(1, skip=("gpu-002", "gpu-004"))
        await pilot.pause()
        table = app.screen.query_one(FleetTable)
        assert cell(table, "gpu-002", "state") == "stale"
        assert cell(table, "gpu-004", "state") == "unreachable"
        assert cell(table, "gpu-004", "error") == "connection refused"
        assert "nodes 2/4 up" in str(app.screen.query_one("#fleet-summary").render())


async def test_filter_sort_and_detail(fleet):
    app = LoadmasterApp(fleet.services)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        fleet.feed(3)
        await pilot.pause()
        screen = app.screen
        table = screen.query_one(FleetTable)
        await pilot.press("slash", "0", "0", "3")
        await pilot.pause()
        assert table.row_count == 1 and table.get_row_at(0)[0] == "gpu-003"
        await pilot.press("escape")
        await pilot.pause()
        assert table.row_count == 4
        table.set_sort("util")
        await pilot.pause()
        assert table.get_row_at(0)[0] == "gpu-003"  # the starved node sorts first
        table.set_sort("util", reverse=True)
        assert table.get_row_at(3)[0] == "gpu-003"
        table.set_sort("node", reverse=False)
        table.focus()
        table.move_cursor(row=1)
        await pilot.press("enter")
        await pilot.pause()
        detail = app.screen
        assert isinstance(detail, NodeDetailScreen) and detail.node_name == "gpu-002"
        gpus = detail.query_one("#node-gpus")
        assert gpus.row_count == 8
        assert "NVIDIA H100 80GB HBM3" in [str(c) for c in gpus.get_row_at(0)]
        fleet.feed(1)
        await pilot.pause()
        label = str(detail.query_one("#plot-label-util_mean").render())
        assert "min" in label and "max" in label
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)


async def test_only_changed_cells_are_updated(fleet):
    app = LoadmasterApp(fleet.services)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        fleet.feed(2)
        await pilot.pause()
        table = app.screen.query_one(FleetTable)
        nodes = fleet.hub.snapshot().nodes
        # The same snapshot again: identical node objects, nothing to redraw.
        assert table.show(nodes, lambda n: []) == 0


def test_fleet_snapshot(snap_compare, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "cfg"))
    fleet = Fleet(count=6, starved=(3,), window=5)
    fleet.hub.mark_unreachable("gpu-006", "connection refused")

    async def feed(pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.pause()
        fleet.feed(10, skip=("gpu-006",))
        await pilot.pause()

    assert snap_compare(LoadmasterApp(fleet.services), terminal_size=(200, 30), run_before=feed)


async def test_ticks_queued_behind_a_busy_ui_are_coalesced(fleet):
    app = LoadmasterApp(fleet.services)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        fleet.feed(1)
        await pilot.pause()
        before = len(screen.apply_times)
        # Five ticks published before the screen gets to run: only the newest is applied.
        fleet.feed(5)
        last_seq = fleet.hub.snapshot().seq
        await pilot.pause()
        assert len(screen.apply_times) == before + 1
        assert screen.last_snapshot is not None and screen.last_snapshot.seq == last_seq
        older = FleetSampled(fleet.hub.snapshot())
        assert older.can_replace(FleetSampled(fleet.hub.snapshot()))
        assert not older.can_replace(Message())


async def test_rows_scrolled_into_view_show_current_data():
    fleet = Fleet(count=60, starved=(), window=60)
    app = LoadmasterApp(fleet.services)
    async with app.run_test(size=(220, 24)) as pilot:
        await pilot.pause()
        app.screen.show_view("table")  # 60 nodes open on the heatmap; this is about the table
        fleet.feed(4)
        await pilot.pause()
        table = app.screen.query_one(FleetTable)
        last = "gpu-060"
        table.focus()
        table.move_cursor(row=table.row_count - 1)
        await pilot.pause()
        node = fleet.hub.snapshot().node(last)
        assert node is not None
        expected = f"{node.util_mean:.0f}% / {node.util_min:.0f}%"
        assert cell(table, last, "util") == expected
        table.flush_all()
        first = fleet.hub.snapshot().node("gpu-001")
        assert cell(table, "gpu-001", "util") == f"{first.util_mean:.0f}% / {first.util_min:.0f}%"


def test_node_detail_snapshot(snap_compare):
    fleet = Fleet(count=3, starved=(2,), window=5)

    async def open_detail(pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.pause()
        fleet.feed(12)
        await pilot.pause()
        pilot.app.screen.open_node("gpu-002")
        await pilot.pause()

    assert snap_compare(LoadmasterApp(fleet.services), terminal_size=(160, 40), run_before=open_detail)
