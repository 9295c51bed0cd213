"""The fleet's data: a ``[[nodes]]`` table as written, the ``[defaults]`` every node inherits, and
the resolved :class:`Node` the transports and the console work with.

They live here, below ``backend.config`` (which re-exports them), so that every inventory source
can build nodes without importing the config loader that asks it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

DEFAULT_SCRATCH = "/mnt/local-nvme"


@dataclass(frozen=True)
class Defaults:
    """Values every node inherits unless it sets its own."""

    user: str | None = None
    port: int | None = None
    identity: list[str] = field(default_factory=list)
    jump: str | None = None
    scratch: str = DEFAULT_SCRATCH
    site: str | None = None
    known_hosts: str | None = None
    trust_on_first_use: bool = False
    connect_timeout: float = 10.0
    #: What runs loadmaster's agent on a node (a python, run -I, or a loadmaster executable);
    #: unset: the node's own agent venv, see backend.nodes.agent.
    agent: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class NodeEntry:
    """One ``[[nodes]]`` table as written (before expansion). ``name``, ``hostfile`` and
    ``ssh_config`` are the keys of the table sources (:data:`backend.inventory.tables.TABLE_SOURCES`):
    a table sets exactly one."""

    name: str | None = None
    hostfile: str | None = None
    ssh_config: str | None = None
    host: str | None = None
    port: int | None = None
    user: str | None = None
    identity: list[str] | None = None
    jump: str | None = None
    scratch: str | None = None
    site: str | None = None
    tags: list[str] = field(default_factory=list)
    transport: Literal["ssh", "local"] = "ssh"
    known_hosts: str | None = None
    trust_on_first_use: bool | None = None
    agent: str | None = None


@dataclass(frozen=True)
class Node:
    """A resolved node: what the transports and the console work with."""

    name: str
    host: str
    transport: Literal["ssh", "local"] = "ssh"
    port: int | None = None
    user: str | None = None
    identity: tuple[str, ...] = ()
    jump: str | None = None
    scratch: str = DEFAULT_SCRATCH
    site: str | None = None
    tags: tuple[str, ...] = ()
    slots: int | None = None
    known_hosts: str | None = None
    trust_on_first_use: bool = False
    connect_timeout: float = 10.0
    #: The ``agent`` setting: None for the default (the node's agent venv, see backend.nodes.agent).
    agent: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view (used by ``loadmaster nodes --json``)."""
        d = dataclasses.asdict(self)
        d["identity"] = list(self.identity)
        d["tags"] = list(self.tags)
        return d
