"""The config's own fleet: its ``[[nodes]]`` tables, each naming its hosts through one
:class:`TableSource` (a hostlist, a hostfile or ``~/.ssh/config`` Host patterns).

:class:`ConfigNodes` is asked while the file is parsed (``backend.config.parse_config``), so a bad
table is reported with every other problem in the file; an outside source
(:data:`backend.inventory.SOURCES`, Slurm) may then replace the fleet, these nodes serving as its
per-node overrides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from backend.errors import ConfigError
from backend.inventory.hostfile import HostfileInventory
from backend.inventory.model import Defaults, Node, NodeEntry
from backend.inventory.names import HostlistNames
from backend.inventory.ssh_config import SshConfigInventory


@runtime_checkable
class TableSource(Protocol):
    """One way a ``[[nodes]]`` table names its hosts, picked by the key the table sets."""

    #: The ``[[nodes]]`` key that picks this source (``hostfile``); a field of ``NodeEntry``.
    key: str
    #: What that key holds, for the "needs exactly one of" message (``a DeepSpeed/MPI hostfile``).
    what: str

    def hosts(self, value: str, *, base: Path, file: str | None, key: str) -> list[tuple[str, int | None]]:
        """The hosts in order, each with its slots (None: not said); a ConfigError naming ``file``
        and ``key`` when ``value`` cannot be read. ``base``: the config file's folder."""
        ...


#: Every table source, in the order the "needs exactly one of" message names them.
TABLE_SOURCES: tuple[TableSource, ...] = (HostlistNames(), HostfileInventory(), SshConfigInventory())


@dataclass(frozen=True)
class ConfigNodes:
    """The nodes of the config's ``[[nodes]]`` tables, in file order: each table's hosts from its
    source, with the table's settings over ``[defaults]``. A name given twice is refused (which
    table would the console act on?)."""

    sources: Sequence[TableSource] = TABLE_SOURCES

    def nodes(self, entries: Sequence[NodeEntry], defaults: Defaults, *, file: str | None, base: Path) -> list[Node]:
        nodes: list[Node] = []
        seen: dict[str, str] = {}
        for i, entry in enumerate(entries):
            key = f"nodes[{i}]"
            hosts = self._hosts(entry, file=file, base=base, key=key)
            if entry.transport == "local" and len(hosts) != 1:
                raise ConfigError("a local node must be a single name", file=file, key=f"{key}.name")
            for name, slots in hosts:
                if name in seen:
                    raise ConfigError(
                        f"duplicate node name {name!r} (also defined by {seen[name]})", file=file, key=key
                    )
                seen[name] = key
                nodes.append(_node(name, slots, entry, defaults))
        return nodes

    def _hosts(self, entry: NodeEntry, *, file: str | None, base: Path, key: str) -> list[tuple[str, int | None]]:
        """The table's hosts from the one source whose key it sets."""
        chosen = [s for s in self.sources if getattr(entry, s.key)]
        if len(chosen) != 1:
            named = [f"'{s.key}' ({s.what})" for s in self.sources]
            raise ConfigError(
                f"each [[nodes]] table needs exactly one of {', '.join(named[:-1])} or {named[-1]}",
                file=file,
                key=key,
            )
        (source,) = chosen
        return source.hosts(getattr(entry, source.key), base=base, file=file, key=f"{key}.{source.key}")


def _node(name: str, slots: int | None, e: NodeEntry, defaults: Defaults) -> Node:
    """One host of table ``e``: the table's settings, else ``[defaults]``; ``{name}`` in ``host``
    is the host's name."""
    host = (e.host or name).replace("{name}", name)
    return Node(
        name=name,
        host="localhost" if e.transport == "local" and not e.host else host,
        transport=e.transport,
        port=e.port if e.port is not None else defaults.port,
        user=e.user or defaults.user,
        identity=tuple(e.identity if e.identity is not None else defaults.identity),
        jump=e.jump or defaults.jump,
        scratch=e.scratch or defaults.scratch,
        site=e.site or defaults.site,
        tags=tuple(dict.fromkeys([*defaults.tags, *e.tags])),
        slots=slots,
        known_hosts=e.known_hosts or defaults.known_hosts,
        trust_on_first_use=e.trust_on_first_use if e.trust_on_first_use is not None else defaults.trust_on_first_use,
        connect_timeout=defaults.connect_timeout,
        agent=e.agent or defaults.agent,
    )
