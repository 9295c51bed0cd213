"""End to end, at 80x24: ``loadmaster lab up --slurm`` (the lab's sshd nodes are real Slurm 22.05
nodes), a real batch job on node-01, an Xid in node-01's kernel log (the lab's stand-in dmesg),
then in the console: the Xid on node-01's row, ``d`` from Fleet, the reason, the exact scontrol
command shown, confirm, the node shows ``draining`` while the job runs, and ``drained`` once the
job ends by itself. Every assertion reads the captured screen; Slurm's own ``sinfo`` agrees.

``lab up --slurm`` itself is held to what it promises on the way: the printed console line
carries ``SLURM_CONF`` so sinfo works by hand beside it, the lab's config has ``[slurm]
enabled``, both nodes start idle, ``loadmaster slurm jobs`` shows the batch job, and ``lab
down`` stops Slurm with the rest (no process of it left).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lab.slurm import find_slurm
from tests.e2e.test_console_tmux import LOADMASTER, PROMPT, SCREEN_TIMEOUT, _env, _lab
from tests.e2e.tmux import Tmux, deadline_poll

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def slurm_sandbox(tmp_path: Path) -> Iterator[tuple[Path, str, dict[str, str]]]:
    """``lab up --slurm`` with two nodes: (lab dir, the printed console command, env with SLURM_CONF)."""
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed: apt-get install -y tmux")
    root = tmp_path / "lab"
    env = _env(tmp_path)
    try:
        up = _lab(env, "up", "--dir", str(root), "--nodes", "2", "--no-seed", "--slurm")
        assert up.returncode == 0, f"lab up --slurm failed:\n{up.stderr}"
        command = up.stdout.strip().splitlines()[-1]
        words = dict(w.split("=", 1) for w in shlex.split(command) if "=" in w and not w.startswith("-"))
        assert "SLURM_CONF" in words, command
        assert Path(words["SLURM_CONF"]).exists(), command
        assert "[slurm]\nenabled = true" in (root / "loadmaster.toml").read_text()
        yield root, command, {**env, "SLURM_CONF": words["SLURM_CONF"]}
    finally:
        down = _lab(env, "down", "--dir", str(root), timeout=60)
        assert down.returncode == 0, down.stderr
    assert not (root / "slurm.json").exists()
    assert _pids_alive(root / "slurm") == [], "a Slurm process outlived 'lab down'"


def _pids_alive(root: Path) -> list[int]:
    """Processes (zombies aside) whose command line names ``root``."""
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


def _slurm(env: dict[str, str], *argv: str) -> str:
    return subprocess.run(
        [find_slurm(argv[0]), *argv[1:]], env=env, capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()


def _row(screen: str, node: str) -> str:
    return next((ln for ln in screen.splitlines() if re.match(rf"\s*{node}\s", ln)), "")


def test_drain_from_fleet_draining_then_drained(
    slurm_sandbox: tuple[Path, str, dict[str, str]], tmp_path: Path
) -> None:
    root, command, env = slurm_sandbox
    assert _slurm(env, "sinfo", "-h", "-N", "-o", "%N %T").split() == ["node-01", "idle", "node-02", "idle"]
    # A real batch job on node-01 that ends by itself once the test says so.
    done = tmp_path / "job-may-end"
    job = _slurm(
        env, "sbatch", "--parsable", "-w", "node-01", "--gres=gpu:1", "-o", "/dev/null", "-J", "train",
        "--wrap", f"while [ ! -e {done} ]; do sleep 0.2; done",
    )  # fmt: skip
    # An Xid in node-01's kernel log: the lab's stand-in dmesg on the node's PATH.
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S,000000+00:00")
    dmesg = root / "nodes" / "node-01" / "bin" / "dmesg"
    dmesg.write_text(
        "#!/bin/sh\ncat <<'EOF'\n"
        f"{stamp} node-01 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\nEOF\n"
    )
    dmesg.chmod(0o755)

    term = Tmux(env=env, width=80, height=24, cwd=str(tmp_path), prompt=PROMPT).start()
    try:
        term.wait_for(PROMPT.strip(), timeout=30, what="the shell prompt")
        term.type(command)
        term.send("Enter")
        # The console starts while Slurm starts the job.
        deadline_poll(
            lambda: _slurm(env, "squeue", "-h", "-j", job, "-o", "%T") == "RUNNING",
            timeout=90,
            what=f"job {job} running",
            every=0.25,
        )
        # node-01's row: its Xid and Slurm's state (mixed or allocated: the job runs).
        screen = term.wait_for(
            lambda s: "XID 79" in _row(s, "node-01") and re.search(r"\b(mixed|allocated)\b", _row(s, "node-01")),
            timeout=SCREEN_TIMEOUT,
            what="node-01 with its Xid and Slurm state",
        )
        header = next(ln for ln in screen.splitlines() if "Node" in ln and "State" in ln)
        assert "Slurm" in header and "Alerts" in header, screen
        # d: the drain form on the selected row (node-01, the first), the reason, enter (after the job).
        term.press("d")
        term.wait_for("Drain node-01 in Slurm", what="the drain form")
        term.wait_for("prompted by: Xid 79", what="the Xid named as what prompted the drain")
        term.type("fell off the bus")
        term.send("Enter")
        # The exact command, shown before anything runs; then confirm.
        screen = term.wait_for(
            lambda s: "Drain node-01?" in s and "Recorded in the audit log" in s, what="the whole confirm dialog"
        )
        flat = " ".join(screen.split())
        assert "scontrol update NodeName=node-01 State=DRAIN" in flat, screen
        assert "'Reason=fell off the" in flat and "[Xid 79" in flat and "loadmaster:" in flat, screen
        assert "draining, then drained" in flat, screen
        assert _slurm(env, "sinfo", "-h", "-N", "-n", "node-01", "-o", "%T") in ("mixed", "allocated")
        term.press("y")
        screen = term.wait_for(
            lambda s: re.search(r"\bdraining\b", _row(s, "node-01")), timeout=SCREEN_TIMEOUT, what="node-01 draining"
        )
        assert _slurm(env, "sinfo", "-h", "-N", "-n", "node-01", "-o", "%T") == "draining"
        assert _slurm(env, "squeue", "-h", "-j", job, "-o", "%T") == "RUNNING"  # the job still runs
        jobs = subprocess.run(
            [str(LOADMASTER), "--config", str(root / "loadmaster.toml"), "slurm", "jobs", "--node", "node-01"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert jobs.returncode == 0, jobs.stderr
        row = next((ln for ln in jobs.stdout.splitlines() if ln.startswith(f"{job} ")), "")
        assert "RUNNING" in row and "node-01(0)" in row, jobs.stdout
        reason = _slurm(env, "scontrol", "show", "node", "node-01")
        assert "Reason=fell off the bus [Xid 79" in reason and "loadmaster:" in reason, reason
        # The job ends by itself: drained.
        done.touch()
        screen = term.wait_for(
            lambda s: re.search(r"\bdrained\b", _row(s, "node-01")), timeout=SCREEN_TIMEOUT, what="node-01 drained"
        )
        assert _slurm(env, "sinfo", "-h", "-N", "-n", "node-01", "-o", "%T") == "drained"
        term.send("q")
    finally:
        term.kill()
