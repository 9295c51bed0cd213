"""A cheap stand-in ``nvidia-smi`` for the fleet-scale benchmark (``bench/fleet_scale.py``): POSIX
sh and one awk, no Python start.

:mod:`lab.fake_nvidia_smi` starts a Python interpreter on every call (~30 ms of CPU):
256 nodes sampled each second would spend more CPU in the stand-in than in everything else. This
one answers the query form the telemetry sampler uses, ``--query-gpu=FIELDS
--format=csv[,noheader][,nounits]`` (and ``--query-remapped-rows``, healthy GPUs only), with exactly the values and bytes the Python stand-in prints
for the same scenario at the same scenario time (the same formulas, ``sin`` and ``%.2f`` from the
same C library), in one sh start and one awk start. The scenario is baked into the script as awk
variables; the clock is ``/proc/uptime`` (read by the shell, no process) minus its value when the
script was written, or a fixed time. Other forms (``-L``, the plain table, ``-l`` loops) and the
Python stand-in's failure scenarios (a lost GPU, a hang) are not offered: use that one for them.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from lab.fake_nvidia_smi import BUS_IDS, DEFAULTS, UNITS

#: Scenario fields this stand-in honours (the rest of the Python stand-in's are refused).
FIELDS = (
    "gpus",
    "model",
    "driver",
    "memory_total_mib",
    "pattern",
    "power",
    "power_limit_w",
    "fixed_t",
    "uuid_prefix",
    "bus_prefix",
    "sm_clock_mhz",
)

_USAGE = 'Invalid combination of input arguments. Please run "nvidia-smi -h" for help.'

_SCRIPT = r"""#!/bin/sh
# nvidia-smi stand-in written by loadmaster's fleet-scale benchmark (bench/nvidia_smi_sh.py): sh + awk.
q=; f=; have_q=
for a in "$@"; do
  case $a in
    --query-gpu=*|--query-remapped-rows=*) q=${a#*=}; have_q=1 ;;
    --format=*) f=${a#*=} ;;
    *) echo '@USAGE@'; echo "(unsupported by the stand-in: $a)"; exit 2 ;;
  esac
