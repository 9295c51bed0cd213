#!/usr/bin/env python3
"""Stand-in for ``nvidia-smi`` on machines without NVIDIA GPUs (test lab, demos). Stdlib only.

Run as ``python3 fake_nvidia_smi.py --scenario FILE <nvidia-smi args>``; the lab puts a sh wrapper
named ``nvidia-smi`` on a node's PATH that execs it. The JSON scenario (see :func:`write_scenario`)
says how many GPUs, which model and driver, what each GPU is doing over time ("training",
"starved", "idle"), whether power is "[Not Supported]" and whether a GPU falls off the bus.
Output follows NVIDIA's documented formats: ``--query-gpu=... --format=csv[,noheader][,nounits]``,
``-L``, the plain summary header, ``-l``/``-lms`` looping; 0 GPUs prints "No devices were found"
and exits 6 like the real one.
"""

from __future__ import annotations

import marshal
import math
import os
import sys
import time

# The stand-in starts once per telemetry sample on every node: it imports only what it runs
# (typing and json cost more than the rest of a start; json is loaded only to read a scenario
# file whose parsed form is not cached yet, see load_scenario).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

DEFAULTS: dict[str, Any] = {
    "gpus": 8,
    "model": "NVIDIA H100 80GB HBM3",
    "driver": "550.54.15",
    "cuda": "12.4",
    "memory_total_mib": 81559,
    # "training", "starved", "idle", or a list with one pattern per GPU
    "pattern": "training",
    "power": "supported",  # or "not_supported"
    "power_limit_w": 700.0,
    "lost_gpu": None,  # index of a GPU that falls off the bus ...
    "lost_after": 0.0,  # ... this many seconds after "start"
    "hang": False,  # true: every call sleeps forever (a wedged driver)
    "start": None,  # epoch seconds the scenario's clock starts at (default: file mtime)
    "fixed_t": None,  # a number: freeze the scenario clock (deterministic output)
    "uuid_prefix": "GPU-5f1c2a3b-0000-4000-8000-",
    "bus_prefix": "00000000:",
    # Health faults per GPU index (a string key, JSON): {"3": {"remap_pending": true}}. Keys:
    # remap_pending, remap_failed (bool); ecc_uncorrected (volatile count); clock_reasons (the
    # clocks_event_reasons bitmask, NVML's nvmlClocksEventReason* bits); sm_clock_pct (the SM
    # clock as % of the healthy one); vanish (the GPU is not listed at all).
    "faults": {},
    # Compute processes for --query-compute-apps: [{"gpu": 0, "pid": 4242, "name": "python"}].
    "apps": [],
    "sm_clock_mhz": 1980,
    # The dcgm-exporter stand-in's counters: "default" (dcgm-exporter's default-counters.csv) or
    # "health" (that plus the health fields a site enables in its own counters CSV).
    "dcgm_counters": "default",
}

#: The fault keys a scenario's ``faults`` may set per GPU.
#: pcie_replays and nvlink_crc are served by the dcgm-exporter stand-in (nvidia-smi's --query-gpu
#: has no field for them).
FAULT_KEYS = frozenset(
    {
        "remap_pending",
        "remap_failed",
        "ecc_uncorrected",
        "clock_reasons",
        "sm_clock_pct",
        "vanish",
        "pcie_replays",
        "nvlink_crc",
    }
)

UNITS = {
    "utilization.gpu": "%",
    "utilization.memory": "%",
    "memory.used": "MiB",
    "memory.total": "MiB",
    "memory.free": "MiB",
    "power.draw": "W",
    "power.limit": "W",
    "clocks.sm": "MHz",
    "clocks.mem": "MHz",
    "clocks.max.sm": "MHz",
    "used_memory": "MiB",
    "used_gpu_memory": "MiB",
}
BUS_IDS = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]


def write_scenario(path: str | os.PathLike[str], **fields: Any) -> Path:
    """Write a scenario JSON file (unknown fields rejected); ``start`` defaults to now."""
    unknown = sorted(set(fields) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown scenario field(s): {', '.join(unknown)}")
    data = {**DEFAULTS, **fields}
    for key, fault in dict(data["faults"]).items():
        bad = sorted(set(fault) - FAULT_KEYS)
        if bad or not str(key).isdigit():
            raise ValueError(f"unknown fault field(s) for GPU {key}: {', '.join(bad) or key}")
    data["faults"] = {str(k): v for k, v in dict(data["faults"]).items()}
    if data["start"] is None:
        data["start"] = time.time()
    from pathlib import Path

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    import json

    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, p)  # readers never see a half-written scenario
    return p


