"""The command server: many commands over one SSH channel, without a login shell per command.

:data:`COMMAND_SERVER` is a small stdlib-python program sshd starts once per connection (through
the user's login shell, so rc files run once); :class:`CommandServer` is its client side in the
SSH transport. Requests and replies are JSON lines; each command still runs in its own
``/bin/sh -c`` and process group, and its output is bounded on the node as well as here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shlex
from collections import deque
from typing import Any, Protocol

from backend.nodes.libsearch import quick_library_search

with quick_library_search():  # asyncssh probes for liboqs at import time
    import asyncssh

from backend.errors import CommandTimeout, NodeError
from backend.nodes.untrusted import (
    CUT_LINE,
    MAX_OUTPUT_BYTES,
    REASON_LIMIT,
    OutputTooLarge,
    bounded_lines,
    clean_text,
)


class ServedTransport(Protocol):
    """What the client reads of the SSH transport it runs over (``backend.nodes.ssh.SshTransport``
    is one): named here so the transport, which starts the server, and its client do not import
    each other."""

    output_limit: int

    @property
    def name(self) -> str: ...

    @property
    def connected(self) -> bool: ...

    def lost_error(self, command: str) -> NodeError: ...


#: Seconds to wait for the command server's ready line (python3 start-up, once per connection).
SERVER_START_TIMEOUT = 20.0


def reply_limit(output_limit: int) -> int:
    """The longest reply line the command server can send: stdout and stderr at their limit, base64."""
    return 2 * (output_limit * 4 // 3 + 4) + 4096


#: A persistent per-connection command runner (stdlib python3, 3.6+). Each command still runs in
#: its own ``/bin/sh -c`` and process group, but without a new SSH channel and login shell: sshd
#: starts the login shell (and its rc files, e.g. a slow ``pyenv init``/``conda init``) once per
#: connection instead of once per command. Requests and replies are JSON lines on the channel;
#: stdin travels inside the request, so secrets still never reach an argv.
COMMAND_SERVER = r"""
import base64, json, os, signal, subprocess, sys, threading
os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # nobody reads this channel's stderr
out = sys.stdout.buffer
lock = threading.Lock()
procs = {}
killed = set()
def send(obj):
    data = (json.dumps(obj) + "\n").encode()
    with lock:
        out.write(data)
        out.flush()
def b64(b):
    return base64.b64encode(b).decode()
