"""Triage through the site's Prometheus: the real Prometheus scraping the dcgm-exporter stand-in,
whose scenario serves the health fields a site enables (``dcgm_counters = "health"``) with the
same per-GPU faults as the SSH tests. Each scenario names exactly its node and GPU; the healthy
fleet names nothing.

Each test sets the whole state of every GPU node's stand-in (:meth:`HealthLab.serve`: what an
earlier test set is gone) and waits once for Prometheus to scrape it; the lab is put back as it
started after the module."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from backend.ops import Operations
from backend.services import Services
from lab import Lab, fake_nvidia_smi
from lab.prometheus import TelemetryStack

pytestmark = [pytest.mark.timeout(120)]

GPU_NODES = ("node-01", "node-02", "node-04")


@dataclass
class HealthLab:
    """The session's Prometheus lab and its GPU nodes' scenarios as it started."""

    stack: TelemetryStack
    scenarios: dict[str, dict[str, Any]]

    def serve(
        self,
        faults: dict[str, dict[str, Any]] | None = None,
        fields: dict[str, dict[str, Any]] | None = None,
        xids: tuple[tuple[str, int, int], ...] = (),
    ) -> None:
        """Every GPU node's stand-in serves the health fields with ``faults`` and other scenario
        ``fields`` (per node) and the (node, GPU, Xid) ``xids``, nothing else; waits until
        Prometheus has scraped all of it."""
        stack = self.stack
        assert stack.dcgm is not None
        for n in GPU_NODES:
            change = {"dcgm_counters": "health", "faults": (faults or {}).get(n, {}), **(fields or {}).get(n, {})}
            fake_nvidia_smi.write_scenario(stack.scenario(n), **(self.scenarios[n] | change))
        stack.dcgm.reset({}, reread=True)  # no Xid; the scenarios read again
        for node, gpu, code in xids:
            stack.inject_xid(node, gpu, code)
        stack.wait_scraped()


@pytest.fixture(scope="module")
def health_lab(prometheus_lab: TelemetryStack) -> Iterator[HealthLab]:
    stack = prometheus_lab
    scenarios = {n: fake_nvidia_smi.load_scenario(str(stack.scenario(n))) for n in GPU_NODES}
    try:
        yield HealthLab(stack, scenarios)
    finally:
        if stack.restore():
            stack.wait_scraped(timeout=60)


def triage(lab: Lab, stack: TelemetryStack, nodes: str = "node-0[1-4]"):  # type: ignore[no-untyped-def]
    text = lab.config_text(stack.telemetry_toml("prometheus"))
    services = Services(config=_config(lab, text))
    try:
        return asyncio.run(Operations(services).triage.run(nodes=[nodes]))
    finally:
        services.db.close()


def _config(lab: Lab, text: str):  # type: ignore[no-untyped-def]
    from backend.config import load_config

    path = lab.root / "triage-prom.toml"
    path.write_text(text)
    return load_config(path)


def named(report) -> list[tuple[str, tuple[int, ...], list[str]]]:  # type: ignore[no-untyped-def]
    return [(s.node, s.gpus, sorted({e.kind for e in s.evidence})) for s in report.suspects]


def test_healthy_fleet_names_nothing(lab: Lab, health_lab: HealthLab) -> None:
    health_lab.serve()
    report = triage(lab, health_lab.stack)
    assert report.suspects == () and report.commands == ()
    by = {n.node: n for n in report.nodes}
    assert len(by["node-01"].gpus) == 8 and all(g.reasons == 0 for g in by["node-04"].gpus)
    assert not by["node-03"].read  # no GPUs, no DCGM series: nothing held against it


def test_pending_row_remap(lab: Lab, health_lab: HealthLab) -> None:
    health_lab.serve({"node-04": {"5": {"remap_pending": True}}})
    assert named(triage(lab, health_lab.stack)) == [("node-04", (5,), ["remap-pending"])]


def test_hw_slowdown_with_five_percent_lower_clock(lab: Lab, health_lab: HealthLab) -> None:
    health_lab.serve({"node-01": {"6": {"clock_reasons": 0x8, "sm_clock_pct": 95}}})
    report = triage(lab, health_lab.stack)
    assert named(report) == [("node-01", (6,), ["clock-event", "straggler"])]


def test_gpu_fallen_off_the_bus_its_metrics_vanish(lab: Lab, health_lab: HealthLab) -> None:
    """dcgm-exporter keeps only the Xid (79) of a GPU that fell off the bus."""
    health_lab.serve(fields={"node-02": {"lost_gpu": 3}})
    report = triage(lab, health_lab.stack)
    assert named(report) == [("node-02", (3,), ["telemetry-missing", "xid"])]


def test_xid_79(lab: Lab, health_lab: HealthLab) -> None:
    health_lab.serve(xids=(("node-04", 2, 79),))
    report = triage(lab, health_lab.stack)
    assert named(report) == [("node-04", (2,), ["xid"])]
    assert "GPU_FELL_OFF_BUS" in report.suspects[0].evidence[0].detail


def test_nvlink_crc_and_pcie_replays(lab: Lab, health_lab: HealthLab) -> None:
    """Counters: their increase over the window is the evidence (from 0 to thousands here, so the
    faults come after a scrape of the healthy counters). Last in the module: the jump stays in
    Prometheus's 15-minute window."""
    health_lab.serve()
    stack = health_lab.stack
    assert stack.dcgm is not None
    stack.dcgm.set_scenario("node-01", faults={"0": {"nvlink_crc": 9000}, "7": {"pcie_replays": 400}})
    stack.wait_scraped()
    report = triage(lab, stack)
    assert named(report) == [("node-01", (0, 7), ["nvlink-crc", "pcie-replay"])]
