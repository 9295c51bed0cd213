"""The writer's reading and buffering: members larger than a buffer, reused buffers, sources that change.

Shards are compared byte for byte with what :mod:`tarfile` writes for the same members and
metadata, and read back with WebDataset.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
from pathlib import Path

import pytest
import webdataset as wds

from backend.shards import tarfmt
from backend.shards.convert import convert_sync, preview
from backend.shards.manifest import MANIFEST_NAME, Manifest
from backend.shards.model import ShardRequest
from backend.shards.plan import ShardError
from backend.shards.sources import CHUNK_BYTES

MB = 10**6


def tarfile_shard(members: list[tuple[str, bytes]]) -> bytes:
    """What tarfile writes for these members with loadmaster's fixed metadata."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), tarfmt.MTIME, tarfmt.MODE
            info.uname = info.gname = ""
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def odd_sized_source(src: Path) -> dict[str, dict[str, bytes]]:
    """Members around and above the buffer size, empty ones, and block-aligned ones."""
    sizes = [
        0,
        1,
        511,
        512,
        513,
        70_000,
        CHUNK_BYTES - 512,
        CHUNK_BYTES,
        CHUNK_BYTES + 1,
        2 * CHUNK_BYTES + 777,
        5,
        1024,
        3 * CHUNK_BYTES,
        4096,
        333,
    ]
    src.mkdir()
    data: dict[str, dict[str, bytes]] = {}
    for i, size in enumerate(sizes):
        body = (bytes((i * 7 + j) % 251 for j in range(4096)) * (size // 4096 + 1))[:size]
        meta = f'{{"i": {i}}}'.encode()
        (src / f"{i:04d}.bin").write_bytes(body)
        (src / f"{i:04d}.json").write_bytes(meta)
        data[f"{i:04d}"] = {"bin": body, "json": meta}
    return data


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_shards_are_what_tarfile_writes_across_buffer_sizes(tmp_path: Path, workers: int) -> None:
    src, dest = tmp_path / "src", tmp_path / "out"
    data = odd_sized_source(src)
    result = convert_sync(ShardRequest(str(src), str(dest), shard_size=3 * MB, workers=workers))
    manifest = Manifest.from_json((dest / MANIFEST_NAME).read_text())
    assert len(manifest.shards) >= 3
    seen: dict[str, dict[str, bytes]] = {}
    for entry in result.manifest.shards:
        raw = (dest / entry.name).read_bytes()
        keys = [s["__key__"] for s in wds.WebDataset([str(dest / entry.name)], shardshuffle=False)]
        expect = tarfile_shard([(f"{k}.{e}", data[k][e]) for k in keys for e in ("bin", "json")])
        assert raw == expect, entry.name
        assert entry.bytes == len(raw) and entry.files == 2 * len(keys)
        for s in wds.WebDataset([str(dest / entry.name)], shardshuffle=False):
            seen[s["__key__"]] = {"bin": s["bin"], "json": s["json"]}
    assert seen == data


def _prepared(src: Path, dest: Path, workers: int) -> tuple[ShardRequest, object]:
    req = ShardRequest(str(src), str(dest), shard_size=64 * MB, workers=workers)
    return req, asyncio.run(preview(req))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(
    "size,change",
    [
        (3000, "grow"),
        (3000, "shrink"),
        (3 * CHUNK_BYTES + 5, "grow"),
        (3 * CHUNK_BYTES + 5, "shrink"),
    ],
)
def test_a_file_changed_after_listing_is_refused(tmp_path: Path, workers: int, size: int, change: str) -> None:
    src, dest = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    for i in range(4):
        (src / f"{i:04d}.bin").write_bytes(bytes(size if i == 2 else 100))
        (src / f"{i:04d}.json").write_bytes(b"{}")
    req, pv = _prepared(src, dest, workers)
    victim = src / "0002.bin"
    if change == "grow":
        victim.write_bytes(bytes(size + 1))
    else:
        victim.write_bytes(bytes(size - 1))
    with pytest.raises(ShardError, match="changed during the conversion"):
        convert_sync(req, prepared=pv)
    assert not list(dest.glob("*.tar")) and not list(dest.glob(".*.partial"))


def test_a_file_removed_after_listing_is_refused(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    for i in range(3):
        (src / f"{i:04d}.bin").write_bytes(b"x" * 10)
        (src / f"{i:04d}.json").write_bytes(b"{}")
    req, pv = _prepared(src, dest, 2)
    (src / "0001.bin").unlink()
    with pytest.raises(ShardError, match="cannot read source file .*0001.bin"):
        convert_sync(req, prepared=pv)
    assert not list(dest.glob(".*.partial"))


def _convert_counting_pools(src: Path, dest: Path, monkeypatch: pytest.MonkeyPatch, **kw: object) -> list[int]:
    from backend.shards import sources

    started: list[int] = []
    real = sources.LocalSource.start_pool

    def start_pool(self: sources.LocalSource) -> None:
        started.append(self.workers)
        real(self)

    monkeypatch.setattr(sources.LocalSource, "start_pool", start_pool)
    convert_sync(ShardRequest(str(src), str(dest), shard_size=2 * MB, **kw))  # type: ignore[arg-type]
    return started


def test_reader_threads_start_only_when_reads_sleep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import time

    from backend.shards import sources

    src = tmp_path / "src"
    src.mkdir()
    for i in range(400):
        (src / f"{i:05d}.bin").write_bytes(bytes([i % 256]) * (20_000 + i))
        (src / f"{i:05d}.json").write_bytes(b"{}")
    # Files just written are in the page cache: reads never sleep, the writer thread reads them.
    assert _convert_counting_pools(src, tmp_path / "cached", monkeypatch, workers=4) == []
    # Reads that wait (a network filesystem, a cold disk) hand reading to the pool.
    real_readv = os.readv

    def slow_readv(fd: int, buffers: list) -> int:
        time.sleep(0.0005)
        return real_readv(fd, buffers)

    monkeypatch.setattr(sources.os, "readv", slow_readv)
    assert _convert_counting_pools(src, tmp_path / "slow", monkeypatch, workers=3) == [3]
    assert _convert_counting_pools(src, tmp_path / "none", monkeypatch, workers=0) == []
    want = {p.name: p.read_bytes() for p in (tmp_path / "cached").glob("*.tar")}
    for d in ("slow", "none"):
        assert {p.name: p.read_bytes() for p in (tmp_path / d).glob("*.tar")} == want


@pytest.mark.parametrize("workers", [0, 4])
def test_a_failed_write_stops_the_conversion_and_resume_finishes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    workers: int,
) -> None:
    import errno
    import os

    from backend.shards import sinks

    src, dest = tmp_path / "src", tmp_path / "out"
    data = odd_sized_source(src)
    real_pwritev = os.pwritev
    calls = []

    def full_disk(fd: int, buffers: list, offset: int) -> int:
        calls.append(fd)
        if len(calls) >= 9:  # the first shard is complete by then
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(sinks.os, "pwritev", full_disk)
    # One line naming the shard being written and what to do (ShardError: printed, no traceback).
    with pytest.raises(
        ShardError,
        match=r"cannot write .*/out/\.shard-\d+\.tar\.partial: No space left "
        r"on device: free space there, then rerun with --resume",
    ):
        convert_sync(ShardRequest(str(src), str(dest), shard_size=3 * MB, workers=workers))
    # Nothing is written after the failure (the writer thread may have started one more write
    # while the output thread's failure was on its way: that one fails too).
    assert 9 <= len(calls) <= 10
    assert not list(dest.glob(".*.partial")) and not (dest / MANIFEST_NAME).exists()
    monkeypatch.setattr(sinks.os, "pwritev", real_pwritev)
    result = convert_sync(ShardRequest(str(src), str(dest), shard_size=3 * MB, workers=workers, resume=True))
    assert len(result.resumed) >= 1
    got = {}
    for s in wds.WebDataset(sorted(str(p) for p in dest.glob("*.tar")), shardshuffle=False):
        got[s["__key__"]] = {"bin": s["bin"], "json": s["json"]}
    assert got == data


@pytest.mark.parametrize("backlog", [0, 5])
def test_writes_by_either_thread_give_the_same_shards(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    backlog: int,
) -> None:
    from backend.shards import sinks

    src = tmp_path / "src"
    data = odd_sized_source(src)
    ref = tmp_path / "ref"
    convert_sync(ShardRequest(str(src), str(ref), shard_size=3 * MB))
    # 0: the output thread writes every piece; 5: it seems behind, the writer thread writes them all
    monkeypatch.setattr(sinks.Output, "backlog", lambda self: backlog)
    dest = tmp_path / "out"
    result = convert_sync(ShardRequest(str(src), str(dest), shard_size=3 * MB))
    for entry in result.manifest.shards:
        raw = (dest / entry.name).read_bytes()
        assert raw == (ref / entry.name).read_bytes() and len(raw) == entry.bytes
        keys = [s["__key__"] for s in wds.WebDataset([str(dest / entry.name)], shardshuffle=False)]
        assert raw == tarfile_shard([(f"{k}.{e}", data[k][e]) for k in keys for e in ("bin", "json")])
    assert (dest / MANIFEST_NAME).read_text() == (ref / MANIFEST_NAME).read_text()
