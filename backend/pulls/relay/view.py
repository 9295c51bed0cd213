"""A relay pull as the operator reads it: who feeds whom, Gbps per hop, progress per node.

Pure: job records in (the "relay" jobs of one or more pulls, as the nodes report them), lines out,
for the Transfers screen and the CLI. A node's upstream is the one it reports now (after a
re-attach it is no longer the planned one); its Gbps is the rate it receives at (a seed's: what
s5cmd gets from the store).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from backend.units import gbps_text

if TYPE_CHECKING:
    from backend.jobs.records import JobRecord


def _group(rec: JobRecord) -> str:
    return str((rec.params.get("relay") or {}).get("group") or "")


def relay_groups(records: Iterable[JobRecord], *, keep_ended: int = 1) -> list[list[JobRecord]]:
    """The relay pulls among ``records``: every one with a job still running, else the latest
    ``keep_ended`` (newest first)."""
    groups: dict[str, list[JobRecord]] = {}
    for r in records:
        if r.kind == "relay" and _group(r):
            groups.setdefault(_group(r), []).append(r)
    ordered = sorted(groups.values(), key=lambda g: -max(r.created for r in g))
    active = [g for g in ordered if any(not r.terminal for r in g)]
    return active or ordered[:keep_ended]


def _upstream(rec: JobRecord) -> str | None:
    relay = rec.params.get("relay") or {}
    if rec.result and (rec.result.get("relay") or {}).get("upstream"):
        return str(rec.result["relay"]["upstream"])
    if rec.progress is not None and rec.progress.extra.get("upstream"):
        return str(rec.progress.extra["upstream"])
    parent = (relay.get("topology") or {}).get(rec.node)
    return None if parent is None else str(parent)


def chain_lines(group: list[JobRecord]) -> list[str]:
    """One relay pull: a title line, then each node under the node that feeds it."""
    by_node = {r.node: r for r in group}
    relay = group[0].params.get("relay") or {}
    seeds = [n for n, r in by_node.items() if (r.params.get("relay") or {}).get("role") == "seed"]
    feeds: dict[str, list[str]] = {}
    for n, r in by_node.items():
        up = _upstream(r)
        if n not in seeds and up is not None:
            feeds.setdefault(up, []).append(n)
    done = sum(1 for r in group if r.state == "succeeded")
    lines = [
        f"relay {relay.get('group', '')}: {group[0].source} -> {group[0].destination}  "
        f"({len(seeds)} from the store, {len(group) - len(seeds)} from peers; {done}/{len(group)} done)"
    ]
    seen: set[str] = set()

    def node_line(n: str, depth: int) -> None:
        if n in seen:
            return
        seen.add(n)
        r = by_node[n]
        p = r.progress
        pct = f"{p.fraction * 100:3.0f}%" if p is not None and p.fraction is not None else "  ?%"
        g = gbps_text(p.gbps) if p is not None and p.gbps is not None and not r.terminal else ""
        up = _upstream(r)
        source = "the store" if n in seeds else (up or "?")
        lines.append(f"{'  ' * (depth + 1)}{n} <- {source}  {pct}  {g}  {r.state}".rstrip())
        for child in sorted(feeds.get(n, [])):
            node_line(child, depth + 1)

    for s in sorted(seeds):
        node_line(s, 0)
    for n in sorted(by_node):  # a node whose upstream is not in the view (or not known yet)
        node_line(n, 0)
    return lines
