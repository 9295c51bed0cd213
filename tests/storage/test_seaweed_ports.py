"""The lab's SeaweedFS picks its own block of ports; when another process takes one of them between
the pick and weed's bind (two test workers starting labs at once), it picks again."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from lab import ports, seaweed
from lab.seaweed import SeaweedS3


def test_a_port_taken_between_the_pick_and_the_bind_is_picked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    picks: list[int] = []
    real = seaweed.free_port_block

    def pick(count: int, ip: str = "127.0.0.1") -> int:
        # First pick: a block whose filer port (base + 4) another process holds.
        block = busy - 4 if not picks else real(count, ip)
        picks.append(block)
        return block

    monkeypatch.setattr(seaweed, "free_port_block", pick)
    s3 = SeaweedS3(root=tmp_path / "s3")
    try:
        s3.start(timeout=60)
        assert len(picks) == 2 and s3.base_port == picks[1]
    finally:
        s3.stop()
        taken.close()


def test_a_block_the_caller_gave_is_not_changed(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    s3 = SeaweedS3(root=tmp_path / "s3", base_port=taken.getsockname()[1] - 4)
    try:
        with pytest.raises(Exception, match="did not start"):
            s3.start(timeout=30)
    finally:
        s3.stop()
        taken.close()


def test_a_block_is_chosen_below_the_ports_outgoing_connections_use() -> None:
    # A port in the kernel's ephemeral range can be held by an outgoing connection in TIME_WAIT,
    # which no listener may bind: after a benchmark's many S3 requests the whole range can be.
    lo, _hi = ports.ephemeral_range()
    for _ in range(20):
        base = seaweed.free_port_block(12)
        assert 1024 <= base and base + 12 + 10000 <= lo
        assert all(ports.port_free("127.0.0.1", p) for p in (*range(base, base + 12), base + 10000, base + 10011))


def test_every_lab_port_is_picked_below_the_ephemeral_range() -> None:
    # slurmd once failed "Unable to bind listen port: Address already in use" on a port the kernel
    # had handed out as free: an outgoing connection took it between the pick and the bind.
    lo, _hi = ports.ephemeral_range()
    picks = [ports.free_port() for _ in range(50)] + [ports.common_free_port(["127.0.0.1", "127.0.0.2"])]
    assert all(ports.LOWEST <= p < lo for p in picks)
    assert len(set(picks)) > 40  # spread out, so two workers rarely pick alike
