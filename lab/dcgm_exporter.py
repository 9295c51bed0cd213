#!/usr/bin/env python3
"""Stand-in for NVIDIA dcgm-exporter on machines without NVIDIA GPUs (the lab, the tests).

One process serves ``/metrics`` for MANY stand-in nodes: one listening socket per node address
(``127.0.0.x:PORT/metrics``, what a site's Prometheus scrapes on a real fleet) and, optionally, one
shared socket with a path per node (``/node/<name>/metrics``, for fleets larger than loopback has
addresses). asyncio, no thread per node; a node's text is rendered at most once per
``collect_interval`` (dcgm-exporter itself collects every 30 s and serves the last collection).

What is served follows dcgm-exporter's source, release 4.5.3-4.8.2 (NVIDIA/dcgm-exporter commit
691c927, "DCGM-Exporter 4.5.3-4.8.2 (#656)"):

* the metric set, types and HELP texts are ``etc/default-counters.csv`` (every uncommented line),
  in DCGM field-id order (the template ranges over a map keyed by the Counter struct, whose first
  field is the field id); field ids from NVIDIA/go-dcgm ``pkg/dcgm/dcgm_fields.h``;
* the line format is ``internal/pkg/rendermetrics/render_metrics.go`` (``gpuMetricsFormat``)::

      # HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
      # TYPE DCGM_FI_DEV_GPU_UTIL gauge
      DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-...",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-01",DCGM_FI_DRIVER_VERSION="550.54.15"} 97

  labels in that order: ``gpu``, ``UUID`` (``uuid`` with ``--use-old-namespace``), ``pci_bus_id``,
  ``device`` (``nvidia<N>``), ``modelName``, ``Hostname`` (absent with ``--no-hostname``; the local
  hostname or ``$NODE_NAME``, ``internal/pkg/hostname/hostname.go``), then the "label" counters
  (``DCGM_FI_DRIVER_VERSION`` is the only one the default CSV enables) and, on
  ``DCGM_FI_DEV_XID_ERRORS`` only, ``err_code`` and ``err_msg`` (``internal/pkg/collector/
  gpu_collector.go`` ``toGPUMetric``; messages from ``xid_errors.go``, "Unknown Error" past the
  table). No kubernetes labels (``--kubernetes`` is off by default), no MIG labels (no MIG here);
* values: int64 fields printed as integers, double fields with Go's ``%f`` (``643.123000``),
  blank values skipped (``toString``/``skipDCGMValue``): a GPU without profiling support (no DCP
  metrics) has no ``DCGM_FI_PROF_*`` series at all, a power reading "[Not Supported]" has no
  ``DCGM_FI_DEV_POWER_USAGE``;
* ``/metrics`` answers ``text/plain; charset=utf-8`` (the handler sets no Content-Type and Go
  sniffs it) with ``X-Content-Type-Options: nosniff``; ``/health`` answers ``OK``.

NVIDIA/dcgm-exporter ``main`` after that release renamed the label to ``hostname`` (commit d5e5f51,
"Rename Hostname label to hostname (#655)", not in a release yet): ``hostname_label`` selects it.

Values come from the stand-in nvidia-smi's scenario file (:mod:`lab.fake_nvidia_smi`):
the same GPUs (count, model, driver, UUIDs, PCI bus ids) and the same utilisation, memory,
temperature and power shapes (``gpu_state``: "training" busy, "starved" low utilisation with the
memory held, "idle"), so the SSH and the Prometheus paths see one fleet. Writing a node's scenario
(:meth:`DcgmExporterStandIn.set_pattern`) changes what is served; a GPU that falls off the bus
(the scenario's ``lost_gpu``) keeps only ``DCGM_FI_DEV_XID_ERRORS`` = 79. Counters
(``TOTAL_ENERGY_CONSUMPTION``, ``NVLINK_BANDWIDTH_TOTAL``) are integrated by the server so they
only increase. Runtime control (an injected Xid, profiling on or off, a node's socket closed) goes
through a JSON control file the server polls and acknowledges, so a caller's change is served on
the next scrape.

Run by :class:`DcgmExporterStandIn` as ``python -m lab.dcgm_exporter --config FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from backend.errors import LoadmasterError
from lab import fake_nvidia_smi
from lab.process import ManagedProcess, log_tail


class DcgmStandInError(LoadmasterError):
    """The dcgm-exporter stand-in could not start or answer."""


@dataclass(frozen=True)
class Field:
    """One line of dcgm-exporter's counters CSV, with the DCGM field id and value type."""

    name: str
    field_id: int
    prom_type: str  # gauge | counter | label
    help: str
    kind: str = "i"  # i: DCGM_FT_INT64, d: DCGM_FT_DOUBLE, s: DCGM_FT_STRING


