"""Triage on the real lab: sshd nodes whose stand-in nvidia-smi (lab/fake_nvidia_smi.py)
prints the health fields with faults injected per GPU, and a stand-in dmesg for the Xid.

Each scenario names exactly its node and GPU; the healthy fleet names nothing. The lab's nodes:
node-01 and node-04 train on 8 GPUs, node-02 is starved on 8, node-03 has no nvidia-smi.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from backend.ops import Operations
from backend.services import Services
from lab import Lab, LabNodeOptions
from tests.conftest import LAB_NODE_OPTIONS

pytestmark = [pytest.mark.timeout(120)]

NODES = "node-01,node-02,node-03,node-04"


@contextlib.contextmanager
def faults(lab: Lab, node: str, **extra: Any) -> Iterator[None]:
    """``node``'s stand-in nvidia-smi with scenario fields ``extra``; the lab's own afterwards."""
    opts = LAB_NODE_OPTIONS[node]
    n = lab.node(node)
    lab.set_gpu_scenario(n, LabNodeOptions(gpus=opts.gpus, pattern=opts.pattern, extra=extra))
    try:
        yield
    finally:
        lab.set_gpu_scenario(n, opts)


@contextlib.contextmanager
def kernel_log(lab: Lab, node: str, text: str) -> Iterator[None]:
    """A stand-in ``dmesg`` on ``node`` printing ``text``."""
    path = lab.node(node).bin_dir / "dmesg"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}EOF\n")
    path.chmod(0o755)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def triage(lab: Lab, nodes: str = NODES):  # type: ignore[no-untyped-def]
    services = Services(config=lab.config)
    try:
        return asyncio.run(Operations(services).triage.run(nodes=[nodes]))
    finally:
        services.db.close()


def suspects(report) -> list[tuple[str, tuple[int, ...], list[str]]]:  # type: ignore[no-untyped-def]
    return [(s.node, s.gpus, sorted({e.kind for e in s.evidence})) for s in report.suspects]


def test_healthy_fleet_names_nothing(lab: Lab) -> None:
    report = triage(lab)
    assert report.suspects == () and report.commands == ()
    assert report.exclude is None
    by = {n.node: n for n in report.nodes}
    assert len(by["node-01"].gpus) == 8 and by["node-03"].gpu_status == "absent"
    assert all(g.sm_mhz == 1980 and g.remap_pending is False for g in by["node-04"].gpus)


def test_pending_row_remap_names_node_and_gpu(lab: Lab) -> None:
    with faults(lab, "node-04", faults={"5": {"remap_pending": True}}):
        report = triage(lab)
    assert suspects(report) == [("node-04", (5,), ["remap-pending"])]
    assert report.commands[0] == "--exclude=node-04"
    assert report.commands[1].startswith("loadmaster drain node-04 --reason 'triage: GPU 5: row remap pending")


def test_hw_slowdown_with_five_percent_lower_clock(lab: Lab) -> None:
    with faults(lab, "node-01", faults={"6": {"clock_reasons": 0x8, "sm_clock_pct": 95}}):
        report = triage(lab)
    assert suspects(report) == [("node-01", (6,), ["clock-event", "straggler"])]
    detail = " ".join(e.detail for e in report.suspects[0].evidence)
    assert "HW slowdown (0x8)" in detail and "95.0% of the median 1980 MHz" in detail


def test_gpu_fallen_off_the_bus(lab: Lab) -> None:
    with faults(lab, "node-02", lost_gpu=3, lost_after=0.0):
        report = triage(lab)
    assert suspects(report) == [("node-02", (3,), ["fell-off-bus"])]


def test_gpu_vanished_from_the_listing(lab: Lab) -> None:
    """The GPU is not enumerated at all while the node answers: its peers' layout names it."""
    with faults(lab, "node-04", faults={"2": {"vanish": True}}):
        report = triage(lab)
    assert suspects(report) == [("node-04", (2,), ["gpu-missing"])]
    assert "3A:00.0" in report.suspects[0].evidence[0].detail


def test_xid_79_named_with_its_gpu_and_catalog_action(lab: Lab) -> None:
    stamp = datetime.fromtimestamp(time.time() - 60, UTC).strftime("%Y-%m-%dT%H:%M:%S,000000+00:00")
    old = datetime.fromtimestamp(time.time() - 3 * 86400, UTC).strftime("%Y-%m-%dT%H:%M:%S,000000+00:00")
    log = (
        f"{old} node kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n"
        f"{stamp} node kernel: NVRM: Xid (PCI:0000:9a:00): 79, pid=1, GPU has fallen off the bus.\n"
        f"{stamp} node kernel: NVRM: Xid (PCI:0000:2a:00): 13, pid=1, Graphics Exception\n"
    )
    with kernel_log(lab, "node-01", log):
        report = triage(lab)
    assert suspects(report) == [("node-01", (4,), ["xid"])]
    ev = report.suspects[0].evidence[0]
    assert "Xid 79 (GPU_FELL_OFF_BUS) on GPU 4" in ev.detail and "reboot" in ev.detail
    node = next(n for n in report.nodes if n.node == "node-01")
    assert [(x.gpu, x.code) for x in node.xids] == [(4, 79), (1, 13)]


def test_unreachable_node_is_a_suspect_and_json_shape(lab: Lab, lab_node_down) -> None:  # type: ignore[no-untyped-def]
    lab_node_down("node-02")
    report = triage(lab, "node-0[1-2]")
    doc = json.loads(json.dumps(report.as_json()))
    assert [s["node"] for s in doc["suspects"]] == ["node-02"]
    assert doc["suspects"][0]["evidence"][0]["kind"] == "unreachable"
    assert doc["commands"][0] == "--exclude=node-02"
    assert set(doc) >= {"suspects", "commands", "checkpoint"}
