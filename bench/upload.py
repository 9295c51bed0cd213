"""Benchmark: upload one checkpoint step folder with loadmaster, ``s5cmd cp`` and ``aws s3 cp``.

Starts its own SeaweedFS S3 (``backend.lab.SeaweedS3``) on loopback, generates a DCP-shaped step
folder (``--size-gb`` GB of random bytes in 8 ``__N_0.distcp`` rank files plus ``.metadata``),
then uploads it with each tool in its own process, alternating the order every round, each
into its own prefix of one bucket. Every upload is checked afterwards (object count and bytes).

* loadmaster -- ``backend.checkpoints.upload.upload_dir`` with its defaults (32 MiB parts,
  8 parts in flight, per-part Content-MD5 + composite-ETag verification, unsigned payload as
  botocore does over https, .metadata last);
* s5cmd      -- ``s5cmd cp 'DIR/*' s3://bucket/prefix/`` with its defaults;
* aws        -- ``aws s3 cp --recursive`` (awscli v1 in the venv) with its defaults.

Wall time per tool includes process start-up. Goal: loadmaster/s5cmd throughput >= 0.9 and
loadmaster >= 1.5x aws cli.

Usage: .venv/bin/python bench/upload.py [--size-gb 2] [--rounds 1] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backend.lab import SeaweedS3  # noqa: E402

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


def run(tool: str, step: Path, s3: SeaweedS3, bucket: str, prefix: str, env: dict[str, str]) -> float:
    url = f"s3://{bucket}/{prefix}"
    if tool == "loadmaster":
        params = {"url": url, "endpoint_url": s3.endpoint, "region": s3.region, "addressing_style": "path"}
        cmd = [sys.executable, "-c", LM, json.dumps(params), str(step)]
    elif tool == "s5cmd":
        cmd = [str(BIN / "s5cmd"), "--endpoint-url", s3.endpoint, "cp", f"{step}/*", f"{url}/"]
    else:
        cmd = [str(BIN / "aws"), "s3", "cp", "--recursive", "--only-show-errors", "--endpoint-url", s3.endpoint,
               str(step), f"{url}/"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    secs = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{tool} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return secs


def check(s3: SeaweedS3, bucket: str, prefix: str, step: Path) -> None:
    c = s3.client()
    got = {}
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            got[o["Key"][len(prefix) + 1:]] = o["Size"]
    want = {p.name: p.stat().st_size for p in step.iterdir()}
    if got != want:
        raise SystemExit(f"upload to {prefix} incomplete: {len(got)} objects vs {len(want)} files")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=2.0, help="size of the step folder (default 2 GB)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds, alternating the order (default 1)")
    ap.add_argument("--workdir", help="scratch directory (default: a temp dir, removed at the end)")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="lm-bench-upload-"))
    s3 = SeaweedS3(work / "weed")  # start() takes a free port block (TIME_WAIT ports count as free)
    try:
        s3.start()
        bucket = s3.new_bucket("bench")
        step = work / "step-48000"
        print(f"generating {args.size_gb} GB step folder ...", flush=True)
        total = generate(step, args.size_gb)
        env = dict(os.environ, AWS_ACCESS_KEY_ID=s3.access_key, AWS_SECRET_ACCESS_KEY=s3.secret_key,
                   AWS_REGION=s3.region, AWS_DEFAULT_REGION=s3.region, AWS_EC2_METADATA_DISABLED="true",
                   AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
        tools = ["loadmaster", "s5cmd", "aws"]
        times: dict[str, list[float]] = {t: [] for t in tools}
        for r in range(args.rounds):
            order = tools[r % 3:] + tools[:r % 3]
            for tool in order:
                prefix = f"{tool}-r{r}/step-48000"
                print(f"round {r + 1}: {tool} ...", flush=True)
                times[tool].append(run(tool, step, s3, bucket, prefix, env))
                check(s3, bucket, prefix, step)
        med = {t: statistics.median(v) for t, v in times.items()}
        print()
        print(f"Step folder: {total / 1e9:.2f} GB in {len(list(step.iterdir()))} files; SeaweedFS on loopback; "
              f"{args.rounds} round(s), order alternating; wall time incl. process start-up")
        print()
        print("| tool | median s | Gbps | runs (s) |")
        print("|---|---:|---:|---|")
        for t in tools:
            print(f"| {t} | {med[t]:.1f} | {total * 8 / 1e9 / med[t]:.2f} | {', '.join(f'{x:.1f}' for x in times[t])} |")
        print()
        print(f"loadmaster/s5cmd throughput: {med['s5cmd'] / med['loadmaster']:.2f} (goal >= 0.9)")
        print(f"loadmaster/aws throughput: {med['aws'] / med['loadmaster']:.2f} (goal >= 1.5)")
    finally:
        s3.stop()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
