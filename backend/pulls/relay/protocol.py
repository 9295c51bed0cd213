"""The peer protocol of a relay pull: handshake, frames, and the chunk checks a receiver makes.

A connection goes child -> upstream. Both ends hold the job's relay secret (from the 0600
secrets file, never argv). The handshake proves it both ways without sending it:

1. child: ``HELLO {"v": 1, "group", "node", "nonce"}``
2. upstream: ``{"nonce", "proof"}`` with proof = HMAC(secret, "server" | group | cnonce | snonce)
3. child: ``{"proof"}`` with HMAC(secret, "client" | group | node | cnonce | snonce); the
   upstream answers ``{"ok": true}`` or closes.

Both then key every frame with ``HMAC(secret, "session" | cnonce | snonce)``. A frame is
``type (1 B) | length (4 B) | payload | mac (32 B)``; the mac covers the direction's sequence
number, the type and, for a control frame, its JSON payload, for a chunk its header (object
index, offset, length) and the SHA-256 of its data. A receiver (:class:`ChunkCheck`) accepts a
chunk only when the sequence number is the next one, the mac and the SHA-256 match, and the chunk
continues its object exactly where the verified bytes end; anything else ends the connection
before a byte of it is written or forwarded.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import socket
import struct
import time
from dataclasses import dataclass

from backend.errors import JobError

VERSION = 1
CTRL = 1
CHUNK = 2
_FRAME = struct.Struct("!BI")
_CHUNK = struct.Struct("!IQI32s")  # index, offset, length, sha256(data)
_MAC_LEN = 32
#: The largest chunk a receiver takes, and the largest control frame (an object list).
MAX_CHUNK = 64 << 20
MAX_CTRL = 64 << 20
SECRET_ENV = "LOADMASTER_RELAY_SECRET"
#: The whole handshake, both ways, in at most this long: a peer that trickles its bytes (one every
#: few seconds, each within a socket timeout) is dropped all the same.
HANDSHAKE_S = 3.0


class ProtocolError(JobError):
    """A peer sent something that is not the protocol (or not authentic): the connection ends."""


class AuthError(ProtocolError):
    """The peer does not hold this job's relay secret."""


#: A control message: a JSON object. Its values are a peer's data, read through :func:`count_in`,
#: :func:`rate_in` and ``str()``, never trusted as typed.
Message = dict[str, object]

#: The largest rate (bytes/s) a peer's message may state: far above any network (8 Pb/s).
MAX_RATE_BPS = 1e15


def count_in(value: object, high: int, what: str) -> int:
    """``value`` as an int in [0, ``high``], or :class:`ProtocolError` naming ``what`` (a peer's
    number is data: a string, a bool, a float or 1e30 ends the connection, not the thread)."""
    if type(value) is not int or not 0 <= value <= high:
        raise ProtocolError(f"{what}: {str(value)[:40]!r} is not a whole number from 0 to {high}")
    return value


def rate_in(value: object, what: str) -> float:
    """``value`` as a finite rate in [0, :data:`MAX_RATE_BPS`] bytes/s, or :class:`ProtocolError`."""
    if (type(value) is int or type(value) is float) and 0 <= value <= MAX_RATE_BPS:  # NaN fails both
        return float(value)
    raise ProtocolError(f"{what}: {str(value)[:40]!r} is not a rate from 0 to {MAX_RATE_BPS:g} bytes/s")


def new_secret() -> str:
    return secrets.token_hex(32)


def _mac(key: bytes, *parts: bytes | bytearray) -> bytes:
    return hmac.new(key, b"|".join(parts), hashlib.sha256).digest()


@dataclass(frozen=True)
class Chunk:
    """A verified piece of one object: ``data`` belongs at ``offset`` of object ``index``."""

    index: int
    offset: int
    data: bytes | memoryview
    #: The SHA-256 of ``data`` the sender sent and the receiver checked (forwarded with it).
    digest: bytes = b""


