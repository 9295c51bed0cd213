"""Slurm at fleet scale: parse time of one refresh (``sinfo --json`` and ``squeue --json``, and the
``scontrol -o`` text forms) at 1,024 nodes and 5,000 jobs.

The documents are recorded output, scaled: each node and job record is one recorded from this
machine's real Slurm 22.05 (tests/slurm/data/*-22.05.*) or written from 23.02's documented schema
(tests/slurm/data/*-23.02.json), copied with new names (``gpu-0001``..), states cycled
(allocated, mixed, idle, idle+DRAIN, mixed+DRAIN, down), jobs spread over the nodes with GPU
indices. loadmaster reads Slurm once per ``[slurm] interval`` (30 s default) with one call for nodes
and one for jobs, so this is the console's whole cost per refresh apart from the commands
themselves. Median of ``--repeat`` runs after one warm-up.

    .venv/bin/python bench/slurm_parse.py                  # 1,024 nodes, 5,000 jobs
    .venv/bin/python bench/slurm_parse.py --nodes 4096 --jobs 20000 --json /tmp/slurm.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.slurm.parse import parse_jobs_json, parse_jobs_text, parse_nodes_json, parse_nodes_text  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "tests" / "slurm" / "data"
STATES_22 = [("allocated", []), ("mixed", []), ("idle", []), ("idle", ["DRAIN"]), ("mixed", ["DRAIN"]), ("down", [])]


def node_name(i: int) -> str:
    return f"gpu-{i:04d}"


def nodes_22(n: int) -> str:
    doc = json.loads((DATA / "sinfo-22.05.json").read_text())
    proto = doc["nodes"][0]
    out = []
    for i in range(n):
        rec = copy.deepcopy(proto)
        rec["name"] = rec["hostname"] = node_name(i)
        rec["state"], rec["state_flags"] = STATES_22[i % len(STATES_22)]
        rec["gres"], rec["gres_used"] = "gpu:8", "gpu:4"
        out.append(rec)
    doc["nodes"] = out
    return json.dumps(doc, indent=2)


def nodes_23(n: int) -> str:
    doc = json.loads((DATA / "sinfo-23.02.json").read_text())
    proto = doc["nodes"][0]
    out = []
    for i in range(n):
        rec = copy.deepcopy(proto)
        rec["name"] = rec["hostname"] = node_name(i)
        base, flags = STATES_22[i % len(STATES_22)]
        rec["state"] = [base.upper(), *flags]
        out.append(rec)
    doc["nodes"] = out
    return json.dumps(doc, indent=2)


def jobs_json(n_jobs: int, n_nodes: int, shape: str) -> str:
    doc = json.loads((DATA / f"squeue-{shape}.json").read_text())
    proto = doc["jobs"][0]
    out = []
    for i in range(n_jobs):
        rec: dict[str, Any] = copy.deepcopy(proto)
        rec["job_id"] = 100000 + i
        rec["name"] = f"train-{i}"
        a, b = i % n_nodes, (i + 1) % n_nodes
        rec["nodes"] = f"{node_name(a)},{node_name(b)}"
        rec["gres_detail"] = [f"gpu:4(IDX:{(i % 2) * 4}-{(i % 2) * 4 + 3})"] * 2
        out.append(rec)
    doc["jobs"] = out
    return json.dumps(doc, indent=2)


def text_forms(n_nodes: int, n_jobs: int) -> tuple[str, str]:
    node_line = (DATA / "scontrol-node-22.05.txt").read_text().splitlines()[0]
    job_line = (DATA / "scontrol-job-22.05.txt").read_text().splitlines()[0]
    nodes = "\n".join(node_line.replace("node-01", node_name(i)) for i in range(n_nodes))
    jobs = "\n".join(
        job_line.replace("JobId=1 ", f"JobId={100000 + i} ").replace("node-01", node_name(i % n_nodes))
        for i in range(n_jobs)
    )
    return nodes, jobs


def timed(fn: Any, arg: str, repeat: int) -> tuple[float, int]:
    fn(arg)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        got, skipped = fn(arg)
        times.append(time.perf_counter() - t)
        assert not skipped, skipped[:3]
    return statistics.median(times), len(got)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    cases = [
        ("sinfo --json (22.05, v0.0.38)", parse_nodes_json, nodes_22(args.nodes)),
        ("sinfo --json (23.02, v0.0.39)", parse_nodes_json, nodes_23(args.nodes)),
        ("squeue --json (22.05)", parse_jobs_json, jobs_json(args.jobs, args.nodes, "22.05")),
        ("squeue --json (23.02)", parse_jobs_json, jobs_json(args.jobs, args.nodes, "23.02")),
    ]
    tn, tj = text_forms(args.nodes, args.jobs)
    cases += [("scontrol show node -o", parse_nodes_text, tn), ("scontrol show job -d -o", parse_jobs_text, tj)]
    results = []
    print(f"{'document':34} {'records':>8} {'MB':>7} {'parse ms':>9} {'us/record':>10}")
    for name, fn, text in cases:
        secs, count = timed(fn, text, args.repeat)
        mb = len(text.encode()) / 1e6
        print(f"{name:34} {count:8d} {mb:7.2f} {secs * 1000:9.1f} {secs / count * 1e6:10.1f}")
        results.append({"document": name, "records": count, "mb": round(mb, 3), "parse_ms": round(secs * 1000, 2)})
    doc = {
        "bench": "slurm_parse",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nodes": args.nodes,
        "jobs": args.jobs,
        "python": platform.python_version(),
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "results": results,
    }
    print(json.dumps(doc))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
