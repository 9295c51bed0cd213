"""The fleet's connections: one transport per node, connected lazily, with per-node status.

``NodePool(config.nodes)`` hands out each node's :class:`Transport` (SSH or local), bounds
concurrent SSH handshakes across the fleet (sshd's MaxStartups), and keeps a frozen
:class:`NodeStatus` per node so a dead node is shown as unreachable instead of failing the app.
:meth:`NodePool.fanout` runs one coroutine per node concurrently and returns every node's result
or exception. With a :class:`~backend.nodes.keeper.KeeperClient` (the command line's), SSH
nodes are reached through the connection keeper, and the SSH stack is imported only where the
keeper cannot be used.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from backend.config import Node
from backend.errors import CommandTimeout, ConfigError
from backend.nodes.transport import (
    DEFAULT_BACKOFF,
    DEFAULT_CHANNELS,
    DEFAULT_KEEPALIVE,
    ExecTransport,
    LocalTransport,
    Transport,
)

if TYPE_CHECKING:
    from backend.nodes.keeper import KeeperClient

T = TypeVar("T")

#: sshd's MaxStartups 10:30:100 starts dropping unauthenticated connections beyond 10.
DEFAULT_HANDSHAKES = 10

NodeState = Literal["connecting", "up", "unreachable"]


@dataclass(frozen=True)
class NodeStatus:
    """A node's connection state: "connecting" (also: not yet used), "up" or "unreachable"."""

    name: str
    state: NodeState
    latency_ms: float | None = None
    last_error: str | None = None
    since: float = 0.0  # wall-clock time (time.time()) the node entered this state

    @property
    def up(self) -> bool:
        return self.state == "up"


class NodePool:
    """One transport per node, reused for many commands; fan-out with per-node results."""

    def __init__(
        self,
        nodes: Iterable[Node],
        *,
        max_handshakes: int = DEFAULT_HANDSHAKES,
        channels_per_connection: int = DEFAULT_CHANNELS,
        keepalive_interval: float = DEFAULT_KEEPALIVE,
        backoff: tuple[float, float] = DEFAULT_BACKOFF,
        ssh_config: str | Path | None = None,
        command_server: bool = True,
        keeper: KeeperClient | None = None,
    ) -> None:
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self._by_name = {n.name: n for n in self.nodes}
        self._max_handshakes = max_handshakes
        self._channels = channels_per_connection
        self._keepalive = keepalive_interval
        self._backoff = backoff
        self._ssh_config = ssh_config
        self._command_server = command_server
        self._keeper = keeper
        #: Called with (node, state, error) when a node's state changes (the keeper logs them).
        self.on_change: Callable[[str, str, str | None], None] | None = None
        self._handshakes: asyncio.Semaphore | None = None
        self._transports: dict[str, Transport] = {}
        now = time.time()
        self._status: dict[str, NodeStatus] = {
            n.name: NodeStatus(n.name, "up" if n.transport == "local" else "connecting", 0.0 if
                               n.transport == "local" else None, None, now)
            for n in self.nodes
        }

    @property
    def names(self) -> list[str]:
        """Node names in inventory order."""
        return [n.name for n in self.nodes]

    def node(self, name: str) -> Node:
        """The configured node called ``name``."""
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(self.names[:10])
            raise ConfigError(f"no node named {name!r} (known: {known})") from None

    def transport(self, name: str) -> Transport:
        """The node's transport (created on first use; SSH connects lazily on its first command)."""
        t = self._transports.get(name)
        if t is None:
            node = self.node(name)
            if node.transport == "local":
                t = LocalTransport(node)
            elif self._keeper is not None:
                from backend.nodes.keeper import KeptTransport

                t = KeptTransport(node, self._keeper, functools.partial(self._ssh, node), on_state=self._record)
            else:
                t = self._ssh(node)
            self._transports[name] = t
        return t

    def _ssh(self, node: Node) -> ExecTransport:
        from backend.nodes.ssh import SshTransport  # the SSH stack only where it is used

        if self._handshakes is None:
            self._handshakes = asyncio.Semaphore(self._max_handshakes)
        return SshTransport(
            node,
            channels=self._channels,
            handshakes=self._handshakes,
            keepalive_interval=self._keepalive,
            backoff=self._backoff,
            ssh_config=self._ssh_config,
            on_state=self._record,
            command_server=self._command_server,
        )

    def _record(self, name: str, state: str, latency_ms: float | None, error: str | None) -> None:
        prev = self._status.get(name)
        since = prev.since if prev is not None and prev.state == state else time.time()
        if latency_ms is None and prev is not None and state == prev.state:
            latency_ms = prev.latency_ms
        self._status[name] = NodeStatus(name, state, latency_ms, error, since)  # type: ignore[arg-type]
        if self.on_change is not None and (prev is None or prev.state != state or prev.last_error != error):
            self.on_change(name, state, error)

    def status(self, name: str) -> NodeStatus:
        """The node's current connection status (a frozen snapshot)."""
        self.node(name)
        return self._status[name]

    def statuses(self) -> dict[str, NodeStatus]:
        """Every node's status, in inventory order."""
        return {n: self._status[n] for n in self.names}

    async def connect(self, name: str) -> NodeStatus:
        """Connect ``name`` now (SSH only) and return its status; errors are kept in the status."""
        connect = getattr(self.transport(name), "connect", None)  # SSH and kept transports
        if connect is not None:
            try:
                await connect()
            except Exception:  # noqa: BLE001 - recorded in the status by the transport
                pass
        return self.status(name)

    async def fanout(
        self,
        fn: Callable[[Transport], Awaitable[T]],
        nodes: Iterable[str | Node] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - a per-node limit, not the whole call's
    ) -> dict[str, T | Exception]:
        """Run ``fn(transport)`` on every node (or ``nodes``) at once; each node's result or error."""
        names = self.names if nodes is None else [n.name if isinstance(n, Node) else n for n in nodes]
        for n in names:
            self.node(n)

        async def one(name: str) -> T | Exception:
            try:
                if timeout is None:
                    return await fn(self.transport(name))
                return await asyncio.wait_for(fn(self.transport(name)), timeout)
            except TimeoutError:
                return CommandTimeout(name, f"no result within {timeout:g}s")
            except Exception as exc:  # noqa: BLE001 - a node's failure is its result
                return exc

        results = await asyncio.gather(*(one(n) for n in names))
        return dict(zip(names, results, strict=True))

    async def close(self) -> None:
        """Close every connection."""
        transports = list(self._transports.values())
        self._transports.clear()
        await asyncio.gather(*(t.close() for t in transports), return_exceptions=True)
        if self._keeper is not None:
            await self._keeper.close()