class FrameCodec:
    """Frames of one direction of one connection: sequence numbers and macs under the session key."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.seq = 0

    def _tag(self, kind: int, meta: bytes) -> bytes:
        return _mac(self.key, self.seq.to_bytes(8, "big"), bytes([kind]), meta)

    def ctrl(self, msg: Message) -> bytes:
        payload = json.dumps(msg, separators=(",", ":")).encode()
        frame = _FRAME.pack(CTRL, len(payload)) + payload + self._tag(CTRL, payload)
        self.seq += 1
        return frame

    def chunk(self, index: int, offset: int, data: bytes, digest: bytes | None = None) -> bytes:
        """A chunk frame; ``digest`` is the data's SHA-256 when the caller has it already."""
        return b"".join(self.chunk_parts(index, offset, data, digest))

    def chunk_parts(self, index: int, offset: int, data: bytes, digest: bytes | None = None) -> list[bytes]:
        """The same frame as its pieces, for :func:`send_parts` (the data is not copied)."""
        head = _CHUNK.pack(index, offset, len(data), digest or hashlib.sha256(data).digest())
        parts = [_FRAME.pack(CHUNK, len(head) + len(data)) + head, data, self._tag(CHUNK, head)]
        self.seq += 1
        return parts


class ChunkCheck:
    """The receiving side of a connection: what a frame must be to be accepted.

    ``have[i]`` is how many bytes of object ``i`` are verified (and written); ``sizes[i]`` its
    size in the listing. :meth:`frame` returns a control message (dict) or a :class:`Chunk`
    that may be written at once; it raises :class:`ProtocolError` for anything else, and the
    caller drops the connection (a new one resumes from ``have``).
    """

    def __init__(self, key: bytes, sizes: list[int], have: list[int], max_chunk: int = MAX_CHUNK) -> None:
        self.key = key
        self.sizes = sizes
        self.have = have
        self.max_chunk = max_chunk
        self.seq = 0

    def _check_tag(self, kind: int, meta: bytes | bytearray, tag: bytes) -> None:
        want = _mac(self.key, self.seq.to_bytes(8, "big"), bytes([kind]), meta)
        if not hmac.compare_digest(want, tag):
            raise ProtocolError(f"frame {self.seq}: bad MAC (corrupted, reordered or forged)")

    def frame(self, kind: int, payload: bytes | bytearray, tag: bytes) -> Message | Chunk:
        if kind == CTRL:
            self._check_tag(CTRL, payload, tag)
            self.seq += 1
            try:
                msg = json.loads(payload)
            except ValueError:
                raise ProtocolError("control frame is not JSON") from None
            if not isinstance(msg, dict):
                raise ProtocolError("control frame is not an object")
            return msg
        if kind != CHUNK:
            raise ProtocolError(f"unknown frame type {kind}")
        if len(payload) < _CHUNK.size:
            raise ProtocolError("chunk frame too short")
        head = bytes(payload[: _CHUNK.size])
        index, offset, length, digest = _CHUNK.unpack(head)
        self._check_tag(CHUNK, head, tag)
        data = memoryview(payload)[_CHUNK.size :]
        if length != len(data) or length == 0 or length > self.max_chunk:
            raise ProtocolError(f"chunk of object {index}: length {length} does not match its {len(data)} bytes")
        if not hmac.compare_digest(hashlib.sha256(data).digest(), digest):
            raise ProtocolError(f"chunk of object {index} at {offset}: SHA-256 mismatch")
        if index >= len(self.sizes):
            raise ProtocolError(f"chunk of object {index}: there are {len(self.sizes)} objects")
        if offset != self.have[index]:
            raise ProtocolError(f"chunk of object {index} at {offset}: the verified bytes end at {self.have[index]}")
        if offset + length > self.sizes[index]:
            raise ProtocolError(f"chunk of object {index} runs past its size {self.sizes[index]}")
        self.seq += 1
        return Chunk(index, offset, data, digest)

    def accepted(self, chunk: Chunk) -> None:
        """The chunk was written: the verified bytes of its object now end after it."""
        self.have[chunk.index] = chunk.offset + len(chunk.data)


# -- sockets ----------------------------------------------------------------------------------


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    return bytes(recv_buffer(sock, n, deadline))


