"""The console shows a relay pull: the chain on Transfers, the month's fan-out savings on Egress."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
import os
import signal
import time
from pathlib import Path

import pytest
from textual.widgets import Button, Input, Static

from backend.config import load_config_file
from backend.pulls.relay.view import chain_lines, relay_groups
from backend.services import Services
from lab import Lab
from tests.counting_proxy import CountingProxy
from tests.helpers import Recorder, wait_until
from tests.relay.conftest import NODES, RelaySource, assert_copy, relay_config
from tests.relay.test_relay_faults import SLOW, _job_dir, _pgid, _wait_progress
from tui.app import LoadmasterApp
from tui.cli import main as cli_main
from tui.screens.transfers import JobsRefreshed, PullLaunched, PullPlanned
from tui.widgets.summary import Summary

pytestmark = pytest.mark.timeout(180)
until = functools.partial(wait_until, rounds=3000, delay=0.02)
PRICED = "\n[prices.providers.aws]\ninternet_tiers = [{usd_per_gb = 100.0}]\n"


async def test_transfers_shows_the_chain_and_egress_the_savings(
    lab: Lab, relay_source: RelaySource, store_proxy: CountingProxy, tmp_path: Path
) -> None:
    cfg = relay_config(lab, tmp_path, store_proxy, pull='fanout = "auto"\n', extra=PRICED)
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


async def test_a_relay_launched_from_the_console_retries_its_dead_node_from_the_store(
    lab: Lab, relay_source: RelaySource, store_proxy: CountingProxy, tmp_path: Path
) -> None:
    cfg = relay_config(lab, tmp_path, store_proxy, pull='fanout = "relay"\n' + SLOW)
    dest = "pulls/relay-console-killed"
    services = Services(load_config_file(cfg))
    rec = Recorder()
    try:
        app = LoadmasterApp(services, mode="transfers")
        async with app.run_test(size=(200, 50), message_hook=rec) as pilot:
            await pilot.press("n")
            await pilot.pause()
            screen = app.screen
            screen.query_one("#pull-src", Input).value = relay_source.url
            screen.query_one("#pull-dest", Input).value = dest
            screen.query_one("#pull-nodes", Input).value = "node-0[1-4]"
            screen.query_one("#pull-estimate", Button).press()
            await until(pilot, lambda: rec.of(PullPlanned) or app.errors)
            planned = rec.of(PullPlanned)[-1]
            assert planned.launchable and "instead of 4x" in planned.text, planned.text
            screen.query_one("#pull-launch", Button).press()
            await until(pilot, lambda: rec.of(PullLaunched))
            victim = await asyncio.to_thread(_job_dir, lab, "node-02", dest)
            below = await asyncio.to_thread(_job_dir, lab, "node-03", dest)
            total = relay_source.total
            await asyncio.to_thread(_wait_progress, below, total // 5, total * 4 // 5)
            killed_at = time.time()
            os.killpg(_pgid(victim), signal.SIGKILL)

            def retried_ok() -> bool:
                # This pull's retry: node-02's jobs from earlier tests of the session's lab show too.
                last = rec.of(JobsRefreshed)
                return bool(last) and any(
                    r.node == "node-02"
                    and r.kind == "pull"
                    and r.state == "succeeded"
                    and r.created >= killed_at
                    and str(r.params.get("dest", "")).rstrip("/").endswith(dest)
                    for r in last[-1].records
                )

            await until(pilot, retried_ok, rounds=6000)
    finally:
        await services.aclose()
    for node in NODES:
        assert_copy(lab.node(node).scratch / dest, relay_source)
