"""Benchmark: pack 20,000 small files into shards with loadmaster, webdataset.ShardWriter and GNU tar.

The dataset is generated: 10,000 samples, each a ~50 KB ``.jpg`` of random bytes plus a small
``.json``. The three tools run side by side on the same files in one run:

* loadmaster  -- ``backend.shards.convert`` (in-process, default settings but the shard size),
  hashing each shard with the manifest's hash (``backend.shards.manifest.HASH``, BLAKE3);
* loadmaster-sha256 -- the same with the hash manifests named before BLAKE3 (sha256), so the
  hash's share of the gap to tar is measured in the same run (``--no-sha256`` leaves it out);
* ShardWriter -- ``webdataset.ShardWriter(pattern, maxsize=...)`` used the documented way: read
  each sample's files, ``sink.write({"__key__": ..., "jpg": ..., "json": ...})``;
* GNU tar     -- ``tar -cf`` once per shard over the same file lists loadmaster planned (the
  near-physical limit: read small files, write sequentially).

Imports are not timed for either Python tool (loadmaster's modules and ``webdataset`` are loaded
before the first run); what is timed is the in-process call, listing and planning included for
loadmaster (tar gets its file lists ready-made). The source files are in the page cache (written
just before, or read by the previous repetition), as they are for tar and ShardWriter.

Each repetition rotates the order of the tools (page-cache and writeback effects fall on each in
turn) and ``sync``s before every timed run; the median of the repetitions is reported, with the
ratios the goal is stated in: ShardWriter/loadmaster (want >= 2) and loadmaster/tar (want <= 1.25).

    .venv/bin/python bench/shard.py [--samples 10000] [--reps 3] [--shard-size 128MB] [--dir DIR] [--no-sha256]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.schema import parse_size  # noqa: E402
from backend.shards import sinks  # noqa: E402
from backend.shards.convert import convert_sync  # noqa: E402
from backend.shards.manifest import HASH, MANIFEST_NAME  # noqa: E402
from backend.shards.model import ShardRequest  # noqa: E402
from backend.shards.plan import group_samples, plan_shards, scan_local  # noqa: E402


def generate(root: Path, samples: int, seed: int = 0) -> int:
    """Write ``samples`` jpg+json pairs; returns total bytes."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    total = 0
    for i in range(samples):
        jpg = os.urandom(rng.randint(45_000, 55_000))
        meta = json.dumps({"i": i, "label": rng.randint(0, 999), "caption": "x" * rng.randint(20, 200)}).encode()
        (root / f"{i:08d}.jpg").write_bytes(jpg)
        (root / f"{i:08d}.json").write_bytes(meta)
        total += len(jpg) + len(meta)
    return total


def run_loadmaster(src: Path, dest: Path, shard_size: int, workers: int | None, algorithm: str = HASH) -> None:
    req = ShardRequest(str(src), str(dest), shard_size=shard_size)
    if workers:
        req = dataclasses.replace(req, workers=workers)
    sinks.HASH = algorithm  # the writer's hash (bench only: the product always writes HASH)
    try:
        convert_sync(req)
    finally:
        sinks.HASH = HASH
    named = json.loads((dest / MANIFEST_NAME).read_text())["hash"]
    assert named == algorithm, f"the manifest names {named}, the bench asked for {algorithm}"


def run_shardwriter(src: Path, dest: Path, shard_size: int) -> None:
    import webdataset as wds  # imported before timing (see main): like loadmaster's, not timed

    dest.mkdir(parents=True, exist_ok=True)
    keys = sorted({p.split(".", 1)[0] for p in os.listdir(src)})
    with wds.ShardWriter(str(dest / "shard-%06d.tar"), maxsize=shard_size, verbose=0) as sink:
        for key in keys:
            with open(src / f"{key}.jpg", "rb") as f:
                jpg = f.read()
            with open(src / f"{key}.json", "rb") as f:
                meta = f.read()
            sink.write({"__key__": key, "jpg": jpg, "json": meta})


def tar_lists(src: Path, shard_size: int, where: Path) -> list[Path]:
    """One file list per shard: the same grouping loadmaster plans (not timed)."""
    files, _ = scan_local(str(src))
    samples, _ = group_samples(files)
    plan = plan_shards(samples, shard_size=shard_size, pattern="shard-%06d.tar")
    lists = []
    for shard in plan.shards:
        path = where / f"{shard.name}.list"
        path.write_text("".join(f"{rel}\n" for s in shard.samples for _e, rel, _n in s.files))
        lists.append(path)
    return lists


