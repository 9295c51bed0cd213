"""The hub over the real lab: sshd nodes reached through NodePool, stand-in nvidia-smi on PATH."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from backend.nodes.pool import NodePool
from backend.telemetry.hub import TelemetryHub
from backend.telemetry.model import NO_GPU, FleetSnapshot, NodeSnapshot
from backend.telemetry.settings import TelemetrySettings

pytestmark = pytest.mark.lab


async def wait_for(hub: TelemetryHub, pred: Callable[[FleetSnapshot], bool], limit: float = 90.0) -> FleetSnapshot:
    async def poll() -> FleetSnapshot:
        while True:
            snap = hub.snapshot()
            if pred(snap):
                return snap
            await asyncio.sleep(0.1)

    try:
        return await asyncio.wait_for(poll(), limit)
    except TimeoutError:
        states = {n.name: (n.state, n.error) for n in hub.snapshot().nodes}
        raise AssertionError(f"condition not met; nodes: {states}") from None


def node(snap: FleetSnapshot, name: str) -> NodeSnapshot:
    n = snap.node(name)
    assert n is not None
    return n


async def test_fleet_over_ssh_with_stop_and_restart(lab):
    # Two samples' starvation raise the alert; a restarted node is retried within 1 s.
    settings = TelemetrySettings(
        interval=0.5, starved_window=1.0, backoff_initial=0.5, backoff_max=1.0, latency_every=1.0
    )
    pool = NodePool(lab.config.nodes)
    hub = TelemetryHub(pool, settings)
    await hub.start()
    try:
        snap = await wait_for(hub, lambda s: all(n.state == "up" and n.samples >= 2 for n in s.nodes))
        n1, n2, n3 = node(snap, "node-01"), node(snap, "node-02"), node(snap, "node-03")
        assert len(n1.gpus) == 8 and n1.util_mean is not None and n1.util_mean >= 90
        assert n1.site == "coreweave:us-east-04" and node(snap, "node-04").site == "aws:us-east-1"
        assert n3.gpu_status == NO_GPU and n3.gpus == ()
        assert n2.util_mean is not None and n2.util_mean < 50
        assert n1.rx_gbps is not None and n1.scratch_free_bytes, n1.nics
        # node-02 holds the job's memory at low utilisation: the alert is raised.
        snap = await wait_for(hub, lambda s: bool(node(s, "node-02").alerts))
        alert = node(snap, "node-02").alerts[0]
        assert alert.gpus == tuple(range(8)) and alert.active
        assert not node(snap, "node-01").alerts
        await wait_for(hub, lambda s: node(s, "node-01").latency_ms is not None)

        # node-04 goes down: stale, then unreachable once the transport says so.
        lab.node("node-04").stop()
        try:
            await wait_for(hub, lambda s: node(s, "node-04").state == "unreachable")
            down = node(hub.snapshot(), "node-04")
            assert down.error
            assert node(hub.snapshot(), "node-01").state == "up"
        finally:
            lab.node("node-04").start()
        # It comes back: the stream restarts by itself.
        await wait_for(hub, lambda s: node(s, "node-04").state == "up")
    finally:
        await hub.stop()
        await pool.close()


async def test_console_fleet_screen_over_the_lab(lab, tmp_path):
    """The real console, real Services, real SSH: the Fleet screen fills in by itself."""
    import dataclasses

    from textual.widgets._data_table import CellDoesNotExist, RowDoesNotExist

    from backend.services import Services
    from tests.helpers import wait_until
    from tui.app import LoadmasterApp
    from tui.screens.fleet import FleetScreen
    from tui.widgets.fleet_alerts import AlertList
    from tui.widgets.fleet_table import FleetTable

    settings = TelemetrySettings(interval=0.5, starved_window=1.0, latency_every=2.0)
    config = dataclasses.replace(lab.config, sections={**lab.config.sections, "telemetry": settings})
    services = Services(config=config)
    app = LoadmasterApp(services)
    async with app.run_test(size=(220, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        hub = services.telemetry
        await wait_for(
            hub, lambda s: all(n.state == "up" and n.samples >= 2 for n in s.nodes) and bool(node(s, "node-02").alerts)
        )
        table = screen.query_one(FleetTable)
        alerts = screen.query_one(AlertList)

        def on_screen() -> bool:  # the hub's next tick reaches the table and the alert list
            table.flush_all()
            try:
                starved = "STARVED" in str(table.get_cell("node-02", "alerts"))
            except (CellDoesNotExist, RowDoesNotExist):
                return False
            return starved and any(str(alerts.get_row_at(i)[0]) == "node-02" for i in range(alerts.row_count))

        await wait_until(pilot, on_screen, delay=0.05)
        table.flush_all()
        assert str(table.get_cell("node-01", "gpus")) == "8"
        assert int(str(table.get_cell("node-01", "util")).split("%")[0]) >= 90
        assert str(table.get_cell("node-03", "gpus")) == NO_GPU
        assert "STARVED" in str(table.get_cell("node-02", "alerts"))
        assert any(str(alerts.get_row_at(i)[0]) == "node-02" for i in range(alerts.row_count))
    # Quitting the console closed the services: the samplers are gone.
    assert not hub.running


def test_top_once_json_over_the_lab(lab, capsys):
    """``loadmaster top --once --json`` over real SSH: one object, every node sampled."""
    import json

    from tui.cli import main

    assert (
        main(
            [
                "--config",
                str(lab.config_path),
                "top",
                "--once",
                "--json",
                "--interval",
                "0.5",
                "--nodes",
                "node-[01-03]",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    tick = json.loads(lines[0])
    nodes = {n["name"]: n for n in tick["nodes"]}
    assert set(nodes) == {"node-01", "node-02", "node-03"}
    assert all(n["state"] == "up" and n["samples"] >= 2 for n in nodes.values())
    assert len(nodes["node-01"]["gpus"]) == 8 and nodes["node-01"]["util_mean"] >= 90
    assert nodes["node-03"]["gpu_status"] == "no NVIDIA GPU"
    assert nodes["node-01"]["rx_gbps"] is not None
    assert tick["summary"]["gpus"] == 16


#: A stand-in kernel log in the driver's documented format: what ``dmesg`` prints on a node whose
#: GPU 2 (bus 3A, see lab/fake_nvidia_smi.py BUS_IDS) fell off the bus, plus noise.
_DMESG = """#!/bin/sh
echo read >> "$0.reads"
cat <<'LOG'
[    1.000000] Linux version 6.1.0 (debian-kernel@lists.debian.org)
[ 4242.123456] NVRM: Xid (PCI:0000:3a:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
[ 4242.123999] NVRM: GPU 0000:3a:00.0: GPU has fallen off the bus.
LOG
"""


async def test_a_kernel_log_xid_over_ssh_is_flagged_with_its_meaning(lab, monkeypatch):
    from backend.telemetry import sampler

    n1 = lab.node("node-01")
    fake = n1.bin_dir / "dmesg"
    fake.write_text(_DMESG)
    fake.chmod(0o755)
    reads = n1.bin_dir / "dmesg.reads"
    # The kernel log is read every XID_EVERY_S (10 s): at every sample here (0.5 s), so the
    # re-reads come soon.
    monkeypatch.setattr(sampler, "XID_EVERY_S", 0.5)
    try:
        settings = TelemetrySettings(interval=0.5, backoff_initial=0.5, backoff_max=2.0)
        hub = TelemetryHub(NodePool(lab.config.nodes), settings, nodes=["node-01"])
        await hub.start()
        try:
            snap = await wait_for(hub, lambda s: bool(node(s, "node-01").xids), limit=60)
            (ev,) = node(snap, "node-01").xids
            assert (ev.gpu, ev.code, ev.mnemonic) == (2, 79, "GPU_FELL_OFF_BUS")
            assert "fallen off the bus" in ev.meaning and "reboot" in ev.action and ev.drain
            assert "Xid on 1 node(s)" in snap.summary_line()
            # The log read again (twice more, so a sample after a re-read is in): the same line is
            # not a second event.
            seen = len(reads.read_text().splitlines())
            await wait_for(hub, lambda s: len(reads.read_text().splitlines()) >= seen + 2, limit=60)
            assert len(node(hub.snapshot(), "node-01").xids) == 1
        finally:
            await hub.stop()
    finally:
        fake.unlink()
        reads.unlink(missing_ok=True)
