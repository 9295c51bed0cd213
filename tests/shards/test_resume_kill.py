"""A conversion killed mid-way (SIGKILL, no chance to clean up) resumes from its last shard."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from backend.shards.convert import convert_sync
from backend.shards.manifest import MANIFEST_NAME
from backend.shards.model import ShardRequest
from backend.shards.sinks import JOURNAL_PREFIX
from tests.shards.conftest import make_dataset
from tui.cli import main

# The child converts with a progress callback that dawdles after each finished shard, so the
# test can kill it while it is surely mid-way (the kill itself is an ordinary SIGKILL).
CHILD = textwrap.dedent("""
    import sys, time
    from backend.shards.convert import convert_sync
    from backend.shards.model import ShardRequest
    def slow(p):
        if p.shards_done:
            time.sleep(0.15)
    convert_sync(ShardRequest(sys.argv[1], sys.argv[2], shard_size=int(sys.argv[3])), on_progress=slow)
""")


def digests(dest: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(dest.glob("shard-*.tar"))}


def test_killed_conversion_resumes_to_the_same_shards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    make_dataset(src, n=80, seed=5)
    size = 8000
    reference = tmp_path / "reference"
    convert_sync(ShardRequest(str(src), str(reference), shard_size=size))
    total = len(digests(reference))
    assert total >= 10

    dest = tmp_path / "out"
    journal = dest / JOURNAL_PREFIX
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(src), str(dest), str(size)], env=env, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if journal.is_dir() and len(list(journal.glob("*.json"))) >= 3:
                break
            if child.poll() is not None:
                pytest.fail(f"conversion ended before it could be killed: {child.stderr.read().decode()[-500:]}")
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    assert not (dest / MANIFEST_NAME).exists()
    done_before = {p.stem for p in journal.glob("*.json")}
    assert 3 <= len(done_before) < total

    rc = main(["shard", str(src), str(dest), "--shard-size", str(size), "--resume", "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    result = json.loads(out)
    assert result["resumed"] >= len(done_before)  # it did not start from zero
    assert result["written"] == total - result["resumed"]
    assert digests(dest) == digests(reference)
    assert not list(dest.glob(".*.partial"))
    assert (
        json.loads((dest / MANIFEST_NAME).read_text())["shards"]
        == json.loads((reference / MANIFEST_NAME).read_text())["shards"]
    )
