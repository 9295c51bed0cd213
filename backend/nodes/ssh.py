"""The SSH transport: one asyncssh connection per node, many channels over it.

asyncssh applies ``~/.ssh/config`` (HostName, User, Port, IdentityFile, ProxyJump) and uses the
ssh-agent and default key files; fields set in loadmaster's config override it. Host keys are
checked strictly against the node's known_hosts (see :mod:`backend.nodes.hostkeys`); nothing
here ever passes ``known_hosts=None``. Channels per connection stay under sshd's MaxSessions
(10) by queueing on a semaphore; handshakes across the fleet are bounded by the pool's
semaphore (sshd's MaxStartups). A dropped connection fails the commands that were running on it
with :class:`NodeUnreachable`; the next call reconnects, after a backoff when connecting failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncssh
import asyncssh.config

from backend.config import Node
from backend.errors import (
    CommandFailed,
    CommandTimeout,
    ConfigError,
    HostKeyRefused,
    NodeError,
    NodeUnreachable,
)
from backend.nodes.hostkeys import VerifyingClient, known_hosts_path, load_known_hosts
from backend.nodes.transport import RunResult, Transport

#: sshd's default MaxSessions is 10; one spare for OpenSSH's own needs (agent, control).
DEFAULT_CHANNELS = 9
DEFAULT_KEEPALIVE = 15.0
#: Backoff after a failed connect: first delay and ceiling, in seconds.
DEFAULT_BACKOFF = (1.0, 30.0)

#: Environment variable that marks every process a command starts (see kill_tree_command).
RUN_ENV = "LOADMASTER_RUN"

StateHook = Callable[[str, str, "float | None", "str | None"], None]


def ssh_config_paths(explicit: str | Path | None = None) -> list[str]:
    """The OpenSSH client config files that apply: ``explicit`` or ``~/.ssh/config`` if readable."""
    if explicit is not None:
        return [str(explicit)] if str(explicit) else []
    default = Path(os.path.expanduser("~/.ssh/config"))
    return [str(default)] if os.access(default, os.R_OK) else []


def load_ssh_config(node: Node, paths: list[str]) -> asyncssh.config.SSHClientConfig:
    """asyncssh's own parse of the OpenSSH client config for this node's host."""
    try:
        return asyncssh.config.SSHClientConfig.load(
            None, paths, False, False, False, getpass.getuser(),
            node.user if node.user else (), node.host, node.port if node.port else (),
        )
    except (OSError, asyncssh.Error, ValueError) as exc:
        raise ConfigError(f"cannot parse OpenSSH config: {exc}", file=", ".join(paths) or None) from None


def _config_value(paths: list[str], node: Node, option: str) -> Any:
    if not paths:
        return None
    return load_ssh_config(node, paths).get(option)


def effective_settings(node: Node, ssh_config: str | Path | None = None) -> dict[str, Any]:
    """How loadmaster will reach ``node``: loadmaster's fields over ``~/.ssh/config``'s."""
    if node.transport == "local":
        return {"name": node.name, "transport": "local", "hostname": node.host, "user": getpass.getuser(),
                "port": None, "identity": [], "proxy_jump": None, "known_hosts": None,
                "trust_on_first_use": False, "scratch": node.scratch, "site": node.site,
                "tags": list(node.tags), "slots": node.slots}
    paths = ssh_config_paths(ssh_config)
    cfg = load_ssh_config(node, paths)
    identity = list(node.identity) or [str(p) for p in (cfg.get("IdentityFile") or [])]
    return {
        "name": node.name,
        "transport": "ssh",
        "hostname": str(cfg.get("Hostname", node.host)),
        "user": node.user or cfg.get("User") or getpass.getuser(),
        "port": node.port or cfg.get("Port") or 22,
        "identity": [os.path.expanduser(p) for p in identity],
        "proxy_jump": node.jump or cfg.get("ProxyJump"),
        "known_hosts": str(known_hosts_path(node)),
        "trust_on_first_use": node.trust_on_first_use,
        "scratch": node.scratch,
        "site": node.site,
        "tags": list(node.tags),
        "slots": node.slots,
        "ssh_config": paths[0] if paths else None,
    }


def kill_tree_command(token: str) -> str:
    """Shell text that SIGKILLs every process whose environment carries this run's token."""
    return (
        f"for p in $(grep -lzx '{RUN_ENV}={token}' /proc/[0-9]*/environ 2>/dev/null"
        " | sed 's#/proc/\\([0-9]*\\)/environ#\\1#'); do kill -9 \"$p\" 2>/dev/null; done; true"
    )


