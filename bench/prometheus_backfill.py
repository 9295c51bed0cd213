"""A fleet far larger than loopback (1,024 nodes x 8 GPUs) for the Prometheus benchmarks: its
dcgm-exporter and node_exporter series written as OpenMetrics and turned into TSDB blocks with
``promtool tsdb create-blocks-from openmetrics``, then served by the lab's real Prometheus
(:class:`lab.prometheus.PrometheusServer`) that answers instant queries at the current time.

How the backfill answers "now" (Prometheus 2.42, checked against the Debian build):

* an instant query at T takes, per series, the newest sample in the lookback window
  (T - 5 m, T] (``--query.lookback-delta``); ``rate(x[w])`` needs two samples in [T - w, T]. So the
  samples run from ``now - history`` to ``now + ahead`` every ``step`` (default 15 s: two samples
  in any 30 s window, four in the console's default 60 s ``prometheus_rate_window``): queries at
  "now" answer, gauges and rate() alike, until ``ahead`` has passed, gauges 5 m longer. Samples
  later than T are never used at T, so the future part is harmless;
* promtool cuts blocks at 2 h boundaries and each slice of the fleet is its own promtool run, so
  blocks overlap in time (disjoint series); 2.42 loads overlapping blocks as they are (vertical
  compaction is always on since 2.39). They are loaded before ``/-/ready`` answers;
* the head block only takes samples newer than the newest block's end, so this Prometheus cannot
  also scrape live targets before ``now + ahead``: the target shows "up" but every sample is
  dropped ("out of bounds", "too old or too far into the future" in its log). It scrapes nothing;
  run a :class:`TelemetryStack` beside it for live targets and target health.

Measured here (2 CPUs shared with other jobs, niced): 1,024 nodes x 8 GPUs with the defaults
(history 2 m, ahead 10 m, step 15 s) is 73,216 series, 3.5 M samples, 0.88 GB of OpenMetrics:
writing it 10-22 s, promtool 35-40 s of CPU (45-60 s wall for both, overlapped), Prometheus ready
on the blocks in 0.2 s (28 MB of TSDB).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import fake_nvidia_smi
from lab.dcgm_exporter import (
    CONSOLE_FIELDS,
    FIELDS_BY_NAME,
    DcgmNode,
    format_value,
    gpu_labels,
    gpu_values,
    label_text,
    xid_message,
)
from lab.process import log_tail
from lab.prometheus import (
    DCGM_JOB,
    NODE_JOB,
    NODE_LABEL,
    PrometheusError,
    PrometheusServer,
    find_prometheus,
    find_promtool,
)


@dataclass
class Backfill:
    """What :func:`backfill` wrote and started (``prometheus`` is None with ``start=False``)."""

    root: Path
    data_dir: Path
    names: list[str]
    gpus: int
    start: float
    end: float
    step: float
    series: int
    samples: int
    input_bytes: int
    #: seconds: "write" (the OpenMetrics text, summed over the slices), "blocks" (writing and
    #: promtool, overlapped, until the last block is made), "start" (Prometheus ready)
    seconds: dict[str, float]
    prometheus: PrometheusServer | None = None

    def stop(self) -> None:
        if self.prometheus:
            self.prometheus.stop()


def default_pattern(index: int, name: str) -> str:
    """The backfilled fleet: every tenth node starved, every 50th idle, the rest training."""
    if index % 50 == 49:
        return "idle"
    return "starved" if index % 10 == 1 else "training"


def default_profiling(index: int, name: str) -> bool:
    """Every 16th node's GPUs have no profiling (DCP) metrics."""
    return index % 16 != 15


_NET_DEVICES = (("eth0", 3.125e9), ("ib0", 5.0e10))  # name, link speed in bytes/s (25 and 400 Gb/s)
_FILESYSTEMS = (
    ("/dev/md0", "xfs", "/scratch", 30.72e12),
    ("/dev/nvme0n1p2", "ext4", "/", 1.9e12),
)


def _node_rates(pattern: str, index: int) -> dict[str, float]:
    """Bytes/s a node moves for ``pattern`` (deterministic per node)."""
    jitter = 1.0 + 0.05 * math.sin(index * 0.37)
    busy = {"training": 1.0, "starved": 0.15, "idle": 0.0}.get(pattern, 0.0)
    return {
        "eth0_rx": (1.2e8 * busy + 2.0e4) * jitter,
        "eth0_tx": (2.0e7 * busy + 1.0e4) * jitter,
        "ib0_rx": 9.5e9 * busy * jitter,
        "ib0_tx": 9.4e9 * busy * jitter,
        "read": 1.6e9 * busy * jitter,
        "write": 2.5e8 * busy * jitter,
    }


