"""Wall time of ``loadmaster pull`` against bare ``s5cmd cp`` with the same flags, side by side.

Starts its own lab (one real sshd node on loopback and SeaweedFS S3), uploads N objects, then
alternates, in one run: the bare tuned command (``s5cmd --numworkers 256 cp --concurrency 32
--part-size 64``, run as a local process, as an operator would on the node) and the same pull
through ``loadmaster pull`` (CLI start-up, listing, free-space probe, egress quote, launch as a
durable job over SSH, progress polling, and the runner's size verification). Prints a markdown
table and the median loadmaster/s5cmd ratio (goal: <= 1.05), for the default (SSH connections
kept between commands by the connection keeper, ``[ssh] persist``) and, in the same rounds, for
``persist = 0`` (every command connects on its own).

    .venv/bin/python bench/pull_overhead.py                    # 2 GB in 16 objects, 3 rounds
    .venv/bin/python bench/pull_overhead.py --objects 16 --object-mb 32 --rounds 3   # lighter
    .venv/bin/python bench/pull_overhead.py --trace   # also when the CLI listed, connected, launched
"""

from __future__ import annotations

import argparse
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

from backend.lab import Lab  # noqa: E402


def _upload(lab: Lab, prefix: str, objects: int, size: int) -> None:
    client = lab.s3.client()  # type: ignore[union-attr]
    block = os.urandom(size)
    for i in range(objects):
        # Distinct bodies per object without paying urandom for every byte.
        body = i.to_bytes(8, "little") + block[8:]
        client.put_object(Bucket=lab.bucket, Key=f"{prefix}/obj-{i:03d}.bin", Body=body)


