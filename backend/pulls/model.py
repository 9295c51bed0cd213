"""A pull's plan as shown before it starts: the presets, each node's pre-launch facts
(:class:`NodeEstimate`) and the plan as a whole (:class:`PullPlan`), with where DEST lands on a
node and which s5cmd a node runs.

Plain data: :mod:`backend.pulls.plan` builds a plan, :mod:`backend.pulls.fanout` chooses its
fan-out, :mod:`backend.pulls.launch` starts its jobs, and the front ends show it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backend.pulls.objects import PulledObject
from backend.units import bytes_text

if TYPE_CHECKING:
    from backend.config import Node
    from backend.credentials import Credentials
    from backend.policy.egress import GuardDecision
    from backend.pulls.relay.planner import RelayTopology

#: node -> ``[[upstream node, address, port], ...]``, nearest first: where a relay node finds the
#: nodes above it (relay-ssh: the console's forwarded loopback ports instead of the peers' own).
Upstreams = dict[str, list[list[str | int]]]

#: Presets offered by the console and ``--preset``: (numworkers, concurrency, part size MiB).
PRESETS: dict[str, tuple[int, int, int]] = {
    "tuned": (256, 32, 64),  # the brief's tuned command: many objects, big parts
    "large-objects": (64, 64, 128),  # few multi-GB objects: parallelism inside each object
    "small-objects": (512, 4, 8),  # millions of small shards: parallelism across objects
    "gentle": (32, 8, 64),  # share the NIC with a running training job
}


@dataclass(frozen=True)
class NodeEstimate:
    """One destination node's pre-launch facts."""

    node: str
    dest: str
    free_bytes: int | None = None
    present_bytes: int = 0
    line_rate_gbps: float | None = None
    line_rate_known: bool = False
    s5cmd: bool = False
    error: str | None = None
    #: The destination directory already exists (files in it may count as present).
    dest_exists: bool = False
    #: The node's own addresses (for a relay's peers).
    addresses: tuple[str, ...] = ()
    #: The local port of every TCP socket on the node, in any state: a relay may not listen there.
    #: Listeners, and also outgoing connections and their TIME_WAIT (60 s after they close): bind()
    #: refuses a port one of them holds, SO_REUSEADDR or not, and the default relay_ports lie inside
    #: Linux's ephemeral range (32768-60999), where outgoing connections take their ports.
    ports_taken: frozenset[int] = frozenset()
    #: False for a relay receiver: its data comes from a peer, not from s5cmd.
    needs_s5cmd: bool = True

    def needed(self, total: int) -> int:
        return max(0, total - self.present_bytes)

    def fits(self, total: int) -> bool:
        return self.error is None and self.free_bytes is not None and self.needed(total) <= self.free_bytes

    def eta_s(self, total: int) -> float | None:
        if not self.line_rate_gbps:
            return None
        return self.needed(total) * 8 / (self.line_rate_gbps * 1e9)

    def problem(self, total: int) -> str | None:
        """Why this node cannot take the pull, or None."""
        if self.error:
            return self.error
        if not self.s5cmd and self.needs_s5cmd:
            return f"{self.node}: s5cmd is not installed on the node (install it or set [pull] s5cmd)"
        if not self.fits(total):
            return (
                f"{self.node}: {self.dest} has {bytes_text(self.free_bytes or 0)} free but the pull needs "
                f"{bytes_text(self.needed(total))}"
            )
        return None


