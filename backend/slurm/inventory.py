"""Slurm's nodes as loadmaster's inventory: the names and addresses come from Slurm, the connection
details (user, port, key, jump host, scratch) from the config's ``[defaults]``, and a ``[[nodes]]``
entry of the same name overrides them for that node.

A node's address is Slurm's ``NodeAddr`` (``address``), else its ``NodeHostname``, else its name,
as slurmctld itself reaches the node. Partitions become tags (``partition:train``), so the console
can group and filter by them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from backend.config import Config, Node
from backend.slurm.model import SlurmNode

_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-:]{0,252}$")


def node_address(node: SlurmNode) -> str:
    """Where loadmaster connects to a Slurm node (Slurm's NodeAddr, hostname, or its name)."""
    for candidate in (node.address, node.hostname):
        if candidate and _HOST.match(candidate):
            return candidate
    return node.name


def nodes_from_slurm(slurm_nodes: Iterable[SlurmNode], config: Config) -> list[Node]:
    """One loadmaster node per Slurm node, in Slurm's order: a configured node of the same name as
    written (the override), else Slurm's address with the config's defaults."""
    configured = {n.name: n for n in config.nodes}
    d = config.defaults
    out = []
    for s in slurm_nodes:
        tags = tuple(dict.fromkeys([*d.tags, "slurm", *(f"partition:{p}" for p in s.partitions)]))
        own = configured.get(s.name)
        if own is not None:
            out.append(own if "slurm" in own.tags else _with_tags(own, tuple(dict.fromkeys([*own.tags, *tags]))))
            continue
        out.append(
            Node(
                name=s.name,
                host=node_address(s),
                port=d.port,
                user=d.user,
                identity=tuple(d.identity),
                jump=d.jump,
                scratch=d.scratch,
                site=d.site,
                tags=tags,
                known_hosts=d.known_hosts,
                trust_on_first_use=d.trust_on_first_use,
                connect_timeout=d.connect_timeout,
                agent=d.agent,
            )
        )
    return out


def _with_tags(node: Node, tags: tuple[str, ...]) -> Node:
    import dataclasses

    return dataclasses.replace(node, tags=tags)
