"""Every command that reads a store from a node is quoted, reserved and ledgered like a pull (#28).

``shard`` from an s3:// source and ``ckpt strip --node`` of a step in the lab's SeaweedFS, run on
real sshd nodes: the launch reserves the bytes the node will read (a block budget refuses it with
nothing started), a SIGTERM during the launch releases the reservation, and the job's end settles
it, capped by the reservation even when a hostile node reports more bytes than were reserved.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from backend.config import load_config_file
from backend.ledger import SETTLE_SLACK
from backend.services import Services
from lab import Lab
from tests.checkpoints.conftest import tiny_full_dcp  # noqa: F401 - a fixture, used by name
from tests.helpers import write_lab_config
from tests.security.hostile_node import NAME, HostileNode, forge_json, start_hostile_node
from tui.cli import main as cli_main

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]
LOADMASTER = str(Path(sys.executable).parent / "loadmaster")
BLOCK = '\n[egress]\nper_transfer_limit_usd = 0.0000001\naction = "block"\n'


@pytest.fixture(scope="module")
def hostile(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> HostileNode:  # type: ignore[misc]
    yield from start_hostile_node(lab, tmp_path_factory.mktemp("hostile-reads"))


@pytest.fixture(scope="module")
def shard_src(lab: Lab, s3: Any) -> tuple[str, int]:
    """40 samples (80 small objects) under a fresh prefix of the lab bucket; (url, total bytes).
    Written once for the module: every test only reads it (each shards into its own destination)."""
    prefix = f"shardsrc-{secrets.token_hex(3)}"
    objects = {
        f"{prefix}/{i:04d}.{ext}": body
        for i in range(40)
        for ext, body in (("cls", str(i % 7).encode()), ("bin", bytes([i]) * (300 + i)))
    }
    s3.put_many(lab.bucket, objects)
    return f"s3://{lab.bucket}/{prefix}", sum(len(b) for b in objects.values())


def _ledger(state: Path) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(state / "state.sqlite3")
    try:
        return db.execute("SELECT job_id, state, bytes, quoted_bytes, store, note FROM egress_ledger").fetchall()
    finally:
        db.close()


def _jobs(state: Path) -> int:
    db = sqlite3.connect(state / "state.sqlite3")
    try:
        return int(db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])
    finally:
        db.close()


async def _wait(cfg: Path, job_id: str) -> Any:
    svc = Services(config=load_config_file(cfg))
    try:
        return await svc.jobs.wait(job_id, timeout=180)
    finally:
        await svc.aclose()


def test_a_shard_on_a_node_reserves_the_source_then_settles_to_what_it_read(
    lab: Lab, shard_src: tuple[str, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    url, total = shard_src
    state = tmp_path / "state"
    cfg = write_lab_config(lab, tmp_path / "lm.toml", state)
    dest = lab.node("node-01").scratch / f"shards-{tmp_path.name[-8:]}"
    args = ["--config", str(cfg), "shard", url, str(dest), "--shard-size", "4KB", "--node", "node-01", "--json"]
    assert cli_main(args) == 0
    job_id = json.loads(capsys.readouterr().out)["job"]
    [(jid, st, nbytes, quoted, store, _)] = _ledger(state)
    assert (jid, nbytes, quoted, store) == (job_id, total, total, "lab")
    assert st in ("reserved", "settled")
    rec = asyncio.run(_wait(cfg, job_id))
    assert rec.state == "succeeded", rec.error
    assert rec.result["source_bytes_read"] == total
    [(jid, st, nbytes, quoted, _, note)] = _ledger(state)
    assert (jid, st, nbytes, quoted) == (job_id, "settled", total, total)
    assert "capped" not in note


def test_a_block_budget_refuses_a_shard_and_a_strip_and_starts_nothing(
    lab: Lab,
    shard_src: tuple[str, int],
    tiny_full_dcp: tuple[Path, dict[str, Any]],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, _ = shard_src
    run = f"blocked-{tmp_path.name[-8:]}"
    free = write_lab_config(lab, tmp_path / "free.toml", tmp_path / "free-state")
    assert cli_main(["--config", str(free), "upload", str(tiny_full_dcp[0]), f"lab/{run}/step-10"]) == 0
    state = tmp_path / "state"
    cfg = write_lab_config(lab, tmp_path / "lm.toml", state, BLOCK)
    dest = lab.node("node-01").scratch / f"blocked-{tmp_path.name[-8:]}"
    capsys.readouterr()
    assert cli_main(["--config", str(cfg), "shard", url, str(dest), "--node", "node-01"]) == 2
    err = capsys.readouterr().err
    assert "not started: the egress guard blocks this shard conversion" in err and err.count("\n") == 1
    assert cli_main(["--config", str(cfg), "ckpt", "strip", f"lab/{run}/step-10", "--node", "node-01"]) == 2
    err = capsys.readouterr().err
    assert "not started: the egress guard blocks this strip" in err and err.count("\n") == 1
    # Nothing reserved, nothing recorded, nothing on the node.
    assert _ledger(state) == [] and _jobs(state) == 0
    assert not dest.exists()


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the command ended before its launch reached the node: {err or out}")
        time.sleep(0.05)


def test_sigterm_during_a_shard_launch_releases_its_reservation(
    lab: Lab, hostile: HostileNode, shard_src: tuple[str, int], tmp_path: Path
) -> None:
    url, total = shard_src
    hostile.clear()
    hostile.hang_launches()
    state = tmp_path / "state"
    try:
        cfg = write_lab_config(lab, tmp_path / "lm.toml", state, hostile.config_section())
        proc = subprocess.Popen(
            [LOADMASTER, "--config", str(cfg), "shard", url, str(hostile.node.scratch / "out"), "--node", NAME],
            env={**os.environ, **lab.env()},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_for(hostile.launch_marker, proc)
        [(_, st, nbytes, *_)] = _ledger(state)
        assert (st, nbytes) == ("reserved", total)  # reserved before the node was asked
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGTERM
        [(_, st, *_)] = _ledger(state)
        assert st == "released"
    finally:
        hostile.hang_launches(on=False)


#: What a hostile node reports as the bytes its shard job read, and how the settle counts it.
FORGED = {"more-than-reserved": (10**15, "cap"), "not-a-number": ("1e30", "reserved"), "negative": (-5, "reserved")}


def test_a_hostile_node_cannot_settle_a_shard_above_its_reservation(
    lab: Lab,
    hostile: HostileNode,
    shard_src: tuple[str, int],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One shard job per forgery, run side by side on the node (each was a test of its own, one
    job after the other); one refresh settles each at most at its reservation."""
    url, total = shard_src
    hostile.clear()
    state = tmp_path / "state"
    cfg = write_lab_config(lab, tmp_path / "lm.toml", state, hostile.config_section())
    jobs: dict[str, str] = {}
    for case in FORGED:
        dest = hostile.node.scratch / f"out-{tmp_path.name[-8:]}-{case}"
        assert cli_main(["--config", str(cfg), "shard", url, str(dest), "--node", NAME, "--json"]) == 0
        jobs[case] = json.loads(capsys.readouterr().out)["job"]
    deadline = time.monotonic() + 180
    for case, job_id in jobs.items():
        result = hostile.jobs / job_id / "result.json"
        while not result.exists():  # the job really runs on the node; no console watches it end
            assert time.monotonic() < deadline, f"the shard job ({case}) never finished on the node"
            time.sleep(0.1)
        assert "source_bytes_read" in result.read_text()
        forge_json(result, "source_bytes_read", FORGED[case][0])
    # A refresh settles them: never more than a reservation allows.
    assert cli_main(["--config", str(cfg), "jobs", "--json", "--limit", "1000"]) in (0, 4)
    capsys.readouterr()
    rows = {jid: (st, nbytes, quoted, note) for (jid, st, nbytes, quoted, _, note) in _ledger(state)}
    assert sorted(rows) == sorted(jobs.values())
    for case, job_id in jobs.items():
        said, counted = FORGED[case]
        st, nbytes, quoted, note = rows[job_id]
        assert (st, quoted) == ("settled", total), case
        if counted == "cap":
            assert nbytes == int(total * SETTLE_SLACK), case
            assert f"the node reported {said}" in note and "capped at its reservation" in note, case
        else:
            assert nbytes == total, case
            assert "unreadable: counted at its reservation" in note, case


