"""The connection keeper's process: holds one config's SSH connections for later commands.

Started by :class:`backend.nodes.keeper.KeeperClient` as
``python -m backend.nodes.keeper_server --config FILE --socket PATH --key KEY --persist SECONDS``.
It forks into the background at once (the starting command reaps the parent), takes a lock so
only one keeper serves a socket, binds the socket 0600 in its private directory, prints
``ready`` on stdout and then serves JSON-line requests (see :mod:`backend.nodes.keeper`):
``hello``, ``run``, ``stream``, ``connect``, ``cancel``, ``status``, ``stop``.

Each client's requests run concurrently on a real :class:`~backend.nodes.pool.NodePool`; when a
client goes away its unfinished commands are cancelled (which stops them on the node), as when a
command's own SSH connection closes. The keeper ends after ``persist`` seconds with no client
and nothing running, on ``stop``, or when its socket file is removed or replaced. It logs
(to the ``.log`` next to the socket) starts, stops, clients and node state changes: no command
text, no input.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import functools
import json
import logging
import os
import socket
import struct
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.nodes.keeper import MESSAGE_LIMIT, b64, encode, error_dict, keeper_key, unb64

if TYPE_CHECKING:
    from backend.config import Config

log = logging.getLogger("backend.nodes.keeper_server")

#: A log larger than this is moved aside (to ``.log.1``) when a keeper starts.
LOG_ROTATE_BYTES = 1 << 20
#: Seconds between checks that the socket is still this keeper's.
IDLE_TICK = 1.0


class Keeper:
    """The serving side: one NodePool, many clients, idle exit."""

    def __init__(self, config: Config, sock: Path, key: str, persist: float) -> None:
        from backend.nodes.pool import NodePool

        self.config = config
        self.sock = sock
        self.key = key
        self.persist = persist
        self.pool = NodePool.from_config(config)
        self.pool.on_change = self._changed
        self.clients = 0
        self.running = 0
        self.requests = 0
        self.last_active = time.monotonic()
        self.last_command = time.monotonic()
        self.started = time.time()
        self._stop = asyncio.Event()
        self._inode: int | None = None
        #: Each connected client's writer and handler task: closed and awaited on exit, so a
        #: handler ends on EOF rather than being cancelled by the loop's shutdown (Python 3.11's
        #: streams then log the cancelled handler as a traceback).
        self._connected: dict[asyncio.StreamWriter, asyncio.Task[None]] = {}

    def _changed(self, name: str, state: str, error: str | None) -> None:
        log.info("%s: %s%s", name, state, f" ({error})" if error else "")

    def _status(self, name: str) -> dict[str, Any]:
        st = self.pool.status(name)
        t = self.pool.transport(name)
        hs = getattr(t, "handshake_seconds", None)
        return {
            "state": st.state,
            "latency_ms": st.latency_ms,
            "error": st.last_error,
            "handshake_ms": None if hs is None else hs * 1000,
        }

    def report(self) -> dict[str, Any]:
        nodes = {}
        for name in self.pool.names:
            t = self.pool.transport(name)
            d = self._status(name)
            d["connected"] = bool(getattr(t, "connected", False))
            nodes[name] = d
        return {
            "pid": os.getpid(),
            "started": self.started,
            "persist": self.persist,
            "clients": self.clients,
            "running": self.running,
            "requests": self.requests,
            "idle_s": round(time.monotonic() - self.last_command, 1),
            "config": self.config.source,
            "nodes": nodes,
        }

    async def serve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.sock.unlink()  # a dead keeper's (we hold the lock: nobody else serves it)
        old = os.umask(0o177)
        try:
            server = await asyncio.start_unix_server(self._client, path=str(self.sock), limit=MESSAGE_LIMIT)
        finally:
            os.umask(old)
        os.chmod(self.sock, 0o600)
        self._inode = os.stat(self.sock).st_ino
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
        log.info(
            "serving %s for %s (%d nodes, persist %gs)",
            self.sock,
            self.config.source,
            len(self.pool.names),
            self.persist,
        )
        why = "stopped"
        try:
            while not self._stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self._next_check())
                if self._stop.is_set():
                    break
                if not self._socket_is_ours():
                    why = "its socket was removed or replaced"
                    break
                if self._idle_left() <= 0:
                    why = f"idle for {self.persist:g}s"
                    break
        finally:
            server.close()
            if self._socket_is_ours():
                with contextlib.suppress(OSError):
                    self.sock.unlink()
            await self._disconnect_clients()
            await self.pool.close()
            log.info("exiting: %s", why)

    def _idle_left(self) -> float:
        """Seconds until the idle limit is reached (inf while a client is connected or a command runs)."""
        if self.clients or self.running:
            return float("inf")
        return self.persist - (time.monotonic() - self.last_active)

    def _next_check(self) -> float:
        """The wait before the next check: its socket each second, the idle limit when it falls due
        (a whole second's tick let an idle keeper linger up to a second past ``persist``)."""
        return min(IDLE_TICK, max(0.01, self._idle_left()))

    async def _disconnect_clients(self) -> None:
        """End every client's connection; its handler reads EOF and cleans up as on a hang-up."""
        handlers = list(self._connected.values())
        for writer in list(self._connected):
            writer.close()
        if handlers:
            await asyncio.wait(handlers, timeout=5)

    def _socket_is_ours(self) -> bool:
        try:
            return os.stat(self.sock).st_ino == self._inode
        except OSError:
            return False

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            pid, uid, _gid = struct.unpack(
                "3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            )
        except OSError:
            pid, uid = 0, -1
        if uid != os.geteuid():
            log.warning("refused a client of uid %d (pid %d): only uid %d may use this keeper", uid, pid, os.geteuid())
            writer.close()
            return
        self.clients += 1
        self.last_active = time.monotonic()
        if (me := asyncio.current_task()) is not None:
            self._connected[writer] = me
        tasks: dict[int, asyncio.Task[None]] = {}
        lock = asyncio.Lock()

        async def send(obj: dict[str, Any]) -> None:
            async with lock:
                with contextlib.suppress(OSError):
                    writer.write(encode(obj))
                    await writer.drain()

        try:
            while True:
                try:
                    line = await reader.readline()
                except (OSError, ValueError, asyncio.LimitOverrunError):
                    break
                if not line:
                    break
                try:
                    req = json.loads(line)
                except ValueError:
                    break
                op, rid = req.get("op"), req.get("id")
                if op == "hello":
                    for name in self.pool.names:
                        forget = getattr(self.pool.transport(name), "forget_failure", None)
                        if forget is not None:
                            forget()  # a new command tries failed nodes again at once
                    await send({"hello": os.getpid(), "key": self.key})
                elif op == "cancel":
                    task = tasks.get(rid)
                    if task is not None:
                        task.cancel()
                elif op == "status":
                    await send({"id": rid, **self.report(), "clients": self.clients - 1})  # not the asker
                elif op == "stop":
                    log.info("stop requested by pid %d", pid)
                    await send({"id": rid, "pid": os.getpid()})
                    self._stop.set()
                elif op in ("run", "stream", "connect"):
                    self.requests += 1
                    task = asyncio.get_running_loop().create_task(self._serve(req, send))
                    tasks[rid] = task
                    task.add_done_callback(functools.partial(_forget, tasks, rid))
                else:
                    await send({"id": rid, "error": {"type": "NodeError", "message": f"unknown op {op!r}"}})
        finally:
            for task in list(tasks.values()):
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks.values(), return_exceptions=True)
            writer.close()
            self._connected.pop(writer, None)
            self.clients -= 1
            self.last_active = time.monotonic()

    async def _serve(self, req: dict[str, Any], send: Any) -> None:
        rid, name = req.get("id"), str(req.get("node"))
        self.running += 1
        try:
            try:
                t = self.pool.transport(name)
                data = unb64(req["in"]) if req.get("in") is not None else None
                if req["op"] == "connect":
                    await t.connect()  # type: ignore[attr-defined]
                    reply: dict[str, Any] = {"id": rid, "ok": True}
                elif req["op"] == "run":
                    code, out, err, elapsed = await t.exec_bytes(  # type: ignore[attr-defined]
                        str(req["cmd"]), data, req.get("timeout")
                    )
                    reply = {"id": rid, "rc": code, "out": b64(out), "err": b64(err), "elapsed": elapsed}
                else:
                    agen = t.stream(str(req["cmd"]), input=data)
                    try:
                        async for line in agen:
                            await send({"id": rid, "line": line})
                    finally:
                        await agen.aclose()  # type: ignore[attr-defined]  # an async generator: stops the command
                    reply = {"id": rid, "end": True}
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure goes back to the command
                reply = {"id": rid, "error": error_dict(exc)}
            with contextlib.suppress(Exception):
                reply["status"] = self._status(name)
            await send(reply)
        finally:
            self.running -= 1
            self.last_active = self.last_command = time.monotonic()


def _forget(tasks: dict[int, asyncio.Task[None]], rid: int, _task: asyncio.Task[None]) -> None:
    tasks.pop(rid, None)


def _rotate(logfile: Path) -> None:
    with contextlib.suppress(OSError):
        if logfile.stat().st_size > LOG_ROTATE_BYTES:
            os.replace(logfile, logfile.with_suffix(".log.1"))
            fd = os.open(logfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 2)
            os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loadmaster-keeper")
    parser.add_argument("--config", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--persist", type=float, required=True)
    args = parser.parse_args(argv)
    sock = Path(args.socket)
    # Into the background: the starting command waits for this parent, then for our "ready".
    if os.fork() > 0:
        os._exit(0)
    lock_fd = os.open(str(sock.with_suffix(".lock")), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("busy", flush=True)  # another keeper serves (or is starting on) this socket
        return 0
    _rotate(sock.with_suffix(".log"))
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s keeper[%(process)d] %(message)s")
    for noisy in ("asyncssh", "backend.nodes.ssh", "backend.nodes.pool"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from backend.config import load_config
    from backend.errors import LoadmasterError

    try:
        config = load_config(args.config)
    except LoadmasterError as exc:
        print(f"error: {exc}", flush=True)
        return 1
    if keeper_key(config) != args.key:
        print(f"error: {args.config} changed while the keeper started; run the command again", flush=True)
        return 1

    async def run() -> None:
        await Keeper(config, sock, args.key, args.persist).serve()

    try:
        asyncio.run(run())
    except Exception as exc:  # noqa: BLE001 - the starting command reads this line
        log.exception("keeper failed")
        with contextlib.suppress(OSError):
            print(f"error: {type(exc).__name__}: {exc}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
