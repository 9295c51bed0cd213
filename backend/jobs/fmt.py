"""Plain-text formatting of job quantities, shared by the CLI and the console."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from backend.units import bytes_text, duration_text


def middle(text: str, width: int) -> str:
    """``text`` cut in the middle to ``width`` characters (both ends of a path carry meaning)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


def nodes_text(nodes: Iterable[str], most: int = 6) -> str:
    """``gpu-01, gpu-02`` while few; ``16 nodes: gpu-01, gpu-02, gpu-03 ... gpu-16`` beyond ``most``."""
    names = sorted(set(nodes))
    if len(names) <= most:
        return ", ".join(names)
    return f"{len(names)} nodes: {', '.join(names[:3])} ... {names[-1]}"


def proof_text(result: Mapping[str, Any]) -> str:
    """How a pull's bytes were proven, said plainly for a detail view: ``verified: bytes proven
    by crc64nvme``, else the runner's own line (``verified: size-only for 4 of 4 objects (...)``)."""
    short = verified_short(result)
    if result.get("verified") == "bytes":
        return f"verified: bytes proven by {short}"
    if short == "-":
        return "verification not reported"
    from backend.textfmt import safe_text

    return safe_text(result.get("verified_text") or f"verified: {short}", 300)


def verified_short(result: Mapping[str, Any] | None) -> str:
    """How a pull's bytes were proven, in a word for a table: the method(s) (``crc64nvme``,
    ``md5``, ``md5+crc32c``), ``size-only`` when nothing proved the bytes, ``partly size-only
    2/4`` when some objects were only sized; ``-`` when the job says nothing of it."""
    if not result or not isinstance(result.get("verified"), str):
        return "-"
    counts = result.get("verification")
    counts = {str(k): v for k, v in counts.items() if isinstance(v, int)} if isinstance(counts, dict) else {}
    if result["verified"] == "size-only":
        return "size-only"
    strong = [m for m, _n in sorted(counts.items(), key=lambda kv: -kv[1]) if m != "size-only"]
    if result["verified"] == "partly":
        weak = counts.get("size-only", 0)
        return f"partly size-only {weak}/{sum(counts.values())}" if weak else "partly size-only"
    return "+".join(strong) or str(result["verified"])


def describe_plan(plan: Any) -> list[str]:
    """The pre-launch estimate of a pull as lines: objects, bytes, per-node fit and ETA, egress."""
    lines = [
        f"pull {plan.src} -> {plan.dest}",
        f"  {len(plan.objects)} object(s), {bytes_text(plan.total_bytes)}"
        + (f", store {plan.store}" if plan.store else ""),
        f"  s5cmd --numworkers {plan.numworkers} cp --concurrency {plan.concurrency} --part-size {plan.part_size_mib}",
    ]
    for n in plan.nodes:
        if n.error:
            lines.append(f"  {n.node}: {n.error.removeprefix(f'{n.node}: ')}")  # the name once
            continue
        rate = f"{n.line_rate_gbps:g} Gbps" + ("" if n.line_rate_known else " assumed")
        fits = n.fits(plan.total_bytes)
        line = (
            f"  {n.node}: {n.dest}  free {bytes_text(n.free_bytes)} ({'fits' if fits else 'DOES NOT FIT'}); "
            f"ETA {duration_text(n.eta_s(plan.total_bytes))} at line rate {rate}"
        )
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
