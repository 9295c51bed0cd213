"""A relay node's server and receiver over real sockets on loopback (no lab): the copy, the secret."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from pathlib import Path

import pytest

import backend.pulls.relay.receiver as receiver_mod
from backend.agent.context import JobContext
from backend.errors import JobError
from backend.pulls.objects import PulledObject
from backend.pulls.relay.node import Holdings, Receiver, RelayServer, Upstream
from backend.pulls.relay.protocol import FrameCodec, server_handshake


def _seed(tmp_path: Path, sizes: list[int]) -> tuple[Holdings, list[bytes]]:
    src = tmp_path / "seed"
    src.mkdir()
    bodies = [os.urandom(n) for n in sizes]
    objects = []
    for i, body in enumerate(bodies):
        (src / f"obj-{i}").write_bytes(body)
        objects.append(PulledObject(f"obj-{i}", len(body), None))
    h = Holdings(src, objects)
    for i, o in enumerate(objects):
        h.publish(i, o.size, src / o.rel, complete=True)
    h.finish({"by": "seed", "listing": "x"})
    return h, bodies


def _server(h: Holdings, secret: str = "right") -> RelayServer:
    ctx = JobContext.in_process("relay", {})
    server = RelayServer(
        h, ctx, secret=secret, group="g", listen=("127.0.0.1", 0), planned=["child"], chunk_size=1 << 16, grace_s=0
    )
    server.start()
    return server


def _receiver(tmp_path: Path, h: Holdings, port: int, secret: str, reattach_s: float = 5.0) -> Receiver:
    dest = tmp_path / "child"
    dest.mkdir(exist_ok=True)
    mine = Holdings(dest, h.objects)
    ctx = JobContext.in_process("relay", {})
    return Receiver(
        mine,
        ctx,
        secret=secret,
        group="g",
        me="child",
        upstreams=[Upstream("seed", "127.0.0.1", port)],
        reattach_s=reattach_s,
    )


def test_a_child_copies_every_object_and_tells_the_seed_it_is_done(tmp_path: Path) -> None:
    h, bodies = _seed(tmp_path, [300_000, 1, 70_000])
    server = _server(h)
    try:
        host, port = server.sock.getsockname()[:2]
        assert host == "127.0.0.1"  # the address it was given, not every address
        recv = _receiver(tmp_path, h, port, "right")
        recv.run()
        for i, body in enumerate(bodies):
            got = (tmp_path / "child" / f"obj-{i}").read_bytes()
            assert hashlib.sha256(got).digest() == hashlib.sha256(body).digest()
        assert sorted(p.name for p in (tmp_path / "child").iterdir()) == ["obj-0", "obj-1", "obj-2"]
        assert not server.subtree_done()  # connected, not done yet
        recv.send({"t": "done"})
        done = threading.Event()
        for _ in range(100):
            if server.subtree_done():
                done.set()
                break
            server.changed.wait(0.05)
        assert done.is_set()
        assert server.served()["child"]["bytes"] == sum(len(b) for b in bodies)
        recv.close()
    finally:
        server.stop()


def test_a_peer_without_the_secret_gets_nothing(tmp_path: Path) -> None:
    h, _ = _seed(tmp_path, [50_000])
    server = _server(h)
    try:
        recv = _receiver(tmp_path, h, server.sock.getsockname()[1], "wrong", reattach_s=0.5)
        with pytest.raises(JobError, match="no upstream answered .* relay secret"):
            recv.run()
        assert list((tmp_path / "child").iterdir()) == []
        assert server.served()["child"]["bytes"] == 0
    finally:
        server.stop()


def test_a_child_leaves_an_upstream_fed_far_slower_than_its_siblings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The planned upstream is a real peer (the handshake, MACed frames) that says, once a second,
    # that it is fed at a tenth of its fastest sibling's rate and sends nothing else: the child
    # re-attaches to the node above it and copies from there.
    monkeypatch.setattr(receiver_mod, "SLOW_S", 1.0)
    h, bodies = _seed(tmp_path, [200_000])
    above = _server(h)
    slow = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def slow_peer() -> None:
        conn, _ = slow.accept()
        with conn:
            _name, key = server_handshake(conn, "right", "g")
            codec = FrameCodec(key)
            conn.settimeout(5)
            conn.recv(65536)  # the child's 'want'
            while not stop.wait(0.2):
                stat = {"t": "stat", "you_bps": 1e6, "best_bps": 1e6, "up_bps": 1e6, "up_best_bps": 1e7}
                try:
                    conn.sendall(codec.ctrl(stat))
                except OSError:
                    return

    t = threading.Thread(target=slow_peer)
    t.start()
    try:
        recv = _receiver(tmp_path, h, 0, "right")
        recv.upstreams = [
            Upstream("slow", "127.0.0.1", slow.getsockname()[1]),
            Upstream("seed", "127.0.0.1", above.sock.getsockname()[1]),
        ]
        recv.chain_len = 2
        recv.run()
        assert (tmp_path / "child" / "obj-0").read_bytes() == bodies[0]
        first, again = recv.attachments
        assert (first["upstream"], again["upstream"]) == ("slow", "seed")
        assert again["why"].startswith("slow slow: fed at 8 Mbps while its fastest sibling gets 80 Mbps")
        recv.close()
    finally:
        stop.set()
        t.join(5)
        slow.close()
        above.stop()
