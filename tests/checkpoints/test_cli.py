"""The ``loadmaster ckpt`` and ``loadmaster upload`` commands, against local dirs and the lab."""

from __future__ import annotations

import asyncio
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from backend.checkpoints.footprint import footprint, upload_backlog
from backend.config import load_config_file
from backend.services import Services
from lab import Lab
from tests.helpers import write_lab_config
from tui.cli import main


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_size_footprint(capsys: pytest.CaptureFixture[str]) -> None:
    d = run_json(capsys, ["ckpt", "size", "--params", "70e9", "--retained", "4"])
    assert d["weights_bytes"] == 140 * 10**9 and d["full_bytes"] == 980 * 10**9
    assert round(d["saving_fraction"], 3) == 0.857 and d["retained_full_bytes"] == 4 * 980 * 10**9
    assert main(["ckpt", "size", "--params", "8B"]) == 0
    out = capsys.readouterr().out
    assert "16.0 GB (14.9 GiB)" in out and "112.0 GB (104.3 GiB)" in out and "85.7%" in out
    assert footprint(1e9, 0).retained_full_bytes == 0


def test_list_strip_inspect_local(
    tmp_path: Path, tiny_full_dcp: tuple[Path, dict], capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_full_dcp[0], run / "step-10")
    shutil.copytree(tiny_full_dcp[0], run / "step-9")
    (run / "step-9" / ".metadata").unlink()
    d = run_json(capsys, ["ckpt", "list", str(run)])
    assert [(s["step"], s["kind"], s["has_bf16_export"]) for s in d["steps"]] == [
        (9, "incomplete", False),
        (10, "full", False),
    ]
    assert main(["ckpt", "list", str(run)]) == 0
    table = capsys.readouterr().out
    assert "STEP" in table and "incomplete" in table and "by kind" in table
    r = run_json(capsys, ["ckpt", "strip", str(run / "step-10"), "--max-shard-size", "8KB"])
    assert r["verified"] and len(r["shards"]) > 1
    got = {}
    for s in r["shards"]:
        got.update(load_file(str(run / "step-10" / s)))
    assert all(torch.equal(got[k], v.to(torch.bfloat16)) for k, v in tiny_full_dcp[1].items())
    d = run_json(capsys, ["ckpt", "list", str(run)])
    assert d["steps"][1]["has_bf16_export"]
    ins = run_json(capsys, ["ckpt", "inspect", str(run / "step-10")])
    names = {t["name"]: t for t in ins["tensors"]}
    assert names["norm.weight"]["dtype"] == "BF16" and names["model.norm.weight"]["dtype"] == "float32"
    assert any(n.startswith("optim.state.") for n in names)
    # inspecting the in-flight step says why it has no keys yet, instead of an empty table
    ins9 = run_json(capsys, ["ckpt", "inspect", str(run / "step-9")])
    assert ins9["tensors"] == [] and any("no .metadata yet: the step is incomplete" in p for p in ins9["problems"])
    # refusing an in-flight step is one clear line, exit 2
    assert main(["ckpt", "strip", str(run / "step-9")]) == 2
    assert capsys.readouterr().err == (
        f"loadmaster: error: {run}/step-9: still being written (no .metadata yet: "
        "DCP writes it last); wait for it to finish or pick another step\n"
    )
    # a run folder given where a step is expected names its steps (it said "incomplete" before)
    assert main(["ckpt", "strip", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"loadmaster: error: {run} is a run folder (") and f"e.g. {run}/step-10" in err
    # inspecting one file of a step reads that file
    ins_file = run_json(capsys, ["ckpt", "inspect", str(run / "step-10" / r["shards"][0])])
    assert ins_file["tensors"] and all(t["dtype"] == "BF16" for t in ins_file["tensors"])
    assert main(["--readonly", "ckpt", "strip", str(run / "step-10")]) == 2
    assert "read-only" in capsys.readouterr().err


def test_upload_and_list_in_lab_store(
    lab: Lab, tmp_path: Path, tiny_full_dcp: tuple[Path, dict], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = str(write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state"))
    run = f"run-{tmp_path.name[-8:]}"
    r = run_json(capsys, ["--config", cfg, "upload", str(tiny_full_dcp[0]), f"lab/{run}/step-10"])
    assert r["objects"] == 2
    d = run_json(capsys, ["--config", cfg, "ckpt", "list", f"lab/{run}"])
    assert [(s["step"], s["layout"], s["kind"]) for s in d["steps"]] == [(10, "dcp", "full")]
    # strip straight from the object store (ranged reads) into the same step folder
    r = run_json(capsys, ["--config", cfg, "ckpt", "strip", f"lab/{run}/step-10"])
    assert r["verified"] and r["out_url"].startswith("s3://")
    d = run_json(capsys, ["--config", cfg, "ckpt", "list", f"lab/{run}"])
    assert d["steps"][0]["has_bf16_export"]
    assert main(["--config", cfg, "ckpt", "list", "s3://no-such-bucket-lm/x"]) == 2
    assert "no-such-bucket-lm" in capsys.readouterr().err


def test_upload_as_durable_job_on_node(
    lab: Lab, tmp_path: Path, tiny_full_dcp: tuple[Path, dict], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state")
    step = tmp_path / "nvme" / "step-48000"
    shutil.copytree(tiny_full_dcp[0], step)
    (step / "__1_0.distcp").write_bytes(b"x" * (6 * 1024 * 1024))
    run = f"jobrun-{tmp_path.name[-8:]}"
    assert (
        main(
            [
                "--config",
                str(cfg),
                "upload",
                str(step),
                f"lab/{run}/step-48000",
                "--node",
                "node-01",
                "--part-size",
                "5MiB",
                "--step",
                "48000",
            ]
        )
        == 0
    )
    job_id = capsys.readouterr().out.strip()

    async def wait() -> Any:
        svc = Services(config=load_config_file(cfg))
        try:
            rec = await svc.jobs.wait(job_id, timeout=180)
            from backend.checkpoints.catalog import list_checkpoints

            store = svc.stores.open("lab")
            async with store:
                cat = await list_checkpoints(store, run)
            return rec, cat
        finally:
            await svc.aclose()

    rec, cat = asyncio.run(wait())
    assert rec.state == "succeeded", rec.error
    assert rec.result["objects"] == 3 and rec.progress.extra.get("step") == 48000
    assert [(s.step, s.kind) for s in cat.steps] == [(48000, "full")]
    # the 6 MiB rank file above is not a real tensor file, so strip a real step uploaded beside it
    assert main(["--config", str(cfg), "upload", str(tiny_full_dcp[0]), f"lab/{run}/step-10"]) == 0
    capsys.readouterr()
    assert main(["--config", str(cfg), "ckpt", "strip", f"lab/{run}/step-10", "--node", "node-01"]) == 0
    job_id = capsys.readouterr().out.strip()
    rec, cat = asyncio.run(wait())
    assert rec.state == "succeeded", rec.error
    assert rec.result["verified"] and rec.kind == "strip"
    assert [(s.step, s.has_bf16_export) for s in cat.steps] == [(10, True), (48000, False)]
    secret = lab.s3.secret_key if lab.s3 else "unused"
    assert secret not in Path(rec.job_dir or "", "log").read_text()
    assert secret not in Path(rec.job_dir or "", "spec.json").read_text()


@dataclass
class Rec:
    id: str
    node: str
    created: float
    state: str = "running"
    kind: str = "upload"
    started: float | None = None
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.state in ("succeeded", "failed", "cancelled", "lost")


def test_upload_backlog_alert() -> None:
    dest = "s3://b/run1/step-{}"
    recs = [
        Rec("a", "n1", 0.0, "succeeded", params={"dest": dest.format(100), "step": 100}),
        Rec("b", "n1", 600.0, "succeeded", params={"dest": dest.format(200), "step": 200}),
        Rec("c", "n1", 1200.0, params={"dest": dest.format(300), "step": 300}),
    ]
    assert upload_backlog(recs, now=1500.0) == []  # running 300 s of a 600 s interval: fine
    alerts = upload_backlog(recs, now=1900.0)
    assert [(a.run, a.step, a.interval_s) for a in alerts] == [("s3://b/run1", 300, 600.0)]
    assert "falling behind" in alerts[0].message
    assert upload_backlog(recs, now=1500.0, interval_s=200.0)[0].step == 300
    # two uploads of the same run in flight is a backlog whatever the age
    recs.append(Rec("d", "n1", 1800.0, params={"dest": dest.format(400), "step": 400}))
    assert upload_backlog(recs, now=1810.0, interval_s=10_000.0)[0].in_flight == 2
