"""A hostile relay peer, as a small responder on loopback: an upstream that holds the secret and
forges bytes or numbers, children that send numbers out of range, peers without the secret that
trickle or stall their handshakes, and a receiver whose own disk fills up.

The peer speaks the real protocol (the handshake, MACed frames) through the project's own codec,
so each case reaches the check it is about; the server and the receiver are the real ones.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import backend.pulls.relay.server as server_mod
from backend.agent.context import JobContext
from backend.errors import JobError
from backend.pulls.objects import PulledObject
from backend.pulls.relay.node import CorruptObject, Holdings, LocalWriteError, Receiver, RelayServer, Upstream
from backend.pulls.relay.protocol import (
    MAX_RATE_BPS,
    FrameCodec,
    ProtocolError,
    client_handshake,
    count_in,
    rate_in,
    read_frame,
    server_handshake,
)

SECRET = "right"


def _md5(b: bytes) -> str:
    return hashlib.md5(b, usedforsecurity=False).hexdigest()


def _seed(tmp_path: Path, bodies: list[bytes]) -> Holdings:
    src = tmp_path / "seed"
    src.mkdir()
    objects = []
    for i, body in enumerate(bodies):
        (src / f"obj-{i}").write_bytes(body)
        objects.append(PulledObject(f"obj-{i}", len(body), _md5(body)))
    h = Holdings(src, objects)
    for i, o in enumerate(objects):
        h.publish(i, o.size, src / o.rel, complete=True)
    h.finish({"by": "seed", "listing": "x"})
    return h


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every exception that ends a thread with a traceback (there must be none)."""
    seen: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda a: seen.append(f"{a.exc_type.__name__}: {a.exc_value}"))
    return seen


@pytest.fixture
def seed_server(tmp_path: Path) -> Iterator[tuple[RelayServer, list[str]]]:
    """A real relay server holding two objects, and its log lines."""
    h = _seed(tmp_path, [os.urandom(200_000), os.urandom(3_000)])
    log: list[str] = []
    ctx = JobContext.in_process("relay", {}, on_log=log.append)
    server = RelayServer(
        h, ctx, secret=SECRET, group="g", listen=("127.0.0.1", 0), planned=["child"], chunk_size=1 << 16, grace_s=0
    )
    server.start()
    try:
        yield server, log
    finally:
        server.stop()


def _receiver(
    dest: Path, objects: list[PulledObject], port: int, reattach_s: float = 5.0, proofs: Any = None
) -> Receiver:
    dest.mkdir(parents=True, exist_ok=True)
    return Receiver(
        Holdings(dest, objects),
        JobContext.in_process("relay", {}),
        secret=SECRET,
        group="g",
        me="child",
        upstreams=[Upstream("evil", "127.0.0.1", port)],
        reattach_s=reattach_s,
        proofs=proofs,
    )


class EvilUpstream:
    """An upstream that holds the secret and answers each connection with ``script(conn, codec)``."""

    def __init__(self, script: Callable[[socket.socket, FrameCodec], None]) -> None:
        self.script = script
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.connections = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> EvilUpstream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() at once (not after its timeout)
        self.thread.join(5)
        self.sock.close()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            with conn:
                try:
                    _name, key = server_handshake(conn, SECRET, "g")
                    conn.settimeout(5)
                    read_frame(conn)  # the child's 'want'
                    self.script(conn, FrameCodec(key))
                    _until_closed(conn, 0.2)  # let the child read it all before the close
                except OSError:
                    pass


