"""The Fleet table's cell rules, one set for both front ends (#30: one row model per table).

``loadmaster top`` (:func:`backend.telemetry.report.fleet_table`) and the console's Fleet table
(``tui/widgets/fleet_format.node_cells``) say a node's GPUs, state, alert and link through these
functions, so a lost GPU, a starved node or an Xid reads the same in a terminal and on the screen.
"""

from __future__ import annotations

from collections.abc import Sequence

from backend.telemetry.model import NO_GPU, NodeSnapshot


def num(v: float | None, fmt: str = "{:.1f}", none: str = "-") -> str:
    return none if v is None else fmt.format(v)


def rate_pct(gbps: float | None, pct: float | None) -> str:
    """'12.3 (49%)', '12.3' when the line rate is unknown, '-' when the rate is unknown."""
    if gbps is None:
        return "-"
    return f"{gbps:.1f} ({pct:.0f}%)" if pct is not None else f"{gbps:.1f}"


def gpus_cell(n: NodeSnapshot) -> str:
    if n.sampled_at is None:
        return "-"  # never sampled: nothing known yet
    if n.gpu_status == NO_GPU:
        return NO_GPU
    if n.gpu_status != "ok" and not n.gpus:
        return f"error: {n.gpu_status[:40]}"
    lost = sum(1 for g in n.gpus if g.lost)
    return f"{len(n.gpus) - lost}/{len(n.gpus)} ({lost} lost)" if lost else str(len(n.gpus))


def state_cell(n: NodeSnapshot) -> str:
    return n.state


def error_cell(n: NodeSnapshot) -> str:
    """The last error while the node is not up (the State column stays short)."""
    return n.error if n.error and n.state != "up" else ""


def alert_cell(n: NodeSnapshot, site_alerts: Sequence[str] = (), *, silenced: bool = False) -> str:
    """Starved, the newest Xid, and ``!N NAME``: the site's active alerts about the node.

    ``silenced``: the node's GPUStarved page is silenced in Alertmanager (said on the row).
    """
    parts = [f"STARVED {n.alerts[0].hint}" + (" (silenced)" if silenced else "")] if n.alerts else []
    if n.xids:
        x = n.xids[-1]
        parts.append(f"XID {x.code} GPU {x.gpu}")
    if site_alerts:
        parts.append(f"!{len(site_alerts)} {site_alerts[0]}" + ("+" if len(site_alerts) > 1 else ""))
    return " · ".join(parts)


def link_cell(n: NodeSnapshot, local: bool) -> str:
    """How the console reaches the node: SSH round trip, or ``local`` (no SSH at all)."""
    return "local" if local else num(n.latency_ms, "{:.0f} ms")
