"""The connection keeper: node connections that outlive one ``loadmaster`` command.

Like OpenSSH's ``ControlMaster``/``ControlPersist`` (Ansible runs every ssh with
``ControlPersist=60s`` by default): the first command that needs a node starts a per-user
background process (:mod:`backend.nodes.keeper_server`) that holds the SSH connections, each with
its command server already running. Later commands send their node commands to it over a Unix
socket and skip importing the SSH stack, the handshake and the node's login shell. The keeper
ends ``[ssh] persist`` seconds (60 by default; 0 turns it off) after its last command.

What keeps this safe:

- The socket sits in a directory only the user can enter (0700, owned by them, checked), and
  the keeper refuses any peer whose uid is not its own (``SO_PEERCRED``).
- One keeper per set of connection facts: the resolved nodes (host, port, user, identity,
  known_hosts, jump...), the OpenSSH client config's text, loadmaster's version, the Python
  that runs it and this host's name (a state dir on a shared home serves each host apart). A changed config gets a new keeper; the old one ends at its idle limit.
- Host keys are checked by the same :class:`~backend.nodes.ssh.SshTransport` code inside the
  keeper, on every (re)connect; a failed connect is retried at once by the next command.
- A command's stdin (where secrets travel) crosses only the socket; the keeper logs no command
  text and no input, and its environment holds no AWS keys.
- If the keeper cannot be started or reached, the command connects on its own, as with
  ``persist = 0``: never worse than without it.

:class:`KeptTransport` is the client side: the same :class:`Transport` contract, errors rebuilt as
the same :mod:`backend.errors` classes the direct transport raises.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import itertools
import json
import logging
import os
import select
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any

from backend import __version__, errors
from backend.config import Config, Node
from backend.errors import (
    CommandFailed,
    ConfigError,
    HostKeyRefused,
    LoadmasterError,
    NodeError,
    NodeUnreachable,
)
from backend.nodes.settings import PERSIST_ENV, SshSettings, _persist
from backend.nodes.ssh_config import ssh_config_files, ssh_config_paths
from backend.nodes.transport import ExecTransport
from backend.nodes.untrusted import OutputTooLarge

log = logging.getLogger(__name__)

#: Longest Unix socket path Linux takes (sun_path is 108 bytes with the NUL).
_MAX_SOCKET_PATH = 107
#: How long a command waits for a keeper it started to say it is ready.
START_TIMEOUT = 15.0
#: The largest single message (a file written through the keeper travels in one line).
MESSAGE_LIMIT = 2**30
#: Never handed to the keeper: it runs no S3 client, so it holds no store secrets.
_DROPPED_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "LOADMASTER_TRACE",
    "LOADMASTER_TRACE_T0",
)

#: Where the ``backend`` package is imported from, handed to the keeper's interpreter.
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent.parent)

StateHook = Callable[[str, str, "float | None", "str | None"], None]


class KeeperUnavailable(LoadmasterError):
    """The connection keeper cannot be used here (the command then connects on its own)."""


# -- where and which keeper ---------------------------------------------------------------------
def persist_seconds(config: Config) -> float:
    """``[ssh] persist``, or ``$LOADMASTER_SSH_PERSIST`` where set (0: no keeper)."""
    env = os.environ.get(PERSIST_ENV)
    if env is not None and env.strip():
        try:
            return _persist(env)
        except ValueError as exc:
            raise ConfigError(f"{exc} (from the environment)", key=PERSIST_ENV) from None
    settings = config.section(SshSettings)
    return settings.persist if isinstance(settings, SshSettings) else SshSettings().persist


def keeper_key(config: Config) -> str:
    """What a keeper's connections depend on, hashed: a change means a different keeper."""
    h = hashlib.sha256()
    ssh_nodes = [n for n in config.nodes if n.transport == "ssh"]
    # The environment (venv) and interpreter, however they were named (python or python3).
    python = f"{sys.prefix}:{os.path.realpath(sys.executable)}"
    # The host too: a state dir on a shared (NFS) home must not send one host's commands to
    # another host's keeper socket, which only its own host can reach.
    for part in (__version__, python, socket.gethostname(), str(os.geteuid()), repr(ssh_nodes)):
        h.update(part.encode() + b"\0")
    # The [ssh] section too: keepalive settings shape the keeper's connections.
    h.update(repr(config.section(SshSettings)).encode() + b"\0")
    for path in ssh_config_files(ssh_config_paths()):
        h.update(str(path).encode() + b"\0")
        with contextlib.suppress(OSError):
            h.update(path.read_bytes())
    return h.hexdigest()


