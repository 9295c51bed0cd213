"""Benchmark: upload one checkpoint step folder with loadmaster, ``s5cmd cp`` and ``aws s3 cp``.

Starts its own SeaweedFS S3 (``lab.SeaweedS3``) on loopback, generates a DCP-shaped step
folder (``--size-gb`` GB of random bytes in 8 ``__N_0.distcp`` rank files plus ``.metadata``),
then uploads it with each tool in its own process, rotating the order every round, each into its
own prefix of one bucket. Every upload is checked afterwards (object count and sizes), then its
objects are deleted and the volumes vacuumed (outside the timing) so every run meets the same
nearly empty server.

Each tool runs with the settings an operator gets by default:

* loadmaster -- ``backend.checkpoints.upload.upload_dir`` with its defaults: 32 MiB parts, 8
  parts in flight, one Content-MD5 per part (checked by the server) + composite-ETag and size
  verified after completion, unsigned payload (botocore's own policy over https), .metadata last;
* s5cmd      -- ``s5cmd cp 'DIR/*' s3://bucket/prefix/`` with its defaults (50 MB parts, 5 parts
  in flight per file, 256 workers; aws-sdk-go v1 sends Content-MD5 and signs the SHA-256 of every
  body over http);
* aws        -- ``aws s3 cp --recursive`` (awscli v1 in the venv) with its defaults
  (``max_concurrent_requests`` 10, ``multipart_chunksize`` 8 MB; botocore adds a CRC32 of every
  part and signs the SHA-256 of every body over http).

Reported per tool: median wall time (including process start-up) and throughput, and CPU
seconds per GB of the client process tree (``RUSAGE_CHILDREN``) and of the ``weed`` server
(``/proc/PID/stat``). Both share one machine, so when it is CPU-bound the throughput follows
their sum: "CPU-bound Gbps" = 8 x cores / (client + server CPU s/GB) is what each tool would
reach if the cores did nothing else, a number that other users' load does not move much.

Goal: loadmaster/s5cmd throughput >= 0.9 and loadmaster >= 1.5x aws cli.

Where the time goes here: SeaweedFS spends 8.5-12 CPU s per GB uploaded (about half of it in
Go's crypto/md5.block by perf: it hashes every byte several times on its way to the volume
server), the
clients 2-3, on the same 2 cores. The server is the bottleneck for every tool, and the wall-time
ratios move +-40% with other users' load, so read them next to the CPU columns.

Server options, for experiments only (the test lab keeps its settings; the defaults here are the
lab's): ``--server-tmpfs`` keeps SeaweedFS's data on /dev/shm; ``--weed-arg=-FLAG=VALUE`` passes
any other ``weed mini`` flag. Measured (1-2 GB, 2-3 rounds each): neither tmpfs nor
``-master.volumeSizeLimitMB=1024`` (instead of the lab's 64) changed the server's CPU per GB or
the wall times beyond the noise.

``--ref GIT_REF`` also runs the uploader as of that commit (tool ``loadmaster@GIT_REF``).

Usage: flock /tmp/loadmaster-bench.lock .venv/bin/python bench/upload.py [--size-gb 2] [--rounds 1]
       [--tools loadmaster,s5cmd,aws] [--ref GIT_REF] [--server-tmpfs] [--weed-arg FLAG] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab import SeaweedS3  # noqa: E402

BIN = Path(sys.executable).parent
LM = """
import asyncio, json, sys
from backend.checkpoints.upload import open_store_params, upload_dir
async def main():
    store = open_store_params(json.loads(sys.argv[1]))
    try:
        res = await upload_dir(store, sys.argv[2], "")
    finally:
        await store.close()
    print(json.dumps(res.as_dict()))
