"""``loadmaster pull ... --slurm-job N``: a pull for a Slurm job's nodes is tagged with the job id.

Against the real lab (sshd nodes, SeaweedFS, s5cmd) and the real slurmctld/slurmd 22.05 on loopback
(tests/slurm_fixtures.py), on SQLite and PostgreSQL (migration 7): without ``--nodes`` the pull goes
to the nodes Slurm runs the job on; each job's row records the tag; ``loadmaster jobs``, ``job
show`` and ``--json`` show it, and so does Transfers. Bad ids, unknown jobs and a job with no node
yet are one-line errors that start nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.config import load_config_file
from backend.errors import ConfigError
from backend.ops.slurm import check_job_id
from backend.services import Services
from lab import Lab
from lab.slurm import SlurmLab
from tests.helpers import wait_until, write_lab_config
from tests.jobs.conftest import SourceData
from tests.jobs.test_pull_lab import _assert_pulled
from tests.pulls_helpers import cli_here, cli_here_async
from tests.slurm_fixtures import job_state, slurm, slurm_lab, wait_for
from tui.app import LoadmasterApp
from tui.widgets.transfers_detail import TransferDetail
from tui.widgets.transfers_table import TransfersTable

__all__ = ["slurm", "slurm_lab"]

pytestmark = pytest.mark.timeout(300)


def _config(lab: Lab, sl: SlurmLab, tmp_path: Path, state_url: str | None) -> Path:
    extra = f'\n[slurm]\nenabled = true\nconf = "{sl.conf}"\ninterval = "5s"\n'
    return write_lab_config(lab, tmp_path / "loadmaster.toml", tmp_path / "state", extra, state_url=state_url)


def test_job_ids_are_digits_or_an_array_task() -> None:
    assert check_job_id("41") == "41" and check_job_id("41_3") == "41_3"
    for bad in ("", "41;rm -rf /", "abc", "41_", "_3", "4 1", "٤١"):
        with pytest.raises(ConfigError, match="--slurm-job"):
            check_job_id(bad)


async def test_a_pull_for_a_slurm_job_goes_to_its_nodes_and_is_tagged(
    lab: Lab,
    slurm: SlurmLab,
    source: SourceData,
    tmp_path: Path,
    state_url: str | None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = _config(lab, slurm, tmp_path, state_url)
    job = slurm.sbatch("-N", "2", "-w", "node-01,node-02", "--gres=gpu:1", "-J", "train", script="sleep 300")
    wait_for(f"job {job} running", lambda: job_state(slurm, job) == "RUNNING")
    dest = f"pulls/slurm-{tmp_path.name}"
    res = await cli_here_async(capsys, cfg, "pull", source.url, dest, "--slurm-job", job, "--yes", "--numworkers", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"Slurm job {job} runs on node-01,node-02" in res.stdout
    services = Services(config=load_config_file(cfg))
    try:
        recs = [r for r in services.jobs.records(limit=50) if r.kind == "pull"]
        assert sorted(r.node for r in recs) == ["node-01", "node-02"]
        assert {r.slurm_job for r in recs} == {job}
        assert all(r.state == "succeeded" for r in recs), [(r.id, r.state, r.error) for r in recs]
        # Bytes on the nodes, checked against the source: the pull ran.
        for r in recs:
            _assert_pulled(lab.node(r.node).scratch / dest, source)
        # loadmaster jobs, job show, --json.
        table = await cli_here_async(capsys, cfg, "jobs", "--local")
        assert table.returncode == 0, table.stderr
        tagged = [line for line in table.stdout.splitlines() if f"[slurm {job}]" in line]
        assert len(tagged) == 2, table.stdout
        show = await cli_here_async(capsys, cfg, "job", "show", recs[0].id)
        assert f"slurm job {job}" in show.stdout, show.stdout
        as_json = json.loads((await cli_here_async(capsys, cfg, "jobs", "--local", "--json")).stdout)
        assert {j["slurm_job"] for j in as_json if j["kind"] == "pull"} == {job}
        # Transfers shows it in the table and the detail.
        app = LoadmasterApp(services, mode="transfers")
        async with app.run_test(size=(120, 40)) as pilot:
            table_w = app.screen.query_one(TransfersTable)
            # The rows, laid out at the table's width (the route is the last column to fit).
            await wait_until(
                pilot, lambda: table_w.row_count >= 2 and "what" in table_w.shown_columns, rounds=1200, delay=0.05
            )
            cells = [" ".join(str(c) for c in table_w.get_row_at(i)) for i in range(table_w.row_count)]
            assert sum(f"slurm {job}" in c for c in cells) == 2, cells
            info = app.screen.query_one(TransferDetail).query_one("#transfers-detail-info")
            await wait_until(pilot, lambda: f"for Slurm job {job}" in str(info.render()), rounds=600, delay=0.05)
    finally:
        services.db.close()


def test_bad_unknown_and_pending_jobs_are_one_line_errors(
    lab: Lab, slurm: SlurmLab, source: SourceData, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(lab, slurm, tmp_path, None)
    # Every GPU held, then a job that must wait: it has no node yet.
    hold = slurm.sbatch("-N", "3", "--gres=gpu:4", "-J", "hold", script="sleep 300")
    wait_for(f"job {hold} running", lambda: job_state(slurm, hold) == "RUNNING")
    waits = slurm.sbatch("--gres=gpu:1", "-J", "waits", script="sleep 300")
    wait_for(f"job {waits} pending", lambda: job_state(slurm, waits) == "PENDING")
    cases = {
        "12;id": "--slurm-job: a Slurm job id is digits",
        "999999": "--slurm-job: Slurm has no running or pending job 999999",
        waits: f"--slurm-job: Slurm job {waits} holds no node yet (pending",
    }
    for given, said in cases.items():
        res = cli_here(capsys, cfg, "pull", source.url, "pulls/x", "--slurm-job", given, "--yes")
        assert res.returncode != 0
        assert said in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
    res = cli_here(capsys, cfg, "pull", source.url, "pulls/x", "--yes")
    assert res.returncode != 0 and "--node, --nodes or --slurm-job" in res.stderr
    services = Services(config=load_config_file(cfg))
    try:
        assert not [r for r in services.jobs.records(limit=50) if r.kind == "pull"]
    finally:
        services.db.close()
