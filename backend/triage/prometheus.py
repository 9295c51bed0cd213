"""Health signals from the site's Prometheus (dcgm-exporter's DCGM fields) instead of SSH.

Three instant queries for any number of nodes: the health gauges in one selector on
``__name__``, and the increase over :data:`COUNTER_WINDOW` of the PCIe replay and NVLink CRC
counters (one query each: ``increase()`` drops the metric name). Series are matched to nodes by
``dcgm_node_label`` as the telemetry source does (:class:`backend.telemetry.prometheus.NodeIndex`).

Field names and bits follow DCGM (``dcgm_fields.h``: ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` 112,
its bits the same as NVML's; ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` 311; ``DCGM_FI_DEV_ROW_REMAP_FAILURE``
395 and ``_PENDING`` 396; ``DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL`` 409). Before DCGM 3.2
the reasons field was called ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``: both are read. A field a site
does not export is simply absent, and absence accuses nobody; a GPU that has series for some fields
but no clock, utilisation or power while its peers do (dcgm-exporter keeps only the Xid of a GPU
that fell off the bus) is telemetry gone missing, and a GPU with no series at all while the node's
peers have it is a missing GPU (:mod:`backend.triage.analyze`).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from backend.config import Node
from backend.telemetry.prometheus import NodeIndex, PrometheusClient
from backend.telemetry.settings import TelemetrySettings
from backend.telemetry.xid import describe
from backend.textfmt import safe_text
from backend.triage.analyze import NodeHealth
from backend.triage.signals import GpuHealth, XidSeen

GAUGES = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_XID_ERRORS",
)
COUNTERS = ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")
#: The window the counters' increase is taken over.
COUNTER_WINDOW = "15m"
_MAX_GPU = 64
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def queries(label: str = "", values: Iterable[str] = ()) -> tuple[str, ...]:
    """The instant queries one triage makes, whatever the number of nodes: restricted to the
    series whose ``label`` is one of ``values`` (the nodes' names and hosts) when given."""
    names = "|".join(GAUGES)
    match = ""
    vals = sorted(set(values))
    if label and vals and _LABEL.fullmatch(label):
        alts = "|".join(re.escape(v).replace("\\", "\\\\").replace('"', '\\"') for v in vals)
        match = f',{label}=~"{alts}"'
    return (
        f'{{__name__=~"{names}"{match}}}',
        *(f"increase({c}{{{match.lstrip(',')}}}[{COUNTER_WINDOW}])" for c in COUNTERS),
    )


def _gpu_key(labels: dict[str, Any]) -> int | None:
    g = labels.get("gpu")
    if not isinstance(g, str) or not (g.isascii() and g.isdigit()) or len(g) > 3:
        return None
    i = int(g)
    return i if i < _MAX_GPU else None


def _yes_no(v: float | None) -> bool | None:
    """A 0/1 gauge: NaN, negative or absent is None (unknown), never "no"."""
    return None if v is None or not math.isfinite(v) or v < 0 else v >= 1


def _in(v: float, lo: float, hi: float) -> float | None:
    return v if math.isfinite(v) and lo <= v <= hi else None


async def read_health(
    settings: TelemetrySettings, inventory: Iterable[Node], names: list[str]
) -> dict[str, NodeHealth]:
    """Each named node's health as Prometheus has it (nodes without any DCGM series are absent)."""
    assert settings.prometheus_url
    client = PrometheusClient(settings.prometheus_url, settings.prometheus_timeout)
    nodes = list(inventory)
    wanted = set(names)
    values = [v for n in nodes if n.name in wanted for v in (n.name, n.host)]
    try:
        gauges, *increases = await asyncio.gather(*(client.query(q) for q in queries(settings.dcgm_node_label, values)))
    finally:
        await client.close()
    index = NodeIndex(nodes)
    per: dict[str, dict[int, dict[str, Any]]] = {}

    def slot(labels: dict[str, Any]) -> dict[str, Any] | None:
        node = index.find(labels.get(settings.dcgm_node_label))
        gpu = _gpu_key(labels)
        if node is None or node not in wanted or gpu is None:
            return None
        return per.setdefault(node, {}).setdefault(gpu, {"labels": labels})

    for labels, value in gauges:
        s = slot(labels)
        if s is not None:
            s[str(labels.get("__name__"))] = value
    for name, answer in zip(COUNTERS, increases, strict=True):
        for labels, value in answer:
            s = slot(labels)
            if s is not None:
                s[name] = value
    now = time.time()
    out: dict[str, NodeHealth] = {}
    for node, gpus in per.items():
        healths: list[GpuHealth] = []
        xids: list[XidSeen] = []
        for i, s in sorted(gpus.items()):
            lab = s["labels"]
            reasons = s.get("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", s.get("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"))
            ecc = s.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")
            pending = s.get("DCGM_FI_DEV_ROW_REMAP_PENDING")
            failed = s.get("DCGM_FI_DEV_ROW_REMAP_FAILURE")
            pcie = s.get("DCGM_FI_DEV_PCIE_REPLAY_COUNTER")
            crc = s.get("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")
            healths.append(
                GpuHealth(
                    index=i,
                    uuid=safe_text(lab.get("UUID") or lab.get("uuid") or "", 96),
                    bus=safe_text(lab.get("pci_bus_id") or "", 32),
                    name=safe_text(lab.get("modelName") or "", 96),
                    util_pct=_in(s.get("DCGM_FI_DEV_GPU_UTIL", math.nan), 0, 100),
                    power_w=_in(s.get("DCGM_FI_DEV_POWER_USAGE", math.nan), 0, 5000),
                    sm_mhz=_in(s.get("DCGM_FI_DEV_SM_CLOCK", math.nan), 1, 10000),
                    reasons=int(reasons) if reasons is not None and 0 <= reasons < 2**63 else None,
                    ecc_uncorrected=int(ecc) if ecc is not None and 0 <= ecc < 2**63 else None,
                    remap_pending=_yes_no(pending),
                    remap_failed=_yes_no(failed),
                    pcie_replays=int(pcie) if pcie is not None and 0 <= pcie < 2**63 else None,
                    nvlink_crc=int(crc) if crc is not None and 0 <= crc < 2**63 else None,
                )
            )
            code = s.get("DCGM_FI_DEV_XID_ERRORS")
            if code is not None and 0 < code < 10000 and code == int(code):
                info = describe(int(code))
                xids.append(XidSeen(i, int(code), None, info.mnemonic, info.action, info.drain))
        out[node] = NodeHealth(node, reachable=True, read_at=now, gpus=tuple(healths), xids=tuple(xids))
    return out


def merge_slurm(health: NodeHealth, base: NodeHealth) -> NodeHealth:
    """Prometheus's numbers with the Slurm fields triage read for the node."""
    return replace(
        health,
        expected_gpus=base.expected_gpus,
        slurm_state=base.slurm_state,
        slurm_reason=base.slurm_reason,
        slurm_reason_at=base.slurm_reason_at,
    )