def _where(host: str, port: int | None, user: str | None) -> str:
    u = f"{user}@" if user else ""
    return f"{u}{host}:{port}" if port else f"{u}{host}"


def parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """``user@host:port`` (user and port optional) -> (user, host, port)."""
    user, _, rest = spec.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = int(tail[1:]) if tail.startswith(":") else None
    elif rest.count(":") == 1:
        host, p = rest.split(":")
        port = int(p)
    return (user or None), host, port


class SshTransport(Transport):
    """A node reached over SSH with asyncssh: lazy connect, channel queueing, reconnect."""

    def __init__(
        self,
        node: Node,
        *,
        channels: int = DEFAULT_CHANNELS,
        handshakes: asyncio.Semaphore | None = None,
        keepalive_interval: float = DEFAULT_KEEPALIVE,
        backoff: tuple[float, float] = DEFAULT_BACKOFF,
        ssh_config: str | Path | None = None,
        on_state: StateHook | None = None,
    ) -> None:
        super().__init__(node)
        self._channels = asyncio.Semaphore(channels)
        self._handshakes = handshakes
        self._keepalive = keepalive_interval
        self._backoff = backoff
        self._ssh_config = ssh_config
        self._on_state = on_state
        self._lock = asyncio.Lock()
        self._conn: asyncssh.SSHClientConnection | None = None
        self._jumps: list[asyncssh.SSHClientConnection] = []
        self._reapers: set[asyncio.Task[None]] = set()
        self._client: VerifyingClient | None = None
        self._failures = 0
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
                self._failures += 1
                first, ceiling = self._backoff
                self._retry_at = time.monotonic() + min(ceiling, first * 2 ** (self._failures - 1))
                self._last_error = exc.detail
                self._last_exc = exc
                self._state("unreachable", None, exc.detail)
                raise exc from None
            self._failures = 0
            self._retry_at = 0.0
            self._last_error = None
            self._conn = conn
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
            "keepalive_count_max": 3,
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
        jump = node.jump or _config_value(self._config_paths(), node, "ProxyJump")
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
        client, factory = self._client_factory(node)
        opts = self._options(node, host, port, user)
        # Never let asyncssh open ~/.ssh/config's ProxyJump itself: _open did it, strictly.
        opts["tunnel"] = tunnel
        where = via or _where(host, port, user)
        try:
            conn = await asyncssh.connect(host, client_factory=factory, **opts)  # type: ignore[arg-type]
        except asyncssh.HostKeyNotVerifiable as exc:
            if client.refusal is not None:
                raise client.refusal.error(node.name) from None
            raise NodeUnreachable(node.name, f"{where}: host key not verifiable: {exc.reason}") from None
        except asyncssh.PermissionDenied:
            keys = ", ".join(node.identity) or "default keys and ssh-agent"
            raise NodeUnreachable(
                node.name, f"{where}: authentication refused (tried {keys}; check 'user' and 'identity')"
            ) from None
        except asyncssh.KeyImportError as exc:
            raise NodeUnreachable(node.name, f"cannot load identity key: {exc}") from None
        except asyncssh.Error as exc:
            raise NodeUnreachable(node.name, f"{where}: {exc.reason}") from None
        except TimeoutError:
            raise NodeUnreachable(
                node.name, f"{where}: no SSH answer within {node.connect_timeout:g}s"
            ) from None
        except ConnectionRefusedError:
            raise NodeUnreachable(node.name, f"{where}: connection refused (is sshd running?)") from None
        except OSError as exc:
            raise NodeUnreachable(node.name, f"{where}: {exc.strerror or exc}") from None
        if via is None:
            self._client = client
            client.on_lost = self._lost
        return conn

    def _lost(self, exc: Exception | None) -> None:
        if self._closing:
            return
        reason = getattr(exc, "reason", None) or (str(exc) if exc else "closed by the node")
        self._state("unreachable", None, f"connection lost: {reason}")

    async def _drop(self) -> None:
        conns = [self._conn, *reversed(self._jumps)]
        self._conn = None
        self._jumps = []
        for c in conns:
            if c is not None:
                c.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(c.wait_closed(), 2)

    def _lost_error(self, command: str) -> NodeUnreachable:
        lost = self._client.lost if self._client else None
        reason = getattr(lost, "reason", None) or (str(lost) if lost else "connection closed")
        return NodeUnreachable(self.name, f"connection lost while running {command!r}: {reason}")

    # -- commands ------------------------------------------------------------------------------
    async def _open_process(
        self, conn: asyncssh.SSHClientConnection, command: str, token: str, **kw: Any
    ) -> asyncssh.SSHClientProcess[bytes]:
        # The token rides in the environment of everything the command starts, so a timeout or
        # a closed stream can kill the whole remote tree: sshd signals only the session leader.
        try:
            return await conn.create_process(f"export {RUN_ENV}={token}; {command}", encoding=None, **kw)
        except asyncssh.ChannelOpenError as exc:
            if not self.connected:
                raise self._lost_error(command) from None
            raise NodeError(self.name, f"cannot open an SSH channel: {exc.reason}") from None
        except (asyncssh.Error, OSError) as exc:
            if not self.connected:
                raise self._lost_error(command) from None
            raise NodeError(self.name, f"cannot start {command!r}: {exc}") from None

    async def _kill_tree(self, conn: asyncssh.SSHClientConnection, token: str) -> None:
        """Kill every process on the node that carries ``token`` (best effort, bounded)."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.run(kill_tree_command(token), check=False), 10)

    def _kill_later(self, conn: asyncssh.SSHClientConnection, token: str) -> None:
        task = asyncio.get_running_loop().create_task(self._kill_tree(conn, token))
        self._reapers.add(task)
        task.add_done_callback(self._reapers.discard)

    async def _exec(
        self, command: str, input: bytes | None, timeout: float | None  # noqa: ASYNC109
    ) -> tuple[int | None, bytes, bytes, float]:
        token = secrets.token_hex(8)
        async with self._channels:
            conn = await self.connect()
            start = time.monotonic()
            proc = await self._open_process(conn, command, token)
            try:
                out, err = await asyncio.wait_for(proc.communicate(input), timeout)
            except TimeoutError:
                _stop(proc)
                # Still holding our channel permit (our own channel is closed): no deadlock.
                await self._kill_tree(conn, token)
                raise CommandTimeout(
                    self.name, f"command {command!r} did not finish within {timeout:g}s"
                ) from None
            except asyncio.CancelledError:
                _stop(proc)
                self._kill_later(conn, token)
                raise
            except (asyncssh.Error, OSError):
                _stop(proc)
                raise self._lost_error(command) from None
            code = proc.returncode
            if code is None and not self.connected:
                raise self._lost_error(command)
            return code, out or b"", err or b"", time.monotonic() - start

    async def run(
        self,
        command: str,
        *,
        input: str | bytes | None = None,
        check: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - the Transport contract
    ) -> RunResult:
        data = input.encode() if isinstance(input, str) else input
        code, out, err, elapsed = await self._exec(command, data, timeout)
        result = RunResult(
            self.name, command, code, out.decode(errors="replace"), err.decode(errors="replace"), elapsed
        )
        if check and not result.ok:
            raise CommandFailed(self.name, command, result.exit_status, result.stderr)
        return result

    async def _run_bytes(self, command: str, *, input: bytes | None = None) -> tuple[int | None, bytes, bytes]:
        code, out, err, _ = await self._exec(command, input, None)
        return code, out, err

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
                buf = b""
                try:
                    async for chunk in proc.stdout:
                        buf += chunk
                        while b"\n" in buf:
                            line, _, buf = buf.partition(b"\n")
                            yield line.decode(errors="replace")
                except (asyncssh.Error, OSError):
                    raise self._lost_error(command) from None
                if buf:
                    yield buf.decode(errors="replace")
                with contextlib.suppress(Exception):
                    # stdout is at EOF: the exit status follows at once unless children kept running.
                    await asyncio.wait_for(proc.wait(), 5)
                finished = proc.returncode is not None
                if not finished and not self.connected:
                    raise self._lost_error(command)
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