#: ``etc/default-counters.csv`` at 691c927 (uncommented lines), in field-id order.
DEFAULT_FIELDS: tuple[Field, ...] = (
    Field("DCGM_FI_DRIVER_VERSION", 1, "label", "Driver Version", "s"),
    Field("DCGM_FI_DEV_SM_CLOCK", 100, "gauge", "SM clock frequency (in MHz)."),
    Field("DCGM_FI_DEV_MEM_CLOCK", 101, "gauge", "Memory clock frequency (in MHz)."),
    Field("DCGM_FI_DEV_MEMORY_TEMP", 140, "gauge", "Memory temperature (in C)."),
    Field("DCGM_FI_DEV_GPU_TEMP", 150, "gauge", "GPU temperature (in C)."),
    Field("DCGM_FI_DEV_POWER_USAGE", 155, "gauge", "Power draw (in W).", "d"),
    Field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 156, "counter", "Total energy consumption since boot (in mJ)."),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 202, "counter", "Total number of PCIe retries."),
    Field("DCGM_FI_DEV_GPU_UTIL", 203, "gauge", "GPU utilization (in %)."),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", 204, "gauge", "Memory utilization (in %)."),
    Field("DCGM_FI_DEV_ENC_UTIL", 206, "gauge", "Encoder utilization (in %)."),
    Field("DCGM_FI_DEV_DEC_UTIL", 207, "gauge", "Decoder utilization (in %)."),
    Field("DCGM_FI_DEV_XID_ERRORS", 230, "gauge", "Value of the last XID error encountered."),
    Field("DCGM_FI_DEV_FB_FREE", 251, "gauge", "Framebuffer memory free (in MiB)."),
    Field("DCGM_FI_DEV_FB_USED", 252, "gauge", "Framebuffer memory used (in MiB)."),
    Field("DCGM_FI_DEV_FB_RESERVED", 253, "gauge", "Framebuffer memory reserved (in MiB)."),
    Field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 393, "counter", "Number of remapped rows for uncorrectable errors"
    ),
    Field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 394, "counter", "Number of remapped rows for correctable errors"),
    Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", 395, "gauge", "Whether remapping of rows has failed"),
    Field(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        449,
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    Field("DCGM_FI_DEV_VGPU_LICENSE_STATUS", 526, "gauge", "vGPU License status"),
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1001, "gauge", "Ratio of time the graphics engine is active.", "d"),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1004, "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.", "d"),
    Field(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        1005,
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        "d",
    ),
    Field(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        1009,
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - "
        "in bytes per second.",
    ),
    Field(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        1010,
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - "
        "in bytes per second.",
    ),
)
#: The health fields a site adds to its counters CSV for triage (commented out in dcgm-exporter's
#: ``etc/dcp-metrics-included.csv``; ids and help from DCGM's ``dcgm_fields.h``). Served, merged
#: in field-id order, when the scenario's ``dcgm_counters`` is ``"health"``.
HEALTH_FIELDS: tuple[Field, ...] = (
    Field(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        112,
        "gauge",
        "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*)",
    ),
    Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 311, "counter", "Total number of double-bit volatile ECC errors."),
    Field("DCGM_FI_DEV_ROW_REMAP_PENDING", 396, "gauge", "Whether remapping of rows is pending"),
    Field(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        409,
        "counter",
        "Total number of NVLink flow-control CRC errors.",
    ),
)
HEALTH_FIELDS_ORDERED: tuple[Field, ...] = tuple(sorted(DEFAULT_FIELDS + HEALTH_FIELDS, key=lambda f: f.field_id))
FIELDS_BY_NAME = {f.name: f for f in HEALTH_FIELDS_ORDERED}

#: The fields loadmaster's Prometheus source reads (backend/telemetry/prometheus.py).
CONSOLE_FIELDS = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
)

#: The label every series carries with the driver version (a "label" counter of the CSV).
DRIVER_LABEL = "DCGM_FI_DRIVER_VERSION"
#: dcgm-exporter's name for the label with the host's name (release 4.5.3-4.8.2 and earlier).
HOSTNAME_LABEL = "Hostname"
UNKNOWN_XID = "Unknown Error"
#: Xid 79: what a GPU that fell off the bus reports.
XID_FALLEN_OFF_BUS = 79

