"""One node of a relay pull: what it holds, the server its children read from, the receiver that
reads from its upstream.

Every node serves its children from its own disk: :class:`Holdings` says, per object, how many
bytes are verified and written and in which file (the temporary while it arrives, the final
name once renamed). A child is served independently of its siblings, from wherever it is, so a
slow child holds back only its own subtree, and a child that re-attaches (its upstream died) to
any node above it resumes from the last verified byte: every node above has at least what the
dead one had.

A receiver writes each object as a direct pull does: a temporary beside the final name in
s5cmd's own naming scheme (so the pull's cleanup recognises it), renamed once every byte is
verified and the size matches the listing. Every byte it has passed a SHA-256 check on each hop
from the seed's file, and the seed's copy passed the direct pull's own verification (sizes, a
fresh listing's ETags, MD5 of single-part objects) before any receiver may end: its end message
says so, and only then does a receiver finish. A receiver hashes each chunk once (to check it)
and forwards it with that digest; the seed hashes each chunk once, whatever its children.

A peer is data, not authority, even one holding the secret: each receiver checks an object's
bytes against the listing before the object is renamed into place, with the proof a direct pull
would choose (:func:`receiver_proofs`): the store's full-object checksum (CRC64NVME, CRC32C, CRC32,
SHA-256, SHA-1) where the spec carries one, else a single-part object's MD5 ETag (the listing comes
from the console in the spec, not from a peer); every number in a message is range-checked
(:func:`count_in`, :func:`rate_in`); a handshake has :data:`HANDSHAKE_S` in all and handshakes
have a cap of their own (:data:`MAX_HANDSHAKES`), so peers without the secret never take a real
child's place; and a local write error (a full disk, EIO) fails the receiver with one line naming
DEST instead of re-attaching for ever.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import os
import queue
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from backend.agent.context import JobContext
from backend.errors import JobError
from backend.pulls.integrity import ALGORITHMS, MD5, ChecksumUnavailable, Hasher, new_hasher
from backend.pulls.objects import PulledObject
from backend.pulls.relay.protocol import (
    HANDSHAKE_S,
    Chunk,
    ChunkCheck,
    FrameCodec,
    Message,
    ProtocolError,
    client_handshake,
    count_in,
    rate_in,
    read_frame,
    send_parts,
    server_handshake,
    tune,
)

#: A connected child hears from its upstream at least this often (a ping when there is no data).
PING_S = 1.0
#: Without a frame for this long, the upstream is taken as dead and the child re-attaches.
SILENCE_S = 5.0
CONNECT_S = 2.0
#: How often an upstream tells a child how fast it is fed, against its fastest sibling.
STAT_S = 1.0
#: An upstream fed at under SLOW_RATIO of its fastest sibling's rate for SLOW_S is a slow node:
#: its children re-attach above it. (A chain has no siblings: it never reshapes itself.)
SLOW_S = 5.0
SLOW_RATIO = 0.5
#: Peers a node's relay serves at once once they proved the secret (children, re-attaching
#: grandchildren).
MAX_CONNECTIONS = 64
#: Connections still in their handshake (no secret proved yet), on a cap of their own: when it is
#: full the oldest is dropped for the new one, so slow peers without the secret take no place of a
#: real child (whose handshake is one round trip) and each has at most HANDSHAKE_S anyway.
MAX_HANDSHAKES = 16
#: How long a receiver waits for its planned upstream to come up before it tries the nodes above.
START_S = 5.0


def listing_digest(objects: list[PulledObject]) -> str:
    """What every node of one relay must agree on: the objects, their sizes and ETags."""
    return hashlib.sha256(json.dumps([list(o) for o in objects]).encode()).hexdigest()


class Cancelled(JobError):
    """The relay was cancelled (here or by a peer)."""


class FatalUpstream(JobError):
    """The seed above this node failed (its source did) and no other seed is left to try."""


class _SlowUpstream(ProtocolError):
    """The upstream is fed far slower than its siblings: this node re-attaches above it."""


class _SeedFailed(ProtocolError):
    """The seed of this node's tree failed: its chain is dropped, other seeds are tried."""


class LocalWriteError(JobError):
    """This node cannot write DEST (a full disk, an I/O error): fatal here, never re-attached."""


