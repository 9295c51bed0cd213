"""Pulls pass the egress guard before launch and land in the ledger when they succeed."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from lab import Lab
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


def test_jobs_found_by_another_state_database_are_shown_as_foreign_and_never_recorded_there(
    lab: Lab, source: SourceData, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Console A launches (and settles) a pull; console B, with its own state, lists the node's
    # jobs: it shows A's job as foreign (its database never launched it) and writes nothing of it
    # (the $5,000 ledger of "3 pulls" came from adopting every job on the nodes).
    mine = write_lab_config(lab, tmp_path / "a.toml", tmp_path / "state-a")
    other = write_lab_config(lab, tmp_path / "b.toml", tmp_path / "state-b")
    args = ["--config", str(mine), "pull", source.url, "pulls/adopted", "--node", "node-01", "--yes", "--json"]
    assert cli_main(args) == 0
    [job] = json.loads(capsys.readouterr().out)["jobs"]
    assert job["state"] == "succeeded"
    for _ in range(2):  # twice: a second look records nothing either
        assert cli_main(["--config", str(other), "jobs", "--json", "--limit", "100000"]) == 0
        rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
        assert rows[job["id"]]["state"] == "foreign"
        assert "no job with this id was launched through this state database" in rows[job["id"]]["foreign"]
        assert rows[job["id"]]["launched_by"] == "?"  # never the node's word
    b = sqlite3.connect(tmp_path / "state-b" / "state.sqlite3")
    assert b.execute("SELECT COUNT(*) FROM egress_ledger").fetchone() == (0,)
    assert b.execute("SELECT COUNT(*) FROM jobs").fetchone() == (0,)
    assert b.execute("SELECT COUNT(*) FROM job_events").fetchone() == (0,)
    a = sqlite3.connect(tmp_path / "state-a" / "state.sqlite3")
    assert a.execute("SELECT bytes, state FROM egress_ledger WHERE job_id = ?", (job["id"],)).fetchall() == [
        (source.total, "settled")
    ]
    # A's own database recorded the digest of the spec it sent and the store.
    assert a.execute("SELECT length(spec_digest), store FROM jobs WHERE id = ?", (job["id"],)).fetchall() == [
        (64, "lab")
    ]


def test_detached_pulls_count_against_the_budget_from_their_launch(
    lab: Lab, source: SourceData, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each pull costs ~$2.55 at $100/GB; the budget holds two. Launched detached, one after
    # another, with no console watching them end: the third is refused at launch.
    cost = source.total / 1e9 * 100
    cfg = write_lab_config(
        lab,
        tmp_path / "lm.toml",
        tmp_path / "state",
        "\n[prices.providers.aws]\ninternet_tiers = [{usd_per_gb = 100.0}]\n"
        f'\n[egress]\nbudgets = {{ lab = {2.5 * cost:.4f} }}\naction = "block"\n',
    )
    launched = []
    for i in range(3):
        rc = cli_main(
            ["--config", str(cfg), "pull", source.url, f"pulls/detached-{i}", "--node", "node-01", "--yes", "--detach"]
        )
        out, err = capsys.readouterr()
        launched.append(rc)
    assert launched == [0, 0, 2]
    assert "blocks this pull" in err and "spent" in err
    assert not (lab.node("node-01").scratch / "pulls/detached-2").exists()
    db = sqlite3.connect(tmp_path / "state" / "state.sqlite3")
    assert db.execute("SELECT COUNT(*) FROM egress_ledger WHERE state = 'reserved'").fetchone() == (2,)