done
[ -n "$have_q" ] || { echo '@USAGE@'; echo '(this stand-in answers --query-gpu only)'; exit 2; }
case ",$f," in *,csv,*) ;; *) echo '@USAGE@'; exit 2 ;; esac
now=; read -r now _ </proc/uptime 2>/dev/null
exec awk -v q="$q" -v fmt="$f" -v now="${now:-0}" @VARS@ '
function round(x) { return sprintf("%.0f", x) + 0 }
function clamp(x) { return x < 0 ? 0 : (x > 100 ? 100 : x) }
BEGIN {
  if (gpus + 0 <= 0) { print "No devices were found"; exit 6 }
  t = (fixed != "") ? fixed + 0 : now - start
  n = split(q, raw, ","); nf = 0
  for (k = 1; k <= n; k++) { v = raw[k]; gsub(/^[ \t]+|[ \t]+$/, "", v); if (v != "") F[++nf] = v }
  split(fmt, fm, ","); noheader = 0; nounits = 0
  for (k in fm) { v = fm[k]; gsub(/^[ \t]+|[ \t]+$/, "", v); if (v == "noheader") noheader = 1; if (v == "nounits") nounits = 1 }
  nu = split(units, U, " "); for (k = 1; k + 1 <= nu; k += 2) unit[U[k]] = U[k + 1]
  np = split(patterns, P, " "); split(bus_ids, B, " "); nb = 0; for (k in B) nb++
  if (!noheader) {
    line = ""
    for (k = 1; k <= nf; k++) line = line (k > 1 ? ", " : "") F[k] ((F[k] in unit && !nounits) ? " [" unit[F[k]] "]" : "")
    print line
  }
  for (i = 0; i < gpus; i++) {
    pat = np ? P[i % np + 1] : "idle"
    w = sin(t * 0.7 + i * 1.3)
    if (pat == "training") { util = 95 + round(3 * w); mem = int(total * 0.86) + 37 * i; pw = 640.0 + 30 * w; base = 71 }
    else if (pat == "starved") { util = 20 + round(10 * w); mem = int(total * 0.84) + 29 * i; pw = 210.0 + 20 * w; base = 48 }
    else { util = 0; mem = 4; pw = 69.5 + w; base = 32 }
    util = clamp(util)
    S["index"] = sprintf("%d", i)
    S["uuid"] = sprintf("%s%012x", uuid_prefix, i)
    S["name"] = model
    S["pci.bus_id"] = bus_prefix B[i % nb + 1] ":00.0"
    S["utilization.gpu"] = sprintf("%d", util)
    S["utilization.memory"] = sprintf("%d", clamp(int(util / 2)))
    S["memory.used"] = sprintf("%d", mem)
    S["memory.total"] = sprintf("%d", total)
    S["memory.free"] = sprintf("%d", total - mem)
    S["temperature.gpu"] = sprintf("%d", base + round(2 * w))
    S["power.draw"] = power == "supported" ? sprintf("%.2f", pw) : "[Not Supported]"
    S["power.limit"] = power == "supported" ? sprintf("%.2f", plimit) : "[Not Supported]"
    S["driver_version"] = driver
    S["count"] = sprintf("%d", gpus)
    S["clocks.sm"] = sprintf("%d", pat == "idle" ? 345 : smclk)
    S["clocks.max.sm"] = sprintf("%d", smclk)
    S["clocks_event_reasons.active"] = pat == "idle" ? "0x0000000000000001" : "0x0000000000000000"
    S["clocks_throttle_reasons.active"] = S["clocks_event_reasons.active"]
    S["ecc.errors.uncorrected.volatile.total"] = "0"
    S["ecc.errors.uncorrected.aggregate.total"] = "0"
    S["remapped_rows.pending"] = "No"
    S["remapped_rows.failure"] = "No"
    S["remapped_rows.correctable"] = "0"
    S["remapped_rows.uncorrectable"] = "0"
    S["gpu_uuid"] = S["uuid"]
    S["gpu_bus_id"] = S["pci.bus_id"]
    line = ""
    for (k = 1; k <= nf; k++) {
      v = (F[k] in S) ? S[F[k]] : "[N/A]"
      if ((F[k] in unit) && !nounits && substr(v, 1, 1) != "[") v = v " " unit[F[k]]
      line = line (k > 1 ? ", " : "") v
    }
    print line
  }
}'
"""


def _uptime() -> float:
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


def script_text(**fields: Any) -> str:
    """The stand-in script for a scenario (the Python stand-in's field names and defaults)."""
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ValueError(f"the sh nvidia-smi stand-in does not offer: {', '.join(unknown)}")
    sc = {k: DEFAULTS[k] for k in FIELDS} | fields
    pattern = sc["pattern"]
    patterns = " ".join(pattern) if isinstance(pattern, list) else str(pattern)
    for value in (sc["model"], sc["driver"], sc["uuid_prefix"], sc["bus_prefix"]):
        if "\\" in str(value):
            raise ValueError(f"scenario text may not hold a backslash (awk -v would unescape it): {value!r}")
    awk_vars = {
        "gpus": str(int(sc["gpus"])),
        "model": str(sc["model"]),
        "driver": str(sc["driver"]),
        "total": str(int(sc["memory_total_mib"])),
        "patterns": patterns,
        "power": str(sc["power"]),
        "plimit": repr(float(sc["power_limit_w"])),
        "fixed": "" if sc["fixed_t"] is None else repr(float(sc["fixed_t"])),
        "start": repr(_uptime()),
        "uuid_prefix": str(sc["uuid_prefix"]),
        "bus_prefix": str(sc["bus_prefix"]),
        "smclk": str(int(sc["sm_clock_mhz"])),
        "bus_ids": " ".join(BUS_IDS),
        "units": " ".join(f"{k} {v}" for k, v in UNITS.items()),
    }
    assigns = " ".join(f"-v {k}={shlex.quote(v)}" for k, v in awk_vars.items())
    return _SCRIPT.replace("@USAGE@", _USAGE).replace("@VARS@", assigns)


def write(path: str | os.PathLike[str], **fields: Any) -> Path:
    """Write the stand-in as an executable ``path`` (atomically: a running sampler never sees half)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(script_text(**fields))
    tmp.chmod(0o755)
    os.replace(tmp, p)
    return p
