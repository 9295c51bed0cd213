"""A pull's fan-out: direct (every node from the store) or a relay (seeds from the store, the
rest from peers), and the egress the store sends either way.

The egress guard (:class:`backend.ledger.EgressGuard`) prices and decides. A plan carries the
guard's decision (:func:`egress_check`); the reservation (budget check and hold in one transaction),
the gate and the override audit are :mod:`backend.ops.pull`'s; the settle of an ended pull is the
pull kind's ``on_ended`` (:class:`backend.pulls.job.PullKind`).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from backend.errors import ConfigError
from backend.pulls.model import NodeEstimate, PullPlan
from backend.pulls.settings import PullSettings
from backend.storage import bucket_profile

if TYPE_CHECKING:
    import random

    from backend.config import Config, Node, StoreProfile
    from backend.ledger import EgressGuard
    from backend.policy.egress import GuardDecision


def _by_site(nodes: Sequence[Node]) -> Counter[str | None]:
    """How many of ``nodes`` are at each site (nodes at one site are priced together)."""
    return Counter(n.site for n in nodes)


def _share_a_site(nodes: Sequence[Node]) -> bool:
    """Two or more of ``nodes`` are at one site: what ``auto`` needs before it weighs a relay."""
    return max(_by_site(nodes).values(), default=0) > 1


def egress_costs(
    guard: EgressGuard, profile: StoreProfile | None, nodes: Sequence[Node], total: int, objects: int, src: str = ""
) -> tuple[int, float | None]:
    """(bytes, $) the store sends when each of ``nodes`` takes ``total`` bytes from it ($ None
    when any route is unpriced)."""
    prof = profile or bucket_profile(src)
    usd: float | None = 0.0
    for site, count in _by_site(nodes).items():
        q = guard.quote_transfer(prof, site, total * count, objects=objects * count)
        usd = None if usd is None or q.total_usd is None or not q.priced else usd + q.total_usd
    return total * len(nodes), usd


def _relay_address(node: Node, est: NodeEstimate, network: str) -> str:
    """Where a node's relay listens: its configured host's address, or its own address in ``network``."""
    import ipaddress
    import socket

    if network == "host":
        if node.transport == "local":
            raise ConfigError(f"{node.name}: a local node has no cluster address; relay needs SSH nodes")
        try:
            infos = socket.getaddrinfo(node.host, None, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ConfigError(
                f"{node.name}: cannot resolve {node.host} for the relay ({exc}); set [pull] relay_network"
            ) from None
        return str(infos[0][4][0])
    net = ipaddress.ip_network(network, strict=False)
    for a in est.addresses:
        with contextlib.suppress(ValueError):
            if ipaddress.ip_address(a) in net:
                return a
    raise ConfigError(
        f"{node.name}: no address in {network} (it has {', '.join(est.addresses) or 'none'}); "
        "fix [pull] relay_network or pull with --fanout direct"
    )


def _relay_port(est: NodeEstimate, ports: str, rng: random.Random) -> int:
    from backend.pulls.settings import port_range

    lo, hi = port_range(ports)
    free = [p for p in range(lo, hi + 1) if p not in est.ports_taken]
    if not free:
        raise ConfigError(f"{est.node}: every port of [pull] relay_ports ({ports}) is in use; widen the range")
    return rng.choice(free)


def may_relay(config: Config, fanout: str | None, nodes: Sequence[str]) -> bool:
    """Whether a plan for ``nodes`` may end as a relay (so its probes must read each node's
    addresses and ports in use): asked for, or ``auto`` with two nodes at one site (what
    :func:`with_fanout` requires before it weighs the price). An unknown mode says yes; the plan
    refuses it later."""
    mode = fanout or config.section(PullSettings).fanout
    if mode == "direct":
        return False
    if mode == "auto":
        return _share_a_site([config.node(n) for n in nodes])
    return True


def with_fanout(
    config: Config,
    guard: EgressGuard,
    plan: PullPlan,
    profile: StoreProfile | None,
    *,
    fanout: str | None,
    seeds: int | None,
    degree: int | None,
    allow_over_budget: str | None,
) -> PullPlan:
    """The plan with its fan-out chosen: direct, or a relay (topology, addresses, seeds' egress)."""
    import dataclasses
    import random

    from backend.pulls.settings import FANOUTS

    settings = config.section(PullSettings)
    mode = fanout or settings.fanout
    if mode not in FANOUTS:
        raise ConfigError(f"--fanout must be one of {', '.join(FANOUTS)}, got {mode!r}")
    cfg_nodes = [config.node(n.node) for n in plan.nodes]
    nobj = len(plan.objects)
    direct = egress_costs(guard, profile, cfg_nodes, plan.total_bytes, nobj, plan.src)
    note = ""
    if mode == "auto":
        shared = _share_a_site(cfg_nodes)
        priced = direct[1] is not None and direct[1] > 0
        mode = "relay" if shared and priced else "direct"
        note = (
            f"auto: relay ({len(cfg_nodes)} nodes take the same data over a priced route)"
            if mode == "relay"
            else "auto: direct ("
            + ("no two nodes share a site" if not shared else "the route has no egress price")
            + ")"
        )
    if mode == "direct":
        return dataclasses.replace(plan, fanout="direct", direct_cost=direct, store_cost=direct, fanout_note=note)
    from backend.pulls.relay.planner import PeerNode, plan_topology

    problems: list[str] = []
    usable = [n for n in plan.nodes if n.error is None]
    try:
        topo = plan_topology(
            [PeerNode(n.node, config.node(n.node).site, n.s5cmd) for n in usable],
            seeds=seeds or settings.relay_seeds,
            degree=degree or settings.relay_degree,
        )
    except ConfigError as exc:
        return dataclasses.replace(plan, fanout=mode, plan_problems=(str(exc),), direct_cost=direct, fanout_note=note)
    rng = random.Random()
    listen: dict[str, tuple[str, int]] = {}
    taken: set[int] = set()
    for est in usable:
        try:
            # relay-ssh: nothing listens on the network, only on each node's loopback (the hops
            # come through SSH); the ports differ from node to node (nodes that share a kernel).
            addr = (
                "127.0.0.1"
                if mode == "relay-ssh"
                else _relay_address(config.node(est.node), est, settings.relay_network)
            )
            port = _relay_port(dataclasses.replace(est, ports_taken=est.ports_taken | taken), settings.relay_ports, rng)
            taken.add(port)
            listen[est.node] = (addr, port)
        except ConfigError as exc:
            problems.append(str(exc))
    ests = tuple(dataclasses.replace(n, needs_s5cmd=n.node in topo.seeds) for n in plan.nodes)
    seed_nodes = [config.node(n) for n in topo.seeds]
    decision, enote = egress_check(guard, profile, seed_nodes, plan.total_bytes, nobj, allow_over_budget, src=plan.src)
    return dataclasses.replace(
        plan,
        nodes=ests,
        fanout=mode,
        topology=topo,
        relay_listen=listen,
        egress=decision,
        egress_note=enote or plan.egress_note,
        direct_cost=direct,
        store_cost=egress_costs(guard, profile, seed_nodes, plan.total_bytes, nobj, plan.src),
        fanout_note=note,
        plan_problems=tuple(problems),
    )


def egress_check(
    guard: EgressGuard,
    profile: StoreProfile | None,
    nodes: Sequence[Node],
    total: int,
    objects: int,
    allow_over_budget: str | None,
    src: str = "",
) -> tuple[GuardDecision | None, str | None]:
    """The guard's decision for pulling ``total`` bytes to each node (the strictest node decides)."""
    prof = profile or bucket_profile(src)
    order = {"allow": 0, "warn": 1, "confirm": 2, "block": 3}
    worst: GuardDecision | None = None
    # Every node receives the whole pull; nodes at the same site are priced together, in sequence.
    for site, count in _by_site(nodes).items():
        quote = guard.quote_transfer(prof, site, total * count, objects=objects * count)
        dec = guard.check(quote, allow_over_budget_reason=allow_over_budget)
        if worst is None or order.get(dec.action, 0) > order.get(worst.action, 0):
            worst = dec
    return worst, None
