"""Pure text formatting for the Fleet screens: cells, bars and text sparklines (no Textual)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rich.text import Text

from backend.ops.fleet import alert_cell, error_cell, gpus_cell, link_cell, num, rate_pct, state_cell
from backend.ops.types import Alert, FleetSnapshot, NodeSnapshot
from backend.textfmt import gpu_ranges, safe_text
from backend.units import age_text, gbps_text

if TYPE_CHECKING:
    from backend.ops.slurm import SlurmNodeRow

SPARK = "▁▂▃▄▅▆▇█"
BAR_FULL = "█"
BAR_EMPTY = "░"


def spark(values: Sequence[float], width: int, *, lo: float = 0.0, hi: float = 100.0) -> str:
    """The last ``width`` values as a block sparkline; missing (NaN) values are spaces."""
    vals = list(values)[-width:]
    out = []
    span = (hi - lo) or 1.0
    for v in vals:
        if v is None or math.isnan(v):
            out.append(" ")
            continue
        i = int((min(max(v, lo), hi) - lo) / span * (len(SPARK) - 1) + 0.5)
        out.append(SPARK[i])
    return "".join(out).rjust(width)


def bar(pct: float | None, width: int) -> str:
    """A horizontal bar of ``width`` cells filled to ``pct`` (blank when unknown)."""
    if pct is None:
        return " " * width
    filled = int(round(min(max(pct, 0.0), 100.0) / 100.0 * width))
    return BAR_FULL * filled + BAR_EMPTY * (width - filled)


def node_cells(
    n: NodeSnapshot,
    trend: Sequence[float],
    trend_width: int,
    *,
    local: bool = False,
    site_alerts: Sequence[str] = (),
    silenced: bool = False,
) -> tuple[str, ...]:
    """The Fleet table's cells for one node (plain strings; styling is the table's job).

    ``local``: the node is this machine over the local transport (no SSH latency to show).
    ``site_alerts``: the alertnames of the site's active, unsilenced alerts about it.
    ``silenced``: its GPUStarved page is silenced in Alertmanager.
    """
    util = "-" if n.util_mean is None else f"{n.util_mean:.0f}% / {n.util_min:.0f}%"
    mem = n.mem_used_mib
    total = n.mem_total_mib
    mem_s = "-" if mem is None else (f"{mem / 1024:.0f}/{total / 1024:.0f} GiB" if total else f"{mem / 1024:.0f} GiB")
    return (  # in the Fleet table's column order (tui/widgets/fleet_table.py COLUMNS)
        n.name,
        state_cell(n),
        gpus_cell(n),
        util,
        rate_pct(n.rx_gbps, n.rx_pct),
        rate_pct(n.tx_gbps, n.tx_pct),
        alert_cell(n, site_alerts, silenced=silenced),
        spark(trend, trend_width),
        num(n.disk_write_mbps),
        mem_s,
        link_cell(n, local),
        n.site or "",
        error_cell(n),
    )


def split_reason(reason: str, set_by: str | None) -> tuple[str, str | None]:
    """A Slurm reason as (what, who): loadmaster's template ``<what> | loadmaster:<operator> |
    <UTC time>`` gives the operator; any other reason is Slurm's ``reason_set_by_user``."""
    parts = reason.split(" | ")
    if len(parts) >= 3 and parts[-2].startswith("loadmaster:"):
        return " | ".join(parts[:-2]), parts[-2].removeprefix("loadmaster:")
    return reason, set_by


def drain_prompt(n: NodeSnapshot | None) -> str | None:
    """What on a node prompts a drain (added to the reason): its newest Xid, else loadmaster's
    starvation check; None: nothing."""
    if n is not None and n.xids:
        x = n.xids[-1]
        return f"Xid {x.code}" + (f" GPU {x.gpu}" if x.gpu >= 0 else "")
    if n is not None and n.alerts:
        return f"GPU starved: {n.alerts[0].hint}"
    return None


def slurm_state_cell(row: SlurmNodeRow | None) -> str:
    """Slurm's word for the node (``drained``, ``draining``, ``down``, ``mixed``, ``idle``; ``*``:
    slurmctld cannot reach it) and ``×N`` when it was drained N >= 3 times in 30 days; ``-``: not
    a Slurm node."""
    if row is None:
        return "-"
    word = safe_text(row.state, 12)
    return f"{word} ×{row.drains_30d}" if row.repeat_offender else word