def private_dir(path: Path) -> Path:
    """``path`` created 0700 if missing; KeeperUnavailable unless it is ours and private."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise KeeperUnavailable(f"{path} is not a directory owned by you")
        if st.st_mode & 0o077:
            os.chmod(path, 0o700)  # ours: tighten rather than refuse
    except OSError as exc:
        raise KeeperUnavailable(f"cannot prepare {path}: {exc.strerror or exc}") from None
    return path


def socket_path(config: Config) -> Path:
    """The keeper's socket for ``config``: in the state dir, or a private temp dir if too long."""
    name = f"keeper-{keeper_key(config)[:16]}.sock"
    path = config.state_dir() / "run" / name
    if len(os.fsencode(str(path))) > _MAX_SOCKET_PATH:
        path = Path(tempfile.gettempdir()) / f"loadmaster-{os.geteuid()}" / name
    return path


def log_path(sock: Path) -> Path:
    return sock.with_suffix(".log")


# -- the wire format (shared with the server) -----------------------------------------------------
def encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def error_dict(exc: BaseException) -> dict[str, Any]:
    """An exception as the keeper sends it: enough to raise the same class on the other side."""
    d: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, NodeError):
        d.update(node=exc.node, detail=exc.detail)
    if isinstance(exc, HostKeyRefused):
        d.update(offered=exc.offered, expected=exc.expected)
    if isinstance(exc, CommandFailed):
        d.update(command=exc.command, exit_status=exc.exit_status, stderr=exc.stderr)
    return d


def error_from(d: dict[str, Any], node: str) -> Exception:
    """The exception :func:`error_dict` described, as its own class where loadmaster defines it."""
    kind, message = str(d.get("type", "")), str(d.get("message", ""))
    name, detail = str(d.get("node") or node), str(d.get("detail") or message)
    if kind == "HostKeyRefused":
        return HostKeyRefused(name, detail, offered=d.get("offered"), expected=d.get("expected"))
    if kind == "CommandFailed":
        return CommandFailed(name, str(d.get("command", "")), d.get("exit_status"), str(d.get("stderr", "")))
    if kind in ("NodeUnreachable", "CommandTimeout", "NodeError"):
        return getattr(errors, kind)(name, detail)  # type: ignore[no-any-return]
    if kind == "OutputTooLarge":
        return OutputTooLarge(name, detail)
    if kind == "ConfigError":
        return ConfigError(message)
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, LoadmasterError) and not issubclass(cls, NodeError):
        return cls(message)
    return NodeError(name, f"connection keeper: {kind}: {message}")


# -- the client ----------------------------------------------------------------------------------
def _read_line(fd: int, deadline: float) -> bytes:
    """One line from a pipe, or what came before EOF or the deadline (runs in a thread)."""
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 256)
        if not chunk:
            break
        buf += chunk
    return buf


