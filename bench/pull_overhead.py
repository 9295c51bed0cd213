"""Wall time of a verified ``loadmaster pull`` against bare ``s5cmd cp`` with the same flags, side by side.

Starts its own lab (one real sshd node on loopback and SeaweedFS S3), uploads N objects twice:
once as AWS S3 keeps objects today (a full-object CRC64NVME the store serves on HEAD), once with
no checksum at all (the store has only the MD5 ETag), then alternates, in one run: the bare
tuned command (``s5cmd --numworkers 256 cp --concurrency 32 --part-size 64``, run as a local
process, as an operator would on the node) and the same pull through ``loadmaster pull`` (CLI
start-up, listing, free-space probe, egress quote, launch as a durable job over SSH, progress
polling, and the runner's proof of every object's bytes). Prints a markdown table per store kind
with the proof each pull used, the verification's CPU seconds per GB, how many of the machine's
cores each side kept busy (from /proc/stat: where the bare copy already keeps them all busy, every
CPU second a pull adds on the node is wall time) and how long the job went on after s5cmd ended, and the median loadmaster/s5cmd ratio; optionally (``--direct``) also for
``persist = 0`` (every command connects on its own).

    .venv/bin/python bench/pull_overhead.py                    # 2 GB in 16 objects, 3 rounds
    .venv/bin/python bench/pull_overhead.py --object-mb 512    # 8.6 GB
    .venv/bin/python bench/pull_overhead.py --objects 2000 --object-mb 1   # many small objects
    .venv/bin/python bench/pull_overhead.py --stores md5       # only the store without checksums
    .venv/bin/python bench/pull_overhead.py --trace   # also when the CLI started, listed, probed, priced, launched
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab import Lab  # noqa: E402

#: The two kinds of store a pull meets: one that keeps a full-object checksum (AWS S3 today:
#: CRC64NVME) and one that keeps none (only the MD5 ETag of a single-part object).
STORES = {"crc64nvme": "CRC64NVME", "md5": None}


def _upload(lab: Lab, prefix: str, objects: int, size: int, checksum: str | None) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import botocore.session
    from botocore.config import Config as BotoConfig

    from lab.seed import put_object

    s3 = lab.s3
    assert s3 is not None
    # botocore adds a CRC32 of its own unless told to send checksums only when required.
    client = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=s3.endpoint,
        region_name=s3.region,
        aws_access_key_id=s3.access_key,
        aws_secret_access_key=s3.secret_key,
        config=BotoConfig(
            s3={"addressing_style": "path"},
            request_checksum_calculation="when_supported" if checksum else "when_required",
            max_pool_connections=16,
        ),
    )
    block = os.urandom(size)

    def put(i: int) -> None:
        # Distinct bodies per object without paying urandom for every byte.
        body = i.to_bytes(8, "little") + block[8:]
        put_object(client, str(lab.bucket), f"{prefix}/obj-{i:04d}.bin", body, checksum=checksum)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(objects)))


def _s5cmd(lab: Lab) -> str:
    """The s5cmd file the bare commands run: the very one node-01's jobs run (its ``bin/s5cmd``
    link, resolved), so the ratio compares the same executable started the same way (the lab
    links the wheel's Go executable, not its Python launcher: lab/fleet.py)."""
    return str((lab.node("node-01").bin_dir / "s5cmd").resolve())


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from the first line of /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(v) - v[3] - v[4], sum(v)


def _busy_cores(since: tuple[int, int]) -> float:
    """How many of the machine's cores were busy on average since ``since`` (_cpu_jiffies):
    with the bare copy near the core count, anything a pull adds on the node is wall time."""
    busy, total = _cpu_jiffies()
    return (busy - since[0]) / max(1, total - since[1]) * (os.cpu_count() or 1)


def _bare(lab: Lab, src: str, dest: Path, flags: tuple[int, int, int]) -> float:
    nw, cc, ps = flags
    assert lab.s3 is not None
    env = {**os.environ, **lab.env(), "AWS_PROFILE": "lab", "AWS_REGION": lab.s3.region}
    cmd = [
        _s5cmd(lab),
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


def _bare_run(lab: Lab, src: str, dest: Path, flags: tuple[int, int, int]) -> float:
    """Bare ``s5cmd run`` fed one exact ``cp --raw`` per object, as the job feeds it (never a
    wildcard s5cmd would expand itself): what s5cmd alone costs with the job's command shape."""
    import json

    nw, cc, ps = flags
    env = {**os.environ, **lab.env(), "AWS_PROFILE": "lab", "AWS_REGION": lab.s3.region}  # type: ignore[union-attr]
    base = [_s5cmd(lab), "--endpoint-url", lab.s3.endpoint]  # type: ignore[union-attr]
    listing = subprocess.run([*base, "--json", "ls", src], env=env, check=True, capture_output=True, text=True)
    keys = [json.loads(line)["key"] for line in listing.stdout.splitlines() if line.startswith("{")]
    dest.mkdir(parents=True, exist_ok=True)
    script = "".join(f"cp --raw --concurrency {cc} --part-size {ps} {k} {dest / k.rsplit('/', 1)[1]}\n" for k in keys)
    t0 = time.perf_counter()
    subprocess.run(
        [*base, "--numworkers", str(nw), "run"], input=script, text=True, env=env, check=True, stdout=subprocess.DEVNULL
    )
    return time.perf_counter() - t0


#: --trace: the CLI's own LOADMASTER_TRACE lines that mark the plan's steps (ms since the spawn):
#: the command started (imports, config), the listing and the nodes' probes in, the egress priced
#: (the ledger opened in a thread meanwhile), the launch sent and the job started on its node.
TRACE_MARKS = {
    "cmd start": "pull: start",
    "listed": "listed with",
    "ssh up": ": connected",
    "shell ready": "command server ready",
    "probed": "plan: probed",
    "priced": "plan: egress priced",
    "launch sent": "pull: launching",
    "launched": "pull: launched",
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
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise SystemExit(f"loadmaster pull failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    phases = _phases(lab, t0, dt)
    # CPU of the CLI process and what it waited for (its listing), not the node's or the keeper's.
    phases["cli cpu"] = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
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
    details = result.get("details") or {}
    LAST_RESULT.clear()
    LAST_RESULT.update(details)
    return {
        "plan": spec["created"] - wall0,
        "agent": result["started"] - spec["created"],
        "copy": result["finished"] - result["started"],
        "tail": dt - (result["finished"] - wall0),
    }


#: The last pull's result (the job's details: its proofs, verification CPU, time after the copy).
LAST_RESULT: dict[str, object] = {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=16)
    ap.add_argument("--object-mb", type=float, default=128, help="MiB per object (default 128: 2 GiB total)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--numworkers", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--part-size", type=int, default=64)
    ap.add_argument("--stores", choices=["both", *STORES], default="both", help="which kinds of store to pull from")
    ap.add_argument("--direct", action="store_true", help="also pull with [ssh] persist = 0 (each command connects)")
    ap.add_argument(
        "--bare-run",
        action="store_true",
        help="also bare `s5cmd run` fed one exact `cp --raw` per object, as the job does (s5cmd's own cost of that shape)",
    )
    ap.add_argument(
        "--trace",
        action="store_true",
        help="also show when the CLI's command started, it listed, connected, had the node's shell ready "
        "and probed, priced the egress, sent the launch and saw the job start (LOADMASTER_TRACE; "
        "seconds since the spawn)",
    )
    args = ap.parse_args()
    flags = (args.numworkers, args.concurrency, args.part_size)
    stores = list(STORES) if args.stores == "both" else [args.stores]
    load0 = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    root = Path(tempfile.mkdtemp(prefix="lm-bench-pull-"))
    lab = Lab(root / "lab", nodes=1).up()
    try:
        size = int(args.object_mb * 2**20)
        for kind in stores:
            _upload(lab, f"bench/{kind}", args.objects, size, STORES[kind])
        cfg = root / "lm.toml"
        cfg.write_text(lab.config_text().replace(f'dir = "{lab.root / "state"}"', f'dir = "{root / "state"}"'))
        scratch = lab.node("node-01").scratch
        rows: dict[str, list[dict[str, object]]] = {k: [] for k in stores}
        first = 0.0
        for kind in stores:
            src = f"s3://{lab.bucket}/bench/{kind}/*"
            # A warm-up of each so neither side pays first-touch costs (page cache, SSH host keys).
            # loadmaster's first command also starts the connection keeper ([ssh] persist, on by
            # default), which later commands reuse: its time is reported on its own.
            _bare(lab, src, scratch / "warm-bare", flags)
            t, _ = _loadmaster(lab, cfg, src, scratch / "warm-lm", flags)
            first = first or t
            shutil.rmtree(scratch / "warm-bare")
            shutil.rmtree(scratch / "warm-lm")
            for i in range(args.rounds):
                kinds = ("bare", "lm", *(("direct",) if args.direct else ()), *(("run",) if args.bare_run else ()))
                order = kinds[i % len(kinds) :] + kinds[: i % len(kinds)]  # each side first in turn
                row: dict[str, object] = {"round": i + 1}
                for which in order:
                    dest = scratch / f"r{i}-{which}"
                    if which == "bare":
                        j0 = _cpu_jiffies()
                        row["bare"] = _bare(lab, src, dest, flags)
                        row["bare busy"] = _busy_cores(j0)
                    elif which == "run":
                        row["run"] = _bare_run(lab, src, dest, flags)
                    elif which == "lm":
                        j0 = _cpu_jiffies()
                        row["lm"], row["phases"] = _loadmaster(lab, cfg, src, dest, flags, args.trace)
                        row["lm busy"] = _busy_cores(j0)
                        row["result"] = dict(LAST_RESULT)
                    else:
                        row["direct"], _ = _loadmaster(lab, cfg, src, dest, flags, persist="0")
                    shutil.rmtree(dest)
                rows[kind].append(row)
        total_gb = args.objects * size / 1e9
        load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"\nstarted {started}; load average at the end (1/5/15 min): {load}; at the start: {load0}")
        print(f"s5cmd, bare and in the job (node-01's bin/s5cmd): {_s5cmd(lab)}")
        for kind in stores:
            _report(kind, rows[kind], args, flags, total_gb, first)
    finally:
        from backend.config import load_config_file
        from backend.nodes.keeper import stop_keeper

        if (root / "lm.toml").exists():
            stop_keeper(load_config_file(root / "lm.toml"))
        lab.down()
        shutil.rmtree(root, ignore_errors=True)
    return 0


def _report(
    kind: str,
    rows: list[dict[str, Any]],
    args: argparse.Namespace,
    flags: tuple[int, int, int],
    gb: float,
    first: float,
) -> None:
    store = "keeps a full-object CRC64NVME" if STORES[kind] else "keeps no checksum (MD5 ETags only)"
    print(
        f"\n### pull overhead, a store that {store}: {args.objects} x {args.object_mb:g} MiB ({gb:.2f} GB), "
        f"s5cmd --numworkers {flags[0]} cp --concurrency {flags[1]} --part-size {flags[2]}\n"
    )
    marks = list(TRACE_MARKS) if args.trace else []
    direct = (" persist 0 (s) | ratio |" if args.direct else "") + (
        " bare s5cmd run, a cp per object (s) | ratio |" if args.bare_run else ""
    )
    print(
        f"| round | bare s5cmd (s) | loadmaster pull (s) | ratio | cores busy, bare / pull |{direct} proof | verify CPU s/GB | "
        "s5cmd in the job (s) | after the copy (s) | plan+launch | agent start | copy+verify in job | end seen -> exit | "
        "CLI CPU (s) |" + "".join(f" {m} |" for m in marks)
    )
    print(
        "|---:|---:|---:|---:|---:|"
        + "---:|---:|" * (args.direct + args.bare_run)
        + "---|"
        + "---:|" * (8 + len(marks))
    )
    for r in rows:
        ph, res = r["phases"], r["result"]
        proof = ", ".join(f"{m} x{n}" for m, n in (res.get("verification") or {}).items()) or "?"
        proof += f" ({res.get('copy_mode', '?')})"  # staged (one wildcard cp) or one cp per object
        cpu = float(res.get("verify_cpu_s", 0.0)) / gb
        d = "".join(f" {r[k]:.2f} | {r[k] / r['bare']:.3f} |" for k in ("direct", "run") if k in r)
        print(
            f"| {r['round']} | {r['bare']:.2f} | {r['lm']:.2f} | {r['lm'] / r['bare']:.3f} | "
            f"{r['bare busy']:.2f} / {r['lm busy']:.2f} of {os.cpu_count()} |{d} {proof} | {cpu:.3f} | "
            f"{float(res.get('seconds', 0.0)) - float(res.get('verify_tail_s', 0.0)):.2f} | "
            f"{float(res.get('verify_tail_s', 0.0)):.2f} | {ph['plan']:.2f} | {ph['agent']:.2f} | {ph['copy']:.2f} | "
            f"{ph['tail']:.2f} | {ph['cli cpu']:.2f} |"
            + "".join(f" {ph[m]:.2f} |" if m in ph else " - |" for m in marks)
        )
    med = statistics.median(r["lm"] / r["bare"] for r in rows)
    extra = statistics.median(r["lm"] - r["bare"] for r in rows)
    cpu = statistics.median(float(r["result"].get("verify_cpu_s", 0.0)) / gb for r in rows)
    direct_med = (
        f"; with [ssh] persist = 0: {statistics.median(r['direct'] / r['bare'] for r in rows):.3f}"
        if args.direct
        else ""
    )
    if args.bare_run:
        direct_med += (
            f"; bare `s5cmd run` with a cp per object / bare cp: "
            f"{statistics.median(r['run'] / r['bare'] for r in rows):.3f}, loadmaster / that: "
            f"{statistics.median(r['lm'] / r['run'] for r in rows):.3f}"
        )
    print(
        f"\nmedian ratio loadmaster/s5cmd: **{med:.3f}** ({kind} store; connections kept between commands, the "
        f"default){direct_med}; median extra {extra:.2f}s; verification {cpu:.3f} CPU s/GB; bare throughput "
        f"{gb * 8 / statistics.median(r['bare'] for r in rows):.2f} Gbps, keeping "
        f"{statistics.median(r['bare busy'] for r in rows):.2f} of {os.cpu_count()} cores busy (the store "
        "runs on this machine too); the first loadmaster command "
        f"(starts the keeper): {first:.2f}s"
    )


if __name__ == "__main__":
    sys.exit(main())
