"""``--fanout relay-ssh``: a relay whose peer hops are carried through the console's SSH connections.

Where the cluster network is not trusted, no relay listens on it: every node's relay listens on
its own loopback (127.0.0.1), and for each hop the console opens, on the child's SSH connection, a
remote listener on the child's loopback (sshd's ``tcpip-forward``, loopback only) whose
connections it carries to the parent's relay over the parent's SSH connection (``direct-tcpip``).
Both legs are SSH (host keys checked as for every command); the relay protocol's handshake and
MACs run end to end inside them. The bytes pass through the console machine, so run it inside
the cluster (a head node), and it must stay up while the pull runs (no ``--detach``).

Console side (asyncssh), imported only for a relay-ssh pull.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from backend.errors import JobError

if TYPE_CHECKING:
    import asyncssh

    from backend.config import Config
    from backend.pulls.model import PullPlan, Upstreams

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


class SshHops:
    """The remote listeners and forwarded connections of one relay-ssh pull."""

    def __init__(self, config: Config, nodes: list[str]) -> None:
        from backend.nodes.ssh import SshTransport

        self.transports = {n: SshTransport(config.node(n), command_server=False) for n in nodes}
        self.conns: dict[str, asyncssh.SSHClientConnection] = {}
        self.listeners: list[asyncssh.SSHListener] = []
        self.tasks: set[asyncio.Task[None]] = set()
        #: Bytes carried per hop (parent, child), for the operator.
        self.carried: dict[tuple[str, str], int] = {}

    async def open(self, plan: PullPlan) -> Upstreams:
        """Connect every node and listen on each receiver's loopback for each node above it;
        node -> its upstreams as the relay job takes them ([name, 127.0.0.1, port], nearest first)."""
        names = list(self.transports)
        got = await asyncio.gather(*(self.transports[n].connect() for n in names), return_exceptions=True)
        for n, c in zip(names, got, strict=True):
            if isinstance(c, BaseException):
                await self.close()
                raise JobError(f"relay-ssh: cannot connect to {n}: {c}")
            self.conns[n] = c
        topo = plan.topology
        if topo is None:
            raise JobError("relay-ssh: the plan has no relay topology")
        out: Upstreams = {}
        for child in names:
            ups: list[list[str | int]] = []
            for parent in topo.ancestors(child):
                port = int(plan.relay_listen[parent][1])
                try:
                    listener = await self.conns[child].start_server(
                        functools.partial(self._accept, parent, child, port), LOOPBACK, 0
                    )
                except Exception as exc:  # noqa: BLE001 - asyncssh's ChannelListenError and OSError alike
                    await self.close()
                    raise JobError(
                        f"relay-ssh: {child}'s sshd refused a loopback listener ({exc}); "
                        "allow TCP forwarding there (AllowTcpForwarding) or pull with --fanout relay"
                    ) from None
                self.listeners.append(listener)
                ups.append([parent, LOOPBACK, listener.get_port()])
            out[child] = ups
        return out

    def _accept(
        self, parent: str, child: str, port: int, _orig_host: str, _orig_port: int
    ) -> Callable[[asyncssh.SSHReader[bytes], asyncssh.SSHWriter[bytes]], Awaitable[None]]:
        async def carry(reader: asyncssh.SSHReader[bytes], writer: asyncssh.SSHWriter[bytes]) -> None:
            try:
                up_reader, up_writer = await self.conns[parent].open_connection(LOOPBACK, port)
            except Exception as exc:  # noqa: BLE001 - the child re-attaches elsewhere
                log.debug("relay-ssh: %s -> %s: %s", parent, child, exc)
                writer.close()
                return
            await asyncio.gather(self._pump(up_reader, writer, (parent, child)), self._pump(reader, up_writer, None))

        return carry

    async def _pump(
        self, reader: asyncssh.SSHReader[bytes], writer: asyncssh.SSHWriter[bytes], hop: tuple[str, str] | None
    ) -> None:
        try:
            while True:
                block = await reader.read(1 << 20)
                if not block:
                    break
                writer.write(block)
                await writer.drain()
                if hop is not None:
                    self.carried[hop] = self.carried.get(hop, 0) + len(block)
        except Exception:  # noqa: BLE001 - either side went away: close both
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.write_eof()
            with contextlib.suppress(Exception):
                writer.close()

    async def close(self) -> None:
        for listener in self.listeners:
            with contextlib.suppress(Exception):
                listener.close()
        self.listeners.clear()
        for t in self.transports.values():
            with contextlib.suppress(Exception):
                await t.close()