#: err_msg per Xid: ``internal/pkg/collector/xid_errors.go`` at 691c927 (NVIDIA's Xid catalog).
XID_ERR_MSG: dict[int, str] = {
    0: "No Error",
    1: "Invalid or corrupted push buffer stream",
    2: "Invalid or corrupted push buffer stream",
    3: "Invalid or corrupted push buffer stream",
    4: "Invalid or corrupted push buffer stream",
    5: "Unused",
    6: "Invalid or corrupted push buffer stream",
    7: "Invalid or corrupted push buffer address",
    8: "GPU stopped processing",
    9: "Driver error programming GPU",
    10: "Unused",
    11: "Invalid or corrupted push buffer stream",
    12: "Driver error handling GPU exception",
    13: "Graphics Engine Exception",
    14: "Unused",
    15: "Unused",
    16: "Display engine hung",
    17: "Unused",
    18: "Bus mastering disabled in PCI Config Space",
    19: "Display Engine error",
    20: "Invalid or corrupted Mpeg push buffer",
    21: "Invalid or corrupted Motion Estimation push buffer",
    22: "Invalid or corrupted Video Processor push buffer",
    23: "Unused",
    24: "GPU semaphore timeout",
    25: "Invalid or illegal push buffer stream",
    26: "Framebuffer timeout",
    27: "Video processor exception",
    28: "Video processor exception",
    29: "Video processor exception",
    30: "GPU semaphore access error",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    33: "Internal micro-controller error",
    34: "Video processor exception",
    35: "Video processor exception",
    36: "Video processor exception",
    37: "Driver firmware error",
    38: "Driver firmware error",
    39: "Unused",
    40: "Unused",
    41: "Unused",
    42: "Video processor exception",
    43: "GPU stopped processing",
    44: "Graphics Engine fault during context switch",
    45: "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
    46: "GPU stopped processing",
    47: "Video processor exception",
    48: "Double Bit ECC Error",
    49: "Unused",
    50: "Unused",
    51: "Unused",
    52: "Unused",
    53: "Unused",
    54: "Auxiliary power is not connected to the GPU board",
    55: "Unused",
    56: "Display Engine error",
    57: "Error programming video memory interface",
    58: "Unstable video memory interface detected",
    59: "Internal micro-controller error",
    60: "Video processor exception",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    65: "Video processor exception",
    66: "Illegal access by driver",
    67: "Illegal access by driver",
    68: "NVDEC0 Exception",
    69: "Graphics Engine class error",
    70: "CE3: Unknown Error",
    71: "CE4: Unknown Error",
    72: "CE5: Unknown Error",
    73: "NVENC2 Error",
    74: "NVLINK Error",
    75: "CE6: Unknown Error",
    76: "CE7: Unknown Error",
    77: "CE8: Unknown Error",
    78: "vGPU Start Error",
    79: "GPU has fallen off the bus",
    80: "Corrupted data sent to GPU",
    81: "VGA Subsystem Error",
    82: "NVJPG0 Error",
    83: "NVDEC1 Error",
    84: "NVDEC2 Error",
    85: "CE9: Unknown Error",
    86: "OFA Exception",
    87: "Reserved",
    88: "NVDEC3 Error",
    89: "NVDEC4 Error",
    90: "Reserved",
    91: "Reserved",
    92: "High single-bit ECC error rate",
    93: "Non-fatal violation of provisioned InfoROM wear limit",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    96: "NVDEC5 Error",
    97: "NVDEC6 Error",
    98: "NVDEC7 Error",
    99: "NVJPG1 Error",
    100: "NVJPG2 Error",
    101: "NVJPG3 Error",
    102: "NVJPG4 Error",
    103: "NVJPG5 Error",
    104: "NVJPG6 Error",
    105: "NVJPG7 Error",
    106: "SMBPBI Test Message",
    107: "SMBPBI Test Message Silent",
    108: "Reserved",
    109: "Context Switch Timeout Error",
    110: "Security Fault Error",
    111: "Display Bundle Error Event",
    112: "Display Supervisor Error",
    113: "DP Link Training Error",
    114: "Display Pipeline Underflow Error",
    115: "Display Core Channel Error",
    116: "Display Window Channel Error",
    117: "Display Cursor Channel Error",
    118: "Display Pixel Pipeline Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    121: "C2C Link Error",
    122: "SPI PMU RPC Read Failure",
    123: "SPI PMU RPC Write Failure",
    124: "SPI PMU RPC Erase Failure",
    125: "Inforom FS Failure",
    126: "Robust Channel CE10 Error",
    127: "Robust Channel CE11 Error",
    128: "Robust Channel CE12 Error",
    129: "Robust Channel CE13 Error",
    130: "Robust Channel CE14 Error",
    131: "Robust Channel CE15 Error",
    132: "Robust Channel CE16 Error",
    133: "Robust Channel CE17 Error",
    134: "Robust Channel CE18 Error",
    135: "Robust Channel CE19 Error",
    136: "ALI Training Fail",
    137: "NVLink Privilege Error",
    138: "Robust Channel DLA Error",
    139: "Robust Channel OFA1 Error",
    140: "Unrecovered ECC Error",
    141: "Robust Channel Fast Path Error",
    142: "Robust Channel NVENVC3 Error",
    143: "GPU Initialization Failure",
    144: "NVLINK: Saw Error",
    145: "NVLINK: RLW Error",
    146: "NVLINK: TLW Error",
    147: "NVLINK: TREX Error",
    148: "NVLINK: NVLPW_CTRL Error",
    149: "NVLINK: NETIR Error",
    150: "NVLINK: MSE Error",
    151: "Robust Channel Key rotation Error",
    152: "Robust Channel DLA SMMU Error",
    153: "Robust Channel DLA timeout Error",
    154: "GPU Recovery Action Changed",
    155: "NVLINK: SW Defined Error",
    156: "Resource Retirement Event",
    157: "Resource Retirement Failure",
    158: "GPU Fatal Timeout",
    159: "Robust Channel CHI Non-Data Error",
    160: "Channel Retirement Event",
    161: "Channel Retirement Failure",
    162: "Power Smoothing HW Circuitry Reengaged",
    163: "Power Smoothing HW Circuitry Disengaged",
    164: "Power Smoothing HW Circuitry Low Lifetime",
    165: "Power Smoothing HW Circuitry Lifetime Exhausted",
    166: "NVLINK Secure Crypto Error",
    167: "PCIE Fatal Timeout",
    168: "Reduced GPU Memory Capacity (Errors found in write protection region)",
    169: "Internal micro-controller halt",
    170: "NVLINK: Interrupt seen in CC mode",
    171: "Uncorrectable DRAM Error",
    172: "Uncorrectable SRAM Error",
}


