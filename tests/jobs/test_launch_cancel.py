"""A pull to three nodes is one launch: its jobs' ids start with the launch id, the state database
records it, and ``loadmaster job cancel LAUNCH`` stops every running job of it with one
confirmation and one audit record (a job id still cancels one job). The commands run in this
process (tests/pulls_helpers.py: the executable's parser and command code without its start-up);
a cancel signals the jobs on their nodes, never the process that asks. Against the real lab (sshd
nodes, SeaweedFS held mid-pull, the real s5cmd), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from backend.config import load_config_file
from backend.ops import Operations, PullRequest
from backend.services import Services
from lab import Lab
from tests.firsthour.screen_text import screen_lines
from tests.helpers import Recorder, wait_until, write_lab_config
from tests.jobs.conftest import SourceData
from tests.jobs.test_pull_lab import store_stalled
from tests.pulls_helpers import cli_here_async
from tui.app import LoadmasterApp
from tui.screens.transfers import JobsRefreshed, LaunchCancelled
from tui.widgets.confirm import ConfirmTyped
from tui.widgets.transfers_table import TransfersTable

pytestmark = pytest.mark.timeout(300)
NODES = ("node-01", "node-02", "node-04")


async def _running(services: Services, ids: list[str]) -> None:
    """Until every job has written its pid and a progress point (s5cmd holds requests in flight)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        recs = [services.jobs.get(i) for i in ids]
        dirs = [Path(r.job_dir or "/nonexistent") for r in recs]
        if all((d / "pid").exists() and (d / "progress.jsonl").exists() for d in dirs):  # noqa: ASYNC240
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the jobs never reported progress")