def kill(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
LIMIT = @LIMIT@
def grab(p, f, box, i):
    # At most LIMIT bytes of each stream: a command that floods is stopped, not buffered whole.
    data = f.read(LIMIT + 1)
    if len(data) > LIMIT:
        box[2] = True
        kill(p)
        data = data[:LIMIT]
    box[i] = data
    f.close()
def run(rid, cmd, data):
    try:
        p = subprocess.Popen(["/bin/sh", "-c", cmd], stdin=subprocess.DEVNULL if data is None else subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except Exception as exc:
        send({"id": rid, "rc": 127, "out": "", "err": b64(str(exc).encode())})
        return
    with lock:
        procs[rid] = p
        doomed = rid in killed
    if doomed:
        kill(p)
    box = [b"", b"", False]
    readers = [threading.Thread(target=grab, args=(p, f, box, i), daemon=True)
               for i, f in enumerate((p.stdout, p.stderr))]
    for t in readers:
        t.start()
    if data is not None:
        try:
            p.stdin.write(data)
        except OSError:
            pass
        try:
            p.stdin.close()
        except OSError:
            pass
    for t in readers:
        t.join()
    p.wait()
    with lock:
        procs.pop(rid, None)
        killed.discard(rid)
    if box[2]:
        send({"id": rid, "rc": p.returncode, "cut": True})
    else:
        send({"id": rid, "rc": p.returncode, "out": b64(box[0]), "err": b64(box[1])})
send({"ready": 1, "pid": os.getpid()})
for line in sys.stdin.buffer:
    req = json.loads(line)
    if "kill" in req:
        with lock:
            p = procs.get(req["kill"])
            if p is None:
                killed.add(req["kill"])
        if p is not None:
            kill(p)
        continue
    data = None if req.get("in") is None else base64.b64decode(req["in"])
    threading.Thread(target=run, args=(req["id"], req["cmd"], data), daemon=True).start()
with lock:
    running = list(procs.values())
for p in running:
    kill(p)
"""


def command_server_command(output_limit: int = MAX_OUTPUT_BYTES) -> str:
    """Shell text that starts the command server: the system python3 when there is one."""
    # /usr/bin/python3 first: a pyenv/conda shim on PATH costs a shell and a lookup per start,
    # and the server needs only the standard library (-S skips site-packages: faster start).
    code = shlex.quote(COMMAND_SERVER.replace("@LIMIT@", str(int(output_limit))))
    return (
        f"if [ -x /usr/bin/python3 ]; then exec /usr/bin/python3 -S -u -c {code}; else exec python3 -S -u -c {code}; fi"
    )


class CommandServer:
    """Client side of :data:`COMMAND_SERVER`: many concurrent commands over one channel."""

    def __init__(
        self,
        transport: ServedTransport,
        conn: asyncssh.SSHClientConnection,
        proc: asyncssh.SSHClientProcess[bytes],
    ) -> None:
        self.transport = transport
        self.conn = conn
        self.proc = proc
        self.alive = True
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[str, asyncio.Future[dict[str, Any]]]] = {}
        loop = asyncio.get_running_loop()
        self._ready: asyncio.Future[str | None] = loop.create_future()
        self._noise: deque[bytes] = deque(maxlen=20)
        self._reader = loop.create_task(self._read())

    async def wait_ready(self, limit: float) -> str | None:
        """None once the server runs; otherwise why it did not start."""
        try:
            why = await asyncio.wait_for(asyncio.shield(self._ready), limit)
        except TimeoutError:
            return f"command server did not start within {limit:g}s"
        if why is not None:
            with contextlib.suppress(Exception):
                err = (await asyncio.wait_for(self.proc.stderr.read(65536), 2)).decode(errors="replace")
                if err.strip():
                    why = f"{why}: {clean_text(err.strip().splitlines()[-1], REASON_LIMIT)}"
        return why

    async def _read(self) -> None:
        lost = False
        # Before the ready line, only a login shell's chatter: short lines. Replies can be long.
        lines = bounded_lines(self.proc.stdout)
        try:
            async for line in lines:
                if not self._ready.done():
                    if line.startswith(b'{"ready"'):
                        self._ready.set_result(None)
                        lines.max_line = reply_limit(self.transport.output_limit)
                    elif line != CUT_LINE.encode():
                        self._noise.append(line)  # rc-file chatter before the server starts
                    continue
                if line == CUT_LINE.encode():
                    break  # a reply larger than the server ever sends: not our server talking
                msg = json.loads(line)
                if not isinstance(msg, dict):
                    break
                rid = msg.get("id")
                entry = self._pending.pop(rid, None) if isinstance(rid, int) else None
                if entry is not None and not entry[1].done():
                    entry[1].set_result(msg)
        except (asyncssh.Error, OSError):
            lost = True
        except (ValueError, RecursionError):
            pass  # a garbled reply: treat as the server going away
        finally:
            self.alive = False
            with contextlib.suppress(Exception):
                self.proc.close()  # its channel is free for the next server
            if not self._ready.done():
                err = b"\n".join(self._noise).decode(errors="replace").strip().splitlines()
                last = clean_text(err[-1], REASON_LIMIT) if err else ""
                self._ready.set_result("command server did not start" + (f": {last}" if last else ""))
            for command, fut in self._pending.values():
                if fut.done():
                    continue
                if lost or not self.transport.connected:
                    fut.set_exception(self.transport.lost_error(command))
                else:
                    fut.set_exception(
                        NodeError(self.transport.name, f"command server exited while running {command!r}")
                    )
            self._pending.clear()

    def _send(self, obj: dict[str, Any]) -> None:
        self.proc.stdin.write(json.dumps(obj).encode() + b"\n")

    async def run(self, command: str, data: bytes | None, limit: float | None) -> tuple[int | None, bytes, bytes]:
        if not self.alive:
            raise self.transport.lost_error(command)
        rid = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = (command, fut)
        req: dict[str, Any] = {"id": rid, "cmd": command}
        if data is not None:
            req["in"] = base64.b64encode(data).decode()
        try:
            self._send(req)
            msg = await asyncio.wait_for(asyncio.shield(fut), limit)
        except TimeoutError:
            self._kill(rid)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(fut, 10)  # the reply comes once the process group is dead
            raise CommandTimeout(self.transport.name, f"command {command!r} did not finish within {limit:g}s") from None
        except asyncio.CancelledError:
            self._kill(rid)
            raise
        except (asyncssh.Error, OSError):
            raise self.transport.lost_error(command) from None
        finally:
            self._pending.pop(rid, None)
        if msg.get("cut"):
            raise OutputTooLarge(
                self.transport.name,
                f"command {command!r} printed more than {self.transport.output_limit:,} bytes; stopped it",
            )
        rc = msg.get("rc")
        return rc, base64.b64decode(msg.get("out", "")), base64.b64decode(msg.get("err", ""))

    def _kill(self, rid: int) -> None:
        with contextlib.suppress(Exception):
            self._send({"kill": rid})

    def close(self) -> None:
        self.alive = False
        with contextlib.suppress(Exception):
            self.proc.stdin.write_eof()
        with contextlib.suppress(Exception):
            self.proc.close()
