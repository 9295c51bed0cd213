"""``loadmaster jobs``, ``job show|logs|cancel`` and ``agent`` against the real lab."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab import Lab
from tests.jobs.conftest import SourceData
from tests.pulls_helpers import cli_here
from tui.cli import main as cli_main

pytestmark = pytest.mark.timeout(240)
LOADMASTER = str(Path(sys.executable).parent / "loadmaster")


def _run(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LOADMASTER, "--config", str(cfg), *args], capture_output=True, text=True, timeout=180)


def test_jobs_show_logs_and_cancel_of_a_finished_job(
    lab: Lab, source: SourceData, jobs_config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    res = _run(
        jobs_config_path, "pull", source.url, "pulls/cli-show", "--node", "node-04", "--yes", "--detach", "--json"
    )
    assert res.returncode == 0, res.stderr
    job = json.loads(res.stdout)["jobs"][0]["id"]

    # logs --follow ends when the job ends, and prints the runner's verification line.
    res = _run(jobs_config_path, "job", "logs", job[:-1], "--follow")  # a unique prefix works
    assert res.returncode == 0, res.stderr
    assert "copied 4 objects" in res.stdout and "every object's bytes proven" in res.stdout
    assert "succeeded" in res.stderr

    res = cli_here(capsys, jobs_config_path, "job", "show", job)
    assert res.returncode == 0
    assert "state     succeeded" in res.stdout and "node-04" in res.stdout and source.url in res.stdout
    shown = json.loads(cli_here(capsys, jobs_config_path, "job", "show", job, "--json").stdout)
    assert shown["result"]["bytes"] == source.total and shown["launched_by"]

    listing = cli_here(capsys, jobs_config_path, "jobs")
    assert job in listing.stdout and "succeeded" in listing.stdout

    res = cli_here(capsys, jobs_config_path, "job", "cancel", job, "--yes")
    assert res.returncode == 2 and "already ended (succeeded)" in res.stderr
    assert "Traceback" not in res.stderr


def test_clear_errors_for_bad_input(
    lab: Lab, source: SourceData, jobs_config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = str(jobs_config_path)
    cases = [
        (["job", "show", "nope-nope"], "no job 'nope-nope'"),
        (["pull", "/local/path", "d", "--node", "node-01", "--yes"], "source must be an s3:// URL"),
        (["pull", source.url, "d", "--node", "node-99", "--yes"], "no node named 'node-99'"),
        (["pull", source.url, "d", "--node", "node-01", "--yes", "--numworkers", "0"], "numworkers must be at least 1"),
        (["pull", source.url, "d", "--node", "node-01", "--store", "nosuch", "--yes"], "no store named 'nosuch'"),
        (["--readonly", "pull", source.url, "d", "--node", "node-01", "--yes"], "read-only"),
        (["pull", source.url, "d", "--node", "node-01"], "pass --yes"),
    ]
    for argv, msg in cases:
        assert cli_main(["--config", cfg, *argv]) == 2, argv
        err = capsys.readouterr().err
        assert msg in err, (argv, err)
        assert err.count("\n") == 1, err  # one line, no traceback


def test_agent_refuses_a_directory_that_is_not_a_job(tmp_path: Path) -> None:
    res = subprocess.run([LOADMASTER, "agent", "run", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "not a loadmaster job directory" in res.stderr
