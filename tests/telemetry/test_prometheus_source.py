"""The Prometheus telemetry source against real Prometheus scraping the real node_exporter and the
dcgm-exporter stand-in of each lab node (tests/prom_fixtures.py): the same FleetSnapshot as SSH,
a handful of queries per refresh, down targets, Xids, auto and the fallback to SSH."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
from collections.abc import Callable

import pytest

from backend.nodes.pool import NodePool
from backend.telemetry.hub import TelemetryHub
from backend.telemetry.model import FleetSnapshot, NodeSnapshot
from backend.telemetry.prometheus import QUERY_COUNT
from backend.telemetry.settings import TelemetrySettings
from backend.telemetry.sources.prometheus import PrometheusPoller
from lab import Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(240)]


#: The hub's tick where only Prometheus is read (no SSH sampling, which ``interval`` also paces):
#: what a refresh brings is in the snapshot 0.2 s later, not up to a second.
FAST_TICK = {"interval": 0.2}


def settings(url: str, **kw: object) -> TelemetrySettings:
    base = {
        "source": "prometheus",
        "prometheus_url": url,
        "prometheus_interval": 1.0,
        "prometheus_rate_window": 5.0,
        "starved_window": 2.0,
        "backoff_initial": 0.5,
        "backoff_max": 2.0,
    }
    return TelemetrySettings(**{**base, **kw})  # type: ignore[arg-type]


async def wait_for(hub: TelemetryHub, pred: Callable[[FleetSnapshot], bool], limit: float = 60.0) -> FleetSnapshot:
    async def poll() -> FleetSnapshot:
        while not pred(snap := hub.snapshot()):
            await asyncio.sleep(0.1)
        return snap

    try:
        return await asyncio.wait_for(poll(), limit)
    except TimeoutError:
        states = {n.name: (n.state, n.source, n.error) for n in hub.snapshot().nodes}
        raise AssertionError(f"condition not met: {states}; note: {hub.snapshot().source_note}") from None


def node(snap: FleetSnapshot, name: str) -> NodeSnapshot:
    n = snap.node(name)
    assert n is not None
    return n


async def test_the_fleet_from_prometheus_is_the_fleet_from_ssh(lab: Lab, prom_lab) -> None:  # type: ignore[no-untyped-def]
    hub = TelemetryHub(NodePool(lab.config.nodes), settings(prom_lab.url, **FAST_TICK))
    await hub.start()
    try:
        snap = await wait_for(
            hub, lambda s: all(n.state == "up" and n.source == "prometheus" and n.samples >= 2 for n in s.nodes)
        )
        n1, n2, n3 = node(snap, "node-01"), node(snap, "node-02"), node(snap, "node-03")
        assert len(n1.gpus) == 8 and n1.util_mean is not None and n1.util_mean >= 90
        assert n1.mem_total_mib and n1.mem_used_mib and n1.gpus[0].temp_c and n1.gpus[0].power_w
        assert n3.gpus == () and "no dcgm-exporter series" in n3.gpu_status
        assert n1.nics and n1.rx_gbps is not None  # rate() of node_network_*_bytes_total
        assert n1.scratch_free_bytes and n1.scratch_total_bytes
        assert n2.util_mean is not None and n2.util_mean < 50
        # The starvation detector runs on Prometheus numbers as on SSH ones.
        snap = await wait_for(hub, lambda s: bool(node(s, "node-02").alerts))
        assert node(snap, "node-02").alerts[0].gpus == tuple(range(8))
        assert not node(snap, "node-01").alerts
        # However many nodes: a fixed handful of queries per refresh.
        (poller,) = hub.sources
        assert isinstance(poller, PrometheusPoller)
        assert poller.last_reading is not None and poller.last_reading.queries == QUERY_COUNT <= 10
        assert not poller.ssh.running  # nothing over SSH
    finally:
        await hub.stop()


async def test_an_xid_from_dcgm_and_a_down_target(lab: Lab, prom_lab) -> None:  # type: ignore[no-untyped-def]
    hub = TelemetryHub(NodePool(lab.config.nodes), settings(prom_lab.url, **FAST_TICK))
    await hub.start()
    try:
        await wait_for(hub, lambda s: all(n.state == "up" for n in s.nodes))
        # Two nodes, two changes at once (waited for together): an Xid on node-01, node-04 down.
        prom_lab.inject_xid("node-01", 3, 48)
        prom_lab.stop_target("node-04")
        snap = await wait_for(hub, lambda s: bool(node(s, "node-01").xids))
        (ev,) = node(snap, "node-01").xids
        assert (ev.gpu, ev.code, ev.mnemonic) == (3, 48, "DBE") and ev.drain and "double-bit ECC" in ev.meaning
        snap = await wait_for(hub, lambda s: node(s, "node-04").state == "stale")
        err = node(snap, "node-04").error or ""
        assert "target down" in err and ("refused" in err or "connect" in err), err
        assert node(snap, "node-01").state == "up"
        prom_lab.start_target("node-04")
        await wait_for(hub, lambda s: node(s, "node-04").state == "up")
        assert len(node(hub.snapshot(), "node-01").xids) == 1  # the same Xid is not a second event
    finally:
        await hub.stop()


async def test_auto_samples_over_ssh_what_prometheus_does_not_have(lab: Lab, prom_lab) -> None:  # type: ignore[no-untyped-def]
    # No series carries a label naming node-02 this way: auto takes it over SSH, the rest stay on
    # Prometheus.
    only = [n for n in lab.config.nodes if n.name in ("node-01", "node-02")]
    renamed = [dataclasses.replace(n, name="gpu-x" if n.name == "node-02" else n.name) for n in only]
    hub = TelemetryHub(NodePool(renamed), settings(prom_lab.url, source="auto"))
    await hub.start()
    try:
        snap = await wait_for(
            hub,
            lambda s: (
                node(s, "node-01").source == "prometheus"
                and node(s, "gpu-x").state == "up"
                and node(s, "gpu-x").source == "ssh"
            ),
        )
        assert len(node(snap, "gpu-x").gpus) == 8
    finally:
        await hub.stop()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_prometheus_unreachable_is_a_clear_state_and_ssh_takes_over(lab: Lab) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    nodes = [n for n in lab.config.nodes if n.name == "node-01"]
    hub = TelemetryHub(NodePool(nodes), settings(url, prometheus_timeout=2.0))
    # Without the fallback, a hub of its own beside it (its 2.5 s of nothing pass while the first
    # one samples over SSH): the node is never sampled, the note says why.
    stale = TelemetryHub(NodePool(nodes), settings(url, prometheus_timeout=2.0, prometheus_fallback_ssh=False))
    await stale.start()
    await hub.start()
    try:
        await wait_for(stale, lambda s: bool(s.source_note))
        noted = time.monotonic()
        snap = await wait_for(hub, lambda s: node(s, "node-01").state == "up")
        assert node(snap, "node-01").source == "ssh"
        assert snap.source_note and "unreachable" in snap.source_note and "over SSH" in snap.source_note
        assert "telemetry degraded" in snap.summary_line()
        await asyncio.sleep(max(0.0, 2.5 - (time.monotonic() - noted)))
        snap = stale.snapshot()
        assert "go stale" in (snap.source_note or "") and node(snap, "node-01").state == "connecting"
    finally:
        await hub.stop()
        await stale.stop()


async def test_nodes_are_found_by_the_label_the_site_uses(lab: Lab, prom_lab) -> None:  # type: ignore[no-untyped-def]
    # The lab's targets carry the target label `node` (= the loadmaster name) on every series, as a
    # site relabelling its scrape jobs would: mapped by it, both exporters' series land on the
    # same nodes as with the defaults (Hostname, instance); a label no series has maps nothing,
    # and with source = "prometheus" those nodes say so rather than showing another node's GPUs.
    # The two hubs (two consoles configured differently) read the same Prometheus side by side.
    nodes = [n for n in lab.config.nodes if n.name in ("node-01", "node-03")]
    hub = TelemetryHub(
        NodePool(nodes), settings(prom_lab.url, dcgm_node_label="node", node_exporter_node_label="node", **FAST_TICK)
    )
    other = TelemetryHub(NodePool(nodes), settings(prom_lab.url, dcgm_node_label="gpu_host", **FAST_TICK))
    await hub.start()
    try:
        await other.start()
        try:
            snap, other_snap = await asyncio.gather(
                wait_for(hub, lambda s: all(n.state == "up" and n.samples >= 2 for n in s.nodes)),
                wait_for(other, lambda s: all(n.samples >= 2 for n in s.nodes)),
            )
        finally:
            await other.stop()
    finally:
        await hub.stop()
    assert len(node(snap, "node-01").gpus) == 8 and node(snap, "node-01").rx_gbps is not None
    assert node(snap, "node-03").gpus == () and node(snap, "node-03").scratch_total_bytes
    n1 = node(other_snap, "node-01")
    assert n1.gpus == () and "no dcgm-exporter series" in n1.gpu_status, "no series names node-01 by gpu_host"
    assert n1.nics, "node_exporter's series still map by instance"
