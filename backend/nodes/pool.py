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

from backend.config import Config, Node
from backend.errors import CommandTimeout, ConfigError, NodeError
from backend.nodes.transport import (
    DEFAULT_BACKOFF,
    DEFAULT_CHANNELS,
    DEFAULT_KEEPALIVE,
    DEFAULT_KEEPALIVE_COUNT,
    ExecTransport,
    LocalTransport,
    Transport,
)
from backend.nodes.untrusted import clean_text

if TYPE_CHECKING:
    from backend.nodes.keeper import KeeperClient

T = TypeVar("T")

#: sshd's MaxStartups 10:30:100 starts dropping unauthenticated connections beyond 10.
DEFAULT_HANDSHAKES = 10

NodeState = Literal["connecting", "up", "unreachable"]

#: Exit status of a command whose view is partial: some nodes could not be read (named on stderr).
PARTIAL_EXIT = 4
#: A node's failure as shown next to its name: one printable line of at most this many characters.
FAILURE_TEXT_LIMIT = 200


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
        keepalive_count: int = DEFAULT_KEEPALIVE_COUNT,
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
        self._keepalive_count = keepalive_count
        self._backoff = backoff
        self._ssh_config = ssh_config
        self._command_server = command_server
        self._keeper = keeper
        #: Called with (node, state, error) when a node's state changes (the keeper logs them).
        self.on_change: Callable[[str, str, str | None], None] | None = None
        self._handshakes: asyncio.Semaphore | None = None
        self._transports: dict[str, Transport] = {}
        #: node -> why its latest fan-out failed (removed when one succeeds): what a view is missing.
        self._unread: dict[str, str] = {}
        now = time.time()
        self._status: dict[str, NodeStatus] = {
            n.name: NodeStatus(
                n.name,
                "up" if n.transport == "local" else "connecting",
                0.0 if n.transport == "local" else None,
                None,
                now,
            )
            for n in self.nodes
        }

    @classmethod
    def from_config(cls, config: Config, *, keeper: KeeperClient | None = None, **options: object) -> NodePool:
        """The pool for ``config``'s nodes with its ``[ssh]`` keepalive settings."""
        from backend.nodes.settings import SshSettings

        ssh = config.section(SshSettings)
        if not isinstance(ssh, SshSettings):
            ssh = SshSettings()
        options.setdefault("keepalive_interval", ssh.keepalive_interval)
        options.setdefault("keepalive_count", ssh.keepalive_count)
        return cls(config.nodes, keeper=keeper, **options)  # type: ignore[arg-type]

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
            keepalive_count=self._keepalive_count,
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

        results = dict(zip(names, await asyncio.gather(*(one(n) for n in names)), strict=True))
        for name, res in results.items():
            if isinstance(res, Exception):
                self._unread[name] = failure_text(res)
            else:
                self._unread.pop(name, None)
        return results

    def unread(self, nodes: Iterable[str] | None = None) -> dict[str, str]:
        """Nodes (of ``nodes``, default all) whose latest fan-out failed, with why: what a view lacks."""
        names = self.names if nodes is None else list(nodes)
        return {n: self._unread[n] for n in names if n in self._unread}

    async def close(self) -> None:
        """Close every connection."""
        transports = list(self._transports.values())
        self._transports.clear()
        await asyncio.gather(*(t.close() for t in transports), return_exceptions=True)
        if self._keeper is not None:
            await self._keeper.close()


def failure_text(exc: BaseException) -> str:
    """Why a node could not be read, as one short printable line (without the node's name)."""
    text = exc.detail if isinstance(exc, NodeError) else (str(exc) or type(exc).__name__)
    return clean_text(text, FAILURE_TEXT_LIMIT)


def unread_line(unread: dict[str, str], total: int, what: str = "read") -> str:
    """``could not read 2 of 16 nodes: gpu-03 (reason), gpu-07 (reason)`` for stderr."""
    parts = ", ".join(f"{name} ({why})" for name, why in unread.items())
    return f"could not {what} {len(unread)} of {total} node(s): {parts}"
