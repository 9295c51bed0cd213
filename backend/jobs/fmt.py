"""Plain-text formatting of job quantities, shared by the CLI and the console."""

from __future__ import annotations

from typing import Any


def fmt_bytes(n: float | None) -> str:
    """``12.6 GB`` in decimal units (as NICs and clouds count); ``?`` when unknown."""
    if n is None:
        return "?"
    # Imported here: the pull's start-up does not wait for the egress policy module.
    from backend.policy.egress import fmt_bytes as egress_fmt_bytes

    return egress_fmt_bytes(n)


def fmt_eta(s: float | None) -> str:
    """``1h02m`` / ``3m05s`` / ``12s`` / ``<1s``; ``-`` when unknown."""
    if s is None:
        return "-"
    if 0 < s < 0.5:
        return "<1s"  # a fast pull's estimate is not "0s"
    s = int(round(s))
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def describe_plan(plan: Any) -> list[str]:
    """The pre-launch estimate of a pull as lines: objects, bytes, per-node fit and ETA, egress."""
    lines = [
        f"pull {plan.src} -> {plan.dest}",
        f"  {len(plan.objects)} object(s), {fmt_bytes(plan.total_bytes)}"
        + (f", store {plan.store}" if plan.store else ""),
        f"  s5cmd --numworkers {plan.numworkers} cp --concurrency {plan.concurrency} "
        f"--part-size {plan.part_size_mib}",
    ]
    for n in plan.nodes:
        if n.error:
            lines.append(f"  {n.node}: {n.error.removeprefix(f'{n.node}: ')}")  # the name once
            continue
        rate = f"{n.line_rate_gbps:g} Gbps" + ("" if n.line_rate_known else " assumed")
        fits = n.fits(plan.total_bytes)
        line = (f"  {n.node}: {n.dest}  free {fmt_bytes(n.free_bytes)} ({'fits' if fits else 'DOES NOT FIT'}); "
                f"ETA {fmt_eta(n.eta_s(plan.total_bytes))} at line rate {rate}")
        prob = n.problem(plan.total_bytes)
        if prob and fits:
            line += f"  -- {prob}"
        lines.append(line)
    if plan.egress is not None:
        from backend.policy.egress import decision_lines

        lines.append("  egress:")
        lines.extend(f"    {line}" for line in decision_lines(plan.egress))
    elif plan.egress_note:
        lines.append(f"  egress: {plan.egress_note}")
    return lines
