"""The SSH transport: one asyncssh connection per node, many channels over it.

asyncssh applies ``~/.ssh/config`` (HostName, User, Port, IdentityFile, ProxyJump; see
:mod:`backend.nodes.ssh_config`) and uses the ssh-agent and default key files; fields set in
loadmaster's config override it. Commands go through the connection's command server
(:mod:`backend.nodes.command_server`), or one SSH channel each where it cannot start. Host keys are
checked strictly against the node's known_hosts (see :mod:`backend.nodes.hostkeys`); nothing
here ever turns host-key checking off. Channels per connection stay under sshd's MaxSessions
(10) by queueing on a semaphore; handshakes across the fleet are bounded by the pool's
semaphore (sshd's MaxStartups). A dropped connection fails the commands that were running on it
with :class:`NodeUnreachable`; the next call reconnects, after a backoff when connecting failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from backend.backoff import Backoff
from backend.nodes.libsearch import quick_library_search

with quick_library_search():  # asyncssh probes for liboqs at import time
    import asyncssh

from backend.config import Node
from backend.errors import (
    CommandTimeout,
    ConfigError,
    HostKeyRefused,
    NodeError,
    NodeUnreachable,
)
from backend.nodes.command_server import SERVER_START_TIMEOUT, CommandServer, command_server_command
from backend.nodes.hostkeys import VerifyingClient, known_hosts_path, load_known_hosts
from backend.nodes.ssh_config import config_value, parse_jump, ssh_config_paths
from backend.nodes.transport import (
    DEFAULT_BACKOFF,
    DEFAULT_CHANNELS,
    DEFAULT_KEEPALIVE,
    DEFAULT_KEEPALIVE_COUNT,
    ExecTransport,
)
from backend.nodes.untrusted import (
    REASON_LIMIT,
    OutputTooLarge,
    bounded_lines,
    clean_text,
    read_capped,
)

#: Attempts to open a channel that sshd refuses while it is still freeing closed sessions.
CHANNEL_OPEN_TRIES = 6
#: Seconds before the second attempt; each later one waits twice the one before.
CHANNEL_OPEN_WAIT = 0.02
#: Attempts at a fresh connection that sshd drops before it answers: beyond MaxStartups' first
#: number (10) of unauthenticated connections it closes new ones at random ("connection lost" or
#: "reset"), so a storm of fresh connections retries with jittered exponential backoff.
CONNECT_TRIES = 8
CONNECT_RETRY_BASE = 0.1
#: Environment variable that marks every process a command starts (see kill_tree_command).
RUN_ENV = "LOADMASTER_RUN"

log = logging.getLogger(__name__)

StateHook = Callable[[str, str, "float | None", "str | None"], None]


def kill_tree_command(token: str) -> str:
    """Shell text that SIGKILLs every process whose environment carries this run's token."""
    return (
        f"for p in $(grep -lzx '{RUN_ENV}={token}' /proc/[0-9]*/environ 2>/dev/null"
        " | sed 's#/proc/\\([0-9]*\\)/environ#\\1#'); do kill -9 \"$p\" 2>/dev/null; done; true"
    )


class _Dropped(Exception):
    """sshd closed a fresh connection before the handshake (worth another try)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _reason(exc: BaseException) -> str:
    """An asyncssh error's reason (text the node may have chosen) as one printable line."""
    return clean_text(str(getattr(exc, "reason", None) or exc), REASON_LIMIT)


def _where(host: str, port: int | None, user: str | None) -> str:
    u = f"{user}@" if user else ""
    return f"{u}{host}:{port}" if port else f"{u}{host}"


