"""Pilot tests of the Egress screen: the live calculator, validation, the ledger view, the dialog."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, Select, Static

from backend.config import parse_config
from backend.ledger import EgressGuard
from backend.services import Services
from tests.helpers import Recorder, wait_until
from tui.app import LoadmasterApp
from tui.screens.egress import EgressScreen
from tui.widgets import Gauge

SIZE = (160, 50)
TB = 10**12


@pytest.fixture
def services(tmp_path: Path) -> Services:
    config = parse_config(
        {
            "nodes": [{"name": "gpu-01", "transport": "local", "site": "coreweave:us-east-04"}],
            "stores": {"datasets": {"url": "s3://datasets/laion", "provider": "aws", "region": "us-east-1"}},
            "egress": {"budgets": {"datasets": 1000}, "action": "confirm"},
            "state": {"dir": str(tmp_path / "state")},
        },
        file="test.toml",
    )
    return Services(config=config)


def _quote_text(screen: EgressScreen) -> str:
    return str(screen.query_one("#egress-quote", Static).render())


async def test_calculator_updates_live_and_validates(services: Services) -> None:
    rec = Recorder()
    app = LoadmasterApp(services, mode="egress")
    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, EgressScreen) and rec.of(EgressScreen.EstimateComputed))
        screen = app.screen
        assert isinstance(screen, EgressScreen)
        # Preloaded: the brief's 40 TB x 5 runs from aws:us-east-1 -> coreweave:us-east-04, 16 nodes.
        first = rec.of(EgressScreen.EstimateComputed)[0].estimate
        assert (first.dataset_bytes, first.runs, first.nodes) == (40 * TB, 5, 16)
        assert "$13,791.00" in _quote_text(screen) and "break-even in month 1" in _quote_text(screen)

        # Typing a bad size: a clear message, the field marked, no new estimate.
        size = screen.query_one("#calc-size", Input)
        await pilot.click("#calc-size")
        size.value = ""
        await pilot.press(*"40", "space", *"TX")
        await wait_until(pilot, lambda: bool(rec.of(EgressScreen.EstimateRejected)) and size.value == "40 TX")
        assert "size like 40TB" in rec.of(EgressScreen.EstimateRejected)[-1].errors["size"]
        error = screen.query_one("#egress-calc-error", Static)
        assert "size like 40TB" in str(error.render()) and error.has_class("-active")
        assert size.has_class("-invalid")

        # Typing a good size: the quote follows. 80 TB x 5 = 400,000 GB:
        # 11,291 for the first 150 TB + 250,000 x 0.05 = 12,500 -> $23,791.
        computed = len(rec.of(EgressScreen.EstimateComputed))
        size.value = ""
        await pilot.press(*"80TB")
        await wait_until(pilot, lambda: screen.estimate is not None and screen.estimate.dataset_bytes == 80 * TB)
        assert len(rec.of(EgressScreen.EstimateComputed)) > computed
        assert "$23,791.00" in _quote_text(screen) and not size.has_class("-invalid")
        assert not screen.query_one("#egress-calc-error", Static).has_class("-active")

        # Every node syncing the whole dataset: 16 x the bytes.
        screen.query_one("#calc-per-node", Select).value = "full"
        await wait_until(pilot, lambda: screen.estimate is not None and screen.estimate.per_node == "full")
        assert screen.estimate.primary.bytes_out == 16 * 400 * TB

        # The example key restores the brief's scenario.
        screen.query_one("#egress-routes", DataTable).focus()
        await pilot.press("x")
        await wait_until(
            pilot,
            lambda: (
                screen.estimate is not None
                and screen.estimate.dataset_bytes == 40 * TB
                and screen.estimate.per_node == "sharded"
            ),
        )
        assert "$13,791.00" in _quote_text(screen)


async def test_month_to_date_routes_and_budget_gauge(services: Services) -> None:
    guard = EgressGuard(services.config, services.db)
    guard.record_transfer(
        services.config.store("datasets"), "coreweave:us-east-04", 10 * TB, job_id="pull-1", when=datetime.now(UTC)
    )
    rec = Recorder()
    app = LoadmasterApp(services, mode="egress")
    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        await wait_until(pilot, lambda: bool(rec.of(EgressScreen.ReportLoaded)))
        await pilot.pause()
        screen = app.screen
        table = screen.query_one("#egress-routes", DataTable)
        # By header, not position: the columns are ordered by importance, not fixed here.
        row = {str(col.label): str(c) for col, c in zip(table.ordered_columns, table.get_row_at(0), strict=True)}
        assert row["Store -> node site"] == "datasets -> coreweave:us-east-04"
        assert row["Bytes"] == "10.0 TB" and row["USD"] == "$891.00"
        (gauge,) = screen.query(Gauge)
        assert gauge.value == pytest.approx(891) and gauge.total == 1000
        assert gauge.has_class("-warn")  # 89% of the budget, warn_at 0.8