def run_tar(src: Path, dest: Path, lists: list[Path]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for lst in lists:
        subprocess.run(
            ["tar", "-cf", str(dest / lst.name.removesuffix(".list")), "-C", str(src), "-T", str(lst)], check=True
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shard-size", default="128MB")
    ap.add_argument("--workers", type=int, default=None, help="loadmaster read threads (default: config default)")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-sha256", action="store_true", help="leave out loadmaster with the old hash (sha256)")
    args = ap.parse_args()
    shard_size = parse_size(args.shard_size)
    work = Path(args.dir or tempfile.mkdtemp(prefix="lm-bench-shard-"))
    src = work / "src"
    if not src.exists():
        nbytes = generate(src, args.samples)
    else:
        nbytes = sum(p.stat().st_size for p in src.iterdir())
    lists_dir = work / "lists"
    lists_dir.mkdir(exist_ok=True)
    lists = tar_lists(src, shard_size, lists_dir)
    import webdataset  # noqa: F401  # the peer's import is not timed (nor are loadmaster's)

    tools = {
        "loadmaster": lambda d: run_loadmaster(src, d, shard_size, args.workers),
        "shardwriter": lambda d: run_shardwriter(src, d, shard_size),
        "gnu-tar": lambda d: run_tar(src, d, lists),
    }
    if not args.no_sha256:
        tools["loadmaster-sha256"] = lambda d: run_loadmaster(src, d, shard_size, args.workers, "sha256")
    names = list(tools)
    # Other work on the machine moves the wall-clock ratio: record the load before and after.
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    shards: dict[str, int] = {}
    for rep in range(args.reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            dest = work / f"out-{name}"
            shutil.rmtree(dest, ignore_errors=True)
            os.sync()
            r0, c0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            tools[name](dest)
            times[name].append(time.perf_counter() - t0)
            r1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            # CPU seconds (user+sys, this process and its children): steadier than wall time on a
            # shared machine, and what a node's cores actually pay.
            cpu[name].append(
                sum(getattr(b, f) - getattr(a, f) for a, b in ((r0, r1), (c0, c1)) for f in ("ru_utime", "ru_stime"))
            )
            shards[name] = len(list(dest.glob("*.tar")))
        print(f"rep {rep + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f}s" for n in order), file=sys.stderr)
    med = {n: statistics.median(v) for n, v in times.items()}
    med_cpu = {n: statistics.median(v) for n, v in cpu.items()}
    result = {
        "files": 2 * args.samples,
        "samples": args.samples,
        "bytes": nbytes,
        "shard_size": shard_size,
        "shards": shards,
        "reps": args.reps,
        "median_s": med,
        "median_cpu_s": med_cpu,
        "load_average": os.getloadavg(),
        "load_average_before": load_before,
        "cpus": os.cpu_count(),
        "mb_per_s": {n: nbytes / t / 1e6 for n, t in med.items()},
        "shardwriter_over_loadmaster": med["shardwriter"] / med["loadmaster"],
        "loadmaster_over_tar": med["loadmaster"] / med["gnu-tar"],
        "cpu_shardwriter_over_loadmaster": med_cpu["shardwriter"] / med_cpu["loadmaster"],
        "cpu_loadmaster_over_tar": med_cpu["loadmaster"] / med_cpu["gnu-tar"],
        "hash": HASH,
        "loadmaster_sha256_over_tar": med["loadmaster-sha256"] / med["gnu-tar"] if "loadmaster-sha256" in med else None,
        "cpu_loadmaster_sha256_over_tar": (
            med_cpu["loadmaster-sha256"] / med_cpu["gnu-tar"] if "loadmaster-sha256" in med else None
        ),
        "workdir": str(work),
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(
            f"{2 * args.samples:,} files, {nbytes / 1e6:,.0f} MB -> shards of {shard_size / 1e6:g} MB "
            f"({shards}); median of {args.reps}"
        )
        print(f"  load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs")
        for n in names:
            print(f"  {n:17s} {med[n]:7.2f} s wall {result['mb_per_s'][n]:8.1f} MB/s   {med_cpu[n]:6.2f} s CPU")
        print(
            f"  ShardWriter / loadmaster = {result['shardwriter_over_loadmaster']:.2f}x wall, "
            f"{result['cpu_shardwriter_over_loadmaster']:.2f}x CPU (goal >= 2)"
        )
        print(
            f"  loadmaster / GNU tar     = {result['loadmaster_over_tar']:.2f}x wall, "
            f"{result['cpu_loadmaster_over_tar']:.2f}x CPU (goal <= 1.25; hash {HASH})"
        )
        if "loadmaster-sha256" in med:
            print(
                f"  loadmaster-sha256 / tar  = {result['loadmaster_sha256_over_tar']:.2f}x wall, "
                f"{result['cpu_loadmaster_sha256_over_tar']:.2f}x CPU (the hash manifests named before)"
            )
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