def _fmt(v: float) -> str:
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


def write_openmetrics(
    path: Path,
    names: list[str],
    *,
    gpus: int,
    start: float,
    end: float,
    step: float,
    pattern_of: Callable[[int, str], str] = default_pattern,
    profiling_of: Callable[[int, str], bool] = default_profiling,
    xids: dict[str, dict[int, int]] | None = None,
    first_index: int = 0,
) -> tuple[int, int]:
    """Write the fleet's dcgm-exporter and node_exporter series (as Prometheus would have scraped
    them: ``job``, ``instance`` = ``node`` = node name, the exporters' own labels) as OpenMetrics
    text, one family at a time, each series in time order. ``first_index``: the fleet index of
    ``names[0]`` (patterns, UUIDs). Returns (series, samples)."""
    xids = xids or {}
    times = []
    k = math.ceil(start / step)
    while k * step <= end:
        times.append(k * step)
        k += 1
    stamps = [_fmt(t) for t in times]
    parts_dir = path.with_name(path.name + ".parts")
    shutil.rmtree(parts_dir, ignore_errors=True)
    parts_dir.mkdir(parents=True)
    part_files: dict[str, Any] = {}
    order: list[tuple[str, str]] = []  # (family, type)
    series = samples = 0

    def emit(family: str, mtype: str, sample_name: str, labels: str, values: list[str]) -> None:
        nonlocal series, samples
        part = part_files.get(family)
        if part is None:
            part = part_files[family] = open(parts_dir / f"{len(order):03d}", "w")  # noqa: SIM115 - closed below
            order.append((family, mtype))
        part.write("".join(f"{sample_name}{{{labels}}} {v} {s}\n" for v, s in zip(values, stamps, strict=True)))
        series += 1
        samples += len(values)

    try:
        for idx, name in enumerate(names, start=first_index):
            pattern = pattern_of(idx, name)
            prof = profiling_of(idx, name)
            scenario = {
                **fake_nvidia_smi.DEFAULTS,
                "gpus": gpus,
                "pattern": pattern,
                "start": start,
                "uuid_prefix": f"GPU-{idx:08x}-0000-4000-8000-",
            }
            dcgm_base = f'instance="{name}",job="{DCGM_JOB}",{NODE_LABEL}="{name}"'
            node_base = f'instance="{name}",job="{NODE_JOB}",{NODE_LABEL}="{name}"'
            node = DcgmNode(name, "", profiling=prof)
            node_xids = xids.get(name, {})
            for i in range(gpus):
                labels = label_text(gpu_labels(node, scenario, i))
                per_t = [
                    gpu_values(node, scenario, i, t - start, xid=node_xids.get(i, 0), profiling=prof) for t in times
                ]
                for fname in CONSOLE_FIELDS:
                    fld = FIELDS_BY_NAME[fname]
                    if fname not in per_t[0]:
                        continue
                    extra = ""
                    if fname == "DCGM_FI_DEV_XID_ERRORS":
                        code = int(per_t[0][fname])
                        extra = f',err_code="{code}",err_msg="{xid_message(code)}"'
                    values = [format_value(fld, v[fname]) for v in per_t]
                    emit(fname, fld.prom_type, fname, f"{dcgm_base},{labels}{extra}", values)
            rates = _node_rates(pattern, idx)
            seed = 1.0e12 + idx * 7.3e9  # bytes counted since boot

            def total(family: str, labels: str, rate: float, seed: float = seed) -> None:
                values = [_fmt(round(seed + rate * (t - start))) for t in times]
                emit(family, "counter", f"{family}_total", labels, values)

            def gauge(family: str, labels: str, value: float) -> None:
                emit(family, "gauge", family, labels, [_fmt(value)] * len(times))

            for dev, speed in _NET_DEVICES:
                lab = f'{node_base},device="{dev}"'
                total("node_network_receive_bytes", lab, rates[f"{dev}_rx"])
                total("node_network_transmit_bytes", lab, rates[f"{dev}_tx"])
                gauge("node_network_speed_bytes", lab, speed)
            disk = f'{node_base},device="nvme0n1"'
            total("node_disk_read_bytes", disk, rates["read"])
            total("node_disk_written_bytes", disk, rates["write"])
            for dev, fstype, mount, size in _FILESYSTEMS:
                lab = f'{node_base},device="{dev}",fstype="{fstype}",mountpoint="{mount}"'
                gauge("node_filesystem_avail_bytes", lab, size * (0.35 + 0.3 * ((idx * 0.618) % 1.0)))
                gauge("node_filesystem_size_bytes", lab, size)
            mem_total = 2.0e12
            gauge("node_memory_MemTotal_bytes", node_base, mem_total)
            gauge("node_memory_MemAvailable_bytes", node_base, mem_total * 0.62)
            gauge("up", node_base, 1)
            gauge("up", dcgm_base, 1)
    finally:
        for part in part_files.values():
            part.close()
    with open(path, "w") as out:
        for n, (family, mtype) in enumerate(order):
            out.write(f"# TYPE {family} {mtype}\n")
            with open(parts_dir / f"{n:03d}") as part:
                shutil.copyfileobj(part, out, 1 << 20)
        out.write("# EOF\n")
    shutil.rmtree(parts_dir, ignore_errors=True)
    return series, samples