def xid_message(code: int) -> str:
    """dcgm-exporter's ``err_msg`` for an Xid."""
    return XID_ERR_MSG.get(code, UNKNOWN_XID) if code >= 0 else UNKNOWN_XID


@dataclass
class DcgmNode:
    """One stand-in node's dcgm-exporter: what it serves and where.

    ``scenario`` is the node's stand-in nvidia-smi scenario file (GPUs, model, driver, pattern).
    ``ip`` None: served only on the shared socket (``/node/<name>/metrics``). ``port`` 0: a free
    one. ``hostname`` is the ``Hostname`` label's value (default: the node's name);
    ``hostname_label`` the label's name ("" omits it, like ``--no-hostname``)."""

    name: str
    scenario: str
    ip: str | None = "127.0.0.1"
    port: int = 0
    profiling: bool = True
    hostname: str | None = None
    hostname_label: str = HOSTNAME_LABEL
    uuid_label: str = "UUID"
    #: ``DCGM_FI_DEV_FB_RESERVED``; ``FB_FREE`` is the scenario's free memory less this.
    fb_reserved_mib: int = 0


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def gpu_labels(node: DcgmNode, sc: dict[str, Any], i: int) -> list[tuple[str, str]]:
    """The labels of GPU ``i``'s series, in dcgm-exporter's order (without the Xid attributes)."""
    st_uuid = f"{sc['uuid_prefix']}{i:012x}"
    bus = f"{sc['bus_prefix']}{fake_nvidia_smi.BUS_IDS[i % len(fake_nvidia_smi.BUS_IDS)]}:00.0"
    labels = [
        ("gpu", str(i)),
        (node.uuid_label, st_uuid),
        ("pci_bus_id", bus),
        ("device", f"nvidia{i}"),
        ("modelName", str(sc["model"])),
    ]
    if node.hostname_label:
        labels.append((node.hostname_label, node.hostname or node.name))
    labels.append((DRIVER_LABEL, str(sc["driver"])))
    return labels


@dataclass
class GpuCounters:
    """The counters the server integrates for one GPU (so they only ever increase)."""

    energy_mj: float
    nvlink: float
    at: float | None = None


def new_counters(i: int) -> GpuCounters:
    # Some energy and NVLink traffic since boot, different per GPU.
    return GpuCounters(energy_mj=3.6e9 + 1.7e7 * i, nvlink=4.2e12 + 9.1e10 * i)


