"""Who feeds whom in a relay pull: seeds per site, then a chain or a tree of a given degree.

Pure: nodes in, a :class:`RelayTopology` out. Only nodes at the same site relay to each other
(the cluster network is free inside a site; between sites it is not), so each site gets its own
seeds. A seed must have s5cmd; a receiver needs none. Seeds are spread over the site's nodes in
order; each further node hangs under the shallowest node with room (``degree`` children), so
``degree = 1`` is one chain per seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.errors import ConfigError


@dataclass(frozen=True)
class PeerNode:
    """A destination node as the planner sees it."""

    name: str
    site: str | None
    s5cmd: bool = True


@dataclass(frozen=True)
class RelayTopology:
    """``parent[node]`` is its upstream (None for a seed); ``children`` the reverse."""

    parent: dict[str, str | None]
    seeds: tuple[str, ...]
    children: dict[str, tuple[str, ...]] = field(default_factory=dict)
    site: dict[str, str | None] = field(default_factory=dict)

    def ancestors(self, node: str) -> list[str]:
        """Upstream first, up to its seed, then the other seeds of its site (fallbacks)."""
        out = self.chain(node)
        root = out[-1] if out else node
        site_of = self.site.get(root)
        out += [s for s in self.seeds if s != root and s not in out and self.site.get(s) == site_of]
        return out

    def chain(self, node: str) -> list[str]:
        """Its upstream, that node's upstream, ... up to the seed."""
        out: list[str] = []
        up = self.parent.get(node)
        while up is not None:
            out.append(up)
            up = self.parent.get(up)
        return out

    def hops(self) -> list[tuple[str, str]]:
        """(upstream, node) for every receiver, in plan order."""
        return [(p, n) for n, p in self.parent.items() if p is not None]

    def lines(self) -> list[str]:
        """``node-01 (seed) -> node-02 -> node-03`` per seed (a tree shows each branch)."""
        out = []

        def walk(n: str, prefix: str) -> None:
            kids = self.children.get(n, ())
            if not kids:
                out.append(prefix)
                return
            for k in kids:
                walk(k, f"{prefix} -> {k}")

        for s in self.seeds:
            walk(s, f"{s} (seed)")
        return out


def plan_topology(nodes: list[PeerNode], *, seeds: int = 1, degree: int = 1) -> RelayTopology:
    """The relay tree: ``seeds`` seeds per site (fewer where a site has fewer nodes)."""
    if seeds < 1:
        raise ConfigError(f"relay seeds must be at least 1, got {seeds}")
    if degree < 1:
        raise ConfigError(f"relay degree must be at least 1, got {degree}")
    by_site: dict[str | None, list[PeerNode]] = {}
    for n in nodes:
        by_site.setdefault(n.site, []).append(n)
    parent: dict[str, str | None] = {}
    children: dict[str, list[str]] = {}
    all_seeds: list[str] = []
    site: dict[str, str | None] = {n.name: n.site for n in nodes}
    for site_name, members in by_site.items():
        capable = [n for n in members if n.s5cmd]
        if not capable:
            names = ", ".join(n.name for n in members)
            raise ConfigError(
                f"no node at site {site_name or '(none)'} has s5cmd to seed the relay ({names}): "
                "install s5cmd on one of them or pull with --fanout direct"
            )
        chosen = capable[: min(seeds, len(members))]
        all_seeds += [n.name for n in chosen]
        for n in chosen:
            parent[n.name] = None
            children[n.name] = []
        # Breadth first: each seed's tree grows level by level, trees take nodes in turn.
        frontier = [[n.name] for n in chosen]
        rest = [n for n in members if n.name not in parent]
        turn = 0
        for n in rest:
            level = frontier[turn % len(frontier)]
            host = next((h for h in level if len(children[h]) < degree), None)
            if host is None:  # the level is full: the next one is made of its children
                nxt = [c for h in level for c in children[h]]
                frontier[turn % len(frontier)] = nxt
                host = nxt[0]
            parent[n.name] = host
            children[host].append(n.name)
            children[n.name] = []
            turn += 1
    return RelayTopology(
        parent=parent, seeds=tuple(all_seeds), children={k: tuple(v) for k, v in children.items()}, site=site
    )


MiB = 1 << 20


def seed_flags(total: int, objects: int, numworkers: int, concurrency: int, part_mib: int) -> tuple[int, int, int]:
    """The s5cmd flags a seed copies with, so its objects land one after another.

    A peer can start on an object only once s5cmd has it in place. With the tuned flags (256
    objects at once) every object of a large pull lands at about the same moment, at the end, and
    the chain would wait for the whole download. So a seed takes few objects at a time and more
    parts in each (about 16 streams in all, parts of at most ``part_mib`` and at least s5cmd's 5
    MiB): the first object lands early and the peers work while the rest downloads. Small objects
    (under 16 MiB on average) land in order anyway, and a pull of a few objects cannot be
    pipelined by object: their flags stay as given.
    """
    if objects < 4 or total // max(objects, 1) < 16 * MiB:
        return numworkers, concurrency, part_mib
    avg_mib = total / objects / MiB
    part = max(5, min(part_mib, int(avg_mib // 8)))
    streams = max(1, min(concurrency, -(-int(avg_mib) // part)))
    return max(1, min(numworkers, -(-16 // streams))), concurrency, part