def test_a_strip_on_a_hostile_node_settles_at_most_its_reservation(
    lab: Lab,
    hostile: HostileNode,
    tiny_full_dcp: tuple[Path, dict[str, Any]],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = f"strip-{tmp_path.name[-8:]}"
    state = tmp_path / "state"
    cfg = write_lab_config(lab, tmp_path / "lm.toml", state, hostile.config_section())
    assert cli_main(["--config", str(cfg), "upload", str(tiny_full_dcp[0]), f"lab/{run}/step-10"]) == 0
    step_bytes = sum(p.stat().st_size for p in tiny_full_dcp[0].iterdir())
    hostile.clear()
    capsys.readouterr()
    assert cli_main(["--config", str(cfg), "ckpt", "strip", f"lab/{run}/step-10", "--node", NAME, "--json"]) == 0
    job_id = json.loads(capsys.readouterr().out)["job"]
    [(jid, st, nbytes, quoted, store, _)] = _ledger(state)
    assert (jid, st, nbytes, quoted, store) == (job_id, "reserved", step_bytes, step_bytes, "lab")
    result = hostile.jobs / job_id / "result.json"
    deadline = time.monotonic() + 180
    while not result.exists():
        assert time.monotonic() < deadline, "the strip job never finished on the node"
        time.sleep(0.1)
    read = json.loads(result.read_text())
    assert 0 < json.dumps(read).count("source_bytes_read")  # what an honest strip reports
    forge_json(result, "source_bytes_read", 10**15)
    assert cli_main(["--config", str(cfg), "jobs", "--json", "--limit", "1000"]) in (0, 4)
    capsys.readouterr()
    [(jid, st, nbytes, quoted, _, note)] = _ledger(state)
    assert (jid, st, nbytes) == (job_id, "settled", int(step_bytes * SETTLE_SLACK))
    assert "capped at its reservation" in note
