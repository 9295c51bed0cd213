"""The console shows a relay pull: the chain on Transfers, the month's fan-out savings on Egress."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
from pathlib import Path

import pytest
from textual.widgets import Static

from backend.config import load_config_file
from backend.lab import Lab
from backend.lab.counting_proxy import CountingProxy
from backend.relay.view import chain_lines, relay_groups
from backend.services import Services
from tests.helpers import wait_until
from tests.relay.conftest import RelaySource, relay_config
from tui.app import LoadmasterApp
from tui.cli import main as cli_main
from tui.widgets.summary import Summary

pytestmark = pytest.mark.timeout(180)
until = functools.partial(wait_until, rounds=3000, delay=0.02)
PRICED = "\n[prices.providers.aws]\ninternet_tiers = [{usd_per_gb = 100.0}]\n"


async def test_transfers_shows_the_chain_and_egress_the_savings(
    lab: Lab, relay_source: RelaySource, store_proxy: CountingProxy, tmp_path: Path
) -> None:
    cfg = relay_config(lab, tmp_path, store_proxy, jobs='fanout = "auto"\n', extra=PRICED)
    so, se = io.StringIO(), io.StringIO()
    args = ["--config", str(cfg), "pull", relay_source.url, "pulls/relay-console", "--nodes", "node-0[1-4]"]
    with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
        rc = await asyncio.to_thread(cli_main, [*args, "--yes", "--json"])
    assert rc == 0, se.getvalue()
    # auto chose the relay: the route is priced and four nodes at one site take the same data.
    assert "fan-out: relay (auto: relay" in se.getvalue()
    saved = 3 * relay_source.total / 1e9 * 100
    assert "saves $" in se.getvalue()
    jobs = json.loads(so.getvalue())["jobs"]

    services = Services(load_config_file(cfg))
    try:
        records = await services.jobs.refresh()
        [group] = relay_groups(records)
        lines = chain_lines(group)
        assert "1 from the store, 3 from peers; 4/4 done" in lines[0]
        assert [ln.strip().split("  ")[0] for ln in lines[1:]] == [
            "node-01 <- the store",
            "node-02 <- node-01",
            "node-03 <- node-02",
            "node-04 <- node-03",
        ]
        app = LoadmasterApp(services, mode="transfers")
        async with app.run_test(size=(200, 50)) as pilot:
            box = app.screen.query_one("#transfers-relay", Static)
            await until(pilot, lambda: box.display and "node-04 <- node-03" in str(box.render()))
            await pilot.press("5")
            await until(pilot, lambda: any(k == "fan-out saved" for k, _ in app.screen.query_one(Summary).items))
            [value] = [v for k, v in app.screen.query_one(Summary).items if k == "fan-out saved"]
            assert value.startswith(f"${saved:,.2f}") and "(3 node copies)" in value
    finally:
        await services.aclose()
    assert {j["node"] for j in jobs} == {"node-01", "node-02", "node-03", "node-04"}
