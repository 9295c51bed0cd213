"""``loadmaster egress`` end to end through tui.cli.main, with a real state DB under tmp_path."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from backend.config import load_config
from backend.ledger import EgressGuard
from backend.state import SQLiteState
from tui.cli import main

CONFIG = """
[[nodes]]
name = "gpu-01"
transport = "local"
site = "coreweave:us-east-04"

[stores.datasets]
url = "s3://datasets/laion"
provider = "aws"
region = "us-east-1"

[egress]
budgets = { datasets = 500 }
action = "{action}"
"""


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    def write(action: str = "confirm") -> Path:
        p = tmp_path / "loadmaster.toml"
        p.write_text(CONFIG.replace("{action}", action) + f'\n[state]\ndir = "{tmp_path / "state"}"\n')
        monkeypatch.setenv("LOADMASTER_CONFIG", str(p))
        return p

    return write


def test_estimate_json_brief_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "egress",
            "estimate",
            "--bytes",
            "40TB",
            "--runs",
            "5",
            "--source",
            "aws:us-east-1",
            "--dest",
            "coreweave:us-east-04",
            "--nodes",
            "16",
            "--per-node",
            "sharded",
            "--objects",
            "500e6",
            "--json",
        ]
    )
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["bytes_out"] == 200 * 10**12
    assert d["egress_usd"] == pytest.approx(13_791) and d["requests_usd"] == pytest.approx(1_000)
    assert d["total_usd"] == pytest.approx(14_791)
    keys = [a["key"] for a in d["alternatives"]]
    assert keys == ["shards", "r2-read", "r2-replicate"]
    assert d["alternatives"][2]["break_even_month"] == 1


def test_estimate_text_and_bad_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "egress",
                "estimate",
                "--bytes",
                "40TB",
                "--runs",
                "5",
                "--source",
                "s3:us-east-1",
                "--dest",
                "coreweave:us-east-04",
                "--nodes",
                "16",
                "--per-node",
                "full",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "$163,791.00" in out and "3.2 PB" in out and "nodes read disjoint shards" in out
    with pytest.raises(SystemExit) as exc:
        main(["egress", "estimate", "--bytes", "40 TX", "--source", "aws:us-east-1", "--dest", "x:y"])
    assert exc.value.code == 2
    assert "size like 40TB" in capsys.readouterr().err


def test_quote_block_confirm_override_and_report(cfg, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    cfg("block")
    assert main(["egress", "quote", "--store", "datasets", "--node", "gpu-01", "--bytes", "10TB"]) == 3
    out = capsys.readouterr().out
    assert "BLOCK" in out and "$891.00" in out and "$500.00" in out
    cfg("confirm")
    assert main(["egress", "quote", "--store", "datasets", "--node", "gpu-01", "--bytes", "10TB"]) == 3
    assert "CONFIRM" in capsys.readouterr().out
    assert (
        main(
            [
                "egress",
                "quote",
                "--store",
                "datasets",
                "--node",
                "gpu-01",
                "--bytes",
                "10TB",
                "--allow-over-budget",
                "deadline",
                "--json",
            ]
        )
        == 0
    )
    d = json.loads(capsys.readouterr().out)
    assert d["action"] == "allow" and d["override_reason"] == "deadline" and d["audit_id"]
    config = load_config()
    db = SQLiteState(config.state_dir() / "state.sqlite3")
    (audit,) = db.audit_entries(action="egress.override")
    assert audit.reason == "deadline"
    # A finished transfer in the ledger shows up in the report.
    EgressGuard(config, db).record_transfer(
        config.store("datasets"), "coreweave:us-east-04", 2 * 10**12, job_id="pull-7", when=datetime.now(UTC)
    )
    db.close()
    assert main(["egress", "report", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    (route,) = rep["routes"]
    assert route["bytes"] == 2 * 10**12 and route["usd"] == pytest.approx(1_900 * 0.09)
    assert route["route"] == "datasets (aws:us-east-1) -> coreweave:us-east-04"
    assert main(["egress", "report"]) == 0
    assert "datasets (aws:us-east-1) -> coreweave:us-east-04" in capsys.readouterr().out


def test_unknown_store_is_one_line_error(cfg, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    cfg()
    assert main(["egress", "quote", "--store", "nope", "--dest", "aws:us-east-1", "--bytes", "1TB"]) == 2
    err = capsys.readouterr().err
    assert "no store named 'nope'" in err and "Traceback" not in err


def test_prices_lists_sources(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["egress", "prices", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"aws", "gcp", "azure", "cloudflare-r2", "backblaze-b2"} <= set(d["providers"])
    assert d["providers"]["azure"]["confirmed"] is False
