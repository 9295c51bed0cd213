"""The restart point: the newest step proven resumable (a real DCP step with model and AdamW),
never one that is in flight or corrupt, and no pick at all without a proof."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from backend.config import parse_config
from backend.ops import Operations
from backend.services import Services
from tests.checkpoints.conftest import tiny_full_dcp
from tui.cli import main

__all__ = ["tiny_full_dcp"]


def services(tmp_path: Path) -> Services:
    raw = {"nodes": [{"name": "here", "transport": "local"}], "state": {"dir": str(tmp_path / "state")}}
    return Services(parse_config(raw, file="t.toml", base=tmp_path))


def test_newest_proven_step_and_steps_lost(tmp_path: Path, tiny_full_dcp, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    src, _ = tiny_full_dcp
    run = tmp_path / "run1"
    shutil.copytree(src, run / "step-10")
    shutil.copytree(src, run / "step-20")
    (run / "step-20" / ".metadata").unlink()  # in flight: no commit marker
    svc = services(tmp_path)
    report = asyncio.run(Operations(svc).triage.run(nodes=["here"], source="ssh", run=str(run)))
    ck = report.checkpoint
    assert ck is not None and ck["step"] == 10 and ck["proof"] == "verified" and ck["steps_lost_at_least"] == 10
    assert [u["step"] for u in ck["newer_unusable"]] == [20] and ck["path"] == "step-10"
    cfg = tmp_path / "lm.toml"
    cfg.write_text(f'[[nodes]]\nname = "here"\ntransport = "local"\n[state]\ndir = "{tmp_path / "state"}"\n')
    assert main(["--config", str(cfg), "triage", "--nodes", "here", "--run", str(run), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["checkpoint"]["step"] == 10 and doc["suspects"] == []
    assert main(["--config", str(cfg), "triage", "--nodes", "here", "--run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "restart from step 10" in out and "at least 10 steps lost since" in out and "not usable:" in out


def test_no_proof_no_pick(tmp_path: Path, tiny_full_dcp) -> None:  # type: ignore[no-untyped-def]
    src, _ = tiny_full_dcp
    run = tmp_path / "run2"
    shutil.copytree(src, run / "step-30")
    shard = next(p for p in (run / "step-30").iterdir() if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:-40])  # a truncated shard: its marker no longer matches
    report = asyncio.run(Operations(services(tmp_path)).triage.run(nodes=["here"], source="ssh", run=str(run)))
    ck = report.checkpoint
    assert ck is not None and ck["step"] is None and "no proof, no pick" in ck["why"]
    assert ck["newer_unusable"] and ck["newer_unusable"][0]["step"] == 30


def test_restage_command_pulls_the_pick_to_the_nodes_that_resume() -> None:
    from backend.triage.restart import restage_command

    ck = {"url": "s3://ckpt/llama/run7", "step": 4800, "path": "step-4800"}
    assert restage_command(ck, ["node-01", "node-03"]) == (
        "loadmaster restage s3://ckpt/llama/run7 --nodes node-01,node-03"
    )
    assert restage_command({**ck, "step": None}, ["node-01"]) is None
    assert restage_command({**ck, "url": "/data/run7"}, ["node-01"]) is None
    assert restage_command(ck, []) is None