def gpu_values(
    node: DcgmNode,
    sc: dict[str, Any],
    i: int,
    t: float,
    *,
    xid: int = 0,
    profiling: bool = True,
    counters: GpuCounters | None = None,
    now: float | None = None,
) -> dict[str, float | int]:
    """Field name -> value for GPU ``i`` at scenario time ``t`` (blank fields left out).

    ``counters`` (updated in place, at wall time ``now``) gives the energy and NVLink counters;
    without it they are left out."""
    if fake_nvidia_smi._lost(sc, i, t):
        return {"DCGM_FI_DEV_XID_ERRORS": XID_FALLEN_OFF_BUS}
    st = fake_nvidia_smi.gpu_state(sc, i, t)
    fault = fake_nvidia_smi._fault(sc, i)
    util = int(st["utilization.gpu"])
    used = int(st["memory.used"])
    total = int(st["memory.total"])
    temp = int(st["temperature.gpu"])
    wobble = math.sin(t * 0.7 + i * 1.3)
    out: dict[str, float | int] = {
        "DCGM_FI_DEV_SM_CLOCK": int(st["clocks.sm"]) if "sm_clock_pct" in fault else 1980 if util > 0 else 345,
        "DCGM_FI_DEV_MEM_CLOCK": 2619 if util > 0 else 1593,
        "DCGM_FI_DEV_MEMORY_TEMP": temp + 4,
        "DCGM_FI_DEV_GPU_TEMP": temp,
    }
    power = None if st["power.draw"].startswith("[") else float(st["power.draw"])
    if power is not None:
        out["DCGM_FI_DEV_POWER_USAGE"] = power
    if counters is not None and now is not None:
        if counters.at is not None and now > counters.at:
            dt = now - counters.at
            counters.energy_mj += (power or 0.0) * dt * 1000.0
            counters.nvlink += util / 100.0 * 2.5e11 * dt
        counters.at = now
        if power is not None:
            out["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] = int(counters.energy_mj)
    out.update(
        {
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": int(fault.get("pcie_replays", 0)),
            "DCGM_FI_DEV_GPU_UTIL": util,
            "DCGM_FI_DEV_MEM_COPY_UTIL": int(st["utilization.memory"]),
            "DCGM_FI_DEV_ENC_UTIL": 0,
            "DCGM_FI_DEV_DEC_UTIL": 0,
            "DCGM_FI_DEV_XID_ERRORS": xid,
            "DCGM_FI_DEV_FB_FREE": max(0, total - used - node.fb_reserved_mib),
            "DCGM_FI_DEV_FB_USED": used,
            "DCGM_FI_DEV_FB_RESERVED": node.fb_reserved_mib,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": int(st["remapped_rows.uncorrectable"]),
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 1 if fault.get("remap_failed") else 0,
        }
    )
    if sc.get("dcgm_counters") == "health":
        out["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] = int(st["clocks_event_reasons.active"], 16)
        out["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] = int(st["ecc.errors.uncorrected.volatile.total"])
        out["DCGM_FI_DEV_ROW_REMAP_PENDING"] = 1 if fault.get("remap_pending") else 0
        out["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] = int(fault.get("nvlink_crc", 0))
    if counters is not None:
        out["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] = int(counters.nvlink)
    out["DCGM_FI_DEV_VGPU_LICENSE_STATUS"] = 0
    if profiling:
        gr = min(1.0, max(0.0, util / 100.0 * (0.97 + 0.02 * wobble)))
        out["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] = gr
        out["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] = gr * 0.46
        out["DCGM_FI_PROF_DRAM_ACTIVE"] = gr * 0.58
        out["DCGM_FI_PROF_PCIE_TX_BYTES"] = int(gr * 1.1e9)
        out["DCGM_FI_PROF_PCIE_RX_BYTES"] = int(gr * 3.4e9)
    return out


def format_value(f: Field, value: float | int) -> str:
    """A value as dcgm-exporter prints it: int64 ``%d``, double ``%f``."""
    return f"{float(value):f}" if f.kind == "d" else str(int(value))


def label_text(labels: list[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in labels)


def render(
    node: DcgmNode,
    sc: dict[str, Any],
    t: float,
    *,
    xids: dict[int, int] | None = None,
    profiling: bool | None = None,
    counters: dict[int, GpuCounters] | None = None,
    now: float | None = None,
) -> str:
    """The ``/metrics`` text of one node at scenario time ``t``."""
    xids = xids or {}
    prof = node.profiling if profiling is None else profiling
    per_gpu: list[tuple[str, dict[str, float | int]]] = []
    for i in fake_nvidia_smi._listed(sc):  # a vanished GPU has no series at all
        c = None
        if counters is not None:
            c = counters.setdefault(i, new_counters(i))
        values = gpu_values(node, sc, i, t, xid=xids.get(i, 0), profiling=prof, counters=c, now=now)
        per_gpu.append((label_text(gpu_labels(node, sc, i)), values))
    out: list[str] = []
    for f in HEALTH_FIELDS_ORDERED if sc.get("dcgm_counters") == "health" else DEFAULT_FIELDS:
        if f.prom_type == "label":
            continue
        lines = []
        for labels, values in per_gpu:
            if f.name not in values:
                continue
            extra = ""
            if f.name == "DCGM_FI_DEV_XID_ERRORS":
                code = int(values[f.name])
                extra = f',err_code="{code}",err_msg="{_escape(xid_message(code))}"'
            lines.append(f"{f.name}{{{labels}{extra}}} {format_value(f, values[f.name])}")
        if lines:
            out.append(f"# HELP {f.name} {f.help}")
            out.append(f"# TYPE {f.name} {f.prom_type}")
            out.extend(lines)
    return "\n".join(out) + "\n" if out else ""


def scenario_time(sc: dict[str, Any], now: float | None = None) -> float:
    """Seconds into the scenario, as the stand-in nvidia-smi computes them."""
    if sc.get("fixed_t") is not None:
        return float(sc["fixed_t"])
    return (time.time() if now is None else now) - float(sc["start"])


# -- the server process ---------------------------------------------------------------------------

_STATUS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 400: "Bad Request"}
_INDEX = (
    b"<html><head><title>GPU Exporter</title></head><body><h1>GPU Exporter</h1>"
    b'<p><a href="./metrics">Metrics</a></p><p><a href="./health">Health</a></p></body></html>'
)


class _NodeState:
    def __init__(self, node: DcgmNode) -> None:
        self.node = node
        self.xids: dict[int, int] = {}
        self.profiling = node.profiling
        self.listening = True
        self.counters: dict[int, GpuCounters] = {}
        self.cache: tuple[float, bytes] | None = None
        self.scenario: tuple[int, dict[str, Any]] | None = None
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.address: str | None = None


class _Server:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.collect_interval = float(cfg.get("collect_interval", 1.0))
        self.control = Path(cfg["control"])
        self.ack = Path(cfg["ack"])
        self.ready = Path(cfg["ready"])
        self.shared_ip: str | None = cfg.get("shared_ip")
        self.shared_port = int(cfg.get("shared_port", 0))
        self.nodes = {n["name"]: _NodeState(DcgmNode(**n)) for n in cfg["nodes"]}
        self.control_mtime: int | None = None
        self.shared: asyncio.Server | None = None
        self.shared_writers: set[asyncio.StreamWriter] = set()

    # rendering
    def _scenario(self, ns: _NodeState) -> dict[str, Any]:
        path = ns.node.scenario
        mtime = os.stat(path).st_mtime_ns
        if ns.scenario is None or ns.scenario[0] != mtime:
            ns.scenario = (mtime, fake_nvidia_smi.load_scenario(path))
        return ns.scenario[1]

    def metrics(self, ns: _NodeState) -> bytes:
        mono = time.monotonic()
        if ns.cache is not None and mono - ns.cache[0] < self.collect_interval:
            return ns.cache[1]
        sc = self._scenario(ns)
        now = time.time()
        text = render(
            ns.node,
            sc,
            scenario_time(sc, now),
            xids=ns.xids,
            profiling=ns.profiling,
            counters=ns.counters,
            now=now,
        ).encode()
        ns.cache = (mono, text)
        return text

    # http
    def _route(self, ns: _NodeState | None, path: str) -> tuple[int, bytes, str]:
        plain = "text/plain; charset=utf-8"
        if ns is None:
            parts = path.strip("/").split("/")
            if len(parts) == 3 and parts[0] == "node" and parts[2] == "metrics" and parts[1] in self.nodes:
                return 200, self.metrics(self.nodes[parts[1]]), plain
            if path == "/health":
                return 200, b"OK", plain
            return 404, b"404 page not found\n", plain
        if path == "/metrics":
            return 200, self.metrics(ns), plain
        if path == "/health":
            return 200, b"OK", plain
        if path == "/":
            return 200, _INDEX, "text/html; charset=utf-8"
        return 404, b"404 page not found\n", plain

    async def handle(self, ns: _NodeState | None, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers = ns.writers if ns is not None else self.shared_writers
        writers.add(writer)
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                headers: dict[str, str] = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                parts = line.decode("latin-1").split()
                if len(parts) != 3:
                    status, body, ctype, version = 400, b"400 Bad Request", "text/plain; charset=utf-8", "HTTP/1.1"
                else:
                    method, target, version = parts
                    length = int(headers.get("content-length", "0") or 0)
                    if length:
                        await reader.readexactly(length)
                    if method not in ("GET", "HEAD"):
                        status, body, ctype = 405, b"Method Not Allowed\n", "text/plain; charset=utf-8"
                    else:
                        status, body, ctype = self._route(ns, target.split("?", 1)[0])
                    if method == "HEAD":
                        body = b""
                keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
                head = [
                    f"HTTP/1.1 {status} {_STATUS.get(status, 'OK')}",
                    f"Content-Type: {ctype}",
                    "X-Content-Type-Options: nosniff",
                    f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S GMT', time.gmtime())}",
                    f"Content-Length: {len(body)}",
                ]
                if not keep:
                    head.append("Connection: close")
                writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
                await writer.drain()
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writers.discard(writer)
            writer.close()

    async def _listen(self, ns: _NodeState) -> None:
        assert ns.node.ip is not None
        ns.server = await asyncio.start_server(
            lambda r, w: self.handle(ns, r, w), ns.node.ip, ns.node.port, reuse_address=True
        )
        sock = ns.server.sockets[0]
        ns.node.port = int(sock.getsockname()[1])
        ns.address = f"{ns.node.ip}:{ns.node.port}"
        ns.listening = True

    async def _close(self, ns: _NodeState) -> None:
        if ns.server is not None:
            ns.server.close()
            for w in list(ns.writers):
                w.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ns.server.wait_closed(), 5)
            ns.server = None
        ns.listening = False

    async def apply_control(self) -> None:
        try:
            mtime = os.stat(self.control).st_mtime_ns
        except FileNotFoundError:
            return
        if mtime == self.control_mtime:
            return
        self.control_mtime = mtime
        doc = json.loads(self.control.read_text())
        for name, c in doc.get("nodes", {}).items():
            ns = self.nodes.get(name)
            if ns is None:
                continue
            ns.xids = {int(k): int(v) for k, v in c.get("xids", {}).items()}
            ns.profiling = bool(c.get("profiling", ns.node.profiling))
            want = bool(c.get("listening", True))
            if ns.node.ip is not None and want != (ns.server is not None):
                if want:
                    await self._listen(ns)
                else:
                    await self._close(ns)
            ns.cache = None
            ns.scenario = None  # the caller may have rewritten the scenario too
        _write_json(self.ack, {"generation": int(doc.get("generation", 0))})

    async def run(self) -> None:
        for ns in self.nodes.values():
            if ns.node.ip is not None:
                await self._listen(ns)
        shared = None
        if self.shared_ip:
            self.shared = await asyncio.start_server(
                lambda r, w: self.handle(None, r, w), self.shared_ip, self.shared_port, reuse_address=True
            )
            shared = f"{self.shared_ip}:{self.shared.sockets[0].getsockname()[1]}"
        await self.apply_control()
        _write_json(
            self.ready,
            {
                "pid": os.getpid(),
                "addresses": {n: s.address for n, s in self.nodes.items() if s.address},
                "shared": shared,
            },
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        while not stop.is_set():
            try:
                await self.apply_control()
            except (OSError, ValueError) as exc:
                print(f"dcgm stand-in: bad control file {self.control}: {exc}", file=sys.stderr, flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dcgm_exporter", description=__doc__.split("\n", 1)[0])
    p.add_argument("--config", required=True, help="the JSON config DcgmExporterStandIn writes")
    args = p.parse_args(argv)
    cfg = json.loads(Path(args.config).read_text())
    try:
        asyncio.run(_Server(cfg).run())
    except OSError as exc:
        print(f"dcgm stand-in: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


# -- the controller (the test or the lab) -----------------------------------------------------------


class DcgmExporterStandIn(ManagedProcess):
    """Start, steer and stop the stand-in dcgm-exporter process for ``nodes``.

    ``DcgmExporterStandIn(root, [DcgmNode("node-01", scenario, ip="127.0.0.2")]).start()`` then
    :attr:`addresses` (node -> ``ip:port``), :meth:`set_pattern`, :meth:`inject_xid`,
    :meth:`stop_node` / :meth:`start_node`. ``shared=True`` also serves every node on one socket
    (:attr:`shared_address`, path ``/node/<name>/metrics``). Ready when it wrote its ready file
    (every node's socket listens)."""

    error = DcgmStandInError
    start_timeout = 20.0
    stop_grace = 10.0

    def __init__(
        self,
        root: Path,
        nodes: list[DcgmNode],
        *,
        collect_interval: float = 1.0,
        shared: bool = False,
        shared_ip: str = "127.0.0.1",
    ) -> None:
        self.root = Path(root).absolute()
        self.nodes = {n.name: n for n in nodes}
        if len(self.nodes) != len(nodes):
            raise DcgmStandInError("dcgm stand-in: node names must be unique")
        self.collect_interval = collect_interval
        self.shared_ip = shared_ip if shared else None
        self.addresses: dict[str, str] = {}
        self.shared_address: str | None = None
        self._generation = 0
        self._control: dict[str, dict[str, Any]] = {
            n.name: {"xids": {}, "profiling": n.profiling, "listening": True} for n in nodes
        }

    @property
    def config_path(self) -> Path:
        return self.root / "dcgm-exporter.json"

    @property
    def control_path(self) -> Path:
        return self.root / "dcgm-control.json"

    @property
    def log_path(self) -> Path:
        return self.root / "dcgm-exporter.log"

    @property
    def _ready_path(self) -> Path:
        return self.root / "dcgm-ready.json"

    @property
    def _ack_path(self) -> Path:
        return self.root / "dcgm-control.ack"

    def args(self) -> list[str]:
        return [sys.executable, "-m", "lab.dcgm_exporter", "--config", str(self.config_path)]

    def env(self) -> dict[str, str]:
        """This environment, with the repository on PYTHONPATH (``-m lab.dcgm_exporter``)."""
        repo = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def before_start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for p in (self._ready_path, self._ack_path):
            p.unlink(missing_ok=True)
        self._write_control()
        _write_json(
            self.config_path,
            {
                "collect_interval": self.collect_interval,
                "control": str(self.control_path),
                "ack": str(self._ack_path),
                "ready": str(self._ready_path),
                "shared_ip": self.shared_ip,
                "nodes": [asdict(n) for n in self.nodes.values()],
            },
        )

    def ready(self) -> bool:
        """Whether the ready file is there; then the nodes' addresses are read from it."""
        if not self._ready_path.exists():
            return False
        ready = json.loads(self._ready_path.read_text())
        self.addresses = dict(ready["addresses"])
        self.shared_address = ready.get("shared")
        for name, addr in self.addresses.items():
            self.nodes[name].port = int(addr.rsplit(":", 1)[1])  # the same port on a restart
        return True

    def start_failure(self) -> str:
        return f"the dcgm-exporter stand-in did not start ({self.root})"

    # -- where Prometheus scrapes -------------------------------------------------------------
    def target(self, name: str) -> tuple[str, str]:
        """(address, metrics path) of a node's exporter: its own socket, else the shared one."""
        if name in self.addresses:
            return self.addresses[name], "/metrics"
        node = self.nodes.get(name)
        if node is not None and node.ip is not None and node.port:
            return f"{node.ip}:{node.port}", "/metrics"  # its port chosen before it listens
        if self.shared_address and name in self.nodes:
            return self.shared_address, f"/node/{name}/metrics"
        raise KeyError(name)

    def url(self, name: str) -> str:
        addr, path = self.target(name)
        return f"http://{addr}{path}"

    def metrics(self, name: str, timeout: float = 5.0) -> str:
        """GET the node's ``/metrics`` text."""
        with urllib.request.urlopen(self.url(name), timeout=timeout) as resp:
            return str(resp.read().decode())

    # -- steering --------------------------------------------------------------------------------
    def _write_control(self) -> None:
        self._generation += 1
        _write_json(self.control_path, {"generation": self._generation, "nodes": self._control})

    def _apply(self, timeout: float = 10.0) -> None:
        self._write_control()
        if not self.running:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if int(json.loads(self._ack_path.read_text())["generation"]) >= self._generation:
                    return
            except (OSError, ValueError, KeyError):
                pass
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise DcgmStandInError(
            f"the dcgm-exporter stand-in did not take the change ({self.root}): {log_tail(self.log_path)}"
        )

    @property
    def generation(self) -> int:
        """How many changes were sent to the process so far (every steering call is one)."""
        return self._generation

    def reset(self, profiling: dict[str, bool], *, reread: bool = False) -> bool:
        """Every node listening, without Xids, serving profiling as ``profiling`` says (its node's
        own setting where it does not): one change, sent only when that is not so already or with
        ``reread`` (the stand-in drops what it rendered and reads the scenario files again).
        Whether a change was sent."""
        want = {
            name: {"xids": {}, "profiling": bool(profiling.get(name, n.profiling)), "listening": True}
            for name, n in self.nodes.items()
        }
        if want == self._control and not reread:
            return False
        self._control = want
        self._apply()
        return True

    def _node(self, name: str) -> DcgmNode:
        try:
            return self.nodes[name]
        except KeyError:
            raise DcgmStandInError(f"the dcgm-exporter stand-in serves no node {name!r}") from None

    def set_pattern(self, name: str, pattern: str | list[str]) -> None:
        """Rewrite the node's scenario with another pattern ("training", "starved", "idle", or one
        per GPU); the scenario's clock and other fields are kept."""
        node = self._node(name)
        sc = fake_nvidia_smi.load_scenario(node.scenario)
        sc["pattern"] = pattern
        fake_nvidia_smi.write_scenario(node.scenario, **sc)
        self._apply()

    def set_scenario(self, name: str, **fields: Any) -> None:
        """Rewrite the node's scenario with ``fields`` changed (``faults``, ``lost_gpu``,
        ``dcgm_counters``, ...; the others kept), served from the next scrape on."""
        node = self._node(name)
        sc = fake_nvidia_smi.load_scenario(node.scenario)
        fake_nvidia_smi.write_scenario(node.scenario, **(sc | fields))
        self._apply()

    def inject_xid(self, name: str, gpu: int, code: int) -> None:
        """GPU ``gpu`` of the node reports Xid ``code`` as its last one (until :meth:`clear_xid`)."""
        self._node(name)
        self._control[name]["xids"][str(int(gpu))] = int(code)
        self._apply()

    def clear_xid(self, name: str, gpu: int | None = None) -> None:
        """Back to "No Error" (a driver reload) for one GPU or all of them."""
        self._node(name)
        if gpu is None:
            self._control[name]["xids"] = {}
        else:
            self._control[name]["xids"].pop(str(int(gpu)), None)
        self._apply()

    def set_profiling(self, name: str, enabled: bool) -> None:
        """Serve the ``DCGM_FI_PROF_*`` fields or not (a GPU model without DCP metrics)."""
        self._node(name)
        self._control[name]["profiling"] = bool(enabled)
        self._apply()

    def stop_node(self, name: str) -> None:
        """Close the node's socket (and its open connections): its scrapes are refused."""
        if self._node(name).ip is None:
            raise DcgmStandInError(f"{name} is served on the shared socket only: it has no socket of its own to close")
        self._control[name]["listening"] = False
        self._apply()

    def start_node(self, name: str) -> None:
        """Listen again on the node's address and port."""
        self._node(name)
        self._control[name]["listening"] = True
        self._apply()


if __name__ == "__main__":
    sys.exit(main())
