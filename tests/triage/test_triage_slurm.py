"""``loadmaster triage --job`` on a real Slurm job (tests/slurm_fixtures.py: slurmctld and slurmd
22.05 on loopback) whose nodes are the lab's sshd nodes of the same names, with the stand-in
nvidia-smi's faults; through the command line, text and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import Lab
from lab.slurm import SlurmLab
from tests.checkpoints.conftest import tiny_full_dcp
from tests.slurm_fixtures import job_state, slurm, slurm_lab, wait_for
from tests.triage.test_triage_lab import faults
from tui.cli import main

__all__ = ["slurm", "slurm_lab", "tiny_full_dcp"]

pytestmark = [pytest.mark.timeout(180)]


def config(tmp_path: Path, lab: Lab, sl: SlurmLab) -> str:
    cfg = tmp_path / "lm.toml"
    cfg.write_text(lab.config_text(f'\n[slurm]\nenabled = true\nconf = "{sl.conf}"\ninterval = "30s"\n'))
    return str(cfg)


def test_job_triage_names_the_suspect_and_prints_exclude(
    lab: Lab, slurm: SlurmLab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = slurm.sbatch("-N", "2", "-w", "node-01,node-02", "--gres=gpu:2", "-J", "train")
    cfg = config(tmp_path, lab, slurm)
    wait_for(f"job {job} running", lambda: job_state(slurm, job) == "RUNNING")
    assert main(["--config", cfg, "triage", "--job", job]) == 0
    out = capsys.readouterr().out
    assert "no suspects" in out and "--exclude" not in out
    with faults(lab, "node-02", faults={"1": {"remap_pending": True, "ecc_uncorrected": 2}}):
        assert main(["--config", cfg, "triage", "--job", job]) == 0
        text = capsys.readouterr().out
        assert main(["--config", cfg, "triage", "--job", job, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
    assert "1. node-02 (GPUs 1)" in text and "  --exclude=node-02" in text
    assert "loadmaster drain node-02 --reason" in text
    assert doc["job"] == job and [s["node"] for s in doc["suspects"]] == ["node-02"]
    assert doc["suspects"][0]["gpus"] == [1]
    assert {e["kind"] for e in doc["suspects"][0]["evidence"]} == {"remap-pending", "ecc-uncorrected"}
    assert doc["commands"][0] == "--exclude=node-02"
    nodes = {n["node"]: n for n in doc["nodes"]}
    assert nodes["node-01"]["slurm_state"] in ("mixed", "allocated") and nodes["node-01"]["expected_gpus"] == 4


def test_drained_node_that_passes_gets_the_resume_command(
    lab: Lab, slurm: SlurmLab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slurm.command(["scontrol", "update", "NodeName=node-01", "State=DRAIN", "Reason=test"])
    cfg = config(tmp_path, lab, slurm)
    assert main(["--config", cfg, "triage", "--nodes", "node-01,node-02", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["suspects"] == [] and doc["commands"] == ["loadmaster resume node-01"]


def test_one_line_errors(lab: Lab, slurm: SlurmLab, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(tmp_path, lab, slurm)
    assert main(["--config", cfg, "triage", "--job", "999999"]) == 2
    err = capsys.readouterr().err.strip()
    assert "999999" in err and "\n" not in err and "Traceback" not in err
    assert main(["--config", cfg, "triage", "--nodes", "node-[01-"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--nodes" in err and "\n" not in err


def test_goodput_of_a_requeued_job_from_slurm_and_the_catalog(  # type: ignore[no-untyped-def]
    lab: Lab, slurm: SlurmLab, tmp_path: Path, tiny_full_dcp, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job Slurm requeued once (its restart count: one failure) and a run folder of four proven
    DCP steps written 100 s apart but for one 400 s gap: goodput 50%, MTBF 600 s, Young/Daly from
    the steps' write spans, each figure checked against the arithmetic."""
    import math
    import os
    import shutil

    # Submitted first: slurmctld starts it on its next pass (up to a second), while the run is built.
    job = slurm.sbatch("-N", "1", "-w", "node-01", "--requeue", "-J", "train")
    src, _ = tiny_full_dcp
    run = tmp_path / "run"
    t0 = 1_700_000_000.0
    for step, at in ((10, t0), (20, t0 + 100), (30, t0 + 200), (40, t0 + 600)):
        shutil.copytree(src, run / f"step-{step}")
        files = sorted(p for p in (run / f"step-{step}").rglob("*") if p.is_file())
        for j, p in enumerate(files):  # written 2 s apart, the newest at `at`
            os.utime(p, (at - 2 * (len(files) - 1 - j), at - 2 * (len(files) - 1 - j)))
    span = 2.0 * (len(files) - 1)
    wait_for(f"job {job} running", lambda: job_state(slurm, job) == "RUNNING")
    slurm.command(["scontrol", "requeue", job])
    # Slurm holds a requeued job back for the job credential's lifetime before it runs again: the
    # lab's slurm.conf makes that seconds (AuthInfo=cred_expire), not the default two minutes.
    wait_for(f"job {job} back to running", lambda: job_state(slurm, job) == "RUNNING", timeout=90)
    cfg = config(tmp_path, lab, slurm)
    assert main(["--config", cfg, "triage", "--job", job, "--run", str(run), "--json"]) == 0
    g = json.loads(capsys.readouterr().out)["goodput"]
    assert g["failures"] == 1 and job in g["failures_from"], g
    assert g["wall_s"] == 600 and g["sec_per_step"] == 10 and g["steps_kept"] == 30 and g["steps_lost"] == 0
    assert g["goodput"] == pytest.approx(0.5) and g["mtbf_s"] == 600 and not g["mtbf_at_least"]
    assert g["save_s"] == span and g["interval_s"] == 100
    assert g["young_daly_s"] == pytest.approx(math.sqrt(2 * span * 600)) and g["missing"] == []
    assert main(["--config", cfg, "triage", "--nodes", "node-01", "--run", str(run)]) == 0
    text = capsys.readouterr().out
    assert "goodput 50%" in text and "missing: failures: no Slurm job given (--job)" in text
