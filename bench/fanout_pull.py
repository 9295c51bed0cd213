"""Relay pull against parallel per-node pulls and a single-node pull, side by side in one run (#21).

Starts its own lab: N real sshd nodes on loopback (default 4, all at one site: one cluster) and
SeaweedFS S3 behind a counting proxy (:mod:`tests.counting_proxy`), so the bytes the store
sends are measured outside loadmaster. Uploads the data (default 16 x 64 MiB = 1.07 GB), then,
for each round, in turns:

* single: ``loadmaster pull`` to one node (the time a relay is held against);
* direct: ``loadmaster pull --nodes ... --fanout direct``: every node from the store, in parallel;
* relay: ``loadmaster pull --nodes ... --fanout relay``: one seed from the store, a chain of peers.

Each is the whole command (listing, probes, quote, launch over SSH, copy, verification, every
node's copy verified) and every copy is checked by size before it is removed. Prints a markdown
table and the goals: relay store bytes <= 1.05x the data, relay wall time <= 1.3x single and no
worse than direct. On a loopback lab every node shares the machine's cores and disk, so the
direct pulls compete for the same CPU the relay's peers use: read the ratios with the load
average printed beside them.

    .venv/bin/python bench/fanout_pull.py                        # 4 nodes, 1.07 GB, 2 rounds
    .venv/bin/python bench/fanout_pull.py --nodes 8 --object-mb 128 --rounds 1   # 8 nodes, 2.1 GB
    .venv/bin/python bench/fanout_pull.py --json
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

from bench.pull_overhead import STORES, _upload  # noqa: E402 - the same objects as the pull benchmark's
from lab import Lab, LabNodeOptions  # noqa: E402
from tests.counting_proxy import CountingProxy  # noqa: E402


def _config(lab: Lab, root: Path, proxy: CountingProxy, args: argparse.Namespace) -> Path:
    assert lab.s3 is not None
    jobs = (
        "[pull]\n"
        f"numworkers = {args.numworkers}\nconcurrency = {args.concurrency}\npart_size_mib = {args.part_size}\n"
        f'relay_chunk_mib = {args.chunk_mib}\nrelay_degree = {args.degree}\nrelay_grace = "5s"\n'
    )
    text = lab.config_text("\n" + jobs).replace(f'dir = "{lab.root / "state"}"', f'dir = "{root / "state"}"')
    text = text.replace(f'endpoint_url = "{lab.s3.endpoint}"', f'endpoint_url = "{proxy.endpoint}"')
    cfg = root / "lm.toml"
    cfg.write_text(text)
    return cfg


def _pull(lab: Lab, cfg: Path, src: str, dest: str, nodes: str, fanout: str) -> float:
    env = {**os.environ, **lab.env(), "LOADMASTER_CONFIG": str(cfg)}
    cmd = [str(Path(sys.executable).parent / "loadmaster"), "pull", src, dest, "--nodes", nodes, "--yes"]
    cmd += ["--fanout", fanout]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"loadmaster pull --fanout {fanout} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return dt


def _check_and_remove(lab: Lab, names: list[str], dest: str, objects: int, size: int) -> None:
    for n in names:
        d = lab.node(n).scratch / dest
        files = sorted(p for p in d.rglob("*") if p.is_file())
        if len(files) != objects or any(p.stat().st_size != size for p in files):
            raise SystemExit(f"{n}: {d} does not hold the {objects} objects of {size} bytes")
        shutil.rmtree(d)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=4, help="lab nodes (4 to 8)")
    ap.add_argument("--objects", type=int, default=16)
    ap.add_argument("--object-mb", type=int, default=64, help="MiB per object (default 64: 1.07 GB in all)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--numworkers", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--part-size", type=int, default=64)
    ap.add_argument("--chunk-mib", type=int, default=4, help="relay chunk (MiB)")
    ap.add_argument("--degree", type=int, default=1, help="relay degree: 1 = a chain")
    ap.add_argument(
        "--store",
        choices=sorted(STORES),
        default="md5",
        help="what the store keeps for each object: md5 (ETags only, as in the runs recorded before "
        "#33; every node proves its copy by MD5) or crc64nvme (a full-object checksum, as AWS S3 keeps)",
    )
    ap.add_argument("--json", action="store_true", help="print the rounds as JSON too")
    args = ap.parse_args()
    if not 2 <= args.nodes <= 16:
        raise SystemExit("--nodes must be between 2 and 16")
    load0 = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    root = Path(tempfile.mkdtemp(prefix="lm-bench-fanout-"))
    options = {f"node-{i:02d}": LabNodeOptions(gpus=0, nvidia_smi=False) for i in range(1, args.nodes + 1)}
    lab = Lab(root / "lab", nodes=args.nodes, options=options).up()
    assert lab.s3 is not None
    proxy = CountingProxy(lab.s3.endpoint).start()
    try:
        prefix = "bench/fanout"
        size = args.object_mb * 2**20
        data = args.objects * size
        _upload(lab, prefix, args.objects, size, STORES[args.store])
        src = f"s3://{lab.bucket}/{prefix}/*"
        cfg = _config(lab, root, proxy, args)
        names = lab.names()
        every = f"node-[01-{args.nodes:02d}]"
        # A warm-up (page cache, SSH host keys, the connection keeper), not counted.
        _pull(lab, cfg, src, "warm", "node-01", "direct")
        _check_and_remove(lab, ["node-01"], "warm", args.objects, size)
        rows = []
        for i in range(args.rounds):
            kinds = ["single", "direct", "relay"]
            order = kinds[i % 3 :] + kinds[: i % 3]
            row: dict[str, float] = {}
            for which in order:
                dest = f"r{i}-{which}"
                targets = ["node-01"] if which == "single" else names
                proxy.reset()
                row[which] = _pull(
                    lab,
                    cfg,
                    src,
                    dest,
                    "node-01" if which == "single" else every,
                    "direct" if which != "relay" else "relay",
                )
                row[f"{which}_bytes"] = proxy.served
                _check_and_remove(lab, targets, dest, args.objects, size)
            rows.append(row)
        load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"\nload average at the end (1/5/15 min): {load}; at the start: {load0}")
        print(
            f"\n### fan-out pull: {args.nodes} nodes, {args.objects} x {args.object_mb} MiB ({data / 1e9:.2f} GB), "
            f"relay degree {args.degree}, chunk {args.chunk_mib} MiB, store keeps {args.store}\n"
        )
        print(
            "| round | single node (s) | direct, parallel (s) | relay (s) | relay / single | relay / direct | "
            "store bytes direct | store bytes relay |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n, r in enumerate(rows, 1):
            print(
                f"| {n} | {r['single']:.2f} | {r['direct']:.2f} | {r['relay']:.2f} | {r['relay'] / r['single']:.3f} | "
                f"{r['relay'] / r['direct']:.3f} | {r['direct_bytes'] / data:.3f}x | {r['relay_bytes'] / data:.4f}x |"
            )
        vs_single = statistics.median(r["relay"] / r["single"] for r in rows)
        vs_direct = statistics.median(r["relay"] / r["direct"] for r in rows)
        ratio = max(r["relay_bytes"] / data for r in rows)
        print(
            f"\nstore bytes, relay: **{ratio:.4f}x** the data (goal <= 1.05); wall time relay/single: "
            f"**{vs_single:.3f}** (goal <= 1.3); relay/direct: **{vs_direct:.3f}** (goal <= 1.0)"
        )
        if args.json:
            print(json.dumps({"nodes": args.nodes, "bytes": data, "rounds": rows}, indent=2))
    finally:
        proxy.stop()
        lab.down()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
