"""``shard`` onto a disk that really fills up (a 1 MiB tmpfs): one line naming the file and what to
do, no traceback, no partial file left, and ``--resume`` finishes once there is room."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import webdataset as wds

from backend.shards.convert import convert_sync
from backend.shards.model import ShardRequest
from backend.shards.plan import ShardError
from tests.shards.conftest import make_dataset
from tui.cli import main

KB = 1000


def test_a_full_disk_is_one_line_naming_the_shard(tmp_path: Path, small_fs: Path) -> None:
    src, dest = tmp_path / "src", small_fs / "out"
    make_dataset(src, n=40, jpg_size=(60 * KB, 70 * KB))  # ~2.6 MB: more than the disk holds
    with pytest.raises(ShardError) as info:
        convert_sync(ShardRequest(str(src), str(dest), shard_size=400 * KB))
    msg = str(info.value)
    assert msg.startswith(f"cannot write {dest}/.shard-")
    assert "No space left on device: free space there, then rerun with --resume" in msg
    assert "\n" not in msg
    assert not list(dest.glob(".*.partial"))  # the half-written shard is removed


@pytest.mark.parametrize("workers", [0, 4])
def test_resume_finishes_once_there_is_room(tmp_path: Path, small_fs: Path, workers: int) -> None:
    src, dest = tmp_path / "src", small_fs / "out"
    data = make_dataset(src, n=40, jpg_size=(60 * KB, 70 * KB))
    req = ShardRequest(str(src), str(dest), shard_size=400 * KB, workers=workers)
    with pytest.raises(ShardError, match="No space left"):
        convert_sync(req)
    done_before = sorted(p.name for p in dest.glob("*.tar"))
    assert done_before  # the shards that fitted are complete and kept
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_fs)], check=True)
    result = convert_sync(ShardRequest(str(src), str(dest), shard_size=400 * KB, workers=workers, resume=True))
    assert set(done_before) <= set(result.resumed)
    got = {
        s["__key__"]: s["jpg"] for s in wds.WebDataset(sorted(str(p) for p in dest.glob("*.tar")), shardshuffle=False)
    }
    assert got == {k: v["jpg"] for k, v in data.items()}


def test_the_cli_prints_it_without_a_traceback(
    tmp_path: Path, small_fs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    make_dataset(src, n=30, jpg_size=(60 * KB, 70 * KB))
    assert main(["shard", str(src), str(small_fs / "out"), "--shard-size", "300KB"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = [ln for ln in err.splitlines() if "error" in ln]
    assert line.startswith("loadmaster: error: cannot write ") and "No space left on device" in line
