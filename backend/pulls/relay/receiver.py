"""The receiving side of a relay node: :class:`Receiver` reads this node's copy from its upstream,
writes each object as a direct pull does (a temporary in s5cmd's naming, renamed once verified),
checks each object against the listing's proof, and re-attaches up the tree when its upstream
dies, goes silent or is fed far slower than its siblings.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from backend.agent.context import JobContext
from backend.errors import JobError
from backend.pulls.integrity import MD5, MD5_MULTIPART
from backend.pulls.relay.holdings import (
    CONNECT_S,
    MAX_DONE_NAMES,
    SILENCE_S,
    Cancelled,
    CorruptObject,
    FatalUpstream,
    Holdings,
    LocalWriteError,
    RateWindow,
)
from backend.pulls.relay.proofs import ObjectProof, ProofPipe, receiver_proofs
from backend.pulls.relay.protocol import (
    Chunk,
    ChunkCheck,
    FrameCodec,
    Message,
    ProtocolError,
    client_handshake,
    count_in,
    rate_in,
    read_frame,
    tune,
)

#: An upstream fed at under SLOW_RATIO of its fastest sibling's rate for SLOW_S is a slow node:
#: its children re-attach above it. (A chain has no siblings: it never reshapes itself.)
SLOW_S = 5.0
SLOW_RATIO = 0.5
#: How long a receiver waits for its planned upstream to come up before it tries the nodes above.
START_S = 5.0


class _SlowUpstream(ProtocolError):
    """The upstream is fed far slower than its siblings: this node re-attaches above it."""


class _SeedFailed(ProtocolError):
    """The seed of this node's tree failed: its chain is dropped, other seeds are tried."""


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
        silence_s: float = SILENCE_S,
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
        #: Without a frame from the upstream for this long (``[pull] relay_silence``), it is taken
        #: as frozen and this node re-attaches above it.
        self.silence_s = silence_s
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
        #: Told the nodes whose subtree is done at the upstream (each ping carries them): this
        #: node's server stops waiting for a child of its own among them that left it.
        self.on_done_below: Callable[[list[str]], None] | None = None

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
                self.md5.start(i, proof.algorithm, proof.part_size)
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
            if proof.algorithm == MD5_MULTIPART:
                raise CorruptObject(
                    f"{o.rel} has multipart MD5 {got} but the listing's ETag is {o.etag}: corrupted or forged "
                    f"upstream of {self.upstream} (removed)"
                )
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
        sock.settimeout(self.silence_s)
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
            try:
                kind, payload, tag = read_frame(sock)
            except TimeoutError:  # still a TimeoutError: run() asks a silent upstream last
                raise TimeoutError(f"silent for {self.silence_s:g}s") from None
            msg = check.frame(kind, payload, tag)
            if isinstance(msg, Chunk):
                self._write(msg)
                check.accepted(msg)
                self.rate.add(h.bytes_done)
                continue
            t = msg.get("t")
            if t == "ping":
                self._heard_done(msg)
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
                    if isinstance(msg, dict) and msg.get("t") == "ping":
                        self._heard_done(msg)
                    if isinstance(msg, dict) and msg.get("t") == "cancel":
                        self.ctx.log(f"relay: {self.upstream} cancelled the pull")
                        self.ctx.request_cancel()
                        return
            except (OSError, ConnectionError, ProtocolError):
                return

        threading.Thread(target=read, name="relay-watch", daemon=True).start()

    def _heard_done(self, ping: Message) -> None:
        """A ping's list of nodes done at the upstream (a peer's list is data: at most
        MAX_DONE_NAMES names of at most 255 characters, else the connection ends)."""
        names = ping.get("done", [])
        if (
            not isinstance(names, list)
            or len(names) > MAX_DONE_NAMES
            or not all(isinstance(n, str) and 0 < len(n) <= 255 for n in names)
        ):
            raise ProtocolError(f"ping: 'done' {str(names)[:40]!r} is not a list of node names")
        if names and self.on_done_below is not None:
            self.on_done_below(names)

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
