"""The hub over real LocalTransport streams (the node's sh loop, real /proc, stand-in nvidia-smi)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from backend.config import Node
from backend.nodes.transport import LocalTransport
from backend.telemetry.hub import TelemetryHub
from backend.telemetry.model import NO_GPU, FleetSnapshot, NodeSnapshot
from backend.telemetry.settings import TelemetrySettings
from lab import fake_nvidia_smi
from lab.fake_nvidia_smi import write_scenario


class LocalPool:
    """The tiny adapter the hub needs: ``.nodes`` and ``.transport(name)``."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = tuple(nodes)
        self._t = {n.name: LocalTransport(n) for n in nodes}

    def transport(self, name: str) -> LocalTransport:
        return self._t[name]


def smi_wrapper(tmp_path: Path, scenario: Path) -> Path:
    script = tmp_path / "nvidia-smi"
    script.write_text(fake_nvidia_smi.stand_in_script(scenario))
    script.chmod(0o755)
    return script


async def wait_node(
    hub: TelemetryHub, name: str, pred: Callable[[NodeSnapshot], bool], limit: float = 60.0
) -> FleetSnapshot:
    """Wait (generously: the machine is shared) until ``pred`` holds for node ``name``."""

    async def poll() -> FleetSnapshot:
        while True:
            snap = hub.snapshot()
            node = snap.node(name)
            if node is not None and pred(node):
                return snap
            await asyncio.sleep(0.05)

    try:
        return await asyncio.wait_for(poll(), limit)
    except TimeoutError:
        raise AssertionError(f"condition not met; last: {hub.snapshot().node(name)!r}") from None


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    return write_scenario(tmp_path / "gpu.json", gpus=8, pattern="training")


async def test_local_node_up_with_gpus_then_stale_then_back(tmp_path, scenario):
    settings = TelemetrySettings(interval=0.2, nvidia_smi=str(smi_wrapper(tmp_path, scenario)))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    hub = TelemetryHub(
        LocalPool([Node(name="local", host="localhost", transport="local", scratch=str(scratch), site="lab")]), settings
    )
    assert hub.snapshot().node("local").state == "connecting"
    await hub.start()
    try:
        snap = await wait_node(hub, "local", lambda n: n.state == "up" and n.rx_gbps is not None)
        node = snap.node("local")
        assert len(node.gpus) == 8 and node.gpu_status == "ok"
        assert node.util_mean is not None and node.util_mean >= 90
        assert node.scratch_free_bytes and node.scratch_error is None
        assert any(n.kind == "loopback" for n in node.nics)
        assert node.rx_gbps >= 0 and all((d.write_mbps or 0) >= 0 for d in node.disks)
        assert len(hub.history("local")) >= 1
        # The node stops answering (a wedged nvidia-smi blocks the loop): stale, not unreachable.
        write_scenario(scenario, gpus=8, pattern="training", hang=True)
        await wait_node(hub, "local", lambda n: n.state == "stale")
        # It answers again: the same stream carries on.
        write_scenario(scenario, gpus=8, pattern="training")
        await wait_node(hub, "local", lambda n: n.state == "up")
    finally:
        await hub.stop()


async def test_no_gpu_and_missing_scratch_are_not_errors(tmp_path):
    sc = write_scenario(tmp_path / "gpu.json", gpus=0)
    settings = TelemetrySettings(interval=0.2, nvidia_smi=str(smi_wrapper(tmp_path, sc)))
    hub = TelemetryHub(
        LocalPool([Node(name="cpu", host="localhost", transport="local", scratch=str(tmp_path / "absent"))]), settings
    )
    await hub.start()
    try:
        snap = await wait_node(hub, "cpu", lambda n: n.state == "up")
        node = snap.node("cpu")
        assert node.gpu_status == NO_GPU and node.gpus == ()
        assert node.scratch_error == "scratch directory missing"
        assert node.error is None
    finally:
        await hub.stop()


async def test_nvidia_smi_absent(tmp_path):
    settings = TelemetrySettings(interval=0.2, nvidia_smi=str(tmp_path / "no-such-nvidia-smi"))
    hub = TelemetryHub(
        LocalPool([Node(name="cpu", host="localhost", transport="local", scratch=str(tmp_path))]), settings
    )
    await hub.start()
    try:
        snap = await wait_node(hub, "cpu", lambda n: n.state == "up")
        assert snap.node("cpu").gpu_status == NO_GPU
    finally:
        await hub.stop()


async def test_subscribers_and_iterator_get_ticks(tmp_path, scenario):
    settings = TelemetrySettings(interval=0.2, nvidia_smi=str(smi_wrapper(tmp_path, scenario)))
    hub = TelemetryHub(
        LocalPool([Node(name="local", host="localhost", transport="local", scratch=str(tmp_path))]), settings
    )
    seen: list[int] = []
    unsubscribe = hub.subscribe(lambda s: seen.append(s.seq))
    await hub.start()
    try:
        got: list[int] = []

        async def three() -> None:
            async for snap in hub.updates():
                got.append(snap.seq)
                if len(got) == 3:
                    break

        await asyncio.wait_for(three(), 60)
        assert got == sorted(got) and len(set(got)) == 3
        assert seen and seen == sorted(seen)
        unsubscribe()
        n = len(seen)
        await asyncio.sleep(0.5)
        assert len(seen) == n
    finally:
        await hub.stop()
    assert not hub.running
