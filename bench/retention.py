"""Benchmark: prune a run's old checkpoints with ``loadmaster retention`` vs ``s5cmd rm``.

Starts a private SeaweedFS S3 (``weed mini``), uploads two identical runs of ``--steps`` DCP
step folders, each holding a real DCP ``.metadata`` and ``--objects`` shard files, then deletes
every step but the latest two in each run:

* loadmaster -- ``compute_plan`` (fresh listing) + ``apply_plan`` (re-listing, re-check, journal,
  batched DeleteObjects of 1000 keys, audit record): everything ``retention apply --yes`` does;
* peer       -- ``s5cmd rm`` of the same step folders (one wildcard per step, one process).

Reports wall seconds for each and the ratio loadmaster / s5cmd (lower is better), objects
deleted per second, and checks that both left exactly the latest two steps.

Usage: .venv/bin/python bench/retention.py [--steps 20] [--objects 250]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore")


def make_step_template(work: Path, objects: int) -> Path:
    """One real DCP step (tiny model + AdamW) padded with ``objects`` extra .distcp shard files."""
    import torch
    import torch.distributed.checkpoint as dcp

    model = torch.nn.Linear(8, 8)
    optim = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    optim.step()
    d = work / "template"
    dcp.save({"model": model.state_dict(), "optim": optim.state_dict()}, checkpoint_id=str(d))
    for i in range(1, objects):
        (d / f"__{i}_0.distcp").write_bytes(os.urandom(1024))
    return d


def build_run(work: Path, name: str, template: Path, steps: int) -> Path:
    run = work / name
    for s in range(1, steps + 1):
        shutil.copytree(template, run / f"step-{s * 1000}")
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--objects", type=int, default=250, help="objects per step folder")
    args = ap.parse_args()

    from backend.config import StateSettings, StoreProfile, parse_config
    from backend.policy.retention import RetentionPolicy
    from backend.retention import apply_plan, compute_plan
    from backend.services import Services
    from lab.seaweed import SeaweedS3

    work = Path(tempfile.mkdtemp(prefix="lm-bench-ret-"))
    s3 = SeaweedS3(work / "s3")
    try:
        s3.start()
        bucket = s3.new_bucket("bench")
        env = {
            **os.environ,
            "AWS_SHARED_CREDENTIALS_FILE": str(s3.credentials_file),
            "AWS_PROFILE": "lab",
            "AWS_REGION": s3.region,
        }
        os.environ.update({"AWS_SHARED_CREDENTIALS_FILE": str(s3.credentials_file)})
        s5 = [shutil.which("s5cmd") or str(Path(sys.executable).parent / "s5cmd"), "--endpoint-url", s3.endpoint]
        template = make_step_template(work, args.objects)
        for name in ("run-lm", "run-peer"):
            run = build_run(work / "src", name, template, args.steps)
            subprocess.run([*s5, "cp", f"{run}/*", f"s3://{bucket}/{name}/"], env=env, check=True, capture_output=True)
        total_objects = args.steps * args.objects

        profile = StoreProfile(
            url=f"s3://{bucket}",
            endpoint_url=s3.endpoint,
            provider="aws",
            region=s3.region,
            profile="lab",
            addressing_style="path",
            name="bench",
        )
        config = parse_config({"nodes": [{"name": "here", "transport": "local"}]}, file="bench")
        import dataclasses

        config = dataclasses.replace(config, stores={"bench": profile}, state=StateSettings(dir=str(work / "state")))
        services = Services(config)

        async def loadmaster() -> tuple[int, int]:
            t0 = time.perf_counter()
            plan = await compute_plan(services, f"s3://{bucket}/run-lm", RetentionPolicy(keep_full_latest=2))
            t1 = time.perf_counter()
            report = await apply_plan(services, plan)
            print(f"plan {t1 - t0:.2f}s apply {time.perf_counter() - t1:.2f}s")
            assert report.ok, report.as_dict()
            return report.count("done"), len(plan.actions)

        t = time.perf_counter()
        done, planned = asyncio.run(loadmaster())
        lm_s = time.perf_counter() - t

        peer_steps = [f"s3://{bucket}/run-peer/step-{s * 1000}/*" for s in range(1, args.steps - 1)]
        t = time.perf_counter()
        cmds = "\n".join(f"rm '{u}'" for u in peer_steps) + "\n"
        subprocess.run([*s5, "run"], input=cmds.encode(), env=env, check=True, capture_output=True)
        peer_s = time.perf_counter() - t

        left = {}
        for name in ("run-lm", "run-peer"):
            out = subprocess.run([*s5, "ls", f"s3://{bucket}/{name}/*"], env=env, capture_output=True, text=True)
            left[name] = sorted({line.split()[-1].split("/")[0] for line in out.stdout.splitlines() if line.strip()})
        deleted = (args.steps - 2) * args.objects
        print(
            f"\n{args.steps} steps x {args.objects} objects = {total_objects} objects per run; "
            f"{deleted} deleted ({done} of {planned} planned actions)"
        )
        print(f"left: loadmaster {left['run-lm']}, s5cmd {left['run-peer']}")
        print("\n| tool | wall s | objects deleted/s |")
        print("|---|---:|---:|")
        print(f"| loadmaster retention plan+apply | {lm_s:.2f} | {deleted / lm_s:.0f} |")
        print(f"| s5cmd rm | {peer_s:.2f} | {deleted / peer_s:.0f} |")
        print(f"\nratio loadmaster / s5cmd wall time: {lm_s / peer_s:.2f}")
        services.db.close()
    finally:
        s3.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