def backfill(
    root: Path,
    nodes: int = 1024,
    gpus: int = 8,
    *,
    history: float = 120.0,
    ahead: float = 600.0,
    step: float = 15.0,
    names: list[str] | None = None,
    pattern_of: Callable[[int, str], str] = default_pattern,
    profiling_of: Callable[[int, str], bool] = default_profiling,
    xids: dict[str, dict[int, int]] | None = None,
    start: bool = True,
    port: int | None = None,
    parallel: int | None = None,
    keep_input: bool = False,
) -> Backfill:
    """Write ``nodes`` synthetic nodes' series from ``now - history`` to ``now + ahead`` every
    ``step`` seconds, make TSDB blocks of them with promtool and (``start``) serve them with a
    Prometheus on ``root`` (no scrape targets). Names default to ``node-0001`` ...; patterns,
    profiling and Xids per node as given (:func:`default_pattern`, :func:`default_profiling`).

    The fleet is cut into ``parallel`` slices (default: one per CPU), each written and handed to
    its own promtool while the next is written; their blocks cover the same time range with
    disjoint series (Prometheus 2.42 takes overlapping blocks as they are)."""
    promtool = find_promtool()
    if start:
        find_prometheus()
    root = Path(root).absolute()
    names = names or [f"node-{i:04d}" for i in range(1, nodes + 1)]
    root.mkdir(parents=True, exist_ok=True)
    data_dir = root / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    for old in root.glob("backfill-*.om*"):  # an earlier run's slices
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
    now = time.time()
    t0, t1 = now - history, now + ahead
    jobs = max(1, min(parallel or os.cpu_count() or 1, len(names)))
    per = math.ceil(len(names) / jobs)
    seconds = {"write": 0.0}
    series = samples = size = 0
    running: list[tuple[Path, subprocess.Popen[bytes]]] = []
    clock = time.monotonic()
    try:
        for first in range(0, len(names), per):
            path = root / f"backfill-{first // per:03d}.om"
            written = time.monotonic()
            n_series, n_samples = write_openmetrics(
                path,
                names[first : first + per],
                gpus=gpus,
                start=t0,
                end=t1,
                step=step,
                pattern_of=pattern_of,
                profiling_of=profiling_of,
                xids=xids,
                first_index=first,
            )
            seconds["write"] += time.monotonic() - written
            series, samples, size = series + n_series, samples + n_samples, size + path.stat().st_size
            log = open(path.with_suffix(".log"), "wb")  # noqa: SIM115 - owned by the child
            cmd = [promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(path), str(data_dir)]
            running.append((path, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
            log.close()
        failed = []
        for path, proc in running:
            if proc.wait() != 0:
                failed.append(f"{path.name}: {log_tail(path.with_suffix('.log'))}")
    finally:
        for path, proc in running:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if not keep_input:
                path.unlink(missing_ok=True)
    seconds["blocks"] = time.monotonic() - clock
    if failed:
        raise PrometheusError(f"promtool could not make blocks in {data_dir}: {failed[0]}")
    result = Backfill(root, data_dir, names, gpus, t0, t1, step, series, samples, size, seconds)
    if start:
        clock = time.monotonic()
        result.prometheus = PrometheusServer(root, port, data_dir=data_dir).start()
        seconds["start"] = time.monotonic() - clock
    return result