def recv_buffer(sock: socket.socket, n: int, deadline: float | None = None) -> bytearray:
    """Exactly ``n`` bytes from ``sock``, in a buffer of their own (not copied again); by
    ``deadline`` (a :func:`time.monotonic` time) when given, however slowly the bytes trickle in."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the peer did not finish the handshake in time")
            sock.settimeout(left)
        try:
            k = sock.recv_into(view[got:], n - got)
        except TimeoutError:
            if deadline is None:
                raise
            raise TimeoutError("the peer did not finish the handshake in time") from None
        if k == 0:
            raise ConnectionError("the peer closed the connection")
        got += k
    return buf


def send_parts(sock: socket.socket, parts: list[bytes]) -> None:
    """Send ``parts`` as one stream (scatter-gather: the pieces are not joined first)."""
    views = [memoryview(p) for p in parts if len(p)]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


def tune(sock: socket.socket, buffer_bytes: int = 4 << 20) -> None:
    """Large socket buffers (a chunk in flight per direction) and no Nagle delay."""
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, opt, buffer_bytes)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def read_frame(sock: socket.socket) -> tuple[int, bytearray, bytes]:
    """(type, payload, mac) of the next frame."""
    kind, length = _FRAME.unpack(recv_exact(sock, _FRAME.size))
    limit = MAX_CTRL if kind == CTRL else MAX_CHUNK + _CHUNK.size
    if length > limit:
        raise ProtocolError(f"frame of {length} bytes is over the limit")
    payload = recv_buffer(sock, length)
    return kind, payload, recv_exact(sock, _MAC_LEN)


def _plain(msg: Message) -> bytes:
    """A handshake message (before the session key): length-prefixed JSON."""
    payload = json.dumps(msg, separators=(",", ":")).encode()
    return _FRAME.pack(CTRL, len(payload)) + payload


def _read_plain(sock: socket.socket, deadline: float | None = None) -> Message:
    kind, length = _FRAME.unpack(recv_exact(sock, _FRAME.size, deadline))
    if kind != CTRL or length > 65536:
        raise ProtocolError("handshake: not a loadmaster relay peer")
    try:
        msg = json.loads(recv_exact(sock, length, deadline))
    except ValueError:
        raise ProtocolError("handshake: not a loadmaster relay peer") from None
    if not isinstance(msg, dict):
        raise ProtocolError("handshake: not a loadmaster relay peer")
    return msg


def client_handshake(sock: socket.socket, secret: str, group: str, node: str, timeout_s: float = HANDSHAKE_S) -> bytes:
    """Prove the secret to the upstream and check its proof (within ``timeout_s`` in all); the
    session key."""
    s = secret.encode()
    deadline = time.monotonic() + timeout_s
    cnonce = secrets.token_hex(16)
    sock.sendall(_plain({"v": VERSION, "group": group, "node": node, "nonce": cnonce}))
    reply = _read_plain(sock, deadline)
    if "error" in reply:
        raise AuthError(f"upstream refused the connection: {str(reply['error'])[:200]}")
    snonce = str(reply.get("nonce", ""))
    want = _mac(s, b"server", group.encode(), cnonce.encode(), snonce.encode())
    if not hmac.compare_digest(want.hex(), str(reply.get("proof", ""))):
        raise AuthError("upstream does not hold this job's relay secret")
    proof = _mac(s, b"client", group.encode(), node.encode(), cnonce.encode(), snonce.encode())
    sock.sendall(_plain({"proof": proof.hex()}))
    if not _read_plain(sock, deadline).get("ok"):
        raise AuthError("upstream refused this node's proof")
    return _mac(s, b"session", cnonce.encode(), snonce.encode())


def server_handshake(sock: socket.socket, secret: str, group: str, timeout_s: float = HANDSHAKE_S) -> tuple[str, bytes]:
    """Check a child's proof of the secret (and prove ours) within ``timeout_s`` in all; (its node
    name, the session key)."""
    s = secret.encode()
    deadline = time.monotonic() + timeout_s
    hello = _read_plain(sock, deadline)
    if hello.get("v") != VERSION or hello.get("group") != group:
        sock.sendall(_plain({"error": "not this relay (version or job group differs)"}))
        raise AuthError("a peer of another relay or version connected")
    node, cnonce = str(hello.get("node", "")), str(hello.get("nonce", ""))
    if not cnonce or len(cnonce) > 64 or not node or len(node) > 255:
        raise AuthError("handshake: malformed hello")
    snonce = secrets.token_hex(16)
    proof = _mac(s, b"server", group.encode(), cnonce.encode(), snonce.encode())
    sock.sendall(_plain({"nonce": snonce, "proof": proof.hex()}))
    answer = _read_plain(sock, deadline)
    want = _mac(s, b"client", group.encode(), node.encode(), cnonce.encode(), snonce.encode())
    if not hmac.compare_digest(want.hex(), str(answer.get("proof", ""))):
        sock.sendall(_plain({"error": "wrong relay secret"}))
        raise AuthError(f"{node[:64]!r} does not hold this job's relay secret")
    sock.sendall(_plain({"ok": True}))
    return node, _mac(s, b"session", cnonce.encode(), snonce.encode())