class CorruptObject(JobError):
    """An object arrived whole but its bytes do not match the listing's checksum or MD5: fatal here."""


class Holdings:
    """What this node has of each object, shared by its receiver (or s5cmd) and its server."""

    def __init__(self, dest: Path, objects: list[PulledObject]) -> None:
        self.dest = dest
        self.objects = objects
        self.sizes = [o.size for o in objects]
        self.avail = [0] * len(objects)
        self.path: list[Path | None] = [None] * len(objects)
        self.complete = [False] * len(objects)
        #: Set when this node's whole copy is verified: the end message its children get.
        self.end: Message | None = None
        #: Set when this node cannot finish: its children are told and fail or re-attach.
        self.error: str | None = None
        self.fatal = False
        #: How fast this node is fed, and its fastest sibling (bytes/s), as its upstream saw it.
        self.fed_bps = 0.0
        self.sibling_bps = 0.0
        self.cancelled = False
        self.cond = threading.Condition()
        #: (object, offset) -> (length, SHA-256) of each chunk hashed or received here: a chunk is
        #: forwarded with the digest it arrived with (or was first hashed with), not hashed again.
        self.digests: dict[tuple[int, int], tuple[int, bytes]] = {}

    def digest(self, index: int, offset: int, data: bytes | memoryview) -> bytes:
        known = self.digests.get((index, offset))
        if known is not None and known[0] == len(data):
            return known[1]
        d = hashlib.sha256(data).digest()
        self.digests[(index, offset)] = (len(data), d)
        return d

    def publish(self, index: int, avail: int, path: Path, *, complete: bool = False) -> None:
        with self.cond:
            self.avail[index] = avail
            self.path[index] = path
            self.complete[index] = complete or self.complete[index]
            self.cond.notify_all()

    def finish(self, end: Message) -> None:
        with self.cond:
            self.end = end
            self.cond.notify_all()

    def fail(self, error: str, *, fatal: bool = False) -> None:
        """This node cannot finish; ``fatal`` when no node below can finish without it (a seed:
        its source failed), else its children re-attach above it."""
        with self.cond:
            self.error = error
            self.fatal = fatal
            self.cond.notify_all()

    def cancel(self) -> None:
        with self.cond:
            self.cancelled = True
            self.cond.notify_all()

    @property
    def bytes_done(self) -> int:
        return sum(self.avail)

    @property
    def items_done(self) -> int:
        return sum(self.complete)


