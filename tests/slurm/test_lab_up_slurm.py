"""``loadmaster lab up --slurm``: the lab's sshd nodes are also Slurm nodes (slurmctld + one slurmd
each), the printed console line carries ``SLURM_CONF`` so sinfo works by hand beside it, the lab's
config has ``[slurm] enabled``, a real batch job runs on a lab node, and ``lab down`` stops Slurm
with the rest."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from lab.slurm import find_slurm
from tests.slurm_fixtures import wait_for
from tui.cli import main

pytestmark = [pytest.mark.lab, pytest.mark.timeout(240)]


def _pids_alive(root: Path) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if str(root).encode() in (d / "cmdline").read_bytes():
                    state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z":
                        out.append(int(d.name))
            except (OSError, IndexError):
                continue
    return out


def test_lab_up_slurm_then_down(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "lab"
    assert main(["lab", "up", "--dir", str(root), "--nodes", "2", "--no-seed", "--slurm"]) == 0
    try:
        out = capsys.readouterr().out.strip().splitlines()[-1]
        words = dict(w.split("=", 1) for w in shlex.split(out) if "=" in w and not w.startswith("-"))
        conf = words["SLURM_CONF"]
        assert Path(conf).exists() and "[slurm]\nenabled = true" in (root / "loadmaster.toml").read_text()
        env = {**os.environ, "SLURM_CONF": conf}
        nodes = subprocess.run(
            [find_slurm("sinfo"), "-h", "-N", "-o", "%N %T"], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        assert nodes == ["node-01", "idle", "node-02", "idle"]
        job = subprocess.run(
            [find_slurm("sbatch"), "--parsable", "-w", "node-02", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 300"],
            env=env, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        squeue = [find_slurm("squeue"), "-h", "-j", job, "-o", "%T"]
        wait_for(
            "the job running",
            lambda: subprocess.run(squeue, env=env, capture_output=True, text=True).stdout.strip() == "RUNNING",
        )
        assert main(["--config", str(root / "loadmaster.toml"), "slurm", "jobs", "--node", "node-02"]) == 0
        row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(f"{job} "))
        assert "RUNNING" in row and "node-02(0)" in row
    finally:
        assert main(["lab", "down", "--dir", str(root)]) == 0
    assert not (root / "slurm.json").exists()
    assert _pids_alive(root / "slurm") == []
