"""``loadmaster slurm nodes|jobs``, ``drain`` and ``resume`` against the real slurmctld and slurmd
(tests/slurm_fixtures.py): the table and --json with a real job's GPU indices, the shown
``scontrol`` command before a drain, the evidence before a resume, and one-line errors (exit 2)
for read-only mode, no confirmation, an unknown node and a refused resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lab.slurm import SlurmLab
from tests.slurm_fixtures import job_state, node_state, wait_for
from tui.cli import main

pytestmark = [pytest.mark.timeout(180)]


def write_config(tmp_path: Path, lab: SlurmLab) -> str:
    cfg = tmp_path / "lm.toml"
    cfg.write_text(
        '[[nodes]]\nname = "node-01"\nhost = "127.0.0.1"\ntransport = "local"\n\n'
        '[[nodes]]\nname = "node-02"\nhost = "127.0.0.1"\ntransport = "local"\n\n'
        '[[nodes]]\nname = "node-03"\nhost = "127.0.0.1"\nport = 1\n\n'
        f'[state]\ndir = "{tmp_path / "state"}"\n\n'
        f'[slurm]\nenabled = true\nconf = "{lab.conf}"\n'
    )
    return str(cfg)


def one_line_error(err: str, needle: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loadmaster: error: ") and needle in lines[0], err
    assert "Traceback" not in err


@pytest.fixture
def quiet_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in nvidia-smi (no compute processes, no remap, no ECC) and dmesg (no Xid) on PATH."""
    b = tmp_path / "gpu-bin"
    b.mkdir()
    (b / "nvidia-smi").write_text(
        '#!/bin/sh\ncase "$1" in --query-gpu=*) printf "0, No, 0, 0\\n1, No, 0, 0\\n2, No, 0, 0\\n3, No, 0, 0\\n" ;; esac\n'
    )
    (b / "dmesg").write_text("#!/bin/sh\necho '[    0.000000] Linux version 6.1'\n")
    for f in b.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{b}:{os.environ['PATH']}")


def test_nodes_and_jobs_table_and_json(slurm: SlurmLab, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, slurm)
    job = slurm.sbatch("-w", "node-02", "--gres=gpu:3", "-J", "pretrain")
    wait_for("job running", lambda: job_state(slurm, job) == "RUNNING")
    assert main(["--config", cfg, "slurm", "nodes"]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("node-02"))
    assert f"{job}:" in row and "(0-2)" in row and " gpu " in row
    assert "3 node(s): 0 drained, draining or down" in out
    assert main(["--config", cfg, "slurm", "nodes", "--json"]) == 0
    docs = {d["name"]: d for d in map(json.loads, capsys.readouterr().out.splitlines())}
    assert docs["node-02"]["jobs"][0]["gpus"] == [0, 1, 2] and docs["node-02"]["jobs"][0]["name"] == "pretrain"
    assert main(["--config", cfg, "slurm", "jobs", "--node", "node-02", "--json"]) == 0
    (doc,) = map(json.loads, capsys.readouterr().out.splitlines())
    assert doc["id"] == job and doc["gpus"] == {"node-02": [0, 1, 2]} and doc["state"] == "RUNNING"


def test_drain_shows_the_command_then_resume_on_evidence(
    slurm: SlurmLab, tmp_path: Path, capsys: pytest.CaptureFixture[str], quiet_gpus: None
) -> None:
    cfg = write_config(tmp_path, slurm)
    assert main(["--config", cfg, "drain", "node-[01-02]", "--reason", "pcie aer storm", "--yes"]) == 0
    out = capsys.readouterr().out
    assert (
        "will run:\n  scontrol update NodeName=node-01,node-02 State=DRAIN 'Reason=pcie aer storm | loadmaster:" in out
    )
    assert node_state(slurm, "node-01") == "drained" and node_state(slurm, "node-02") == "drained"
    assert main(["--config", cfg, "slurm", "nodes"]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("node-01"))
    assert "drained" in row and "pcie aer storm | loadmaster:" in row and " ago)" in row
    assert main(["--config", cfg, "resume", "node-01", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "node-01: ok   gpu processes: none" in out and "node-01: ok   xid: none since the drain" in out
    assert "  scontrol update NodeName=node-01 State=RESUME" in out
    wait_for("node-01 idle", lambda: node_state(slurm, "node-01") == "idle")
    assert node_state(slurm, "node-02") == "drained"


def test_gpus_of_a_node_map_processes_to_jobs(
    slurm: SlurmLab, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    info = tmp_path / "pid"
    job = slurm.sbatch(
        "-w", "node-01", "--gres=gpu:1", script=f"echo $$ > {info}.tmp; mv {info}.tmp {info}; exec sleep 600"
    )
    wait_for("the job's pid", info.exists)
    pid = info.read_text().strip()
    b = tmp_path / "gpu-bin"
    b.mkdir()
    (b / "nvidia-smi").write_text(
        '#!/bin/sh\ncase "$1" in\n'
        '  --query-gpu=index,uuid) printf "0, GPU-0\\n1, GPU-1\\n" ;;\n'
        f'  --query-compute-apps=*) printf "{pid}, GPU-1\\n" ;;\nesac\n'
    )
    (b / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{b}:{os.environ['PATH']}")
    cfg = write_config(tmp_path, slurm)
    assert main(["--config", cfg, "slurm", "gpus", "node-01", "--json"]) == 0
    (doc,) = map(json.loads, capsys.readouterr().out.splitlines())
    assert doc == {"gpu": 1, "pid": int(pid), "job": job, "via": "environ"}
    assert main(["--config", cfg, "slurm", "gpus", "node-03"]) == 2  # nobody answers there
    one_line_error(capsys.readouterr().err, "node-03")


def test_one_line_errors(slurm: SlurmLab, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, slurm)
    assert main(["--config", cfg, "--readonly", "drain", "node-02", "--reason", "x", "--yes"]) == 2
    one_line_error(capsys.readouterr().err, "read-only mode: cannot drain Slurm nodes")
    assert main(["--config", cfg, "--readonly", "resume", "node-02", "--yes"]) == 2
    one_line_error(capsys.readouterr().err, "read-only mode: cannot resume Slurm nodes")
    assert main(["--config", cfg, "drain", "node-02", "--reason", "x"]) == 2  # stdin is no terminal
    one_line_error(capsys.readouterr().err, "not confirmed: pass --yes")
    assert node_state(slurm, "node-02") == "idle"
    assert main(["--config", cfg, "drain", "node-09", "--reason", "x", "--yes"]) == 2
    one_line_error(capsys.readouterr().err, "Slurm has no node 'node-09'")
    assert main(["--config", cfg, "drain", "node-[01", "--reason", "x", "--yes"]) == 2
    one_line_error(capsys.readouterr().err, "cannot expand hostlist")
    slurm.command(["scontrol", "update", "NodeName=node-03", "State=DRAIN", "Reason=by hand"])
    assert main(["--config", cfg, "resume", "node-03", "--yes"]) == 2
    one_line_error(capsys.readouterr().err, "resume refused: node-03: reachable:")
    assert node_state(slurm, "node-03") == "drained"