def _until_closed(conn: socket.socket, at_most_s: float) -> None:
    """Wait until the child closes ``conn`` (it read everything and acted), ``at_most_s`` at most."""
    deadline = time.monotonic() + at_most_s
    with contextlib.suppress(OSError):
        while (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            if not conn.recv(65536):
                return


# -- the receiver: bytes against the listing's MD5 ---------------------------------------------


def test_forged_bytes_with_good_hashes_fail_the_listing_md5_and_are_removed(tmp_path: Path) -> None:
    # The peer holds the secret: its MACs and SHA-256s are right, only the bytes are not the
    # object's. The receiver has the listing (from the console's spec), so it knows.
    real = os.urandom(100_000)
    forged = os.urandom(len(real))
    objects = [PulledObject("obj-0", len(real), _md5(real))]

    def forge(conn: socket.socket, codec: FrameCodec) -> None:
        conn.sendall(codec.chunk(0, 0, forged[:60_000]))
        conn.sendall(codec.chunk(0, 60_000, forged[60_000:]))
        conn.sendall(codec.ctrl({"t": "end", "listing": "x", "md5_verified": 1}))

    with EvilUpstream(forge) as evil:
        recv = _receiver(tmp_path / "dest", objects, evil.port)
        with pytest.raises(CorruptObject) as info:
            recv.run()
    msg = str(info.value)
    assert msg.startswith(f"obj-0 has MD5 {_md5(forged)} but the listing's ETag is {_md5(real)}")
    assert "\n" not in msg
    assert list((tmp_path / "dest").iterdir()) == []  # neither the object nor its temporary
    assert evil.connections == 1  # fatal here: not re-attached to the forger


def test_the_true_bytes_pass_the_md5_and_are_counted(
    tmp_path: Path, seed_server: tuple[RelayServer, list[str]]
) -> None:
    server, _log = seed_server
    recv = _receiver(tmp_path / "dest", server.h.objects, server.sock.getsockname()[1])
    recv.run()
    recv.close()
    assert recv.md5_verified == 2
    for o in server.h.objects:
        assert _md5((tmp_path / "dest" / o.rel).read_bytes()) == o.etag


# -- the receiver: numbers in an upstream's messages ---------------------------------------------

BAD_NUMBERS: list[Any] = [float("nan"), float("inf"), -1, "12", None, True, [1], {"x": 1}, 1e300]


@pytest.mark.parametrize("bad", BAD_NUMBERS, ids=repr)
def test_an_upstream_stat_out_of_range_ends_the_connection_with_one_line(tmp_path: Path, bad: Any) -> None:
    def stat(conn: socket.socket, codec: FrameCodec) -> None:
        payload = {"t": "stat", "you_bps": 1.0, "best_bps": bad, "up_bps": 1.0, "up_best_bps": 1.0}
        conn.sendall(codec.ctrl(payload))

    objects = [PulledObject("obj-0", 10, None)]
    with EvilUpstream(stat) as evil:
        recv = _receiver(tmp_path / "dest", objects, evil.port, reattach_s=0.2)
        with pytest.raises(JobError) as info:
            recv.run()
    msg = str(info.value)
    assert msg.startswith("no upstream answered for 0.2s (evil); last: evil: stat: ")
    assert "is not a rate from 0 to" in msg and "\n" not in msg


def test_an_upstream_that_accepts_and_sends_garbage_does_not_hold_the_receiver_for_ever(tmp_path: Path) -> None:
    # It accepts each connection, then says something that is not the protocol. The receiver's
    # re-attach window counts from its last byte, not from its last connection.
    def junk(conn: socket.socket, codec: FrameCodec) -> None:
        conn.sendall(codec.ctrl({"t": "end", "listing": 7}))

    with EvilUpstream(junk) as evil:
        recv = _receiver(tmp_path / "dest", [PulledObject("obj-0", 10, None)], evil.port, reattach_s=1.0)
        with pytest.raises(JobError, match="no upstream answered for 1s"):
            recv.run()
    assert evil.connections >= 2


# -- the server: numbers in a child's messages ---------------------------------------------------


def _hostile_child(port: int, want: Any) -> bytes:
    """Connect with the secret, send ``want`` as the 'want' message; what the server sent back."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        key = client_handshake(sock, SECRET, "g", "child")
        sock.sendall(FrameCodec(key).ctrl({"t": "want", "have": want}))
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
        return got


@pytest.mark.parametrize("bad", [*BAD_NUMBERS, 10**30, 200_001], ids=repr)
def test_a_child_want_out_of_range_ends_its_connection_not_the_server(
    tmp_path: Path, seed_server: tuple[RelayServer, list[str]], thread_errors: list[str], bad: Any
) -> None:
    server, log = seed_server
    assert _hostile_child(server.sock.getsockname()[1], [bad, 0]) == b""  # nothing served
    assert any("'want' of object 0:" in line and "is not a whole number from 0 to 200000" in line for line in log)
    # The server still serves a real child, and no thread died with a traceback.
    recv = _receiver(tmp_path / "dest", server.h.objects, server.sock.getsockname()[1])
    recv.run()
    recv.close()
    assert thread_errors == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3),
        max_leaves=5,
    )
)
def test_count_and_rate_checks_accept_only_numbers_in_range(value: Any) -> None:
    """Whatever JSON a peer sends, the checks return a number in range or raise ProtocolError."""
    try:
        n = count_in(value, 1000, "x")
    except ProtocolError as exc:
        assert "\n" not in str(exc)
    else:
        assert type(n) is int and 0 <= n <= 1000
    try:
        r = rate_in(value, "x")
    except ProtocolError:
        pass
    else:
        assert 0.0 <= r <= MAX_RATE_BPS


# -- the server: handshakes without the secret ---------------------------------------------------


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (read until EOF or a reset; 30 s at most)."""
    sock.settimeout(30)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def test_stalled_handshakes_without_the_secret_never_take_a_real_child_s_place(
    tmp_path: Path, seed_server: tuple[RelayServer, list[str]]
) -> None:
    server, _log = seed_server
    port = server.sock.getsockname()[1]
    # Far more stalled connections than the handshake cap (each sends half a hello, then nothing).
    stalled = []
    for _ in range(server_mod.MAX_HANDSHAKES * 3):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(struct.pack("!BI", 1, 100) + b'{"v"')
        stalled.append(s)
    try:
        recv = _receiver(tmp_path / "dest", server.h.objects, port)
        recv.run()  # the real child is served at once
        recv.close()
        assert recv.md5_verified == 2
        # The oldest stalled ones were dropped to make room: the cap holds.
        assert _closed(stalled[0])
        assert len(server.pending) <= server_mod.MAX_HANDSHAKES
    finally:
        for s in stalled:
            s.close()


def test_a_handshake_trickled_a_byte_at_a_time_is_dropped_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch, seed_server: tuple[RelayServer, list[str]]
) -> None:
    monkeypatch.setattr(server_mod, "HANDSHAKE_S", 1.0)
    server, log = seed_server
    hello = json.dumps({"v": 1, "group": "g", "node": "slow", "nonce": "ab" * 8}).encode()
    frame = struct.pack("!BI", 1, len(hello)) + hello
    stop = threading.Event()
    with socket.create_connection(("127.0.0.1", server.sock.getsockname()[1]), timeout=5) as sock:

        def trickle() -> None:
            for b in frame:  # each byte well within any per-read timeout
                if stop.wait(0.3):
                    return
                try:
                    sock.send(bytes([b]))
                except OSError:
                    return

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        try:
            assert _closed(sock)
        finally:
            stop.set()
            t.join(5)
    assert any("did not finish the handshake in time" in line for line in log)


