"""The Slurm jobs screen (``J`` on Fleet) against the real slurmctld and slurmd 22.05 on loopback
(tests/slurm_fixtures.py): running and pending jobs with user, name, elapsed, nodes, GPUs and
pending reasons; a collapsed array record listed per task; enter filters Fleet to the job's nodes;
``T`` triages the job; explained, not opened, without ``[slurm] enabled``; 80x24 and 120x40.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backend.config import default_config
from backend.services import Services
from backend.slurm.model import SlurmJob
from lab import Lab
from lab.slurm import SlurmLab
from tests.firsthour.screen_text import screen_lines
from tests.helpers import wait_until
from tests.slurm_fixtures import job_state, slurm, slurm_lab
from tests.tui.test_fleet_slurm import cell, fleet_ready, job_running, refresh, services_for
from tui.app import LoadmasterApp
from tui.screens.fleet import FleetScreen
from tui.screens.slurm_jobs import (
    HEADERS,
    MAX_TASKS,
    SlurmJobsScreen,
    array_rows,
    fit_cells,
    job_rows,
    task_ids,
)
from tui.widgets.fleet_table import FleetTable

__all__ = ["slurm", "slurm_lab"]

pytestmark = [pytest.mark.timeout(240)]


# -- pure: array tasks ---------------------------------------------------------------------------


def test_task_strings_expand_per_task() -> None:
    assert task_ids("4-7") == (["4", "5", "6", "7"], 0)
    assert task_ids("1-9:4") == (["1", "5", "9"], 0)
    assert task_ids("1,3,5-6%2") == (["1", "3", "5", "6"], 0)
    assert task_ids("0-9", limit=3) == (["0", "1", "2"], 7)
    for bad in ("", "a-b", "5-1", "1-3:0", "²", "1-"):
        with pytest.raises(ValueError):
            task_ids(bad)


@given(st.integers(0, 10**6), st.integers(0, 5000), st.integers(1, 50), st.integers(1, 2 * MAX_TASKS))
def test_task_ids_never_exceed_the_limit_and_count_the_rest(lo: int, span: int, step: int, limit: int) -> None:
    ids, more = task_ids(f"{lo}-{lo + span}:{step}", limit=limit)
    assert len(ids) <= limit
    assert len(ids) + more == span // step + 1
    assert ids == [str(i) for i in range(lo, lo + span + 1, step)][: len(ids)]


def test_collapsed_array_record_is_one_row_per_task_and_running_come_first() -> None:
    pending = SlurmJob("7_[2-4]", "sweep", "alice", "PENDING", reason="Resources", array_job_id="7")
    running = SlurmJob(
        "7_1", "sweep", "alice", "RUNNING", nodes=("node-01",), start_time=100.0, array_job_id="7", array_task_id="1"
    )
    plain = SlurmJob("9", "x\x1b[31m", "bob", "RUNNING", nodes=("node-02",), start_time=50.0)
    assert [r.job_id for r in array_rows(pending, 200.0)] == ["7_2", "7_3", "7_4"]
    rows = job_rows([pending, running, plain], now=200.0)
    assert [r.job_id for r in rows] == ["9", "7_1", "7_2", "7_3", "7_4"]
    assert "\x1b" not in rows[0].name
    assert rows[2].reason == "Resources" and rows[2].nodes == ()


@pytest.mark.parametrize("state", ["CONFIGURING", "RESIZING", "STAGE_OUT", "SIGNALING"])
def test_a_job_that_holds_its_nodes_is_listed_as_running(state: str) -> None:
    # The screen's "running" is the model's one definition (SlurmJob.holds_nodes): a job still
    # booting its nodes (CONFIGURING) holds them, shows its elapsed time and sorts with the running.
    held = SlurmJob("5", "boot", "alice", state, nodes=("node-01",), start_time=100.0)
    waiting = SlurmJob("6", "next", "bob", "PENDING", reason="Resources")
    rows = job_rows([waiting, held], now=200.0)
    assert [r.job_id for r in rows] == ["5", "6"] and rows[0].running and not rows[1].running
    assert held.holds_nodes


@given(
    st.lists(
        st.tuples(st.text(min_size=1, max_size=30), st.text(max_size=80), st.text(max_size=200), st.text(max_size=120)),
        min_size=1,
        max_size=5,
    )
)
def test_rows_fit_80_columns(cells: list[tuple[str, str, str, str]]) -> None:
    rows = [
        [f"{i}_{i}", "pending", user, name, "12h05m", nodes, "8", reason]
        for i, (user, name, nodes, reason) in enumerate(cells)
    ]
    fitted = fit_cells(rows, 80)
    widths = [max(len(h), *(len(r[i]) for r in fitted)) for i, h in enumerate(HEADERS)]
    assert sum(w + 2 for w in widths) + 1 <= 80


def test_array_task_zero_is_a_task_not_unset() -> None:
    import json

    from backend.slurm.parse import parse_jobs_json

    rec = {"job_id": 5, "name": "s", "user_name": "u", "job_state": "RUNNING", "array_job_id": 4, "array_task_id": 0}
    plain = {"job_id": 6, "name": "p", "user_name": "u", "job_state": "RUNNING", "array_job_id": 0}
    jobs, skipped = parse_jobs_json(json.dumps({"jobs": [rec, {**plain, "array_task_id": 0}]}))
    assert not skipped
    assert (jobs[0].job_id, jobs[0].array_task_id) == ("4_0", "0")
    assert (jobs[1].job_id, jobs[1].array_task_id) == ("6", None)


# -- against the real Slurm ----------------------------------------------------------------------


def table_text(app: LoadmasterApp) -> str:
    return "\n".join(screen_lines(app))


async def open_jobs(app: LoadmasterApp, pilot: object) -> SlurmJobsScreen:
    screen = await fleet_ready(app, pilot)
    # Slurm read afresh: the screen's first rows are the console's last read, which may be from
    # before its jobs ran (the console started while slurmctld was starting them).
    await refresh(screen, pilot)
    screen.query_one(FleetTable).focus()
    await pilot.press("J")  # type: ignore[attr-defined]
    await wait_until(pilot, lambda: isinstance(app.screen, SlurmJobsScreen))
    jobs = app.screen
    assert isinstance(jobs, SlurmJobsScreen)
    jobs.action_reload()
    await wait_until(pilot, lambda: bool(jobs.rows), rounds=1200, delay=0.05)
    return jobs


def check_listing(app: LoadmasterApp, jobs: SlurmJobsScreen, train: str, sweep: str, width: int) -> None:
    """The jobs screen as shown ``width`` columns wide: every array task its own row, running first,
    pending ones with their reason, no line past the edge, every column in the header."""
    ids = [r.job_id for r in jobs.rows]
    # Every array task is its own row (squeue --json collapses the pending ones).
    assert {f"{sweep}_{t}" for t in range(6)} <= set(ids), ids
    assert not any("[" in i for i in ids), ids
    waiting = [r for r in jobs.rows if r.state == "PENDING"]
    assert waiting and all(r.reason for r in waiting), waiting
    running = [r for r in jobs.rows if r.running]
    assert ids[: len(running)] == [r.job_id for r in running]  # running first
    row = next(r for r in jobs.rows if r.job_id == train)
    assert row.user and row.name == "train" and row.nodes == ("node-01",) and row.gpu_count == 2
    lines = screen_lines(app)
    text = "\n".join(lines)
    assert all(len(line) <= width for line in lines)
    header = next(line for line in lines if "job" in line and "state" in line)
    for column in ("user", "name", "elapsed", "nodes", "gpus", "reason"):
        assert column in header, (width, header)
    assert "running" in text and "train" in text
    assert any("pending" in line and f"{sweep}_" in line for line in lines), text
    assert "Its nodes in Fleet" in text or "enter" in text


async def test_jobs_screen_lists_running_pending_and_array_tasks(lab: Lab, slurm: SlurmLab, tmp_path: Path) -> None:
    """At 120x40, then opened again after the terminal is resized to 80x24 (one cluster's jobs and
    one console for both sizes: the screen fits its rows to the width it opens at)."""
    services = services_for(lab, slurm, tmp_path)
    train = slurm.sbatch("-w", "node-01", "--gres=gpu:2", "-J", "train", script="sleep 300")
    # Six tasks of four GPUs each on three 4-GPU nodes (one holds job train's 2): some wait.
    # Submitted after train, they come after it in Slurm's queue (its order is their priority).
    sweep = slurm.sbatch("--array=0-5", "--gres=gpu:4", "-J", "sweep", script="sleep 300")
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="fleet")
    async with app.run_test(size=(120, 40)) as pilot:
        await job_running(pilot, slurm, train)
        await wait_until(pilot, lambda: "RUNNING" in job_state(slurm, sweep), rounds=1800, delay=0.05)
        jobs = await open_jobs(app, pilot)
        # Every task listed (a read may land while slurmctld still starts some of them).
        for _ in range(60):
            if sum(r.job_id.startswith(f"{sweep}_") for r in jobs.rows) == 6:
                break
            await pilot.pause(0.05)
        assert sum(r.job_id.startswith(f"{sweep}_") for r in jobs.rows) == 6, [(r.job_id, r.state) for r in jobs.rows]
        await pilot.pause()
        check_listing(app, jobs, train, sweep, 120)
        # Back to Fleet, the terminal resized to 80x24, the screen opened again.
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, FleetScreen))
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        jobs = await open_jobs(app, pilot)
        await wait_until(
            pilot, lambda: sum(r.job_id.startswith(f"{sweep}_") for r in jobs.rows) == 6, rounds=60, delay=0.05
        )
        await pilot.pause()
        check_listing(app, jobs, train, sweep, 80)
        # / filters the rows.
        await pilot.press("slash", *"train", "enter")
        await pilot.pause()
        assert [r.job_id for r in jobs.shown] == [train], (jobs.filter_text, app.focused)
        assert jobs.triage_target() == {"job": train}
        assert "node-01 GPU" in str(jobs.query_one("#slurm-jobs-detail").render())
        # enter: back to Fleet, filtered to the job's nodes.
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, FleetScreen))
        fleet = app.screen
        assert isinstance(fleet, FleetScreen)
        assert fleet.filter_text == f"job:{train}"
        await wait_until(pilot, lambda: set(fleet.query_one(FleetTable)._row_cells) == {"node-01"}, rounds=600)
        assert cell(app, "node-01", "slurm") in ("mixed", "allocated")
    services.db.close()


async def test_t_on_a_job_opens_triage_for_it(lab: Lab, slurm: SlurmLab, tmp_path: Path) -> None:
    from tui.screens.triage import TriageScreen

    services = services_for(lab, slurm, tmp_path)
    job = slurm.sbatch("-w", "node-02", "--gres=gpu:1", "-J", "eval", script="sleep 120")
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="fleet")
    async with app.run_test(size=(80, 24)) as pilot:
        await job_running(pilot, slurm, job)
        jobs = await open_jobs(app, pilot)
        jobs.query_one("#slurm-jobs-table").focus()
        assert jobs.selected() == job
        await pilot.press("T")
        await wait_until(pilot, lambda: isinstance(app.screen, TriageScreen))
        assert getattr(app.screen, "job", None) == job
    services.db.close()


async def test_without_slurm_j_explains_and_opens_nothing(tmp_path: Path) -> None:
    (tmp_path / "lm-data" / "checkpoints").mkdir(parents=True)
    services = Services(config=default_config())
    app = LoadmasterApp(services, mode="fleet")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        app.screen.query_one(FleetTable).focus()
        await pilot.press("J")
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        assert any("Slurm is not enabled" in n.message for n in app._notifications)
        # Pushed anyway (from code), the screen says so instead of a table.
        app.push_screen(SlurmJobsScreen(services))
        await pilot.pause()
        assert "Slurm is not enabled: add [slurm] enabled = true" in table_text(app)
