"""Triage of a 256-node job through a real Prometheus: query to answer.

A real Prometheus 2.42 serves 256 synthetic nodes x 8 GPUs of the dcgm-exporter health series
triage reads (SM clock, utilisation, power, clock event reasons, ECC, row remap pending/failure,
Xid, PCIe replay and NVLink CRC counters), made by the dcgm-exporter stand-in's own value
functions (lab.dcgm_exporter: the stand-in nvidia-smi scenario with per-GPU faults) and
loaded with ``promtool tsdb create-blocks-from openmetrics``. One GPU is a straggler (95% SM clock,
HW slowdown); one GPU of another node fell off the bus (only its Xid 79 left). The timed part is
``ops.triage.run(nodes=..., source="prometheus")``: the queries over HTTP, the parse, the
analysis, the commands. Goal (#32): within 2 s; the answer must name exactly those two GPUs.

    .venv/bin/python bench/triage.py                     # 256 nodes, 5 runs
    .venv/bin/python bench/triage.py --nodes 64 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.config import load_config  # noqa: E402
from backend.ops import Operations
from backend.services import Services  # noqa: E402
from lab import fake_nvidia_smi  # noqa: E402
from lab.dcgm_exporter import (  # noqa: E402
    FIELDS_BY_NAME,
    DcgmNode,
    format_value,
    gpu_labels,
    gpu_values,
    label_text,
    xid_message,
)
from lab.prometheus import PrometheusServer, find_promtool  # noqa: E402

FIELDS = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
)


def write_fleet(path: Path, names: list[str], gpus: int, slow: str, lost: str, t0: float, t1: float) -> int:
    """The fleet's health series as OpenMetrics (every family declared a gauge: OpenMetrics wants
    ``_total`` on counters, and PromQL's increase() does not look at the type)."""
    step = 15.0
    times = [k * step for k in range(math.ceil(t0 / step), math.floor(t1 / step) + 1)]
    per_family: dict[str, list[str]] = {f: [] for f in FIELDS}
    for idx, name in enumerate(names):
        sc = {
            **fake_nvidia_smi.DEFAULTS,
            "gpus": gpus,
            "pattern": "training",
            "start": t0,
            "uuid_prefix": f"GPU-{idx:08x}-0000-4000-8000-",
            "dcgm_counters": "health",
            "faults": {"5": {"sm_clock_pct": 95, "clock_reasons": 0x8}} if name == slow else {},
            "lost_gpu": 2 if name == lost else None,
        }
        node = DcgmNode(name, "")
        base = f'instance="{name}",job="dcgm"'
        for i in range(gpus):
            labels = f"{base},{label_text(gpu_labels(node, sc, i))}"
            per_t = [gpu_values(node, sc, i, t - t0) for t in times]
            for fname in FIELDS:
                if fname not in per_t[0]:
                    continue
                extra = ""
                if fname == "DCGM_FI_DEV_XID_ERRORS":
                    code = int(per_t[0][fname])
                    extra = f',err_code="{code}",err_msg="{xid_message(code)}"'
                fld = FIELDS_BY_NAME[fname]
                per_family[fname].extend(
                    f"{fname}{{{labels}{extra}}} {format_value(fld, v[fname])} {t:.3f}\n"
                    for v, t in zip(per_t, times, strict=True)
                )
    series = 0
    with path.open("w") as f:
        for fname, lines in per_family.items():
            f.write(f"# TYPE {fname} gauge\n")
            f.writelines(lines)
            series += len(lines) // len(times)
        f.write("# EOF\n")
    return series


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="print where one more run spends its time")
    args = ap.parse_args()
    names = [f"node-{i:04d}" for i in range(1, args.nodes + 1)]
    slow, lost = names[len(names) // 2], names[-3]
    root = Path(tempfile.mkdtemp(prefix="lm-bench-triage-"))
    now = time.time()
    om = root / "fleet.om"
    clock = time.monotonic()
    series = write_fleet(om, names, args.gpus, slow, lost, now - 900, now + 600)
    data = root / "data"
    data.mkdir()
    subprocess.run(
        [find_promtool(), "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(om), str(data)], check=True
    )
    om.unlink()
    made = time.monotonic() - clock
    prom = PrometheusServer(root / "prom", data_dir=data).start()
    try:
        cfg = root / "lm.toml"
        cfg.write_text(
            "".join(f'[[nodes]]\nname = "{n}"\nhost = "{n}"\ntransport = "local"\n' for n in names)
            + f'[state]\ndir = "{root / "state"}"\n'
            + f'[telemetry]\nsource = "prometheus"\nprometheus_url = "{prom.url}"\nprometheus_timeout = "30s"\n'
        )
        services = Services(load_config(cfg))
        ops = Operations(services)
        took = []
        report = None
        for _ in range(args.runs):
            t = time.perf_counter()
            report = asyncio.run(ops.triage.run(nodes=[",".join(names)], source="prometheus"))
            took.append(time.perf_counter() - t)
        if args.profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            asyncio.run(ops.triage.run(nodes=[",".join(names)], source="prometheus"))
            prof.disable()
            pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
        assert report is not None
        named = sorted((s.node, s.gpus) for s in report.suspects)
        want = sorted([(slow, (5,)), (lost, (2,))])
        result = {
            "nodes": args.nodes,
            "gpus": args.nodes * args.gpus,
            "series": series,
            "fleet_made_s": round(made, 1),
            "query_to_answer_s": {"median": round(statistics.median(took), 3), "max": round(max(took), 3)},
            "suspects": [f"{n} GPU {','.join(map(str, g))}" for n, g in named],
            "exact": named == want,
            "goal_s": 2.0,
        }
        print(json.dumps(result, indent=1))
        services.db.close()
        return 0 if named == want and max(took) <= 2.0 else 1
    finally:
        prom.stop()


if __name__ == "__main__":
    sys.exit(main())
