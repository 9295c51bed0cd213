"""Health signals beyond Xid, read over SSH: what one ``nvidia-smi`` query, the remapped-rows
query and the kernel log say about each GPU of a node, parsed once into typed, ranged values.

The text comes from a node and is not trusted: a cell that is not a finite number in its range
(``NaN``, ``1e400``, ``[N/A]``, junk) is ``None``, and ``None`` never accuses anything (a suspect
needs positive evidence). Field names and bit meanings follow NVIDIA's documentation: the
``--query-gpu`` fields of ``nvidia-smi --help-query-gpu`` and NVML's ``nvmlClocksEventReason*``
bits (nvml.h; DCGM's ``DCGM_CLOCKS_EVENT_REASON_*`` are the same bits).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime

from backend.nodes.untrusted import clean_text
from backend.telemetry.parse import bus_key
from backend.telemetry.xid import describe

#: The per-GPU health query (``--format=csv,noheader,nounits``), in this order.
HEALTH_FIELDS = (
    "index",
    "uuid",
    "pci.bus_id",
    "name",
    "utilization.gpu",
    "power.draw",
    "clocks.sm",
    "clocks.max.sm",
    "clocks_event_reasons.active",
    "ecc.errors.uncorrected.volatile.total",
)
#: Drivers before R535 call the reasons field ``clocks_throttle_reasons.active``.
HEALTH_FIELDS_OLD = tuple(
    "clocks_throttle_reasons.active" if f.startswith("clocks_event") else f for f in HEALTH_FIELDS
)
REMAP_FIELDS = ("gpu_uuid", "remapped_rows.pending", "remapped_rows.failure", "remapped_rows.uncorrectable")

# NVML nvmlClocksEventReason* bits (nvml.h; docs.nvidia.com/deploy/nvml-api, group
# nvmlClocksEventReasons): the same values as DCGM_CLOCKS_EVENT_REASON_*.
GPU_IDLE = 0x1
APPLICATIONS_CLOCKS_SETTING = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SYNC_BOOST = 0x10
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
DISPLAY_CLOCK_SETTING = 0x100

#: Reasons that say the hardware (or its cooling or power) slows the GPU down: evidence.
REASON_NAMES = {
    HW_SLOWDOWN: "HW slowdown",
    HW_THERMAL_SLOWDOWN: "HW thermal slowdown",
    HW_POWER_BRAKE_SLOWDOWN: "HW power brake",
    SW_THERMAL_SLOWDOWN: "SW thermal slowdown",
}
#: The other reasons are normal operation (idle, the power cap a job runs into, sync boost): never evidence.

#: The script triage runs on a node: one round trip, each part cut short, each with its exit status.
SCRIPT = (
    r"""
q={fields}; q_old={fields_old}
echo '@@gpu'
if command -v nvidia-smi >/dev/null 2>&1; then
  out=$(nvidia-smi --query-gpu=$q --format=csv,noheader,nounits 2>&1); rc=$?
  if [ $rc -ne 0 ] && printf '%s' "$out" | grep -q 'not a valid field'; then
    out=$(nvidia-smi --query-gpu=$q_old --format=csv,noheader,nounits 2>&1); rc=$?
  fi
  printf '%s\n' "$out" | head -c 65536; echo "@@gpu-rc $rc"
  echo '@@remap'; out=$(nvidia-smi --query-remapped-rows={remap} --format=csv,noheader 2>&1); rc=$?
  printf '%s\n' "$out" | head -c 65536; echo "@@remap-rc $rc"
else
  echo '@@gpu-rc absent'
fi
echo '@@xid'; out=$(dmesg --time-format iso 2>&1); rc=$?
printf '%s\n' "$out" | grep -E 'NVRM: Xid|^dmesg' | tail -n 200 | head -c 65536; echo "@@xid-rc $rc"
""".replace("{fields}", ",".join(HEALTH_FIELDS))
    .replace("{fields_old}", ",".join(HEALTH_FIELDS_OLD))
    .replace("{remap}", ",".join(REMAP_FIELDS))
)

_MAX_GPUS = 64
_LOST = re.compile(r"device handle for GPU\s*([0-9A-Fa-f:.]+)?.*GPU is lost", re.I)
_XID = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[,.]\d+)?(?:[+-]\d\d:?\d\d|Z)?)\s.*?"
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f:.]+)\): (?P<code>\d{1,4})\b"
)


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's health numbers at one read; None: not reported or not believable."""

    index: int
    uuid: str = ""
    bus: str = ""
    name: str = ""
    util_pct: float | None = None
    power_w: float | None = None
    sm_mhz: float | None = None
    sm_max_mhz: float | None = None
    #: The clocks event (throttle) reasons bitmask.
    reasons: int | None = None
    ecc_uncorrected: int | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    #: nvidia-smi printed "GPU is lost" for it (fallen off the bus).
    lost: bool = False
    #: PCIe replays and NVLink CRC flit errors over the last window (Prometheus only: nvidia-smi's
    #: --query-gpu has no field for them).
    pcie_replays: int | None = None
    nvlink_crc: int | None = None

    @property
    def reason_names(self) -> tuple[str, ...]:
        """The evidence-worthy clock event reasons set."""
        r = self.reasons or 0
        return tuple(name for bit, name in REASON_NAMES.items() if r & bit)