class SshTransport(ExecTransport):
    """A node reached over SSH with asyncssh: lazy connect, channel queueing, reconnect."""

    def __init__(
        self,
        node: Node,
        *,
        channels: int = DEFAULT_CHANNELS,
        handshakes: asyncio.Semaphore | None = None,
        keepalive_interval: float = DEFAULT_KEEPALIVE,
        keepalive_count: int = DEFAULT_KEEPALIVE_COUNT,
        backoff: tuple[float, float] = DEFAULT_BACKOFF,
        ssh_config: str | Path | None = None,
        on_state: StateHook | None = None,
        command_server: bool = True,
    ) -> None:
        super().__init__(node)
        self._use_server = command_server
        self._server: CommandServer | None = None
        self._server_lock = asyncio.Lock()
        self._server_failed = False
        #: Why the command server is not used on this connection (None while it is, or untried).
        self.command_server_unavailable: str | None = None
        # With the command server on, one of the channels is reserved for it, so runs never queue
        # behind long-lived streams.
        self._channels = asyncio.Semaphore(max(1, channels - 1) if command_server else channels)
        self._handshakes = handshakes
        self._keepalive = keepalive_interval
        self._keepalive_count = keepalive_count
        #: The wait before the next connect after a failed one: doubles per failure up to the cap.
        self._backoff = Backoff(*backoff)
        self._ssh_config = ssh_config
        self._on_state = on_state
        self._lock = asyncio.Lock()
        self._conn: asyncssh.SSHClientConnection | None = None
        self._jumps: list[asyncssh.SSHClientConnection] = []
        self._reapers: set[asyncio.Task[None]] = set()
        self._client: VerifyingClient | None = None
        self._retry_at = 0.0
        self._last_error: str | None = None
        self._last_exc: NodeUnreachable | None = None
        self._closing = False
        #: Seconds the last successful handshake (TCP + key exchange + auth) took.
        self.handshake_seconds: float | None = None

    # -- connection ----------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        """Whether a live connection is open now."""
        return self._conn is not None and self._client is not None and not self._client.closed

    def _state(self, state: str, latency: float | None = None, error: str | None = None) -> None:
        if self._on_state is not None:
            self._on_state(self.name, state, latency, error)

    async def connect(self) -> asyncssh.SSHClientConnection:
        """The open connection, connecting (once, under a lock) when there is none."""
        if self.connected:
            assert self._conn is not None
            return self._conn
        async with self._lock:
            if self.connected:
                assert self._conn is not None
                return self._conn
            await self._drop()
            wait = self._retry_at - time.monotonic()
            if wait > 0:
                msg = f"{self._last_error} (next retry in {wait:.1f}s)"
                last = self._last_exc
                if isinstance(last, HostKeyRefused):
                    raise HostKeyRefused(self.name, msg, offered=last.offered, expected=last.expected)
                raise NodeUnreachable(self.name, msg)
            self._closing = False
            self._state("connecting")
            try:
                if self._handshakes is not None:
                    async with self._handshakes:
                        conn = await self._open()
                else:
                    conn = await self._open()
            except (NodeUnreachable, ConfigError) as exc:
                if isinstance(exc, ConfigError):
                    exc = NodeUnreachable(self.name, str(exc))
                self._retry_at = time.monotonic() + self._backoff.failed()
                self._last_error = exc.detail
                self._last_exc = exc
                self._state("unreachable", None, exc.detail)
                raise exc from None
            except asyncio.CancelledError:
                # e.g. a fan-out's per-node limit ran out mid-handshake: do not stay "connecting".
                self._state("unreachable", None, "connect attempt cancelled before it finished")
                raise
            self._backoff.reset()
            self._server_failed = False
            self._retry_at = 0.0
            self._last_error = None
            self._conn = conn
            log.debug("%s: connected (handshake %.1f ms)", self.name, (self.handshake_seconds or 0) * 1000)
            self._state("up", (self.handshake_seconds or 0.0) * 1000, None)
            return conn

    def _client_factory(self, node: Node) -> tuple[VerifyingClient, Callable[[], VerifyingClient]]:
        client = VerifyingClient(node.name, known_hosts_path(node), node.trust_on_first_use)
        return client, lambda: client

    def _options(self, node: Node, host: str, port: int | None, user: str | None) -> dict[str, object]:
        path = known_hosts_path(node)
        try:
            known = load_known_hosts(path)
        except (OSError, ValueError) as exc:
            raise NodeUnreachable(node.name, f"cannot read known_hosts {path}: {exc}") from None
        opts: dict[str, object] = {
            "known_hosts": known,
            "connect_timeout": node.connect_timeout,
            "keepalive_interval": self._keepalive,
            "keepalive_count_max": self._keepalive_count,
        }
        if port:
            opts["port"] = port
        if user:
            opts["username"] = user
        if node.identity:
            keys = [os.path.expanduser(p) for p in node.identity]
            for k in keys:
                if not os.path.exists(k):
                    raise NodeUnreachable(node.name, f"identity file {k} does not exist (check 'identity')")
            opts["client_keys"] = keys
        # An explicit (possibly empty) list: asyncssh must not fall back to another file.
        opts["config"] = self._config_paths()
        return opts

    async def _open(self) -> asyncssh.SSHClientConnection:
        node = self.node
        # ProxyJump (ours or ~/.ssh/config's) is opened here, hop by hop, so every hop's host key
        # is checked by the same strict policy as the node's own.
        jump = node.jump or config_value(self._config_paths(), node, "ProxyJump")
        tunnel: asyncssh.SSHClientConnection | None = None
        hops: list[asyncssh.SSHClientConnection] = []
        try:
            for hop in (h.strip() for h in (jump or "").split(",") if h.strip()):
                if hop.lower() == "none":
                    break
                juser, jhost, jport = parse_jump(hop)
                tunnel = await self._connect_one(node, jhost, jport, juser, tunnel, f"jump host {hop}")
                hops.append(tunnel)
            start = time.monotonic()
            conn = await self._connect_one(node, node.host, node.port, node.user, tunnel, None)
        except BaseException:
            for h in reversed(hops):
                h.close()
            raise
        self.handshake_seconds = time.monotonic() - start
        self._jumps = hops
        return conn

    def _config_paths(self) -> list[str]:
        return ssh_config_paths(self._ssh_config)

    async def _connect_one(
        self,
        node: Node,
        host: str,
        port: int | None,
        user: str | None,
        tunnel: asyncssh.SSHClientConnection | None,
        via: str | None,
    ) -> asyncssh.SSHClientConnection:
        where = via or _where(host, port, user)
        opts = self._options(node, host, port, user)
        # Never let asyncssh open ~/.ssh/config's ProxyJump itself: _open did it, strictly.
        opts["tunnel"] = tunnel
        # Full jitter, no cap (the tries are bounded): a storm of connections must not come back in step.
        backoff = Backoff(CONNECT_RETRY_BASE, float("inf"), jitter=0.5)
        for attempt in range(CONNECT_TRIES):
            try:
                return await self._connect_attempt(node, host, opts, via is None, where)
            except _Dropped as exc:
                if attempt + 1 == CONNECT_TRIES:
                    raise NodeUnreachable(
                        node.name,
                        f"{where}: {exc.reason} before the SSH handshake, {CONNECT_TRIES} "
                        "times (sshd's MaxStartups refusing new connections?)",
                    ) from None
                await backoff.sleep()
        raise AssertionError("unreachable")

    async def _connect_attempt(
        self, node: Node, host: str, opts: dict[str, object], final_hop: bool, where: str
    ) -> asyncssh.SSHClientConnection:
        client, factory = self._client_factory(node)
        try:
            conn = await asyncssh.connect(host, client_factory=factory, **opts)  # type: ignore[arg-type]
        except asyncssh.HostKeyNotVerifiable as exc:
            if client.refusal is not None:
                raise client.refusal.error(node.name) from None
            raise NodeUnreachable(node.name, f"{where}: host key not verifiable: {_reason(exc)}") from None
        except asyncssh.PermissionDenied:
            keys = ", ".join(node.identity) or "default keys and ssh-agent"
            raise NodeUnreachable(
                node.name, f"{where}: authentication refused (tried {keys}; check 'user' and 'identity')"
            ) from None
        except asyncssh.KeyImportError as exc:
            raise NodeUnreachable(node.name, f"cannot load identity key: {_reason(exc)}") from None
        except asyncssh.ConnectionLost as exc:
            raise _Dropped(_reason(exc) or "connection lost") from None
        except asyncssh.Error as exc:
            raise NodeUnreachable(node.name, f"{where}: {_reason(exc)}") from None
        except TimeoutError:
            raise NodeUnreachable(node.name, f"{where}: no SSH answer within {node.connect_timeout:g}s") from None
        except ConnectionRefusedError:
            raise NodeUnreachable(node.name, f"{where}: connection refused (is sshd running?)") from None
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise _Dropped(exc.strerror or "connection reset") from None
        except OSError as exc:
            raise NodeUnreachable(node.name, f"{where}: {exc.strerror or exc}") from None
        if final_hop:
            self._client = client
            client.on_lost = self._lost
        return conn

    def _lost(self, exc: Exception | None) -> None:
        if self._closing:
            return
        reason = _reason(exc) if exc else "closed by the node"
        self._state("unreachable", None, f"connection lost: {reason or 'closed by the node'}")

    async def _drop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        conns = [self._conn, *reversed(self._jumps)]
        self._conn = None
        self._jumps = []
        for c in conns:
            if c is not None:
                c.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(c.wait_closed(), 2)

    def lost_error(self, command: str) -> NodeUnreachable:
        lost = self._client.lost if self._client else None
        reason = (_reason(lost) if lost else "") or "connection closed"
        return NodeUnreachable(self.name, f"connection lost while running {command!r}: {reason}")

    # -- commands ------------------------------------------------------------------------------
    async def _open_process(
        self, conn: asyncssh.SSHClientConnection, command: str, token: str, **kw: Any
    ) -> asyncssh.SSHClientProcess[bytes]:
        # The token rides in the environment of everything the command starts, so a timeout or
        # a closed stream can kill the whole remote tree: sshd signals only the session leader.
        backoff = Backoff(CHANNEL_OPEN_WAIT, float("inf"))
        for attempt in range(CHANNEL_OPEN_TRIES):
            try:
                return await conn.create_process(f"export {RUN_ENV}={token}; {command}", encoding=None, **kw)
            except asyncssh.ChannelOpenError as exc:
                if not self.connected:
                    raise self.lost_error(command) from None
                if attempt + 1 == CHANNEL_OPEN_TRIES:
                    raise NodeError(self.name, f"cannot open an SSH channel: {exc.reason}") from None
                # sshd frees a closed session only in a later pass of its main loop, so an open
                # that races a close can briefly exceed MaxSessions: wait and retry.
                await backoff.sleep()
            except (asyncssh.Error, OSError) as exc:
                if not self.connected:
                    raise self.lost_error(command) from None
                raise NodeError(self.name, f"cannot start {command!r}: {exc}") from None
        raise AssertionError("unreachable")

    async def _kill_tree(self, conn: asyncssh.SSHClientConnection, token: str) -> None:
        """Kill every process on the node that carries ``token`` (best effort, bounded)."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.run(kill_tree_command(token), check=False), 10)

    def _kill_later(self, conn: asyncssh.SSHClientConnection, token: str) -> None:
        task = asyncio.get_running_loop().create_task(self._kill_tree(conn, token))
        self._reapers.add(task)
        task.add_done_callback(self._reapers.discard)

    async def _command_server(self) -> CommandServer | None:
        """This connection's command server, started on first use; None where it cannot run."""
        conn = await self.connect()
        server = self._server
        if server is not None and server.alive and server.conn is conn:
            return server
        async with self._server_lock:
            conn = await self.connect()
            server = self._server
            if server is not None and server.alive and server.conn is conn:
                return server
            if self._server_failed:
                return None
            # The server lives on the channel reserved for it in __init__.
            proc = await self._open_process(conn, command_server_command(self.output_limit), secrets.token_hex(8))
            server = CommandServer(self, conn, proc)
            why = await server.wait_ready(SERVER_START_TIMEOUT)
            if why is not None:
                server.close()
                if not self.connected:
                    raise self.lost_error("command server start")
                self._server_failed = True
                self.command_server_unavailable = why
                return None
            self.command_server_unavailable = None
            log.debug("%s: command server ready", self.name)
            self._server = server
            return server

    async def exec_bytes(
        self,
        command: str,
        input: bytes | None,
        timeout: float | None,  # noqa: ASYNC109
    ) -> tuple[int | None, bytes, bytes, float]:
        """Run ``command`` with binary stdin; (exit status, stdout, stderr, seconds) as they were."""
        if self._use_server:
            server = await self._command_server()
            if server is not None:
                start = time.monotonic()
                code, out, err = await server.run(command, input, timeout)
                return code, out, err, time.monotonic() - start
        token = secrets.token_hex(8)
        async with self._channels:
            conn = await self.connect()
            start = time.monotonic()
            proc = await self._open_process(conn, command, token)
            try:
                # asyncssh's communicate() sends EOF only with non-empty input; a command that
                # reads stdin must always see it end, as with the local transport.
                if input:
                    proc.stdin.write(input)
                proc.stdin.write_eof()
                out, err = await asyncio.wait_for(self._collect(proc, command), timeout)
            except OutputTooLarge:
                _stop(proc)
                await self._kill_tree(conn, token)
                raise
            except TimeoutError:
                _stop(proc)
                # Still holding our channel permit (our own channel is closed): no deadlock.
                await self._kill_tree(conn, token)
                raise CommandTimeout(self.name, f"command {command!r} did not finish within {timeout:g}s") from None
            except asyncio.CancelledError:
                _stop(proc)
                self._kill_later(conn, token)
                raise
            except (asyncssh.Error, OSError):
                _stop(proc)
                raise self.lost_error(command) from None
            code = proc.returncode
            if code is None and not self.connected:
                raise self.lost_error(command)
            return code, out or b"", err or b"", time.monotonic() - start

    async def _collect(self, proc: asyncssh.SSHClientProcess[bytes], command: str) -> tuple[bytes, bytes]:
        """stdout and stderr to their end, each bounded (communicate() would take any amount)."""
        what = f"command {command!r}"
        out, err = await asyncio.gather(
            read_capped(proc.stdout, self.output_limit, node=self.name, what=what),
            read_capped(proc.stderr, self.output_limit, node=self.name, what=f"{what} (stderr)"),
        )
        await proc.wait_closed()
        return out, err

    def forget_failure(self) -> None:
        """Drop the backoff after a failed connect: the next command tries to connect at once.

        The connection keeper calls this when a new command arrives, so an operator who fixed a
        node (started sshd, corrected known_hosts) is not told to wait for a retry it set earlier.
        """
        self._backoff.reset()
        self._retry_at = 0.0

    async def stream(self, command: str, *, input: str | bytes | None = None) -> AsyncIterator[str]:
        token = secrets.token_hex(8)
        async with self._channels:
            conn = await self.connect()
            proc = await self._open_process(conn, command, token, stderr=asyncssh.DEVNULL)
            finished = False
            try:
                if input is not None:
                    proc.stdin.write(input.encode() if isinstance(input, str) else input)
                proc.stdin.write_eof()
                try:
                    # Bounded lines, found in linear time: a node printing 200 MB without a
                    # newline costs one line's memory, not 200 MB (and not quadratic copying).
                    async for line in bounded_lines(proc.stdout):
                        yield line.decode(errors="replace")
                except (asyncssh.Error, OSError):
                    raise self.lost_error(command) from None
                with contextlib.suppress(Exception):
                    # stdout is at EOF: the exit status follows at once unless children kept running.
                    await asyncio.wait_for(proc.wait(), 5)
                finished = proc.returncode is not None
                if not finished and not self.connected:
                    raise self.lost_error(command)
            finally:
                if not finished:
                    _stop(proc)
                    if self.connected:
                        try:
                            await self._kill_tree(conn, token)
                        except BaseException:
                            self._kill_later(conn, token)
                            raise

    async def close(self) -> None:
        self._closing = True
        await self._drop()


def _stop(proc: asyncssh.SSHClientProcess[bytes]) -> None:
    """Ask sshd to kill the command, then close the channel (its pipes close with it)."""
    with contextlib.suppress(Exception):
        proc.kill()
    with contextlib.suppress(Exception):
        proc.close()