def _bare(lab: Lab, src: str, dest: Path, flags: tuple[int, int, int]) -> float:
    nw, cc, ps = flags
    env = {**os.environ, **lab.env(), "AWS_PROFILE": "lab", "AWS_REGION": lab.s3.region}  # type: ignore[union-attr]
    cmd = [
        shutil.which("s5cmd") or str(Path(sys.executable).parent / "s5cmd"),
        "--numworkers",
        str(nw),
        "--endpoint-url",
        lab.s3.endpoint,
        "cp",
        "--concurrency",
        str(cc),
        "--part-size",
        str(ps),  # type: ignore[union-attr]
        src,
        str(dest) + "/",
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


#: --trace: the CLI's own LOADMASTER_TRACE lines that mark the plan's steps (ms since the spawn).
TRACE_MARKS = {
    "listed": "listed with",
    "ssh up": ": connected",
    "shell ready": "command server ready",
    "launch sent": "pull: launching",
}


def _loadmaster(
    lab: Lab, cfg: Path, src: str, dest: Path, flags: tuple[int, int, int], trace: bool = False, persist: str = "60"
) -> tuple[float, dict[str, float]]:
    nw, cc, ps = flags
    env = {**os.environ, **lab.env(), "LOADMASTER_CONFIG": str(cfg), "LOADMASTER_SSH_PERSIST": persist}
    cmd = [
        str(Path(sys.executable).parent / "loadmaster"),
        "pull",
        src,
        str(dest),
        "--node",
        "node-01",
        "--numworkers",
        str(nw),
        "--concurrency",
        str(cc),
        "--part-size",
        str(ps),
        "--yes",
    ]
    if trace:
        env.update(LOADMASTER_TRACE="1", LOADMASTER_TRACE_T0=repr(time.time()))
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"loadmaster pull failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    phases = _phases(lab, t0, dt)
    for line in res.stderr.splitlines() if trace else ():
        for name, mark in TRACE_MARKS.items():
            if mark in line and name not in phases and line.startswith("[trace"):
                phases[name] = float(line.split()[1]) / 1000
    return dt, phases


def _phases(lab: Lab, t0: float, dt: float) -> dict[str, float]:
    """Where the wall time went, from the job directory's own timestamps (same clock: loopback)."""
    import json

    jobs = sorted((lab.node("node-01").home / "jobs").iterdir(), key=lambda p: p.stat().st_mtime)
    d = jobs[-1]
    spec = json.loads((d / "spec.json").read_text())
    result = json.loads((d / "result.json").read_text())
    wall0 = time.time() - (time.perf_counter() - t0)  # wall-clock time of t0
    return {
        "plan": spec["created"] - wall0,
        "agent": result["started"] - spec["created"],
        "copy": result["finished"] - result["started"],
        "tail": dt - (result["finished"] - wall0),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=16)
    ap.add_argument("--object-mb", type=int, default=128, help="MiB per object (default 128: 2 GiB total)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--numworkers", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--part-size", type=int, default=64)
    ap.add_argument(
        "--trace",
        action="store_true",
        help="also show when the CLI listed, connected, had the "
        "node's shell ready and sent the launch (LOADMASTER_TRACE; seconds since the spawn)",
    )
    args = ap.parse_args()
    flags = (args.numworkers, args.concurrency, args.part_size)
    load0 = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    root = Path(tempfile.mkdtemp(prefix="lm-bench-pull-"))
    lab = Lab(root / "lab", nodes=1).up()
    try:
        prefix = "bench/pull"
        size = args.object_mb * 2**20
        _upload(lab, prefix, args.objects, size)
        src = f"s3://{lab.bucket}/{prefix}/*"
        cfg = root / "lm.toml"
        cfg.write_text(lab.config_text().replace(f'dir = "{lab.root / "state"}"', f'dir = "{root / "state"}"'))
        scratch = lab.node("node-01").scratch
        rows = []
        # A warm-up of each so neither side pays first-touch costs (page cache, SSH host keys).
        # loadmaster's first command also starts the connection keeper ([ssh] persist, on by
        # default), which later commands reuse: its time is reported on its own.
        _bare(lab, src, scratch / "warm-bare", flags)
        first, _ = _loadmaster(lab, cfg, src, scratch / "warm-lm", flags)
        shutil.rmtree(scratch / "warm-bare")
        shutil.rmtree(scratch / "warm-lm")
        for i in range(args.rounds):
            kinds = ("bare", "lm", "direct")
            order = kinds[i % 3 :] + kinds[: i % 3]  # each side goes first, second and last in turn
            times: dict[str, float] = {}
            phases: dict[str, float] = {}
            for which in order:
                dest = scratch / f"r{i}-{which}"
                if which == "bare":
                    times[which] = _bare(lab, src, dest, flags)
                elif which == "lm":
                    times[which], phases = _loadmaster(lab, cfg, src, dest, flags, args.trace)
                else:
                    times[which], _ = _loadmaster(lab, cfg, src, dest, flags, persist="0")
                shutil.rmtree(dest)
            rows.append((i + 1, times["bare"], times["lm"], times["lm"] / times["bare"], phases, times["direct"]))
        total_gb = args.objects * size / 1e9
        load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"\nload average at the end (1/5/15 min): {load}; at the start: {load0}")
        print(
            f"\n### pull overhead: {args.objects} x {args.object_mb} MiB ({total_gb:.2f} GB), "
            f"s5cmd --numworkers {flags[0]} cp --concurrency {flags[1]} --part-size {flags[2]}\n"
        )
        marks = list(TRACE_MARKS) if args.trace else []
        print(
            "| round | bare s5cmd (s) | loadmaster pull (s) | ratio | persist 0 (s) | ratio | plan+launch | "
            "agent start | copy+verify in job | end seen -> exit |" + "".join(f" {m} |" for m in marks)
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(marks))
        for r, b, lm, ratio, ph, direct in rows:
            print(
                f"| {r} | {b:.2f} | {lm:.2f} | {ratio:.3f} | {direct:.2f} | {direct / b:.3f} | {ph['plan']:.2f} | "
                f"{ph['agent']:.2f} | {ph['copy']:.2f} | {ph['tail']:.2f} |"
                + "".join(f" {ph[m]:.2f} |" if m in ph else " - |" for m in marks)
            )
        med = statistics.median(r[3] for r in rows)
        med_direct = statistics.median(r[5] / r[1] for r in rows)
        extra = statistics.median(r[2] - r[1] for r in rows)
        print(
            f"\nmedian ratio loadmaster/s5cmd: **{med:.3f}** (goal <= 1.05; connections kept between "
            f"commands, the default); with [ssh] persist = 0 (each command connects): {med_direct:.3f}; "
            f"median fixed overhead {extra:.2f}s; bare throughput "
            f"{total_gb * 8 / statistics.median(r[1] for r in rows):.2f} Gbps; the first loadmaster command "
            f"(starts the keeper): {first:.2f}s"
        )
    finally:
        from backend.config import load_config_file
        from backend.nodes.keeper import stop_keeper

        if (root / "lm.toml").exists():
            stop_keeper(load_config_file(root / "lm.toml"))
        lab.down()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