def _start(cmd: list[str], logfile: Path) -> subprocess.Popen[bytes]:
    """Start the keeper's process: its own session, no AWS keys, stderr to its 0600 log."""
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    try:
        fd = os.open(logfile, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError as exc:
        raise KeeperUnavailable(f"cannot open {logfile}: {exc.strerror}") from None
    try:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=fd,
            env=env,
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        raise KeeperUnavailable(f"cannot start {cmd[0]}: {exc.strerror}") from None
    finally:
        os.close(fd)


class KeeperClient:
    """One command's link to the keeper for its config: started on first use, shared by its nodes."""

    def __init__(self, config: Config, persist: float) -> None:
        if config.source.startswith("<"):
            raise KeeperUnavailable("the config is not a file the keeper could load")
        self.config = config
        self.persist = persist
        self.key = keeper_key(config)
        self.socket = socket_path(config)
        #: Why the keeper is not used (the command connects on its own), once that is known.
        self.unavailable: str | None = None
        #: The keeper's pid once connected.
        self.pid: int | None = None
        self._lock: asyncio.Lock | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._streams: dict[int, asyncio.Queue[dict[str, Any]]] = {}
        self._read_task: asyncio.Task[None] | None = None
        self._warned = False

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def available(self) -> bool:
        """Connected to a keeper (starting one when none runs); False where it cannot be used."""
        if self.connected:
            return True
        if self.unavailable is not None:
            return False
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.connected:
                return True
            if self.unavailable is not None:
                return False
            try:
                await self._open()
            except KeeperUnavailable as exc:
                self.unavailable = str(exc)
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "connection keeper not used (%s); connecting directly (set [ssh] persist = 0 to stop trying)",
                        exc,
                    )
                return False
            return True

    async def _open(self) -> None:
        private_dir(self.socket.parent)
        for attempt in range(2):
            if await self._connect():
                return
            started = await self._spawn()
            deadline = time.monotonic() + START_TIMEOUT
            while time.monotonic() < deadline:
                if await self._connect():
                    return
                if started:  # it said ready: a refusal now means it already ended (a race)
                    break
                await asyncio.sleep(0.02)  # another command is starting it
            log.debug("keeper: not reachable after start (attempt %d)", attempt + 1)
        raise KeeperUnavailable(f"the keeper did not answer on {self.socket}; see {log_path(self.socket)}")

    async def _connect(self) -> bool:
        """Connect and greet; False when nobody (or a keeper that is ending) is listening."""
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.socket), limit=MESSAGE_LIMIT)
        except (FileNotFoundError, ConnectionRefusedError):
            return False
        except OSError as exc:
            raise KeeperUnavailable(f"cannot reach {self.socket}: {exc.strerror or exc}") from None
        try:
            writer.write(encode({"op": "hello", "key": self.key}))
            line = await asyncio.wait_for(reader.readline(), START_TIMEOUT)
            msg = json.loads(line) if line else {}
        except (OSError, TimeoutError, ValueError):
            msg = {}
        if msg.get("key") != self.key or not msg.get("hello"):
            writer.close()
            return False  # it was shutting down (idle) as we came: start another
        self.pid = int(msg["hello"])
        self._reader, self._writer = reader, writer
        self._read_task = asyncio.get_running_loop().create_task(self._read())
        log.debug("keeper: connected to pid %d", self.pid)
        return True

    async def _spawn(self) -> bool:
        """Start a keeper; True once it said ready (False: another one was starting)."""
        cmd = [
            sys.executable,
            "-m",
            "backend.nodes.keeper_server",
            "--config",
            self.config.source,
            "--socket",
            str(self.socket),
            "--key",
            self.key,
            "--persist",
            repr(self.persist),
        ]
        logfile = log_path(self.socket)
        proc = _start(cmd, logfile)
        assert proc.stdout is not None
        try:
            # The process forks at once and its parent exits: reap it, then wait for the keeper's line.
            line = await asyncio.to_thread(_read_line, proc.stdout.fileno(), time.monotonic() + START_TIMEOUT)
        finally:
            proc.stdout.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(proc.wait, 5)
        word = line.decode(errors="replace").strip()
        log.debug("keeper: spawned, said %r", word)
        if word == "ready":
            return True
        if word == "busy":
            return False
        raise KeeperUnavailable(f"the keeper did not start ({word or 'no answer'}); see {logfile}")

    async def _read(self) -> None:
        assert self._reader is not None
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                msg = json.loads(line)
                rid = msg.get("id")
                fut = self._pending.get(rid)
                if fut is not None:
                    if not fut.done():
                        fut.set_result(msg)
                    continue
                queue = self._streams.get(rid)
                if queue is not None:
                    queue.put_nowait(msg)
        except (OSError, ValueError, asyncio.LimitOverrunError) as exc:
            log.debug("keeper: link lost: %s", exc)
        finally:
            if self._writer is not None:
                self._writer.close()
            self._writer = None
            lost = {"lost": True}
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_result(lost)
            for queue in self._streams.values():
                queue.put_nowait(lost)

    def _send(self, obj: dict[str, Any]) -> None:
        if self._writer is None:
            raise OSError("keeper link closed")
        self._writer.write(encode(obj))

    def _lost(self, node: str, what: str) -> NodeUnreachable:
        return NodeUnreachable(
            node, f"the connection keeper (pid {self.pid}) went away while running {what}; see {log_path(self.socket)}"
        )

    async def call(self, req: dict[str, Any]) -> dict[str, Any]:
        """Send one request and wait for its reply; cancelling the wait cancels it in the keeper."""
        rid = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            self._send({**req, "id": rid})
            assert self._writer is not None
            await self._writer.drain()
            msg = await fut
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):
                self._send({"op": "cancel", "id": rid})
            raise
        except OSError:
            msg = {"lost": True}
        finally:
            self._pending.pop(rid, None)
        if msg.get("lost"):
            raise self._lost(str(req.get("node", "?")), repr(req.get("cmd", req.get("op"))))
        return msg

    async def stream(self, req: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        """Send a streaming request; yield its messages until its end (closing it cancels it)."""
        rid = next(self._ids)
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._streams[rid] = queue
        finished = False
        try:
            try:
                self._send({**req, "id": rid})
            except OSError:
                queue.put_nowait({"lost": True})
            while True:
                msg = await queue.get()
                if msg.get("lost"):
                    finished = True
                    raise self._lost(str(req.get("node", "?")), repr(req.get("cmd")))
                if "line" not in msg:
                    finished = True
                    yield msg
                    return
                yield msg
        finally:
            self._streams.pop(rid, None)
            if not finished:
                with contextlib.suppress(OSError):
                    self._send({"op": "cancel", "id": rid})

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        if self._read_task is not None:
            with contextlib.suppress(BaseException):
                await self._read_task


class KeptTransport(ExecTransport):
    """A node reached through the connection keeper; directly over SSH where the keeper is not used."""

    def __init__(
        self, node: Node, client: KeeperClient, direct: Callable[[], ExecTransport], on_state: StateHook | None = None
    ) -> None:
        super().__init__(node)
        self._client = client
        self._make_direct = direct
        self._direct: ExecTransport | None = None
        self._on_state = on_state
        #: Seconds the keeper's handshake with this node took (as SshTransport reports it).
        self.handshake_seconds: float | None = None

    def _fallback(self) -> ExecTransport:
        if self._direct is None:
            self._direct = self._make_direct()
        return self._direct

    def _status(self, msg: dict[str, Any]) -> None:
        st = msg.get("status")
        if not st:
            return
        if st.get("handshake_ms") is not None:
            self.handshake_seconds = st["handshake_ms"] / 1000
        if self._on_state is not None:
            self._on_state(self.name, st["state"], st.get("latency_ms"), st.get("error"))

    def _reply(self, msg: dict[str, Any]) -> dict[str, Any]:
        self._status(msg)
        if "error" in msg:
            raise error_from(msg["error"], self.name)
        return msg

    async def connect(self) -> None:
        """Have the keeper connect this node now (errors raise, as SshTransport.connect's do)."""
        if not await self._client.available():
            await self._fallback().connect()  # type: ignore[attr-defined]
            return
        self._reply(await self._client.call({"op": "connect", "node": self.name}))

    async def exec_bytes(
        self,
        command: str,
        input: bytes | None,
        timeout: float | None,  # noqa: ASYNC109
    ) -> tuple[int | None, bytes, bytes, float]:
        """Run ``command`` with binary stdin; (exit status, stdout, stderr, seconds)."""
        if not await self._client.available():
            return await self._fallback().exec_bytes(command, input, timeout)
        msg = self._reply(
            await self._client.call(
                {"op": "run", "node": self.name, "cmd": command, "in": b64(input), "timeout": timeout}
            )
        )
        return msg.get("rc"), unb64(msg.get("out")), unb64(msg.get("err")), float(msg.get("elapsed", 0.0))

    async def stream(self, command: str, *, input: str | bytes | None = None) -> AsyncIterator[str]:
        if not await self._client.available():
            async for line in self._fallback().stream(command, input=input):
                yield line
            return
        data = input.encode() if isinstance(input, str) else input
        agen = self._client.stream({"op": "stream", "node": self.name, "cmd": command, "in": b64(data)})
        try:
            async for msg in agen:
                if "line" in msg:
                    yield msg["line"]
                else:
                    self._reply(msg)
        finally:
            await agen.aclose()

    async def close(self) -> None:
        if self._direct is not None:
            await self._direct.close()


# -- managing a running keeper (sync: used by `loadmaster keeper` and the lab) -------------------
def _ask(sock: Path, req: dict[str, Any], timeout: float = 5.0) -> dict[str, Any] | None:
    """One request to the keeper at ``sock`` with plain sockets; None when none is listening."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(sock))
        f = s.makefile("rwb")
        f.write(encode({"op": "hello", "key": None}))
        f.flush()
        if not json.loads(f.readline() or b"{}").get("hello"):
            return None
        f.write(encode({**req, "id": 1}))
        f.flush()
        line = f.readline()
        return json.loads(line) if line else None
    except (OSError, ValueError):
        return None
    finally:
        s.close()


def keeper_status(config: Config) -> dict[str, Any] | None:
    """The running keeper's own report for ``config`` (pid, uptime, nodes), or None."""
    sock = socket_path(config)
    if not sock.exists():
        return None
    reply = _ask(sock, {"op": "status"})
    if reply is not None:
        reply.pop("id", None)
        reply["socket"] = str(sock)
    return reply


def stop_keeper(config: Config, *, wait: float = 5.0) -> int | None:
    """Stop ``config``'s keeper (it closes its connections); its pid, or None if none ran."""
    sock = socket_path(config)
    if not sock.exists():
        return None
    reply = _ask(sock, {"op": "stop"})
    if reply is None:
        return None
    deadline = time.monotonic() + wait
    while sock.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return int(reply.get("pid", 0)) or None