async def test_a_three_node_pull_is_cancelled_as_one_launch(
    lab: Lab, source: SourceData, tmp_path: Path, state_url: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_lab_config(lab, tmp_path / "loadmaster.toml", tmp_path / "state", state_url=state_url)
    services = Services(config=load_config_file(cfg))
    req = PullRequest(
        src=source.url,
        dest=f"pulls/launch-{tmp_path.name}",
        nodes="node-0[1,2,4]",
        numworkers=2,
        concurrency=2,
        part_size_mib=5,
    )
    try:
        preview = await Operations(services).pulls.plan(req)
        with store_stalled(lab):
            started = await Operations(services).pulls.start(req, shown=preview)
            launch = started.launch
            assert launch is not None
            ids = [r.id for r in started.records]
            assert sorted(r.node for r in started.records) == list(NODES)
            # Every job's id is unique and starts with its launch's; the launch is recorded.
            assert len(set(ids)) == 3 and all(i.startswith(f"{launch}.") for i in ids)
            assert sorted(services.jobs.launch_ids(launch)) == sorted(ids)
            assert all(services.jobs.get(i).launch == launch for i in ids)
            await _running(services, ids)
            await services.pool.close()

            # A job id still cancels that job alone.
            one = next(r for r in started.records if r.node == "node-01")
            res = await cli_here_async(capsys, cfg, "job", "cancel", one.id, "--yes", "--reason", "one node")
            assert res.returncode == 0, res.stdout + res.stderr
            assert f"job {one.id}: cancelled" in res.stdout

            # Without --yes and without a terminal: refused, nothing stopped.
            res = await cli_here_async(capsys, cfg, "job", "cancel", launch)
            assert res.returncode != 0 and "pass --yes" in res.stderr, res.stderr
            assert "Traceback" not in res.stderr

            # The launch: the two still running, one confirmation (--yes), one audit record.
            res = await cli_here_async(capsys, cfg, "job", "cancel", launch, "--yes", "--reason", "wrong prefix")
            assert res.returncode == 0, res.stdout + res.stderr
            assert f"cancel launch {launch} (2 running job(s) on node-02, node-04; 1 already ended" in res.stderr
            assert f"launch {launch}: 2 of 2 running job(s) cancelled" in res.stdout

        listed = json.loads((await cli_here_async(capsys, cfg, "jobs", "--json")).stdout)
        mine = {r["id"]: r for r in listed if r["id"] in ids}
        assert {r["state"] for r in mine.values()} == {"cancelled"}
        assert {r["launch"] for r in mine.values()} == {launch}
        for node in NODES:
            dest = lab.node(node).scratch / req.dest
            assert not [p for p in dest.rglob("*") if p.is_file()], f"partial output left on {node}"

        entries = services.db.audit_entries(action="job.cancel")
        assert len(entries) == 2, [(e.target, e.outcome) for e in entries]
        by_target = {e.target: e for e in entries}
        whole = by_target[f"launch:{launch}"]
        assert whole.outcome == "cancelled" and whole.reason == "wrong prefix"
        assert set(whole.detail["jobs"]) == set(ids) - {one.id}
        assert set(whole.detail["jobs"].values()) == {"cancelled"}
        assert whole.detail["already_ended"] == {one.id: "cancelled"}
        assert by_target[f"node-01:{one.id}"].reason == "one node"
        launched = services.db.audit_entries(action="pull.launch")
        assert launched[0].detail["launch"] == launch

        # The launch id is taken wherever a job id is: show lists its jobs, logs asks for one.
        res = await cli_here_async(capsys, cfg, "job", "show", launch)
        assert res.returncode == 0 and f"launch {launch}: 3 job(s), 3 cancelled" in res.stdout, res.stdout + res.stderr
        assert all(i in res.stdout for i in ids)
        res = await cli_here_async(capsys, cfg, "job", "logs", launch)
        assert res.returncode != 0 and f"{launch} is a launch of 3 job(s): name one" in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1

        # Nothing of it runs: cancelling the launch again says so in one line.
        res = await cli_here_async(capsys, cfg, "job", "cancel", launch, "--yes")
        assert res.returncode != 0 and "already ended (3 cancelled); nothing to cancel" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
    finally:
        await services.aclose()


async def test_the_console_cancels_the_selected_launch_at_80x24(lab: Lab, source: SourceData, tmp_path: Path) -> None:
    cfg = write_lab_config(lab, tmp_path / "loadmaster.toml", tmp_path / "state")
    services = Services(config=load_config_file(cfg))
    req = PullRequest(
        src=source.url, dest="pulls/console-launch", nodes="node-0[1,2,4]", numworkers=2, concurrency=2, part_size_mib=5
    )
    try:
        preview = await Operations(services).pulls.plan(req)
        with store_stalled(lab):
            started = await Operations(services).pulls.start(req, shown=preview)
            ids = [r.id for r in started.records]
            await _running(services, ids)
            app = LoadmasterApp(services, mode="transfers")
            rec = Recorder()
            async with app.run_test(size=(80, 24), message_hook=rec) as pilot:
                table = app.screen.query_one(TransfersTable)
                await wait_until(pilot, lambda: set(ids) <= {str(k.value) for k in table.rows}, rounds=3000)
                await pilot.pause()
                shown = "\n".join(screen_lines(app))
                for r in started.records:  # each job's whole id (which starts with the launch's)
                    assert r.id in shown, shown
                table.focus()
                table.move_cursor(row=[str(k.value) for k in table.rows].index(ids[1]))
                await pilot.press("c")
                await wait_until(pilot, lambda: isinstance(app.screen, ConfirmTyped), rounds=500)
                body = "\n".join(screen_lines(app))
                assert f"launch {started.launch}: 3 running" in body, body
                await pilot.press(*"cancel")
                await pilot.press("enter")
                await wait_until(pilot, lambda: rec.of(LaunchCancelled), rounds=6000)
                done = rec.of(LaunchCancelled)[-1].result
                await wait_until(
                    pilot,
                    lambda: any(
                        {r.state for r in m.records if r.id in ids} == {"cancelled"} for m in rec.of(JobsRefreshed)
                    ),
                    rounds=3000,
                )
                entries = services.db.audit_entries(action="job.cancel")
        assert done.launch == started.launch and done.ok
        assert sorted(r.id for r in done.finals) == sorted(ids)
        assert [e.target for e in entries] == [f"launch:{started.launch}"]
        assert entries[0].reason == "cancelled from the console"
    finally:
        await services.aclose()