@dataclass(frozen=True)
class XidSeen:
    """An Xid in a node's kernel log, with NVIDIA's catalog entry."""

    gpu: int
    code: int
    at: float | None
    mnemonic: str
    action: str
    drain: bool


def number(text: str, lo: float, hi: float) -> float | None:
    """A CSV cell as a finite number within [lo, hi]; anything else is None."""
    t = text.strip()
    if not t or t.startswith("["):
        return None
    try:
        v = float(t.split()[0]) if len(t) < 64 else math.nan
    except ValueError:
        return None
    return v if math.isfinite(v) and lo <= v <= hi else None


def count(text: str) -> int | None:
    """A non-negative counter cell (ASCII digits only), below 2**63."""
    t = text.strip()
    if not t or len(t) > 19 or not (t.isascii() and t.isdigit()):
        return None
    return int(t)


def flag(text: str) -> bool | None:
    """A yes/no cell (``Yes``/``No``, ``1``/``0``, ``True``/``False``); anything else is None."""
    t = text.strip().lower()
    if t in ("yes", "1", "true", "active"):
        return True
    if t in ("no", "0", "false", "not active"):
        return False
    return None


def bitmask(text: str) -> int | None:
    """``0x0000000000000008`` (or a decimal) as a 64-bit mask; anything else is None."""
    t = text.strip().lower()
    try:
        v = int(t, 16) if t.startswith("0x") and 2 < len(t) <= 18 else int(t) if t.isascii() and t.isdigit() else None
    except ValueError:
        return None
    return v if v is not None and 0 <= v < 2**64 else None


def _cells(line: str, n: int) -> list[str]:
    cells = [c.strip() for c in line.split(",")]
    return cells + [""] * (n - len(cells))


def parse_health(gpu_text: str, remap_text: str = "") -> tuple[GpuHealth, ...]:
    """The health query's rows (and the remapped-rows query's, joined by UUID) -> GpuHealth.

    A row "Unable to determine the device handle for GPU<bus>: GPU is lost" is a lost GPU at its
    position. Rows beyond 64 GPUs, and lines that are neither rows nor lost GPUs, are ignored.
    """
    remap: dict[str, tuple[bool | None, bool | None]] = {}
    for ln in remap_text.splitlines()[: _MAX_GPUS * 2]:
        c = _cells(ln, len(REMAP_FIELDS))
        uuid = clean_text(c[0], 96)
        if uuid:
            remap[uuid] = (flag(c[1]), flag(c[2]))
    out: list[GpuHealth] = []
    for ln in gpu_text.splitlines():
        if len(out) >= _MAX_GPUS:
            break
        if "GPU is lost" in ln and "," not in ln:
            m = _LOST.search(ln)
            bus = clean_text((m.group(1) or "") if m else "", 32).rstrip(":.")
            out.append(GpuHealth(index=len(out), bus=bus, lost=True))
            continue
        if ln.count(",") < len(HEALTH_FIELDS) - 3:
            continue
        c = _cells(ln, len(HEALTH_FIELDS))
        idx = count(c[0])
        if idx is None or idx >= _MAX_GPUS:
            continue
        uuid = clean_text(c[1], 96)
        pending, failed = remap.get(uuid, (None, None))
        out.append(
            GpuHealth(
                index=idx,
                uuid=uuid,
                bus=clean_text(c[2], 32),
                name=clean_text(c[3], 96),
                util_pct=number(c[4], 0, 100),
                power_w=number(c[5], 0, 5000),
                sm_mhz=number(c[6], 1, 10000),
                sm_max_mhz=number(c[7], 1, 10000),
                reasons=bitmask(c[8]),
                ecc_uncorrected=count(c[9]),
                remap_pending=pending,
                remap_failed=failed,
            )
        )
    return tuple(out)


def parse_xids(log: str, gpus: tuple[GpuHealth, ...], since: float) -> tuple[XidSeen, ...]:
    """Xids from ``dmesg --time-format iso`` lines at or after ``since``, each mapped to its GPU by
    PCI bus id (-1 when the bus is not one of the node's GPUs)."""
    by_bus = {bus_key(g.bus): g.index for g in gpus if g.bus}
    out: list[XidSeen] = []
    for ln in log.splitlines()[-200:]:
        m = _XID.match(ln.strip())
        if not m:
            continue
        try:
            at = datetime.fromisoformat(m.group("ts").replace(",", ".")).timestamp()
        except ValueError:
            continue
        if at < since:
            continue
        code = int(m.group("code"))
        info = describe(code)
        gpu = by_bus.get(bus_key(m.group("bus")), -1)
        out.append(XidSeen(gpu, code, at, info.mnemonic, info.action, info.drain))
    return tuple(out)