asyncio.run(main())
"""


def generate(step: Path, size_gb: float, files: int = 8) -> int:
    step.mkdir(parents=True, exist_ok=True)
    per = int(size_gb * 1e9 / files)
    chunk = 16 << 20
    for i in range(files):
        with open(step / f"__{i}_0.distcp", "wb") as f:
            left = per
            while left > 0:
                n = min(chunk, left)
                f.write(os.urandom(n))
                left -= n
    (step / ".metadata").write_bytes(os.urandom(64 << 10))
    return sum(p.stat().st_size for p in step.iterdir())


def proc_cpu(pid: int) -> float:
    """utime + stime of one process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def checkout(ref: str, dest: Path) -> Path:
    """``backend/`` as of git ``ref``, extracted under ``dest`` (to compare uploader versions)."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", ref, "backend"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def run(
    tool: str, step: Path, s3: SeaweedS3, bucket: str, prefix: str, env: dict[str, str], trees: dict[str, Path]
) -> tuple[float, float, float]:
    """(wall s, client CPU s, server CPU s) of one upload."""
    url = f"s3://{bucket}/{prefix}"
    cwd = ROOT
    if tool.startswith("loadmaster"):
        params = {"url": url, "endpoint_url": s3.endpoint, "region": s3.region, "addressing_style": "path"}
        cmd = [sys.executable, "-c", LM, json.dumps(params), str(step)]
        cwd = trees.get(tool, ROOT)  # "loadmaster@REF": that commit's backend/
    elif tool == "s5cmd":
        cmd = [str(BIN / "s5cmd"), "--endpoint-url", s3.endpoint, "cp", f"{step}/*", f"{url}/"]
    else:
        cmd = [
            str(BIN / "aws"),
            "s3",
            "cp",
            "--recursive",
            "--only-show-errors",
            "--endpoint-url",
            s3.endpoint,
            str(step),
            f"{url}/",
        ]
    assert s3.proc is not None
    c0, w0 = children_cpu(), proc_cpu(s3.proc.pid)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    secs = time.perf_counter() - t0
    client, server = children_cpu() - c0, proc_cpu(s3.proc.pid) - w0
    if p.returncode != 0:
        raise SystemExit(f"{tool} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return secs, client, server


def check(s3: SeaweedS3, bucket: str, prefix: str, step: Path) -> None:
    c = s3.client()
    got = {}
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            got[o["Key"][len(prefix) + 1 :]] = o["Size"]
    want = {p.name: p.stat().st_size for p in step.iterdir()}
    if got != want:
        raise SystemExit(f"upload to {prefix} incomplete: {len(got)} objects vs {len(want)} files")


def clean(s3: SeaweedS3, bucket: str, prefix: str, step: Path) -> None:
    """Delete one run's objects and vacuum, so every run meets the same (near-empty) server."""
    s3.client().delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": f"{prefix}/{p.name}"} for p in step.iterdir()]}
    )
    with contextlib.suppress(OSError):
        urllib.request.urlopen(f"http://{s3.ip}:{s3.base_port}/vol/vacuum?garbageThreshold=0.0001", timeout=120).read()
    time.sleep(1)  # let the (asynchronous) compaction finish before the next run is timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=2.0, help="size of the step folder (default 2 GB)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds, alternating the order (default 1)")
    ap.add_argument("--workdir", help="scratch directory (default: a temp dir, removed at the end)")
    ap.add_argument("--tools", default="loadmaster,s5cmd,aws", help="comma-separated subset of the tools")
    ap.add_argument(
        "--ref",
        action="append",
        default=[],
        metavar="GIT_REF",
        help="also run the uploader as of this commit, as tool 'loadmaster@GIT_REF' (repeatable)",
    )
    ap.add_argument(
        "--server-tmpfs",
        action="store_true",
        help="keep SeaweedFS's data on tmpfs (/dev/shm) instead of the scratch disk",
    )
    ap.add_argument(
        "--weed-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra 'weed mini' flag, e.g. --weed-arg=-filer.maxMB=16 (repeatable)",
    )
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed bench still stops its server
    work = Path(args.workdir or tempfile.mkdtemp(prefix="lm-bench-upload-"))
    weed_root = Path(tempfile.mkdtemp(prefix="lm-bench-weed-", dir="/dev/shm")) if args.server_tmpfs else work / "weed"
    # start() takes a free port block (TIME_WAIT ports count as free)
    weed_args = tuple(args.weed_arg)
    s3 = SeaweedS3(weed_root, extra_args=weed_args)
    try:
        s3.start()
        bucket = s3.new_bucket("bench")
        step = work / "step-48000"
        print(f"generating {args.size_gb} GB step folder ...", flush=True)
        total = generate(step, args.size_gb)
        env = dict(
            os.environ,
            AWS_ACCESS_KEY_ID=s3.access_key,
            AWS_SECRET_ACCESS_KEY=s3.secret_key,
            AWS_REGION=s3.region,
            AWS_DEFAULT_REGION=s3.region,
            AWS_EC2_METADATA_DISABLED="true",
            AWS_CONFIG_FILE=os.devnull,
            AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        )
        tools = [t for t in ("loadmaster", "s5cmd", "aws") if t in args.tools.split(",")]
        trees = {f"loadmaster@{ref}": checkout(ref, work / f"ref-{i}") for i, ref in enumerate(args.ref)}
        tools[1:1] = list(trees)
        runs: dict[str, list[tuple[float, float, float]]] = {t: [] for t in tools}
        for r in range(args.rounds):
            k = r % len(tools)
            order = tools[k:] + tools[:k]
            for tool in order:
                prefix = f"{tool.replace('@', '-')}-r{r}/step-48000"
                res = run(tool, step, s3, bucket, prefix, env, trees)
                print(
                    f"round {r + 1}: {tool:10s} {res[0]:6.1f} s  client CPU {res[1]:5.1f} s  "
                    f"server CPU {res[2]:5.1f} s  (load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
                runs[tool].append(res)
                check(s3, bucket, prefix, step)
                clean(s3, bucket, prefix, step)
        gb = total / 1e9
        med = {t: [statistics.median(x[i] for x in v) for i in range(3)] for t, v in runs.items()}
        print()
        print(
            f"Step folder: {gb:.2f} GB in {len(list(step.iterdir()))} files; SeaweedFS on loopback "
            f"({' '.join(('tmpfs' if args.server_tmpfs else 'disk', *weed_args))}); "
            f"{args.rounds} round(s), order rotating; wall time incl. process start-up; "
            f"load avg {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
        )
        print()
        cores = os.cpu_count() or 1
        print("| tool | median s | Gbps | client CPU s/GB | server CPU s/GB | CPU-bound Gbps | runs (s) |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for t in tools:
            w, c, sv = med[t]
            print(
                f"| {t} | {w:.1f} | {gb * 8 / w:.2f} | {c / gb:.2f} | {sv / gb:.2f} | "
                f"{8 * cores * gb / (c + sv):.2f} | {', '.join(f'{x[0]:.1f}' for x in runs[t])} |"
            )
        print()
        for a, b, goal in (("loadmaster", "s5cmd", "0.9"), ("loadmaster", "aws", "1.5"), ("s5cmd", "aws", "-")):
            if a in med and b in med:
                print(f"{a}/{b} throughput: {med[b][0] / med[a][0]:.2f} (goal >= {goal})")
    finally:
        s3.stop()
        if args.server_tmpfs:
            shutil.rmtree(weed_root, ignore_errors=True)
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
