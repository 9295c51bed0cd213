"""The serving side of a relay node: :class:`RelayServer` serves this node's holdings to its
children on the cluster address, each child independently from wherever it is, so a slow child
holds back only its own subtree and a child that re-attaches resumes from its last verified byte.

Peers prove the per-job secret in a handshake with a deadline and a cap of its own
(:data:`MAX_HANDSHAKES`), and at most :data:`MAX_CONNECTIONS` proved peers are served at once.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
import time
from dataclasses import dataclass, field

from backend.agent.context import JobContext
from backend.errors import JobError
from backend.pulls.relay.holdings import CONNECT_S, MAX_DONE_NAMES, PING_S, Holdings, RateWindow
from backend.pulls.relay.protocol import (
    HANDSHAKE_S,
    Chunk,
    ChunkCheck,
    FrameCodec,
    ProtocolError,
    count_in,
    read_frame,
    send_parts,
    server_handshake,
    tune,
)

#: How often an upstream tells a child how fast it is fed, against its fastest sibling.
STAT_S = 1.0
#: Peers a node's relay serves at once once they proved the secret (children, re-attaching
#: grandchildren).
MAX_CONNECTIONS = 64
#: Connections still in their handshake (no secret proved yet), on a cap of their own: when it is
#: full the oldest is dropped for the new one, so slow peers without the secret take no place of a
#: real child (whose handshake is one round trip) and each has at most HANDSHAKE_S anyway.
MAX_HANDSHAKES = 16


@dataclass
class ChildState:
    """What this node knows of one child: connections, whether its subtree is done, bytes sent."""

    connected: int = 0
    done: bool = False
    gone_at: float | None = None
    served: int = 0
    rate: RateWindow = field(default_factory=RateWindow)


class RelayServer:
    """Serves this node's holdings to its children on the cluster address (never every address)."""

    def __init__(
        self,
        holdings: Holdings,
        ctx: JobContext,
        *,
        secret: str,
        group: str,
        listen: tuple[str, int],
        planned: list[str],
        chunk_size: int,
        grace_s: float,
        max_bps: float = 0.0,
    ) -> None:
        self.h = holdings
        self.ctx = ctx
        self.secret = secret
        self.group = group
        self.chunk_size = chunk_size
        self.grace_s = grace_s
        #: Bytes per second to each child at most (0: no cap), to share the cluster network.
        self.max_bps = max_bps
        self.children: dict[str, ChildState] = {n: ChildState() for n in planned}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        #: Set when a child is done or goes away (the node's main loop re-checks its subtree).
        self.changed = threading.Event()
        self.ready_at: float | None = None
        self.sock = _listen(listen)
        self.sock.settimeout(0.5)
        self.threads: list[threading.Thread] = []
        #: Connections in their handshake, oldest first; and how many peers proved the secret.
        self.pending: list[socket.socket] = []
        self.attached = 0

    def start(self) -> None:
        t = threading.Thread(target=self._accept, name="relay-accept", daemon=True)
        t.start()
        self.threads.append(t)

    def stop(self) -> None:
        self.stopping.set()
        # shutdown() wakes the accept() blocked in the accept thread at once (on Linux; close()
        # alone does not), so stopping does not wait out the accept timeout (0.5 s).
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()
        with self.h.cond:
            self.h.cond.notify_all()
        for t in self.threads:
            t.join(timeout=5)

    # -- children -----------------------------------------------------------------------------

    def subtree_done(self) -> bool:
        """Every child is done, or gone for longer than the grace (the console retries it)."""
        now = time.time()
        ready = self.ready_at or now
        with self.lock:
            for st in self.children.values():
                if st.done:
                    continue
                if st.connected > 0:
                    return False
                if now - max(st.gone_at or ready, ready) < self.grace_s:
                    return False
        return True

    def done_here(self) -> list[str]:
        """The children whose subtree is done here (at most :data:`MAX_DONE_NAMES`): told to the
        other children in each ping, so a node that a child left is not kept waiting for it."""
        with self.lock:
            return sorted(n for n, st in self.children.items() if st.done)[:MAX_DONE_NAMES]

    def done_elsewhere(self, names: list[str]) -> None:
        """The upstream says these nodes' subtrees are done there: a child of this node among them
        that left (it re-attached above this node) is done, not waited for until the grace ends."""
        with self.lock:
            left = [st for n, st in self.children.items() if n in names and not st.done and not st.connected]
            for st in left:
                st.done = True
        if left:
            self.changed.set()

    def abandoned(self) -> list[str]:
        with self.lock:
            return sorted(n for n, st in self.children.items() if not st.done)

    def served(self) -> dict[str, dict[str, object]]:
        with self.lock:
            return {
                n: {"bytes": st.served, "gbps": round(st.rate.bps() * 8 / 1e9, 3), "done": st.done}
                for n, st in self.children.items()
            }

    # -- connections --------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _addr = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.threads = [x for x in self.threads if x.is_alive()]
            with self.lock:
                if len(self.pending) >= MAX_HANDSHAKES:
                    # The oldest handshake has had the longest; a real child's takes a round trip.
                    with contextlib.suppress(OSError):
                        self.pending.pop(0).shutdown(socket.SHUT_RDWR)
                self.pending.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), name="relay-serve", daemon=True)
            t.start()
            self.threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        name = None
        st: ChildState | None = None
        counted = False
        try:
            try:
                name, key = server_handshake(conn, self.secret, self.group, HANDSHAKE_S)
            finally:
                with self.lock:
                    if conn in self.pending:
                        self.pending.remove(conn)
            with self.lock:
                if self.attached >= MAX_CONNECTIONS:
                    raise ProtocolError(f"{MAX_CONNECTIONS} peers are attached already")
                self.attached += 1
                counted = True
            conn.settimeout(CONNECT_S + 1)
            tune(conn)
            inbound = ChunkCheck(key, [], [])
            outbound = FrameCodec(key)
            kind, payload, tag = read_frame(conn)
            want = inbound.frame(kind, payload, tag)
            have = want.get("have") if isinstance(want, dict) and want.get("t") == "want" else None
            if not isinstance(have, list) or len(have) != len(self.h.sizes):
                raise ProtocolError("the child's 'want' does not match this relay's objects")
            sent = [
                count_in(x, size, f"'want' of object {i}")
                for i, (x, size) in enumerate(zip(have, self.h.sizes, strict=True))
            ]
            with self.lock:
                st = self.children.setdefault(name, ChildState())
                st.connected += 1
                st.done = False
            self.ctx.log(f"relay: {name} attached (has {sum(sent)} of {sum(self.h.sizes)} bytes)")
            self._stream(conn, name, st, inbound, outbound, sent)
        except (OSError, ConnectionError, ProtocolError, ValueError) as exc:
            if not self.stopping.is_set():
                self.ctx.log(f"relay: connection from {name or 'a peer'} ended: {exc}")
        except Exception as exc:  # a serving thread never dies with a traceback
            self.ctx.log(f"relay: connection from {name or 'a peer'} ended: {type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(OSError):
                conn.close()
            if counted:
                with self.lock:
                    self.attached -= 1
            if st is not None:
                with self.lock:
                    st.connected -= 1
                    if not st.done:
                        st.gone_at = time.time()
                self.changed.set()

    def _stream(
        self,
        conn: socket.socket,
        name: str,
        st: ChildState,
        inbound: ChunkCheck,
        outbound: FrameCodec,
        sent: list[int],
    ) -> None:
        h = self.h
        conn.settimeout(30)
        gone = threading.Event()

        def read_child() -> None:
            try:
                while True:
                    kind, payload, tag = read_frame(conn)
                    msg = inbound.frame(kind, payload, tag)
                    if isinstance(msg, Chunk):
                        raise ProtocolError("a child sent a chunk")
                    if msg.get("t") == "done":
                        with self.lock:
                            st.done = True
                        self.changed.set()
                        with h.cond:
                            h.cond.notify_all()
                    elif msg.get("t") == "cancel":
                        self.ctx.log(f"relay: {name} cancelled the pull")
                        self.ctx.request_cancel()
                        h.cancel()
            except (OSError, ConnectionError, ProtocolError):
                pass
            finally:
                gone.set()
                with h.cond:
                    h.cond.notify_all()

        reader = threading.Thread(target=read_child, name="relay-child-read", daemon=True)
        reader.start()
        fds: dict[int, int] = {}
        cur: int | None = None
        end_sent = False
        last = time.monotonic()
        last_stat = 0.0
        paced_from, paced = time.monotonic(), 0
        try:
            while not gone.is_set() and not self.stopping.is_set():
                if time.monotonic() - last_stat >= STAT_S and not end_sent:
                    with self.lock:
                        rates = {n: c.rate.bps() for n, c in self.children.items() if c.connected}
                    stat = {
                        "t": "stat",
                        # how fast this child is fed here and its fastest sibling
                        "you_bps": rates.get(name, 0.0),
                        "best_bps": max(rates.values(), default=0.0),
                        # how fast this node is fed, against its own fastest sibling
                        "up_bps": h.fed_bps,
                        "up_best_bps": h.sibling_bps,
                    }
                    conn.sendall(outbound.ctrl(stat))
                    last_stat = last = time.monotonic()
                if h.cancelled or self.ctx.cancelled:
                    conn.sendall(outbound.ctrl({"t": "cancel"}))
                    return
                if h.error is not None:
                    conn.sendall(outbound.ctrl({"t": "failed", "error": h.error[:500], "fatal": h.fatal}))
                    return
                with h.cond:
                    if cur is None or sent[cur] >= h.sizes[cur]:
                        cur = next((i for i, a in enumerate(h.avail) if a > sent[i]), None)
                    todo = None
                    if cur is not None and h.avail[cur] > sent[cur]:
                        todo = (cur, sent[cur], min(self.chunk_size, h.avail[cur] - sent[cur]), h.path[cur])
                    elif not end_sent and h.end is not None and sent == h.sizes:
                        pass
                    else:
                        h.cond.wait(PING_S)
                if todo is not None:
                    i, off, n, path = todo
                    fd = fds.get(i)
                    if fd is None:
                        assert path is not None
                        fd = fds[i] = os.open(path, os.O_RDONLY)
                    data = os.pread(fd, n, off)
                    if len(data) != n:
                        raise JobError(f"{path}: {len(data)} bytes where {n} were verified")
                    send_parts(conn, outbound.chunk_parts(i, off, data, h.digest(i, off, data)))
                    sent[i] = off + n
                    if sent[i] >= h.sizes[i]:
                        os.close(fds.pop(i))
                    with self.lock:
                        st.served += n
                        st.rate.add(st.served)
                    last = time.monotonic()
                    if self.max_bps > 0:
                        paced += n
                        ahead = paced_from + paced / self.max_bps - last
                        if ahead > 0:
                            time.sleep(min(ahead, 1.0))
                    continue
                if not end_sent and h.end is not None and sent == h.sizes:
                    conn.sendall(outbound.ctrl({"t": "end", **h.end}))
                    end_sent = True
                    last = time.monotonic()
                    continue
                if end_sent and st.done:
                    return
                if time.monotonic() - last >= PING_S:
                    conn.sendall(outbound.ctrl({"t": "ping", "done": self.done_here()}))
                    last = time.monotonic()
        finally:
            for fd in fds.values():
                os.close(fd)
            gone.wait(0.1 if st.done else 0)


def _family(addr: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


#: How long a receiver keeps trying its planned port while something else holds it. No socket
#: held the port when the pull was planned (the probe's ports_taken: listeners, connections and
#: TIME_WAIT alike); an outgoing connection that took it since, as its ephemeral port (the default
#: range lies inside Linux's 32768-60999), may end soon, though its TIME_WAIT holds it 60 s more.
LISTEN_RETRY_S = 5.0


def _listen(listen: tuple[str, int]) -> socket.socket:
    """The relay's listening socket on its planned address and port (the upstream's children
    connect to exactly that), retried for :data:`LISTEN_RETRY_S` while the port is in use."""
    deadline = time.monotonic() + LISTEN_RETRY_S
    while True:
        try:
            return socket.create_server(listen, family=_family(listen[0]), backlog=64)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise JobError(
                f"cannot listen for relay peers on {listen[0]}:{listen[1]}: {exc.strerror}; "
                "set [pull] relay_network to this node's cluster address or relay_ports to a free range"
            ) from None
