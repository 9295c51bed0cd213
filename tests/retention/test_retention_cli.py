"""``loadmaster retention plan|apply`` and ``loadmaster audit`` on a real local DCP run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from retention_helpers import DcpRun  # type: ignore[import-not-found]

from tui.cli import main


@pytest.fixture
def cfg(tmp_path: Path) -> str:
    p = tmp_path / "loadmaster.toml"
    p.write_text('[[nodes]]\nname = "here"\ntransport = "local"\n\n[retention]\nkeep_full_latest = 3\n')
    return str(p)


def test_plan_apply_audit_round_trip(
    tmp_path: Path, cfg: str, dcp_run: DcpRun, capsys: pytest.CaptureFixture[str]
) -> None:
    root = dcp_run.copy_to(tmp_path / "run1")
    plan_file = tmp_path / "plan.json"
    rc = main(
        [
            "--config",
            cfg,
            "retention",
            "plan",
            str(root),
            "--keep-full",
            "2",
            "--milestones",
            "4000,8000",
            "--pin",
            "3000:eval baseline",
            "--out",
            str(plan_file),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "strip-to-weights" in out and "pinned: eval baseline" in out and "local store" in out
    plan = json.loads(plan_file.read_text())
    acts = {a["step"]: a["action"] for a in plan["actions"]}
    assert acts[3000] == "keep-full" and acts[4000] == "strip-to-weights" and acts[2000] == "delete"
    assert acts[10000] == "delete" and acts[11000] == "keep-full"  # --keep-full beat the config's 3
    assert plan["totals"]["bytes_saved"] > 0 and len(plan["hash"]) == 64

    # without --yes nothing is deleted
    assert main(["--config", cfg, "retention", "apply", str(plan_file)]) == 2
    err = capsys.readouterr().err
    assert "add --yes" in err and "Traceback" not in err
    assert (root / "step-1000" / ".metadata").exists()

    assert main(["--config", cfg, "retention", "apply", str(plan_file), "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["dry_run"] and {a["outcome"] for a in dry["actions"]} == {"would-do", "kept"}
    assert (root / "step-1000" / ".metadata").exists()

    assert main(["--config", cfg, "retention", "apply", str(plan_file), "--yes"]) == 0
    out = capsys.readouterr().out
    assert "applied plan" in out and "audit record #" in out
    assert not (root / "step-1000").exists() and (root / "step-3000" / ".metadata").exists()
    assert (root / "step-4000" / "model.safetensors.index.json").exists()
    assert not (root / "step-4000" / ".metadata").exists()

    assert main(["--config", cfg, "audit", "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert entries[0]["action"] == "retention.apply" and entries[0]["plan_hash"] == plan["hash"]
    assert main(["--config", cfg, "audit"]) == 0
    assert "retention.apply" in capsys.readouterr().out


def test_edited_plan_and_bad_flags_are_clear_errors(
    tmp_path: Path, cfg: str, dcp_run: DcpRun, capsys: pytest.CaptureFixture[str]
) -> None:
    root = dcp_run.copy_to(tmp_path / "run1")
    plan_file = tmp_path / "plan.json"
    assert main(["--config", cfg, "retention", "plan", str(root), "--out", str(plan_file), "--json"]) == 0
    capsys.readouterr()
    plan_file.write_text(plan_file.read_text().replace('"delete"', '"keep-full"', 1))
    assert main(["--config", cfg, "retention", "apply", str(plan_file), "--yes"]) == 2
    assert "hash does not match" in capsys.readouterr().err
    assert main(["--config", cfg, "retention", "plan", str(root), "--min-age", "soon"]) == 2
    assert "--min-age" in capsys.readouterr().err
    assert main(["--config", cfg, "retention", "plan", str(root), "--pin", "latest"]) == 2
    assert "STEP[:REASON]" in capsys.readouterr().err
    assert main(["--config", cfg, "--readonly", "retention", "apply", str(tmp_path / "nope.json"), "--yes"]) == 2
    assert "cannot read the plan file" in capsys.readouterr().err