@dataclass(frozen=True)
class PullPlan:
    """Everything shown before a pull starts: what, where, how big, whether it fits, what it costs."""

    src: str
    dest: str
    store: str | None
    objects: tuple[PulledObject, ...]
    total_bytes: int
    nodes: tuple[NodeEstimate, ...]
    numworkers: int
    concurrency: int
    part_size_mib: int
    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    egress: GuardDecision | None = None
    egress_note: str | None = None
    #: The store's resolved credentials for the jobs' secrets files (never shown or serialised).
    credentials: Credentials | None = field(default=None, repr=False, compare=False)
    #: ``direct`` (every node from the store), ``relay`` or ``relay-ssh`` (seeds from the store).
    fanout: str = "direct"
    #: Who feeds whom (backend.pulls.relay.planner.RelayTopology) for a relay, else None.
    topology: RelayTopology | None = None
    #: node -> (address, port) its relay listens on.
    relay_listen: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: What the store would send (bytes, $) to every node directly, and what it sends in this plan.
    direct_cost: tuple[int, float | None] | None = None
    store_cost: tuple[int, float | None] | None = None
    #: Why the fan-out is what it is (auto's choice), one line.
    fanout_note: str = ""
    #: Problems of the plan as a whole (no seed at a site, no relay address), one line each.
    plan_problems: tuple[str, ...] = ()

    @property
    def problems(self) -> list[str]:
        return [*self.plan_problems, *(p for n in self.nodes if (p := n.problem(self.total_bytes)))]

    @property
    def store_nodes(self) -> list[str]:
        """The nodes the store sends the data to: every node, or a relay's seeds."""
        if self.topology is None:
            return [n.node for n in self.nodes]
        return list(self.topology.seeds)

    @property
    def saved_usd(self) -> float | None:
        if self.direct_cost is None or self.store_cost is None:
            return None
        if self.direct_cost[1] is None or self.store_cost[1] is None:
            return None
        return max(0.0, self.direct_cost[1] - self.store_cost[1])

    @property
    def eta_s(self) -> float | None:
        etas = [e for n in self.nodes if (e := n.eta_s(self.total_bytes)) is not None]
        return max(etas) if etas else None

    def as_dict(self) -> dict[str, object]:
        return {
            "src": self.src,
            "dest": self.dest,
            "store": self.store,
            "objects": len(self.objects),
            "bytes": self.total_bytes,
            "numworkers": self.numworkers,
            "concurrency": self.concurrency,
            "part_size_mib": self.part_size_mib,
            "eta_s": self.eta_s,
            "problems": self.problems,
            "nodes": [
                {
                    "node": n.node,
                    "dest": n.dest,
                    "free_bytes": n.free_bytes,
                    "fits": n.fits(self.total_bytes),
                    "line_rate_gbps": n.line_rate_gbps,
                    "line_rate_known": n.line_rate_known,
                    "eta_s": n.eta_s(self.total_bytes),
                    "error": n.error,
                }
                for n in self.nodes
            ],
            "egress": self.egress.as_dict() if self.egress is not None else None,
            "egress_note": self.egress_note,
            "fanout": self.fanout,
            "fanout_note": self.fanout_note,
            "relay": None
            if self.topology is None
            else {
                "seeds": list(self.topology.seeds),
                "parent": dict(self.topology.parent),
                "listen": {k: list(v) for k, v in self.relay_listen.items()},
            },
            "store_bytes": self.store_cost[0] if self.store_cost else None,
            "store_usd": self.store_cost[1] if self.store_cost else None,
            "direct_bytes": self.direct_cost[0] if self.direct_cost else None,
            "direct_usd": self.direct_cost[1] if self.direct_cost else None,
            "saved_usd": self.saved_usd,
        }


def node_dest(dest: str, scratch: str) -> str:
    """DEST as the node sees it: absolute, ``~/...``, or relative to the node's scratch dir."""
    if dest.startswith("/") or dest.startswith("~"):
        return dest.rstrip("/") or "/"
    return f"{scratch.rstrip('/')}/{dest.strip('/')}"


def node_s5cmd(node: Node, configured: str) -> str:
    """The s5cmd a node's job runs: as configured, except that this machine (a local node) with
    the default ``s5cmd`` not on PATH runs the one installed beside loadmaster."""
    if node.transport == "local" and configured == "s5cmd":
        from backend.config import installed_s5cmd

        return installed_s5cmd()
    return configured
