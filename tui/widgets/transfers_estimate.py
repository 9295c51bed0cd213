"""A pull's estimate as the form shows it: the egress guard's decision first, then what it moves.

The operator decides on the first line (ALLOW / WARN / CONFIRM / BLOCK, or why it cannot start),
so it comes before anything that grows with the fleet. Nodes get a line each while they fit the
room the form has; past that, one summary (how many fit, which do not, which did not answer, the
ETA range). Paths are shortened in the middle, never wrapped onto a second line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from backend.units import bytes_text, duration_text
from tui.widgets.transfers_format import short

if TYPE_CHECKING:
    from backend.ops import PullPreview

#: At most this many node names are listed in a summary line ("+N more" after them).
NAMES_SHOWN = 4
#: Problems that stop the pull, listed right under the decision (the rest at the end).
BLOCKERS_FIRST = 2


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    return shown + (f" +{len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else "")


def decision_line(preview: PullPreview) -> str:
    """The one line the operator decides on: the guard's verdict, or why the pull cannot start."""
    plan = preview.plan
    dec = plan.egress
    if dec is not None:
        line = f"{dec.action.upper()}: {dec.message}"
        if dec.action == "confirm" and not dec.override_reason:
            line += " (type a reason to go ahead)"
    else:
        line = f"egress: {plan.egress_note or 'not priced'}"
    other = [b for b in preview.blockers if not b.startswith("the egress guard")]
    if other:
        line = f"NOT STARTABLE ({len(other)} problem{'s' * (len(other) != 1)}) · {line}"
    return line


def node_summary(plan: Any, width: int = 80) -> list[str]:
    """The nodes in two lines: how many fit and which do not or did not answer; the ETA range."""
    total = plan.total_bytes
    failed = [n.node for n in plan.nodes if n.error]
    short_of_room = [n.node for n in plan.nodes if not n.error and not n.fits(total)]
    fit = len(plan.nodes) - len(failed) - len(short_of_room)
    parts = [f"{fit} fit"]
    # A node's own problem is listed in full under the decision; here, only its name.
    if short_of_room:
        parts.append(f"{len(short_of_room)} DO NOT FIT ({_names(short_of_room)})")
    if failed:
        parts.append(f"{len(failed)} did not answer ({_names(failed)})")
    lines = [f"  {len(plan.nodes)} nodes: " + ", ".join(parts)]
    etas = [e for n in plan.nodes if (e := n.eta_s(total)) is not None]
    rates = sorted({n.line_rate_gbps for n in plan.nodes if n.line_rate_gbps})
    assumed = sum(1 for n in plan.nodes if n.line_rate_gbps and not n.line_rate_known)
    frees = [(n.free_bytes, n.node) for n in plan.nodes if n.free_bytes is not None and not n.error]
    detail = []
    if etas:
        lo, hi = min(etas), max(etas)
        detail.append(f"ETA {duration_text(lo)}" + (f"-{duration_text(hi)}" if hi > lo else ""))
    if rates:
        detail.append(
            "line rate " + "-".join(f"{r:g}" for r in (rates[0], rates[-1])[: 1 + (len(rates) > 1)]) + " Gbps"
        )
        if assumed:
            detail[-1] += f" ({assumed} assumed)"
    if frees:
        least, where = min(frees)
        detail.append(f"least free {bytes_text(least)} on {where}")
    line = " "
    for part in detail:
        if len(line) > 2 and len(line) + 3 + len(part) > width:
            lines.append(line)
            line = " "
        line += (" · " if len(line) > 2 else " ") + part
    if len(line) > 2:
        lines.append(line)
    return [_cut(x, width) for x in lines]


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(1, width - 1)] + "…"


def node_line(plan: Any, n: Any, width: int) -> str:
    """One node: its destination (shortened in the middle), free space, fit and ETA."""
    if n.error:
        return "  " + short(f"{n.node}: {n.error.removeprefix(f'{n.node}: ')}", width - 2)
    total = plan.total_bytes
    rate = f"{n.line_rate_gbps:g} Gbps" + ("" if n.line_rate_known else "?") if n.line_rate_gbps else "rate ?"
    tail = (
        f"  free {bytes_text(n.free_bytes)} {'fits' if n.fits(total) else 'DOES NOT FIT'}"
        f"  ETA {duration_text(n.eta_s(total))} @{rate}"
    )
    head = f"  {n.node} "
    room = max(8, width - len(head) - len(tail))
    return head + short(n.dest, room) + tail


def estimate_lines(preview: PullPreview, *, width: int, node_lines: int) -> list[str]:
    """The estimate for a form ``width`` cells wide with room for ``node_lines`` node lines.

    First the decision, then the pull (source, size, store), the nodes (a line each while they
    fit, else a summary), the quote, the fan-out and the s5cmd flags, then every blocker.
    """
    from backend.ops.pull import fanout_lines

    plan = preview.plan
    lines = [decision_line(preview)]
    other = [b for b in preview.blockers if not b.startswith("the egress guard")]
    lines += [_cut(f"  ! {b}", width) for b in other[:BLOCKERS_FIRST]]
    if len(other) > BLOCKERS_FIRST:
        lines.append(f"  ! +{len(other) - BLOCKERS_FIRST} more, listed at the end")
    size = f"{len(plan.objects)} object(s), {bytes_text(plan.total_bytes)}" + (
        f", store {plan.store}" if plan.store else ""
    )
    lines.append(short(f"pull {plan.src} -> {plan.dest}", width - len(size) - 3) + f" · {size}")
    if len(plan.nodes) <= node_lines:
        lines += [node_line(plan, n, width) for n in plan.nodes]
    else:
        lines += node_summary(plan, width)
    if plan.egress is not None:
        from backend.ops.egress import quote_lines

        lines += [
            f"  egress: {line}" if i == 0 else f"    {line}" for i, line in enumerate(quote_lines(plan.egress.quote))
        ]
    lines += fanout_lines(plan)
    lines.append(
        f"  s5cmd --numworkers {plan.numworkers} cp --concurrency {plan.concurrency} --part-size {plan.part_size_mib}"
    )
    lines += [f"not startable: {b}" for b in preview.blockers]
    lines += [f"warning: {w}" for w in preview.warnings]
    return lines
