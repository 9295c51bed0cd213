"""Pilot tests of the Transfers screen against the real lab (sshd nodes, SeaweedFS, s5cmd)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from pathlib import Path

import pytest
from textual.widgets import Button, Input, Static

from backend.config import Config
from lab import Lab
from tests.helpers import Recorder, type_text, wait_until
from tests.jobs.conftest import SourceData, fresh_services
from tests.jobs.test_pull_lab import _assert_pulled, _launch_stalled
from tui.app import LoadmasterApp
from tui.cli import main as cli_main
from tui.screens.transfers import (
    JobCancelled,
    JobDetailLoaded,
    JobsRefreshed,
    PullLaunched,
    PullPlanned,
)
from tui.widgets.confirm import ConfirmTyped
from tui.widgets.transfers_table import TransfersTable

pytestmark = pytest.mark.timeout(300)
SIZE = (200, 50)
# lab jobs take real seconds: wait in 20 ms steps, up to 3000 of them
until = functools.partial(wait_until, rounds=3000, delay=0.02)


async def test_cli_jobs_show_in_console_and_console_pulls_show_in_cli(
    lab: Lab,
    source: SourceData,
    jobs_config: Config,
    jobs_config_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = await asyncio.to_thread(
        cli_main,
        [
            "--config",
            str(jobs_config_path),
            "pull",
            source.url,
            "pulls/from-cli",
            "--node",
            "node-03",
            "--yes",
            "--detach",
        ],
    )
    err = capsys.readouterr().err
    # node-03 has no s5cmd: refused before launch with one clear line.
    assert rc == 2 and "node-03: s5cmd is not installed" in err, err
    rc = await asyncio.to_thread(
        cli_main,
        [
            "--config",
            str(jobs_config_path),
            "pull",
            source.url,
            "pulls/from-cli",
            "--node",
            "node-04",
            "--yes",
            "--detach",
            "--json",
        ],
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    cli_job = json.loads(out)["jobs"][0]["id"]

    # The console has its own connections and its own handle on the team's state: it finds the
    # CLI's job on the node.
    services = fresh_services(jobs_config)
    app = LoadmasterApp(services, mode="transfers")
    rec = Recorder()
    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        table = app.screen.query_one(TransfersTable)
        await until(
            pilot, lambda: any(r.id == cli_job and r.terminal for m in rec.of(JobsRefreshed) for r in m.records)
        )
        await until(pilot, lambda: cli_job in [str(k.value) for k in table.rows])
        table.focus()
        table.move_cursor(row=[str(k.value) for k in table.rows].index(cli_job))
        # The detail pane follows the job: loaded when the row is selected, again on each refresh.
        await until(pilot, lambda: any(m.record.id == cli_job and m.record.terminal for m in rec.of(JobDetailLoaded)))
        await until(pilot, lambda: "succeeded" in str(app.screen.query_one("#transfers-detail-info", Static).render()))
        info = str(app.screen.query_one("#transfers-detail-info", Static).render())
        assert "succeeded" in info and "verified" in info

        # New pull from the console: estimate first, then launch.
        await pilot.press("n")
        await pilot.pause()
        screen = app.screen
        screen.query_one("#pull-src", Input).value = source.url
        screen.query_one("#pull-dest", Input).value = "pulls/from-console"
        screen.query_one("#pull-nodes", Input).value = "node-01"
        screen.query_one("#pull-numworkers", Input).value = "4"
        screen.query_one("#pull-concurrency", Input).value = "4"
        screen.query_one("#pull-part-size", Input).value = "5"
        screen.query_one("#pull-estimate", Button).press()
        await until(pilot, lambda: rec.of(PullPlanned) or app.errors)
        assert not app.errors, [e.detail for e in app.errors]
        planned = rec.of(PullPlanned)[-1]
        assert planned.launchable, planned.text
        assert "4 object(s)" in planned.text and "fits" in planned.text and "ETA" in planned.text
        screen.query_one("#pull-launch", Button).press()
        await until(pilot, lambda: rec.of(PullLaunched))
        console_job = rec.of(PullLaunched)[-1].records[0].id
        await until(
            pilot,
            lambda: any(
                r.id == console_job and r.state == "succeeded" for m in rec.of(JobsRefreshed) for r in m.records
            ),
        )
    await services.aclose()
    _assert_pulled(lab.node("node-01").scratch / "pulls/from-console", source)
    _assert_pulled(lab.node("node-04").scratch / "pulls/from-cli", source)

    # ... and the CLI sees the console's job.
    rc = await asyncio.to_thread(cli_main, ["--config", str(jobs_config_path), "jobs", "--json"])
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[console_job]["state"] == "succeeded"
    assert rows[console_job]["result"]["bytes"] == source.total


async def test_cancel_from_console_needs_typed_confirmation(
    lab: Lab,
    source: SourceData,
    jobs_config: Config,
    tmp_path: Path,
) -> None:
    services = fresh_services(jobs_config, tmp_path / "console.sqlite3")
    with contextlib.ExitStack() as stack:
        job, _job_dir, _pgid = await _launch_stalled(services, lab, source, "node-02", "pulls/console-cancel", stack)
        await services.pool.close()
        app = LoadmasterApp(services, mode="transfers")
        rec = Recorder()
        async with app.run_test(size=SIZE, message_hook=rec) as pilot:
            table = app.screen.query_one(TransfersTable)
            await until(pilot, lambda: job.id in [str(k.value) for k in table.rows])
            table.focus()
            table.move_cursor(row=[str(k.value) for k in table.rows].index(job.id))
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, ConfirmTyped))
            await type_text(pilot, "cancel")
            await pilot.press("enter")
            await until(pilot, lambda: rec.of(JobCancelled))
            final = rec.of(JobCancelled)[-1].record
            entries = services.db.audit_entries(action="job.cancel")
    assert final.id == job.id and final.state == "cancelled"
    assert entries and entries[0].target == f"node-02:{job.id}"


async def test_readonly_console_refuses_cancel(lab: Lab, jobs_config: Config, tmp_path: Path) -> None:
    services = fresh_services(jobs_config, tmp_path / "ro.sqlite3")
    services.readonly = True
    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("c")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmTyped)
    await services.aclose()
