"""Conversion on local directories: round trip, size bounds, determinism, headers, progress, jobs."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import blake3
import pytest
import webdataset as wds

from backend.agent.context import JobContext
from backend.shards import tarfmt
from backend.shards.convert import convert_sync
from backend.shards.job import run_shard_job
from backend.shards.manifest import MANIFEST_NAME, Manifest
from backend.shards.model import ShardProgress, ShardRequest
from backend.shards.plan import Sample, SourceFile, group_samples, plan_shards, split_key
from tests.shards.conftest import make_dataset

KB = 1000


def shard_paths(dest: Path) -> list[str]:
    return sorted(str(p) for p in dest.glob("shard-*.tar"))


def read_back(dest: Path) -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    for s in wds.WebDataset(shard_paths(dest), shardshuffle=False):
        assert s["__key__"] not in out, "a sample was split or duplicated"
        out[s["__key__"]] = {k: v for k, v in s.items() if not k.startswith("__")}
    return out


def digests(dest: Path) -> dict[str, str]:
    return {Path(p).name: blake3.blake3(Path(p).read_bytes()).hexdigest() for p in shard_paths(dest)}


@pytest.mark.parametrize(
    "name,size",
    [
        ("000001.jpg", 0),
        ("a/b/000001.jpg", 51_234),
        ("x" * 100, 7),
        ("é" * 20 + ".json", 3),
        ("d/" * 70 + "k.jpg", 5),
        ("z" * 300 + ".seg.png", 9),
    ],
)
def test_fast_header_is_what_tarfile_writes(name: str, size: int) -> None:
    assert tarfmt.header(name, size) == tarfmt.slow_header(name, size)
    assert tarfmt.member_bytes(name, size) == len(tarfmt.slow_header(name, size)) + size + (-size % 512)


def test_keys_split_as_webdataset_does() -> None:
    from webdataset.tariterators import base_plus_ext

    for path in [
        "000123.jpg",
        "a/000123.seg.png",
        "v1.0/x.tar.gz",
        "noext",
        ".hidden",
        "d/.h.json",
        "a.b/c",
        "dir/file.JSON",
        "a.",
        "x/.",
        "a\nb.c",
        "/abs.x",
        "k..j",
    ]:
        got = split_key(path)
        want = base_plus_ext(path)
        assert got == want, path
        # group_samples splits inline: the same answer
        samples, problems = group_samples([SourceFile(path, 1)])
        if want == (None, None):
            assert problems.unkeyed == (path,) and not samples, path
        else:
            assert [(s.key, s.files) for s in samples] == [(want[0], ((want[1], path, 1),))], path


def test_round_trip_every_sample_with_original_bytes(dataset: tuple[Path, dict], tmp_path: Path) -> None:
    src, data = dataset
    dest = tmp_path / "out"
    result = convert_sync(ShardRequest(str(src), str(dest), shard_size=16 * KB))
    assert len(result.manifest.shards) > 3
    assert read_back(dest) == data
    # GNU tar lists them as ordinary ustar archives
    listing = subprocess.run(["tar", "-tf", shard_paths(dest)[0]], capture_output=True, text=True, check=True)
    assert listing.stdout.splitlines()[:2] == ["000000.jpg", "000000.json"]
    with tarfile.open(shard_paths(dest)[0]) as tf:
        m = tf.getmembers()[0]
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) == (0, 0, 0, "", "", 0o644)


def test_manifest_lists_every_shard_and_the_get_arithmetic(dataset: tuple[Path, dict], tmp_path: Path) -> None:
    src, data = dataset
    dest = tmp_path / "out"
    convert_sync(ShardRequest(str(src), str(dest), shard_size=16 * KB))
    m = Manifest.from_json((dest / MANIFEST_NAME).read_text())
    assert [s.name for s in m.shards] == [Path(p).name for p in shard_paths(dest)]
    assert digests(dest) == {s.name: s.digest for s in m.shards} and {s.hash for s in m.shards} == {"blake3"}
    assert {s.name: s.bytes for s in m.shards} == {Path(p).name: Path(p).stat().st_size for p in shard_paths(dest)}
    assert m.samples == len(data) and m.files == 2 * len(data)
    doc = json.loads((dest / MANIFEST_NAME).read_text())
    assert doc["totals"] == {"shards": len(m.shards), "samples": 60, "files": 120, "bytes": m.bytes}
    req = doc["requests"]
    assert (req["gets_before"], req["gets_after"]) == (120, len(m.shards))
    assert req["usd_per_epoch_before"] == pytest.approx(120 / 1000 * req["get_per_1000_usd"], rel=1e-3)


def test_size_bounds_and_no_sample_split(tmp_path: Path) -> None:
    src = tmp_path / "src"
    data = make_dataset(src, n=80, jpg_size=(500, 9000), seed=3)
    big = bytes(range(256)) * 200  # 51 KB: larger than the target on its own
    (src / "zzbig.jpg").write_bytes(big)
    (src / "zzbig.json").write_bytes(b"{}")
    data["zzbig"] = {"jpg": big, "json": b"{}"}
    target = 20 * KB
    dest = tmp_path / "out"
    result = convert_sync(ShardRequest(str(src), str(dest), shard_size=target))
    sizes = {Path(p).name: Path(p).stat().st_size for p in shard_paths(dest)}
    by_shard: dict[str, set[str]] = {}
    for s in wds.WebDataset(shard_paths(dest), shardshuffle=False):
        by_shard.setdefault(Path(s["__url__"]).name, set()).add(s["__key__"])
    for name, size in sizes.items():
        if size > target:  # only a shard holding one sample (too big alone) may exceed the target
            assert len(by_shard[name]) == 1, name
        else:
            assert size <= target
    assert {"zzbig"} in by_shard.values()
    assert read_back(dest) == data
    assert sum(e.samples for e in result.manifest.shards) == 81


def test_byte_identical_twice_and_seeded_shuffle(dataset: tuple[Path, dict], tmp_path: Path) -> None:
    src, data = dataset
    a, b = tmp_path / "a", tmp_path / "b"
    convert_sync(ShardRequest(str(src), str(a), shard_size=16 * KB, workers=1))
    convert_sync(ShardRequest(str(src), str(b), shard_size=16 * KB, workers=8))
    c = tmp_path / "c"
    convert_sync(ShardRequest(str(src), str(c), shard_size=16 * KB, workers=0))  # all in one thread
    assert digests(a) == digests(b) == digests(c)
    assert (a / MANIFEST_NAME).read_text() == (b / MANIFEST_NAME).read_text()
    s1, s2, s3 = tmp_path / "s1", tmp_path / "s2", tmp_path / "s3"
    for d, seed in ((s1, 7), (s2, 7), (s3, 8)):
        convert_sync(ShardRequest(str(src), str(d), shard_size=16 * KB, seed=seed))
    assert digests(s1) == digests(s2)
    assert digests(s1) != digests(s3) != digests(a)
    keys = [s["__key__"] for s in wds.WebDataset(shard_paths(s1), shardshuffle=False)]
    assert keys != sorted(keys) and sorted(keys) == sorted(data)
    assert read_back(s1) == data


def test_plan_hash_is_stable_across_versions() -> None:
    # Resume compares this hash with the one a journal recorded, possibly by an older loadmaster:
    # faster planning must not change it (values from the per-file-update implementation).
    files = [
        SourceFile(f"d/{i:05d}.{e}", 1000 + 37 * i + len(e)) for i in range(500) for e in ("jpg", "json", "seg.png")
    ]
    samples, _ = group_samples(files)
    plain = plan_shards(samples, shard_size=100_000, pattern="shard-%06d.tar")
    shuffled = plan_shards(samples, shard_size=100_000, pattern="shard-%06d.tar", seed=5)
    assert plain.plan_hash == "04f0902cd3b4fdfe37b876f8afc72729db9e10ef887cab1e7a9dc6115415f624"
    assert shuffled.plan_hash == "9a1646e2bb5b612a1efdb62c4d5e1f770d4b32fb5b72f6451880ba29926d6dd1"
    assert len(shuffled.shards) == 236 and (plain.files, plain.samples) == (1500, 500)


def test_plan_depends_only_on_listing() -> None:
    files = [SourceFile(f"{i:04d}.{e}", 100 + i) for i in range(30) for e in ("jpg", "cls")]
    samples, problems = group_samples(files)
    assert problems.describe() == []
    p1 = plan_shards(samples, shard_size=4000, pattern="s-%03d.tar", seed=1)
    p2 = plan_shards(list(reversed(samples)), shard_size=4000, pattern="s-%03d.tar", seed=1)
    assert p1.plan_hash != p2.plan_hash  # order in is order planned: callers pass sorted samples
    p3 = plan_shards(samples, shard_size=4000, pattern="s-%03d.tar", seed=1)
    assert p1 == p3
    assert all(isinstance(s, Sample) for sh in p1.shards for s in sh.samples)


def test_progress_reports_samples_bytes_shards_and_rates(dataset: tuple[Path, dict], tmp_path: Path) -> None:
    src, _ = dataset
    seen: list[ShardProgress] = []
    result = convert_sync(ShardRequest(str(src), str(tmp_path / "out"), shard_size=16 * KB), on_progress=seen.append)
    last = seen[-1]
    assert last.final and last.samples_done == last.samples_total == 60
    assert last.shards_done == last.shards_total == len(result.manifest.shards)
    assert last.bytes_done == last.bytes_total == result.manifest.bytes
    assert any(0 < p.shards_done < p.shards_total for p in seen)
    assert last.samples_per_s > 0 and last.mb_per_s > 0


def test_in_process_job_context_gets_progress_and_result(dataset: tuple[Path, dict], tmp_path: Path) -> None:
    src, data = dataset
    dest = tmp_path / "out"
    lines: list[dict] = []
    logs: list[str] = []
    params = ShardRequest(str(src), str(dest), shard_size=16 * KB).as_params()
    ctx = JobContext.in_process("shard", params, on_progress=lines.append, on_log=logs.append)
    result = run_shard_job(ctx)
    assert result["samples"] == 60 and result["shards"] == len(shard_paths(dest))
    assert lines[-1]["items_done"] == 60 and lines[-1]["shards_done"] == result["shards"]
    assert {"samples_per_s", "mb_per_s", "shards_total"} <= set(lines[-1])
    assert any("GETs per epoch" in m for m in logs)
    assert read_back(dest) == data


def test_cancel_keeps_completed_shards_and_resume_finishes(dataset: tuple[Path, dict], tmp_path: Path) -> None:
    from backend.shards.model import ShardCancelled

    src, data = dataset
    dest = tmp_path / "out"
    done = [0]

    def on_progress(p: ShardProgress) -> None:
        done[0] = p.shards_done

    with pytest.raises(ShardCancelled):
        convert_sync(
            ShardRequest(str(src), str(dest), shard_size=8 * KB),
            on_progress=on_progress,
            cancelled=lambda: done[0] >= 2,
        )
    assert not (dest / MANIFEST_NAME).exists()
    assert not list(dest.glob(".*.partial"))
    kept = shard_paths(dest)
    assert kept
    result = convert_sync(ShardRequest(str(src), str(dest), shard_size=8 * KB, resume=True))
    assert len(result.resumed) >= len(kept) >= 2
    assert read_back(dest) == data


def test_convert_runs_exactly_the_previewed_plan(dataset: tuple[Path, dict], tmp_path: Path) -> None:
    import asyncio

    from backend.shards.convert import preview

    src, data = dataset
    req = ShardRequest(str(src), str(tmp_path / "out"), shard_size=16 * KB)
    pv = asyncio.run(preview(req))
    (src / "999999.jpg").write_bytes(b"added after the preview")
    (src / "999999.json").write_bytes(b"{}")
    result = convert_sync(req, prepared=pv)
    assert result.manifest.samples == pv.samples == len(data)
    assert len(result.manifest.shards) == pv.shards
    # a different request does not reuse it
    other = convert_sync(ShardRequest(str(src), str(tmp_path / "other"), shard_size=16 * KB), prepared=pv)
    assert other.manifest.samples == len(data) + 1


def test_destination_inside_the_source_is_not_read_back(dataset: tuple[Path, dict], tmp_path: Path) -> None:
    src, data = dataset
    dest = src / "shards"
    first = convert_sync(ShardRequest(str(src), str(dest), shard_size=16 * KB))
    again = convert_sync(ShardRequest(str(src), str(dest), shard_size=16 * KB, resume=True))
    assert again.manifest.plan_hash == first.manifest.plan_hash and again.written == ()
    assert read_back(dest) == data


def test_get_price_comes_from_the_price_table_with_overrides() -> None:
    from backend.config import StoreProfile, parse_config
    from backend.shards.manifest import DEFAULT_GET_PER_1000, get_price

    r2 = StoreProfile(url="s3://b", provider="r2", region="auto")
    config = parse_config(
        {"nodes": [{"name": "n", "transport": "local"}], "prices": {"providers": {"r2": {"get_per_1000": 0.00036}}}}
    )
    assert get_price(config, r2) == (0.00036, "Cloudflare R2 GET price")
    local = StoreProfile(url="/data", provider="local")
    assert get_price(None, local, None) == (DEFAULT_GET_PER_1000, "S3 Standard GET price")


def test_unreadable_by_permissions_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from backend.shards.plan import scan_local

    src = tmp_path / "src"
    make_dataset(src, n=3)
    (src / "000001.jpg").chmod(0o600)
    (src / "000002.jpg").chmod(0o644)
    # Seen as an unprivileged user (the suite may run as root, who reads everything).
    monkeypatch.setattr(os, "geteuid", lambda: 54321)
    monkeypatch.setattr(os, "getegid", lambda: 54321)
    monkeypatch.setattr(os, "getgroups", lambda: [])
    files, unreadable = scan_local(str(src))
    assert unreadable == [("000001.jpg", "permission denied")]
    assert "000002.jpg" in {f.rel for f in files}
