"""``loadmaster lab up`` says what sample data it seeded, with the URLs to type, and they hold it.

The sandbox is started as an operator starts it (a subprocess, ``--nodes 1`` to keep it small);
each printed ``s3://`` URL is then listed on the sandbox's own SeaweedFS and must hold what its
line says. ``lab down`` always runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from backend.config import load_config_file
from backend.units import bytes_text

pytestmark = [pytest.mark.lab, pytest.mark.slow]

LOADMASTER = Path(sys.executable).parent / "loadmaster"


def _lab(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LOADMASTER), "lab", *args], env=env, capture_output=True, text=True, timeout=300)


def test_lab_up_prints_the_seeded_data_and_it_is_there(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "LOADMASTER_DATA_DIR": str(tmp_path / "data"),
        "LOADMASTER_CONFIG_DIR": str(tmp_path / "config"),
    }
    for k in ("LOADMASTER_CONFIG", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        env.pop(k, None)
    root = tmp_path / "lab"
    try:
        up = _lab(env, "up", "--dir", str(root), "--nodes", "1")
        assert up.returncode == 0, up.stderr
        bucket = json.loads((root / "lab.json").read_text())["bucket"]
        err = up.stderr.splitlines()
        start = err.index(
            "sample data: pull or shard the dataset (Transfers, Shards), prune the run (Checkpoints, Retention):"
        )
        lines = err[start + 1 : start + 4]
        assert err[start + 4] == "open the console on the sandbox with (again later: loadmaster lab env):", up.stderr
        raw, shards, ckpt = (re.match(r"\s+(s3://\S+)\s+(.*)$", line).groups() for line in lines)  # type: ignore[union-attr]
        assert raw[0] == f"s3://{bucket}/datasets/laion-mini/raw/"
        assert shards[0] == f"s3://{bucket}/datasets/laion-mini/shards/"
        assert ckpt[0] == f"s3://{bucket}/checkpoints/llama-demo/"
        assert ckpt[1] == "12 DCP checkpoints, steps 1000-12000 (12000 still uploading)"
        # The product does not know the lab's demo run: the config lab up wrote names it.
        config = load_config_file(root / "loadmaster.toml")
        assert config.ui.opening_run == f"s3://{bucket}/checkpoints/llama-demo"

        objects = _list(root, bucket)
        raw_objs = {k: v for k, v in objects.items() if k.startswith("datasets/laion-mini/raw/")}
        shard_objs = {k: v for k, v in objects.items() if k.startswith("datasets/laion-mini/shards/")}
        assert raw[1] == (
            f"{len(raw_objs) // 2} samples (.jpg + .json: {len(raw_objs)} files, {bytes_text(sum(raw_objs.values()))})"
        )
        assert shards[1] == f"{len(shard_objs)} tar shards, {bytes_text(sum(shard_objs.values()))}"
        assert len(raw_objs) == 240 and len(shard_objs) == 8
        steps = {k.split("/")[2] for k in objects if k.startswith("checkpoints/llama-demo/")}
        assert steps == {f"step-{s}" for s in range(1000, 12001, 1000)}
        assert "checkpoints/llama-demo/step-12000/.metadata" not in objects
        assert "checkpoints/llama-demo/step-11000/.metadata" in objects
        status = _lab(env, "status", "--dir", str(root)).stdout
        assert (
            f"  bucket {bucket} (s3://{bucket}/datasets/laion-mini/, s3://{bucket}/checkpoints/llama-demo/)" in status
        ), status
    finally:
        down = _lab(env, "down", "--dir", str(root))
        assert down.returncode == 0, down.stderr


def _list(root: Path, bucket: str) -> dict[str, int]:
    from lab.seed import lab_client, list_objects

    return {key: size for key, (size, _etag) in list_objects(lab_client(root), bucket).items()}


def test_the_checkpoint_saves_are_made_once_per_torch_and_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second ``lab up`` uploads the kept saves: it neither imports torch nor saves again."""
    from lab import seed

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    made: list[Path] = []

    def save(folder: Path, steps: range) -> None:  # what torch writes, minus torch's import
        made.append(folder)
        for step in steps:
            (folder / f"step-{step}").mkdir()
            (folder / f"step-{step}" / ".metadata").write_bytes(b"meta")

    monkeypatch.setattr(seed, "_save_steps", save)
    first = seed.saved_checkpoints(range(1, 3))
    assert seed.saved_checkpoints(range(1, 3)) == first and len(made) == 1
    assert first.is_relative_to(tmp_path / "cache") and sorted(p.name for p in first.iterdir()) == ["step-1", "step-2"]
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".building-")]
    # Other steps are other saves; a failed save leaves nothing that a later one would take.
    monkeypatch.setattr(seed, "_save_steps", lambda folder, steps: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        seed.saved_checkpoints(range(1, 4))
    assert [p.name for p in first.parent.iterdir()] == [first.name]