class RateWindow:
    """Bytes per second over the last few seconds of (time, bytes so far) points."""

    def __init__(self, span_s: float = 3.0) -> None:
        self.span_s = span_s
        self.points: list[tuple[float, int]] = []

    def add(self, nbytes: int) -> None:
        now = time.time()
        self.points = [p for p in self.points if now - p[0] <= self.span_s] + [(now, nbytes)]

    def bps(self) -> float:
        if len(self.points) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self.points[0], self.points[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


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
                    conn.sendall(outbound.ctrl({"t": "ping"}))
                    last = time.monotonic()
        finally:
            for fd in fds.values():
                os.close(fd)
            gone.wait(0.1 if st.done else 0)


def _family(addr: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


@dataclass(frozen=True)
class Upstream:
    name: str
    addr: str
    port: int


class _Temp:
    """One object arriving: its temporary file and descriptor."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd


def temp_name(final: Path) -> Path:
    """A temporary beside ``final`` in s5cmd's scheme (name + decimal uint32), as a direct pull's."""
    return final.with_name(f"{final.name}{random.randint(1, 2**32 - 1)}")


class Receiver:
    """Reads this node's copy from its upstream, re-attaching up the tree when the upstream dies."""

    def __init__(
        self,
        holdings: Holdings,
        ctx: JobContext,
        *,
        secret: str,
        group: str,
        me: str,
        upstreams: list[Upstream],
        reattach_s: float,
        chain_len: int | None = None,
        proofs: list[ObjectProof | None] | None = None,
    ) -> None:
        self.h = holdings
        self.ctx = ctx
        self.secret = secret
        self.group = group
        self.me = me
        self.upstreams = upstreams
        #: How many of ``upstreams`` are this node's own chain up to its seed (the rest: other seeds).
        self.chain_len = len(upstreams) if chain_len is None else chain_len
        self.reattach_s = reattach_s
        self.temps: dict[int, _Temp] = {}
        self.upstream: str | None = None
        self.attachments: list[dict[str, object]] = []
        self.end: Message | None = None
        self.sock: socket.socket | None = None
        self.codec: FrameCodec | None = None
        self.check: ChunkCheck | None = None
        self.rate = RateWindow()
        #: What each object's bytes are checked against before it is renamed, from the console's
        #: spec (never a peer): the store's full-object checksum where the spec carries one, else
        #: a single-part object's MD5 ETag (:func:`receiver_proofs`); None: the per-hop SHA-256 only.
        self.proofs = proofs if proofs is not None else receiver_proofs(holdings.objects, None)
        #: The checksum of each such object's bytes (chunks arrive in order), computed beside the
        #: receive loop.
        self.md5 = ProofPipe()
        self.md5_verified = 0
        #: Objects proven, by method ("md5", "crc64nvme", "sha256", ...).
        self.verified: dict[str, int] = {}

    # -- writing ------------------------------------------------------------------------------

    def prepare_empty(self) -> None:
        """Objects of zero bytes have no chunks: written (and renamed) at once."""
        for i, o in enumerate(self.h.objects):
            if o.size == 0:
                final = self.h.dest / o.rel
                try:
                    final.parent.mkdir(parents=True, exist_ok=True)
                    tmp = temp_name(final)
                    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
                    os.replace(tmp, final)
                except OSError as exc:
                    raise self._write_error(exc, o.rel) from None
                self.h.publish(i, 0, final, complete=True)

    def _write_error(self, exc: OSError, rel: str) -> LocalWriteError:
        """One line naming DEST: a local disk that fails (ENOSPC, EIO) fails here, whoever sends."""
        why = exc.strerror or type(exc).__name__
        return LocalWriteError(f"cannot write to DEST {self.h.dest}: {why} (writing {rel}); nothing more is received")

    def _write(self, chunk: Chunk) -> None:
        i = chunk.index
        o = self.h.objects[i]
        try:
            end = self._write_chunk(chunk)
        except OSError as exc:
            raise self._write_error(exc, o.rel) from None
        if end < o.size:
            return
        t = self.temps.pop(i)
        try:
            os.close(t.fd)
            self._check_proof(i, t.path)
            final = self.h.dest / o.rel
            os.replace(t.path, final)
        except OSError as exc:
            raise self._write_error(exc, o.rel) from None
        self.h.publish(i, end, final, complete=True)

    def _write_chunk(self, chunk: Chunk) -> int:
        """Write ``chunk`` to its object's temporary; where the object's written bytes end now."""
        i = chunk.index
        o = self.h.objects[i]
        t = self.temps.get(i)
        if t is None:
            final = self.h.dest / o.rel
            final.parent.mkdir(parents=True, exist_ok=True)
            path = temp_name(final)
            t = self.temps[i] = _Temp(path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            if (proof := self.proofs[i]) is not None:
                self.md5.start(i, proof.algorithm)
        written = os.pwrite(t.fd, chunk.data, chunk.offset)
        if written != len(chunk.data):
            raise OSError(errno.ENOSPC, f"short write ({written} of {len(chunk.data)} bytes); is the disk full?")
        self.md5.add(i, chunk.data)
        self.h.digests[(i, chunk.offset)] = (written, chunk.digest)
        end = chunk.offset + written
        if end < o.size:
            self.h.publish(i, end, t.path)
        return end

    def _check_proof(self, index: int, tmp: Path) -> None:
        """An object's bytes against the listing's proof: the store's full-object checksum, else
        the MD5 ETag of a single-part object (the receiver has the listing from the console, not
        from a peer): a mismatch removes it and fails this node."""
        got = self.md5.digest(index)
        proof = self.proofs[index]
        if got is None or proof is None:
            return
        o = self.h.objects[index]
        if got != proof.expected:
            tmp.unlink(missing_ok=True)
            if proof.algorithm == MD5:
                raise CorruptObject(
                    f"{o.rel} has MD5 {got} but the listing's ETag is {o.etag}: corrupted or forged upstream "
                    f"of {self.upstream} (removed; an SSE-KMS object's ETag is not its MD5: pull those directly)"
                )
            raise CorruptObject(
                f"{o.rel} has {proof.algorithm.upper()} {got} but the store's checksum is {proof.expected}: "
                f"corrupted or forged upstream of {self.upstream} (removed)"
            )
        self.verified[proof.algorithm] = self.verified.get(proof.algorithm, 0) + 1
        if proof.algorithm == MD5:
            self.md5_verified += 1

    def remove_temps(self) -> None:
        self.md5.close()
        for t in self.temps.values():
            with contextlib.suppress(OSError):
                os.close(t.fd)
            t.path.unlink(missing_ok=True)
        self.temps.clear()

    # -- the connection -----------------------------------------------------------------------

    def rate_bps(self) -> float:
        return self.rate.bps()

    def run(self) -> None:
        """Receive every object and the upstream's end message (its copy verified)."""
        lost_since: float | None = None
        last_error = ""
        started = time.monotonic()
        started_at = time.time()
        #: Upstreams that went silent (frozen, not dead) or were slow: tried after the others.
        avoid: list[str] = []
        why = "start"
        while True:
            # At the start the planned upstream may still be starting its job: it alone is tried
            # for a while, so the plan's chain is kept (the nodes above it are a fallback).
            first = not self.attachments and time.monotonic() - started < START_S
            order = self.upstreams[:1] if first else self.upstreams
            if avoid:  # a frozen node still accepts connections, a slow one stays slow: ask them last
                order = [u for u in order if u.name not in avoid] + [u for u in order if u.name in avoid]
            for up in order:
                if self.ctx.cancelled:
                    raise Cancelled("cancelled")
                try:
                    sock, key = self._connect(up)
                except (OSError, ConnectionError, ProtocolError) as exc:
                    last_error = f"{up.name}: {exc}"
                    continue
                self.upstream = up.name
                self.attachments.append(
                    {
                        "upstream": up.name,
                        "t": time.time(),
                        "at_bytes": self.h.bytes_done,
                        "after_s": None if lost_since is None else round(time.time() - lost_since, 3),
                        "why": why,
                    }
                )
                if lost_since is not None:
                    self.ctx.log(f"relay: re-attached to {up.name} after {time.time() - lost_since:.1f}s")
                else:
                    self.ctx.log(f"relay: attached to {up.name}")
                at_bytes = self.h.bytes_done
                try:
                    self._stream(sock, key)
                    return
                except (OSError, ConnectionError, ProtocolError) as exc:
                    with contextlib.suppress(OSError):
                        sock.close()
                    self.sock = None
                    if isinstance(exc, _SeedFailed):
                        # Every node of this chain has only what its seed had: the other seeds, if any.
                        self.upstreams, self.chain_len = self.upstreams[self.chain_len :], 0
                        if not self.upstreams:
                            raise FatalUpstream(str(exc)) from None
                    last_error = f"{up.name}: {exc}"
                    # Lost since the last byte that arrived: an upstream that accepts and then
                    # sends nothing good (or garbage) does not keep this node re-attaching for ever.
                    if lost_since is None or self.h.bytes_done > at_bytes:
                        lost_since = time.time()
                    if isinstance(exc, TimeoutError | _SlowUpstream) and up.name not in avoid:
                        avoid.append(up.name)
                    why = f"{'slow' if isinstance(exc, _SlowUpstream) else 'lost'} {up.name}: {exc}"[:200]
                    self.ctx.log(f"relay: lost {up.name} ({exc}); re-attaching from byte {self.h.bytes_done}")
                    break  # start again from the nearest upstream
            # Never attached: the time since the start counts (the first window included).
            since = lost_since if lost_since is not None else started_at
            if time.time() - since > self.reattach_s:
                names = ", ".join(u.name for u in self.upstreams)
                raise JobError(f"no upstream answered for {self.reattach_s:g}s ({names}); last: {last_error}")
            if self.ctx.wait_cancelled(0.3):
                raise Cancelled("cancelled")

    def _connect(self, up: Upstream) -> tuple[socket.socket, bytes]:
        sock = socket.create_connection((up.addr, up.port), timeout=CONNECT_S)
        try:
            sock.settimeout(CONNECT_S + 1)
            key = client_handshake(sock, self.secret, self.group, self.me)
        except BaseException:
            sock.close()
            raise
        return sock, key

    def _stream(self, sock: socket.socket, key: bytes) -> None:
        h = self.h
        tune(sock)
        sock.settimeout(SILENCE_S)
        out = FrameCodec(key)
        check = ChunkCheck(key, list(h.sizes), list(h.avail))
        sock.sendall(out.ctrl({"t": "want", "have": list(h.avail)}))
        slow_since: float | None = None
        self.sock, self.codec, self.check = sock, out, check
        while True:
            if self.ctx.cancelled:
                with contextlib.suppress(OSError):
                    sock.sendall(out.ctrl({"t": "cancel"}))
                raise Cancelled("cancelled")
            kind, payload, tag = read_frame(sock)
            msg = check.frame(kind, payload, tag)
            if isinstance(msg, Chunk):
                self._write(msg)
                check.accepted(msg)
                self.rate.add(h.bytes_done)
                continue
            t = msg.get("t")
            if t == "ping":
                continue
            if t == "stat":
                h.fed_bps, h.sibling_bps = rate_in(msg.get("you_bps"), "stat"), rate_in(msg.get("best_bps"), "stat")
                up, best = rate_in(msg.get("up_bps"), "stat"), rate_in(msg.get("up_best_bps"), "stat")
                # Slow: the upstream is fed far slower than its siblings are, by the same node.
                if best > 0 and up < SLOW_RATIO * best and len(self.upstreams) > 1 and not all(h.complete):
                    slow_since = slow_since or time.monotonic()
                    if time.monotonic() - slow_since >= SLOW_S:
                        raise _SlowUpstream(
                            f"fed at {up * 8 / 1e6:.0f} Mbps while its fastest sibling gets {best * 8 / 1e6:.0f} Mbps"
                        )
                else:
                    slow_since = None
                continue
            if t == "cancel":
                self.ctx.log(f"relay: {self.upstream} cancelled the pull")
                self.ctx.request_cancel()
                raise Cancelled("cancelled")
            if t == "failed":
                why = f"upstream {self.upstream} failed: {str(msg.get('error'))[:300]}"
                if msg.get("fatal") is True:
                    raise _SeedFailed(why)
                raise ProtocolError(why)  # a receiver above failed: re-attach to the node above it
            if t == "end":
                if not all(h.complete):
                    raise ProtocolError("the upstream ended before every object was sent")
                if not isinstance(msg.get("listing"), str):
                    raise ProtocolError("the upstream's end names no listing")
                self.end = {
                    "listing": msg["listing"],
                    "md5_verified": count_in(msg.get("md5_verified", 0), len(h.objects), "end md5_verified"),
                }
                return
            raise ProtocolError(f"unexpected control message {str(t)[:40]!r}")

    def watch(self) -> None:
        """After the copy: keep reading the upstream (pings) so a cancel from above still arrives."""
        sock, check = self.sock, self.check
        if sock is None or check is None:
            return

        def read() -> None:
            try:
                while True:
                    msg = check.frame(*read_frame(sock))
                    if isinstance(msg, dict) and msg.get("t") == "cancel":
                        self.ctx.log(f"relay: {self.upstream} cancelled the pull")
                        self.ctx.request_cancel()
                        return
            except (OSError, ConnectionError, ProtocolError):
                return

        threading.Thread(target=read, name="relay-watch", daemon=True).start()

    def send(self, msg: Message) -> None:
        """A message to the upstream on the connection the copy came over (done, cancel)."""
        if self.sock is None or self.codec is None:
            return
        with contextlib.suppress(OSError):
            self.sock.sendall(self.codec.ctrl(msg))

    def close(self) -> None:
        self.md5.close()
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None


@dataclass(frozen=True)
class ObjectProof:
    """What one received object's bytes must give: ``algorithm`` ("md5", or one of the store's
    full-object checksums) and the value as the listing writes it (MD5 hex; checksum base64)."""

    algorithm: str
    expected: str


def receiver_proofs(
    objects: list[PulledObject], checksums: object, *, crt: bool | None = None
) -> list[ObjectProof | None]:
    """Each object's proof for a receiver, chosen as a direct pull chooses
    (``backend.pulls.integrity.choose_proof``): the store's full-object checksum where the spec
    lists one (``checksums``: one ``"ALGORITHM:BASE64"`` or None per object, from the console's
    HEADs), else the MD5 ETag of a single-part object, else None (the per-hop SHA-256 alone: a
    multipart object without a full-object checksum). A malformed entry is no proof: the next
    weaker one is used."""
    from backend.pulls.integrity import choose_proof, crt_available, parse_checksum_value

    have_crt = crt_available() if crt is None else crt
    listed = checksums if isinstance(checksums, list) and len(checksums) == len(objects) else [None] * len(objects)
    out: list[ObjectProof | None] = []
    for o, text in zip(objects, listed, strict=True):
        found = []
        if isinstance(text, str) and ":" in text:
            alg, _, value = text.partition(":")
            c = parse_checksum_value(alg.lower(), value, "FULL_OBJECT")
            if c is not None:
                found.append(c)
        proof = choose_proof(o.size, o.etag, found, crt=have_crt)
        if proof.algorithm in ALGORITHMS and proof.parts is None and isinstance(proof.expected, bytes):
            out.append(ObjectProof(proof.algorithm, base64.b64encode(proof.expected).decode()))
        elif proof.method == MD5 and isinstance(proof.expected, str):
            out.append(ObjectProof(MD5, proof.expected))
        else:
            out.append(None)
    return out


class ProofPipe:
    """The checksum of objects' bytes on a thread of its own (MD5, or the store's full-object
    algorithm: CRC64NVME, CRC32C, CRC32, SHA-256, SHA-1), so the receive loop (SHA-256 check,
    write, forward) and the checksum each take a core; hashlib and awscrt release the GIL on
    large buffers. At most :data:`MD5_BACKLOG` chunks wait (each is its own buffer: nothing
    reuses it meanwhile)."""

    def __init__(self) -> None:
        self.q: queue.Queue[tuple[int, bytes | memoryview | None, threading.Event | None] | None] = queue.Queue(
            MD5_BACKLOG
        )
        self.hashes: dict[int, tuple[str, Hasher]] = {}
        self.done: dict[int, str] = {}
        self.thread: threading.Thread | None = None

    def start(self, index: int, algorithm: str = MD5) -> None:
        """Object ``index`` is hashed with ``algorithm`` from its first byte on."""
        try:
            self.hashes[index] = (algorithm, new_hasher(algorithm))
        except ChecksumUnavailable as exc:
            raise JobError(f"cannot check the received objects: {exc}") from None
        if self.thread is None:
            self.q = queue.Queue(MD5_BACKLOG)
            self.thread = threading.Thread(target=self._run, args=(self.q,), name="relay-md5", daemon=True)
            self.thread.start()

    def add(self, index: int, data: bytes | memoryview) -> None:
        if index in self.hashes:
            self.q.put((index, data, None))

    def digest(self, index: int) -> str | None:
        """The checksum of every byte added for ``index``, once hashed (MD5 as hex, the others as
        base64, as S3 writes them); None when not hashed."""
        if index not in self.hashes:
            return None
        ev = threading.Event()
        self.q.put((index, None, ev))
        while not ev.wait(1.0):
            if self.thread is None or not self.thread.is_alive():
                raise JobError("the checksum of the received objects stopped")
        self.hashes.pop(index, None)
        got = self.done.pop(index, None)
        if got is None:  # closed meanwhile: nothing proves these bytes
            raise JobError("the checksum of the received objects stopped")
        return got

    def close(self) -> None:
        if self.thread is not None and self.thread.is_alive():
            with contextlib.suppress(queue.Full):
                self.q.put(None, timeout=5)
        self.thread = None
        self.hashes.clear()

    def _run(self, q: queue.Queue[tuple[int, bytes | memoryview | None, threading.Event | None] | None]) -> None:
        while (item := q.get()) is not None:
            index, data, ev = item
            held = self.hashes.get(index)  # None once closed: what is left is dropped
            if ev is not None:
                if held is not None:
                    alg, h = held
                    self.done[index] = h.digest().hex() if alg == MD5 else base64.b64encode(h.digest()).decode()
                ev.set()
            elif data is not None and held is not None:
                held[1].update(data)


#: The name this had while it hashed MD5 alone.
Md5Pipe = ProofPipe


#: Chunks waiting for the MD5 thread at most (with 4 MiB chunks: 64 MiB).
MD5_BACKLOG = 16


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
