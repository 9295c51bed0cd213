"""Triage through the site's Prometheus: the real Prometheus scraping the dcgm-exporter stand-in,
whose scenario serves the health fields a site enables (``dcgm_counters = "health"``) with the
same per-GPU faults as the SSH tests. Each scenario names exactly its node and GPU; the healthy
fleet names nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from backend.ops import Operations
from backend.services import Services
from lab import Lab
from lab.prometheus import TelemetryStack

pytestmark = [pytest.mark.timeout(120)]

GPU_NODES = ("node-01", "node-02", "node-04")


@contextlib.contextmanager
def health(stack: TelemetryStack, faults: dict[str, dict[str, Any]] | None = None) -> Iterator[None]:
    """Every GPU node's stand-in serves the health fields; ``faults`` per node; put back after."""
    assert stack.dcgm is not None
    saved = {n: stack.scenario(n).read_text() for n in GPU_NODES}
    try:
        for n in GPU_NODES:
            stack.dcgm.set_scenario(n, dcgm_counters="health", faults=(faults or {}).get(n, {}))
        stack.wait_scraped()
        yield
    finally:
        for n, text in saved.items():
            stack.scenario(n).write_text(text)
        stack.dcgm.set_scenario(GPU_NODES[0])  # the server drops what it rendered before
        stack.wait_scraped()


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


def test_healthy_fleet_names_nothing(lab: Lab, prom_lab: TelemetryStack) -> None:
    with health(prom_lab):
        report = triage(lab, prom_lab)
    assert report.suspects == () and report.commands == ()
    by = {n.node: n for n in report.nodes}
    assert len(by["node-01"].gpus) == 8 and all(g.reasons == 0 for g in by["node-04"].gpus)
    assert not by["node-03"].read  # no GPUs, no DCGM series: nothing held against it


def test_pending_row_remap(lab: Lab, prom_lab: TelemetryStack) -> None:
    with health(prom_lab, {"node-04": {"5": {"remap_pending": True}}}):
        assert named(triage(lab, prom_lab)) == [("node-04", (5,), ["remap-pending"])]


def test_hw_slowdown_with_five_percent_lower_clock(lab: Lab, prom_lab: TelemetryStack) -> None:
    with health(prom_lab, {"node-01": {"6": {"clock_reasons": 0x8, "sm_clock_pct": 95}}}):
        report = triage(lab, prom_lab)
    assert named(report) == [("node-01", (6,), ["clock-event", "straggler"])]


def test_gpu_fallen_off_the_bus_its_metrics_vanish(lab: Lab, prom_lab: TelemetryStack) -> None:
    """dcgm-exporter keeps only the Xid (79) of a GPU that fell off the bus."""
    with health(prom_lab):
        assert prom_lab.dcgm is not None
        prom_lab.dcgm.set_scenario("node-02", lost_gpu=3)
        prom_lab.wait_scraped()
        report = triage(lab, prom_lab)
    assert named(report) == [("node-02", (3,), ["telemetry-missing", "xid"])]


def test_xid_79(lab: Lab, prom_lab: TelemetryStack) -> None:
    with health(prom_lab):
        prom_lab.inject_xid("node-04", 2, 79)
        prom_lab.wait_scraped()
        report = triage(lab, prom_lab)
    assert named(report) == [("node-04", (2,), ["xid"])]
    assert "GPU_FELL_OFF_BUS" in report.suspects[0].evidence[0].detail


def test_nvlink_crc_and_pcie_replays(lab: Lab, prom_lab: TelemetryStack) -> None:
    """Counters: their increase over the window is the evidence (from 0 to thousands here)."""
    with health(prom_lab):
        assert prom_lab.dcgm is not None
        prom_lab.dcgm.set_scenario("node-01", faults={"0": {"nvlink_crc": 9000}, "7": {"pcie_replays": 400}})
        prom_lab.wait_scraped()
        report = triage(lab, prom_lab)
    assert named(report) == [("node-01", (0, 7), ["nvlink-crc", "pcie-replay"])]