def load_scenario(path: str) -> dict[str, Any]:
    """Read a scenario file, defaults filled in."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        cache = f"{path}.{os.getuid()}.marshal"
        try:
            with open(cache, "rb") as c:
                cached_key, parsed = marshal.load(c)
        except (OSError, EOFError, ValueError, TypeError):
            cached_key, parsed = None, None
        if cached_key != key or not isinstance(parsed, dict):
            import json

            parsed = json.loads(f.read())
            _cache_parsed(cache, key, parsed)
    data = {**DEFAULTS, **parsed}
    if data["start"] is None:
        data["start"] = st.st_mtime
    return data


def _cache_parsed(cache: str, key: tuple[int, int, int], parsed: Any) -> None:
    """Keep a scenario's parsed form beside it, keyed by the file's inode, size and mtime (a
    rewritten scenario, always a new inode, is parsed again); best effort."""
    tmp = f"{cache}.{os.getpid()}"
    try:
        with open(tmp, "wb") as c:
            marshal.dump((key, parsed), c)
        os.replace(tmp, cache)
    except (OSError, ValueError):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _pattern(sc: dict[str, Any], i: int) -> str:
    pat = sc["pattern"]
    if isinstance(pat, list):
        return pat[i % len(pat)] if pat else "idle"
    return str(pat)


def gpu_state(sc: dict[str, Any], i: int, t: float) -> dict[str, Any]:
    """Values of GPU ``i`` at ``t`` seconds into the scenario (deterministic in t)."""
    pat = _pattern(sc, i)
    total = int(sc["memory_total_mib"])
    wobble = math.sin(t * 0.7 + i * 1.3)
    if pat == "training":
        util = 95 + round(3 * wobble)
        mem = int(total * 0.86) + 37 * i
        power = 640.0 + 30 * wobble
    elif pat == "starved":
        util = 20 + round(10 * wobble)
        mem = int(total * 0.84) + 29 * i
        power = 210.0 + 20 * wobble
    else:
        util, mem, power = 0, 4, 69.5 + wobble
    temp = {"training": 71, "starved": 48}.get(pat, 32) + round(2 * wobble)
    fault = _fault(sc, i)
    max_sm = int(sc["sm_clock_mhz"])
    sm = max_sm if pat != "idle" else 345
    if "sm_clock_pct" in fault:
        sm = int(round(sm * float(fault["sm_clock_pct"]) / 100))
    reasons = int(fault.get("clock_reasons", 0 if pat != "idle" else 0x1))
    return {
        "index": str(i),
        "uuid": f"{sc['uuid_prefix']}{i:012x}",
        "name": sc["model"],
        "pci.bus_id": f"{sc['bus_prefix']}{BUS_IDS[i % len(BUS_IDS)]}:00.0",
        "utilization.gpu": str(min(100, max(0, util))),
        "utilization.memory": str(min(100, max(0, util // 2))),
        "memory.used": str(mem),
        "memory.total": str(total),
        "memory.free": str(total - mem),
        "temperature.gpu": str(temp),
        "power.draw": f"{power:.2f}" if sc["power"] == "supported" else "[Not Supported]",
        "power.limit": f"{sc['power_limit_w']:.2f}" if sc["power"] == "supported" else "[Not Supported]",
        "driver_version": sc["driver"],
        "count": str(sc["gpus"]),
        "clocks.sm": str(sm),
        "clocks.max.sm": str(max_sm),
        "clocks_event_reasons.active": f"0x{reasons:016X}",
        "clocks_throttle_reasons.active": f"0x{reasons:016X}",
        "ecc.errors.uncorrected.volatile.total": str(int(fault.get("ecc_uncorrected", 0))),
        "ecc.errors.uncorrected.aggregate.total": str(int(fault.get("ecc_uncorrected", 0))),
        "remapped_rows.pending": "Yes" if fault.get("remap_pending") else "No",
        "remapped_rows.failure": "Yes" if fault.get("remap_failed") else "No",
        "remapped_rows.correctable": "0",
        "remapped_rows.uncorrectable": "1" if fault.get("remap_pending") or fault.get("remap_failed") else "0",
        "gpu_uuid": f"{sc['uuid_prefix']}{i:012x}",
        "gpu_bus_id": f"{sc['bus_prefix']}{BUS_IDS[i % len(BUS_IDS)]}:00.0",
    }


def _fault(sc: dict[str, Any], i: int) -> dict[str, Any]:
    got = dict(sc.get("faults") or {}).get(str(i))
    return dict(got) if isinstance(got, dict) else {}


def _listed(sc: dict[str, Any]) -> list[int]:
    """The GPU indices nvidia-smi enumerates (a vanished GPU is not listed)."""
    return [i for i in range(int(sc["gpus"])) if not _fault(sc, i).get("vanish")]


def _lost(sc: dict[str, Any], i: int, t: float) -> bool:
    return sc["lost_gpu"] is not None and int(sc["lost_gpu"]) == i and t >= float(sc["lost_after"])


def query(sc: dict[str, Any], fields: list[str], fmt: set[str], t: float) -> str:
    """The text ``nvidia-smi --query-gpu=FIELDS --format=FMT`` prints at time ``t``."""
    lines = []
    if "noheader" not in fmt:
        lines.append(_header(fields, fmt))
    for pos, i in enumerate(_listed(sc)):
        # nvidia-smi numbers the GPUs it enumerates: after a vanished one, the indices close up.
        st = {**gpu_state(sc, i, t), "index": str(pos)}
        if _lost(sc, i, t):
            lines.append(
                f"Unable to determine the device handle for GPU{st['pci.bus_id']}: "
                "GPU is lost.  Reboot the system to recover this GPU"
            )
            continue
        lines.append(_row(fields, fmt, st))
    return "\n".join(lines) + "\n"


def _row(fields: list[str], fmt: set[str], values: dict[str, str]) -> str:
    """One CSV row: "[N/A]" for a field the stand-in does not know, units unless nounits."""
    cells = []
    for f in fields:
        v = values.get(f, "[N/A]")
        if f in UNITS and "nounits" not in fmt and not v.startswith("["):
            v = f"{v} {UNITS[f]}"
        cells.append(v)
    return ", ".join(cells)


def _header(fields: list[str], fmt: set[str]) -> str:
    return ", ".join(f"{f} [{UNITS[f]}]" if f in UNITS and "nounits" not in fmt else f for f in fields)


def _rows(fields: list[str], fmt: set[str], rows: list[dict[str, str]]) -> str:
    lines = [] if "noheader" in fmt else [_header(fields, fmt)]
    lines.extend(_row(fields, fmt, row) for row in rows)
    return "\n".join(lines) + "\n" if lines else ""


def remapped_rows(sc: dict[str, Any], fields: list[str], fmt: set[str], t: float) -> str:
    """``nvidia-smi --query-remapped-rows=FIELDS --format=FMT`` (one row per GPU on the bus)."""
    return _rows(fields, fmt, [gpu_state(sc, i, t) for i in _listed(sc) if not _lost(sc, i, t)])


def compute_apps(sc: dict[str, Any], fields: list[str], fmt: set[str], t: float) -> str:
    """``nvidia-smi --query-compute-apps=FIELDS --format=FMT``: the scenario's processes; none
    prints only the header (or nothing with noheader), as the real one does."""
    rows = []
    for app in sc.get("apps") or []:
        i = int(app.get("gpu", 0))
        if i not in _listed(sc) or _lost(sc, i, t):
            continue
        st = gpu_state(sc, i, t)
        used = str(int(app.get("used_mib", 1024)))
        rows.append(
            {
                "pid": str(int(app["pid"])),
                "gpu_uuid": st["uuid"],
                "gpu_bus_id": st["pci.bus_id"],
                "process_name": str(app.get("name", "python")),
                "name": str(app.get("name", "python")),
                "used_memory": used,
                "used_gpu_memory": used,
            }
        )
    return _rows(fields, fmt, rows)


def listing(sc: dict[str, Any], t: float) -> str:
    """``nvidia-smi -L``."""
    out = []
    for i in range(int(sc["gpus"])):
        st = gpu_state(sc, i, t)
        out.append(f"GPU {i}: {sc['model']} (UUID: {st['uuid']})")
    return "\n".join(out) + "\n"


def summary(sc: dict[str, Any], t: float) -> str:
    """The plain ``nvidia-smi`` table (header and one row pair per GPU)."""
    stamp = time.strftime("%a %b %d %H:%M:%S %Y")
    bar = "+-----------------------------------------------------------------------------------------+"
    out = [
        stamp,
        bar,
        f"| NVIDIA-SMI {sc['driver']:<22} Driver Version: {sc['driver']:<14} CUDA Version: {sc['cuda']:<9}|",
        bar,
    ]
    for i in range(int(sc["gpus"])):
        st = gpu_state(sc, i, t)
        if _lost(sc, i, t):
            out.append(f"| {i:>3}  ERR!  GPU is lost {'':<64}|")
            continue
        pw = (
            f"{float(st['power.draw']):>4.0f}W / {float(st['power.limit']):>4.0f}W"
            if sc["power"] == "supported"
            else "   N/A /  N/A "
        )
        out.append(f"| {i:>3}  {sc['model'][:28]:<28} On | {st['pci.bus_id']} Off |")
        out.append(
            f"| N/A {st['temperature.gpu']:>3}C P0 {pw} | {st['memory.used']:>6}MiB / "
            f"{st['memory.total']}MiB | {st['utilization.gpu']:>3}% Default |"
        )
    out.append(bar)
    return "\n".join(out) + "\n"


def stand_in_script(scenario: str | os.PathLike[str]) -> str:
    """The ``nvidia-smi`` a lab node runs: a sh wrapper that starts this module for ``scenario``.

    The telemetry sampler runs nvidia-smi once per sample on every node (hundreds of starts in a
    test run), so the start is kept lean: no ``site`` (this module needs only the stdlib), and the
    module is imported rather than run as a script, so its compiled bytecode is reused."""
    import shlex

    here = os.path.dirname(os.path.abspath(__file__))
    boot = f"import sys; sys.path[0] = {here!r}; import fake_nvidia_smi as m; m.run(sys.argv[1:])"
    argv = " ".join(shlex.quote(a) for a in (sys.executable, "-S", "-c", boot, "--scenario", os.fspath(scenario)))
    return f'#!/bin/sh\nexec {argv} "$@"\n'


def run(argv: list[str]) -> None:
    """:func:`main` as a process: exit with its status; a closed pipe or ^C ends it quietly."""
    try:
        sys.exit(main(argv))
    except (BrokenPipeError, KeyboardInterrupt):
        sys.exit(0)


def main(argv: list[str]) -> int:
    """Answer one nvidia-smi invocation (or loop with -l/-lms)."""
    scenario_path = os.environ.get("FAKE_NVIDIA_SMI_SCENARIO")
    args: list[str] = []
    it = iter(argv)
    for a in it:
        if a == "--scenario":
            scenario_path = next(it, None)
        elif a.startswith("--scenario="):
            scenario_path = a.split("=", 1)[1]
        else:
            args.append(a)
    if not scenario_path:
        print("fake nvidia-smi: --scenario FILE is required", file=sys.stderr)
        return 2
    fields: list[str] | None = None
    other: tuple[str, list[str]] | None = None
    fmt: set[str] = set()
    loop_s: float | None = None
    list_mode = False
    it = iter(args)
    for a in it:
        if a.startswith("--query-gpu="):
            fields = [f.strip() for f in a.split("=", 1)[1].split(",") if f.strip()]
        elif a.startswith(("--query-remapped-rows=", "--query-compute-apps=")):
            kind = a.split("=", 1)[0]
            other = (kind, [f.strip() for f in a.split("=", 1)[1].split(",") if f.strip()])
        elif a.startswith("--format="):
            fmt = {f.strip() for f in a.split("=", 1)[1].split(",")}
        elif a in ("-L", "--list-gpus"):
            list_mode = True
        elif a in ("-l", "--loop") or a.startswith(("--loop=", "-l=")):
            loop_s = float(a.split("=", 1)[1]) if "=" in a else float(next(it, "5"))
        elif a in ("-lms", "--loop-ms") or a.startswith("--loop-ms="):
            loop_s = (float(a.split("=", 1)[1]) if "=" in a else float(next(it, "1000"))) / 1000
        else:
            print(
                f'Invalid combination of input arguments. Please run "nvidia-smi -h" for help.\n'
                f"(unsupported by the stand-in: {a})"
            )
            return 2
    if (fields is not None or other is not None) and "csv" not in fmt:
        print('Invalid combination of input arguments. Please run "nvidia-smi -h" for help.')
        return 2
    while True:
        sc = load_scenario(scenario_path)
        if sc["hang"]:
            # A wedged driver: block until the scenario stops hanging (re-read so tests recover).
            time.sleep(0.1)
            continue
        t = float(sc["fixed_t"]) if sc["fixed_t"] is not None else time.time() - float(sc["start"])
        if int(sc["gpus"]) <= 0:
            print("No devices were found")
            return 6
        if other is not None:
            answer = remapped_rows if other[0] == "--query-remapped-rows" else compute_apps
            sys.stdout.write(answer(sc, other[1], fmt, t))
            sys.stdout.flush()
            return 0
        if fields is not None:
            sys.stdout.write(query(sc, fields, fmt, t))
        elif list_mode:
            sys.stdout.write(listing(sc, t))
        else:
            sys.stdout.write(summary(sc, t))
        sys.stdout.flush()
        if loop_s is None or list_mode:
            lost = sc["lost_gpu"] is not None and t >= float(sc["lost_after"]) and fields is not None
            return 15 if lost else 0
        time.sleep(loop_s)


if __name__ == "__main__":
    run(sys.argv[1:])