# -- the receiver: its own disk ------------------------------------------------------------------


def test_a_full_disk_on_a_receiver_is_fatal_with_one_line_naming_dest(tmp_path: Path, small_fs: Path) -> None:
    big = os.urandom(3 << 20)  # more than the 1 MiB file system holds
    h = _seed(tmp_path, [big])
    ctx = JobContext.in_process("relay", {})
    server = RelayServer(
        h, ctx, secret=SECRET, group="g", listen=("127.0.0.1", 0), planned=["child"], chunk_size=1 << 18, grace_s=0
    )
    server.start()
    try:
        dest = small_fs / "dest"
        recv = _receiver(dest, h.objects, server.sock.getsockname()[1])
        with pytest.raises(LocalWriteError) as info:
            recv.run()
        recv.remove_temps()
    finally:
        server.stop()
    msg = str(info.value)
    assert msg.startswith(f"cannot write to DEST {dest}: No space left on device (writing obj-0)")
    assert "\n" not in msg
    assert len(recv.attachments) == 1  # never re-attached
    assert list(dest.iterdir()) == []


def test_the_md5_thread_hashes_each_object_s_chunks_in_order() -> None:
    from backend.pulls.relay.node import Md5Pipe

    pipe = Md5Pipe()
    bodies = {i: os.urandom(50_000 + i) for i in range(3)}
    for i in bodies:
        pipe.start(i)
    for off in range(0, 60_000, 7_000):  # interleaved, as objects can arrive
        for i, b in bodies.items():
            if off < len(b):
                pipe.add(i, memoryview(b)[off : off + 7_000])
    assert [pipe.digest(i) for i in bodies] == [_md5(b) for b in bodies.values()]
    assert pipe.digest(7) is None  # not hashed: no single-part ETag
    pipe.close()
