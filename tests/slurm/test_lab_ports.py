"""The Slurm lab picks its daemons' ports itself; a port another process takes between the pick and
the daemon's bind makes it start again on fresh ports instead of failing ``lab up --slurm``."""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from lab import slurm
from lab.slurm import SlurmLab


def test_a_port_taken_before_slurmd_binds_it_is_picked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("0.0.0.0", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    real = slurm.free_port
    picks: list[int] = []

    def pick(ip: str = "127.0.0.1") -> int:
        # The first config's slurmd port (the second pick) is one another process listens on.
        port = busy if len(picks) == 1 else real(ip)
        picks.append(port)
        return port

    monkeypatch.setattr(slurm, "free_port", pick)
    root = Path(tempfile.mkdtemp(prefix="lm-slurm-port-"))
    sl = SlurmLab(root, [("pn1", "127.0.0.1")], gpus=0)
    try:
        sl.up(timeout=60)
        assert len(picks) == 4, picks  # ctld + slurmd, twice
        assert sl.node_ports["pn1"] == picks[3] != busy
        assert sl.command(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout.split() == ["pn1", "idle"]
    finally:
        sl.down()
        taken.close()
        shutil.rmtree(root, ignore_errors=True)
