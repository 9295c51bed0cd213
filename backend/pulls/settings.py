"""The ``[pull]`` config section: the tuned s5cmd defaults, what a plan assumes, and the fan-out
(direct or relay) with the relay's knobs.

These keys were in ``[jobs]`` before #30; a ``[jobs]`` key that is one of them is still read,
with a one-line note (see :data:`backend.config.MOVED_KEYS`), and where both sections set it,
``[pull]`` wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.schema import parse_duration

#: How a pull to several nodes gets the data (``--fanout``, ``[pull] fanout``).
FANOUTS = ("direct", "relay", "relay-ssh", "auto")


def _positive_int(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected a whole number >= 1, got {value!r}")
    return value


def _fanout(value: str) -> str:
    if value not in FANOUTS:
        raise ValueError(f"expected one of {', '.join(FANOUTS)} for fanout, got {value!r}")
    return value


def _network(value: str) -> str:
    import ipaddress

    if value == "host":
        return value
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError(f"expected 'host' or a network like 10.0.0.0/16, got {value!r}") from None
    return value


def port_range(value: str) -> tuple[int, int]:
    """``41000-41999`` (or one port) as (low, high)."""
    lo, _, hi = str(value).partition("-")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"expected a port range like 41000-41999, got {value!r}") from None
    if not 1 <= a <= b <= 65535:
        raise ValueError(f"expected a port range like 41000-41999 within 1-65535, got {value!r}")
    return a, b


def _port_range(value: str) -> str:
    port_range(value)
    return value


#: The shortest silence window a receiver may be given: an idle upstream pings every second
#: (``backend.pulls.relay.holdings.PING_S``), so a window of two pings still tells a quiet
#: upstream from a frozen one.
MIN_RELAY_SILENCE_S = 2.0


def _silence(value: str | int | float) -> float:
    seconds = parse_duration(value)
    if seconds < MIN_RELAY_SILENCE_S:
        raise ValueError(
            f"expected at least {MIN_RELAY_SILENCE_S:g}s (an idle upstream pings every second), got {value!r}"
        )
    return seconds


@dataclass(frozen=True)
class PullSettings:
    """The tuned s5cmd defaults for pulls, what a plan assumes, and how a pull fans out."""

    #: s5cmd on the nodes (a path where it is not on the login PATH).
    s5cmd: str = "s5cmd"
    #: ``s5cmd --numworkers``: parallel objects (the tuned command uses 256).
    numworkers: int = field(default=256, metadata={"parse": _positive_int})
    #: ``s5cmd cp --concurrency``: parallel parts per object.
    concurrency: int = field(default=32, metadata={"parse": _positive_int})
    #: ``s5cmd cp --part-size`` in MiB.
    part_size_mib: int = field(default=64, metadata={"parse": _positive_int})
    #: NIC line rate assumed when a node does not report one (/sys/class/net/*/speed).
    nic_gbps: float = 100.0
    #: How many objects a pull spec carries for verification (larger pulls list on the node).
    max_spec_objects: int = field(default=20000, metadata={"parse": _positive_int})
    #: How a pull to several nodes gets the data: ``direct`` (each node from the store), ``relay``
    #: (seeds from the store, the rest from peers over the cluster network), ``relay-ssh`` (the
    #: peer hops carried through the console's SSH connections), or ``auto`` (relay where the
    #: route has an egress price and more than one node at a site takes the same data).
    fanout: str = field(default="direct", metadata={"parse": _fanout})
    #: Seed nodes per site that pull from the store (the rest receive from peers).
    relay_seeds: int = field(default=1, metadata={"parse": _positive_int})
    #: Children per relay node: 1 is a chain, more a tree.
    relay_degree: int = field(default=1, metadata={"parse": _positive_int})
    #: Where peers listen: ``host`` (the address the console reaches the node at) or a network in
    #: CIDR form (``10.0.0.0/16``: each node's own address in it, its cluster interface).
    relay_network: str = field(default="host", metadata={"parse": _network})
    #: The TCP ports a relay may listen on (a free one is chosen per node and pull).
    relay_ports: str = field(default="41000-41999", metadata={"parse": _port_range})
    #: Bytes per relay chunk (each carries its SHA-256), in MiB.
    relay_chunk_mib: int = field(default=4, metadata={"parse": _positive_int})
    #: The most each relay hop may carry, in Gbps (0: no cap; leave room for a running job's traffic).
    relay_max_gbps: float = 0.0
    #: How long a relay node waits for a child that went away before leaving it to the console.
    relay_grace: float = field(default=15.0, metadata={"parse": parse_duration})
    #: How long a receiver tries to re-attach to a node above it before it fails.
    relay_reattach: float = field(default=60.0, metadata={"parse": parse_duration})
    #: How long a receiver hears nothing from its upstream (no chunk, no ping) before it takes it
    #: as frozen and re-attaches above it (at least 2s: an idle upstream pings every second).
    relay_silence: float = field(default=5.0, metadata={"parse": _silence})
