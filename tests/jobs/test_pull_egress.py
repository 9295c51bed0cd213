"""Pulls pass the egress guard before launch and land in the ledger when they succeed."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from backend.lab import Lab
from tests.helpers import write_lab_config
from tests.jobs.conftest import SourceData
from tui.cli import main as cli_main

pytestmark = pytest.mark.timeout(240)


def test_over_budget_pull_needs_a_reason_then_is_audited_and_ledgered(
    lab: Lab, source: SourceData, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    cfg = write_lab_config(
        lab, tmp_path / "lm.toml", state, extra='\n[egress]\nmonthly_budget_usd = 0.0000001\naction = "confirm"\n'
    )
    args = ["--config", str(cfg), "pull", source.url, "pulls/egress", "--node", "node-01", "--yes"]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert "--allow-over-budget" in err
    assert not (lab.node("node-01").scratch / "pulls/egress").exists()

    assert cli_main([*args, "--allow-over-budget", "eval run needs it", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    [job] = out["jobs"]
    assert job["state"] == "succeeded"
    db = sqlite3.connect(state / "state.sqlite3")
    overrides = db.execute("SELECT reason FROM audit WHERE action = 'egress.override'").fetchall()
    assert overrides == [("eval run needs it",)]
    rows = db.execute("SELECT bytes, store FROM egress_ledger WHERE job_id = ?", (job["id"],)).fetchall()
    assert rows == [(source.total, "lab")]


def test_blocked_pull_does_not_start(
    lab: Lab, source: SourceData, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_lab_config(
        lab,
        tmp_path / "lm.toml",
        tmp_path / "state",
        extra='\n[egress]\nper_transfer_limit_usd = 0.0000001\naction = "block"\n',
    )
    rc = cli_main(
        [
            "--config",
            str(cfg),
            "pull",
            source.url,
            "pulls/blocked",
            "--node",
            "node-01",
            "--yes",
            "--allow-over-budget",
            "please",
        ]
    )
    assert rc == 2
    assert "blocks this pull" in capsys.readouterr().err
    assert not (lab.node("node-01").scratch / "pulls/blocked").exists()