def slurm_reason_cell(row: SlurmNodeRow | None) -> str:
    """The reason, who set it and how long ago: ``Xid 79 (alice, 2h ago)``; empty when none."""
    if row is None or not row.reason:
        return ""
    what, who = split_reason(safe_text(row.reason, 300), row.reason_by)
    when = f"{age_text(row.reason_age_s)} ago" if row.reason_age_s is not None else "when unknown"
    return f"{what} ({safe_text(who or '?', 40)}, {when})"


def slurm_detail(row: SlurmNodeRow) -> str:
    """Node detail's Slurm line: state in Slurm's spelling, partitions, the full reason with who
    and when, drains in 30 days, and the jobs on the node with their GPUs."""
    parts = [f"Slurm {safe_text(row.state, 12)} ({safe_text(row.state_text, 80)})"]
    parts.append("partitions " + (", ".join(safe_text(p, 40) for p in row.partitions) or "none"))
    if row.reason:
        who = safe_text(row.reason_by or "?", 40)
        when = f"{age_text(row.reason_age_s)} ago" if row.reason_age_s is not None else "when unknown"
        parts.append(f"reason: {safe_text(row.reason, 300)} (set by {who}, {when})")
    drains = f"drained {row.drains_30d}x in 30 days"
    parts.append(drains + (" (repeat offender)" if row.repeat_offender else ""))
    jobs = [
        f"job {safe_text(j.job_id, 20)} {safe_text(j.user, 32)}/{safe_text(j.name, 40)}"
        f" {age_text(j.elapsed_s) if j.elapsed_s is not None else '?'}"
        f" GPUs {gpu_ranges(j.gpus) or '?'}"
        for j in row.jobs
    ]
    parts.append("jobs: " + ("; ".join(jobs) if jobs else "none"))
    return " · ".join(parts)


def styled(text: str, style: str | None) -> Text | str:
    return Text(text, style=style) if style else text


def alert_cells(a: Alert) -> tuple[str, ...]:
    """The alert list's cells: node, hint, duration, util, NIC, GPUs, since, status."""
    nic = rate_pct(a.rx_gbps, a.rx_pct)
    since = "-" if a.started_wall is None else time.strftime("%H:%M:%S", time.localtime(a.started_wall))
    return (
        a.node,
        a.hint,
        f"{a.duration:.0f}s",
        f"{a.mean_util_pct:.0f}%",
        nic,
        gpu_ranges(a.gpus),
        since,
        "active" if a.active else "cleared",
    )


def theme_style(variables: Mapping[str, str], name: str) -> str | None:
    """A Rich style string from a theme variable (``node-up`` ...), None when absent."""
    value = variables.get(name)
    return value or None


def fleet_summary(snap: FleetSnapshot) -> str:
    """The fleet's totals: nodes up, GPUs, utilisation, NIC rates, Xids, a degraded source."""
    util = "-" if snap.util_mean is None else f"{snap.util_mean:.0f}%"
    xids = sum(1 for n in snap.nodes if n.xids)
    return (
        f"nodes {snap.nodes_up}/{len(snap.nodes)} up · GPUs {snap.gpu_count} · util {util} · "
        f"rx {gbps_text(snap.rx_gbps)} · tx {gbps_text(snap.tx_gbps)}"
        + (f" · Xid on {xids} node(s)" if xids else "")
        + (f" · telemetry degraded: {snap.source_note}" if snap.source_note else "")
    )


def conditions_line(
    snap: FleetSnapshot,
    *,
    alertmanager: bool,
    site_alerts: Mapping[str, Sequence[str]] | None,
    silenced: Mapping[str, Sequence[str]] | None,
    state_down: str | None = None,
) -> str:
    """What needs the operator, each source named: loadmaster's own starvation check (computed
    here from the samples), Alertmanager's alerts (firing and silenced, or that none is set), and
    a state database that cannot be reached (said once, here, not per node)."""
    starved = [a.node for a in snap.active_alerts]
    own = (
        f"starved {len(starved)} ({', '.join(starved[:3])}{'…' if len(starved) > 3 else ''})"
        if starved
        else "none starved"
    )
    # A database that is down comes first: every action that must be recorded is refused.
    parts = [f"STATE DATABASE DOWN: {state_down}"] if state_down else []
    parts.append(f"loadmaster check: {own}")
    if not alertmanager:
        parts.append("Alertmanager: not set")
    elif site_alerts is None:
        parts.append("Alertmanager: not read yet")
    else:
        firing = sum(len(v) for v in site_alerts.values())
        quiet = sum(len(v) for v in (silenced or {}).values())
        parts.append(f"Alertmanager: {firing} firing" + (f", {quiet} silenced" if quiet else ""))
    return " · ".join(parts)
