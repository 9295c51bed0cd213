"""Headless renderings of a FleetSnapshot: a plain-text fleet table and a JSON-ready dict."""

from __future__ import annotations

import dataclasses
from typing import Any

from backend.telemetry.cells import alert_cell, error_cell, gpus_cell, link_cell, state_cell
from backend.telemetry.model import FleetSnapshot, NodeSnapshot
from backend.textfmt import align_columns


def _r(v: float | None, nd: int = 2) -> float | None:
    return None if v is None else round(v, nd)


def node_dict(n: NodeSnapshot, now: float) -> dict[str, Any]:
    """One node as plain JSON types (derived totals included)."""
    return {
        "name": n.name,
        "site": n.site,
        "state": n.state,
        "error": n.error,
        "age_s": _r(now - n.sampled_at) if n.sampled_at is not None else None,
        "latency_ms": _r(n.latency_ms, 1),
        "samples": n.samples,
        "gpu_status": n.gpu_status,
        "gpu_count": len(n.live_gpus),
        "gpus_lost": sum(1 for g in n.gpus if g.lost),
        "util_mean": _r(n.util_mean, 1),
        "util_min": _r(n.util_min, 1),
        "mem_used_mib": n.mem_used_mib,
        "mem_total_mib": n.mem_total_mib,
        "rx_gbps": _r(n.rx_gbps, 3),
        "tx_gbps": _r(n.tx_gbps, 3),
        "rx_pct": _r(n.rx_pct, 1),
        "tx_pct": _r(n.tx_pct, 1),
        "disk_write_mbps": _r(n.disk_write_mbps),
        "disk_read_mbps": _r(n.disk_read_mbps),
        "scratch": {
            "path": n.scratch,
            "free_bytes": n.scratch_free_bytes,
            "total_bytes": n.scratch_total_bytes,
            "error": n.scratch_error,
        },
        "gpus": [dataclasses.asdict(g) for g in n.gpus],
        "nics": [
            {
                **dataclasses.asdict(x),
                "rx_gbps": _r(x.rx_gbps, 3),
                "tx_gbps": _r(x.tx_gbps, 3),
                "rx_pct": _r(x.rx_pct, 1),
                "tx_pct": _r(x.tx_pct, 1),
            }
            for x in n.nics
        ],
        "disks": [
            {**dataclasses.asdict(d), "read_mbps": _r(d.read_mbps), "write_mbps": _r(d.write_mbps)} for d in n.disks
        ],
        "alerts": [alert_dict(a) for a in n.alerts],
        "source": n.source,
        "xids": [{**dataclasses.asdict(x), "message": x.message} for x in n.xids],
    }


def alert_dict(a: Any) -> dict[str, Any]:
    """An Alert as plain JSON types, with its one-line message."""
    d = dataclasses.asdict(a)
    d["gpus"] = list(a.gpus)
    d["message"] = a.message
    for k in ("duration", "mean_util_pct", "rx_gbps", "rx_pct"):
        d[k] = _r(d[k], 1)
    return d


def fleet_dict(snap: FleetSnapshot, *, wall_time: float) -> dict[str, Any]:
    """One sample tick as a JSON object (``loadmaster top --json`` prints one per line)."""
    return {
        "seq": snap.seq,
        "time": wall_time,
        "summary": {
            "nodes_up": snap.nodes_up,
            "nodes_total": len(snap.nodes),
            "gpus": snap.gpu_count,
            "util_mean": _r(snap.util_mean, 1),
            "rx_gbps": _r(snap.rx_gbps, 3),
            "tx_gbps": _r(snap.tx_gbps, 3),
            "active_alerts": len(snap.active_alerts),
            "xid_nodes": sum(1 for n in snap.nodes if n.xids),
            "source_note": snap.source_note,
        },
        "nodes": [node_dict(n, snap.t) for n in snap.nodes],
        "alerts": [alert_dict(a) for a in snap.alerts],
    }


def unread_nodes(snap: FleetSnapshot) -> dict[str, str]:
    """Nodes of ``snap`` whose figures are missing or partial (not up, or a malformed sample),
    with why: what ``top`` names on stderr and a console footer says is missing."""
    out: dict[str, str] = {}
    for n in snap.nodes:
        if n.state != "up":
            out[n.name] = n.state + (f": {n.error}" if n.error else "")
        elif n.error and n.error.startswith("malformed"):
            out[n.name] = n.error
    return out


COLUMNS = (
    "NODE",
    "STATE",
    "SSH",
    "GPUS",
    "UTIL",
    "MIN",
    "MEM GiB",
    "RX Gbps",
    "RX%",
    "TX Gbps",
    "DISK W MB/s",
    "ALERT",
)


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def fleet_table(snap: FleetSnapshot, *, local: frozenset[str] = frozenset()) -> str:
    """The fleet as an aligned text table with a summary line (like nvidia-smi for a fleet);
    nodes named in ``local`` are this machine (no SSH: their link shows ``local``)."""
    rows = [COLUMNS]
    for n in snap.nodes:  # the cells the console's Fleet table shows (backend.telemetry.cells)
        error = error_cell(n)
        rows.append(
            (
                n.name,
                (f"{state_cell(n)} ({error})" if error else state_cell(n))[:48],
                link_cell(n, n.name in local),
                gpus_cell(n),
                _f(n.util_mean, "{:.0f}%"),
                _f(n.util_min, "{:.0f}%"),
                _f(None if n.mem_used_mib is None else n.mem_used_mib / 1024, "{:.0f}"),
                _f(n.rx_gbps, "{:.2f}"),
                _f(n.rx_pct, "{:.0f}%"),
                _f(n.tx_gbps, "{:.2f}"),
                _f(n.disk_write_mbps, "{:.1f}"),
                alert_cell(n),
            )
        )
    lines = [snap.summary_line(), *align_columns(rows)]
    for a in snap.active_alerts:
        lines.append(f"! {a.message}")
    for n in snap.nodes:
        for x in n.xids[-3:]:
            lines.append(f"! {x.message}")
    return "\n".join(lines)
