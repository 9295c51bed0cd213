"""Triage of a node whose GPU telemetry is missing: Prometheus has no series for it, nvidia-smi is not
installed on it, or its answer was cut short. That proves the telemetry is missing, not the GPUs:
the node is reported "no telemetry" (``gpu_status`` ``no-telemetry``, a note, the command line's
table), never accused of "0 of N GPUs listed", and no drain is proposed for it on that ground. An
Xid its kernel log was read to hold still counts.

Slurm's view is the literal JSON of tests/slurm/test_shapes.py (three nodes with eight H100 each)
served by the stand-in commands of tests/slurm/test_ops_partial.py."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.config import load_config
from backend.ops import Operations
from backend.services import Services
from backend.triage import prometheus
from backend.triage.analyze import NodeHealth, analyze
from backend.triage.signals import GpuHealth, XidSeen
from tests.slurm.test_ops_partial import FakeSlurm
from tui.cli.triage import render

NOW = time.time()


def gpu(i: int, **kw: Any) -> GpuHealth:
    base: dict[str, Any] = {"bus": f"0000:{0x18 + i:02X}:00.0", "name": "NVIDIA H100", "util_pct": 95.0,
                            "power_w": 650.0, "sm_mhz": 1980.0, "reasons": 0, "ecc_uncorrected": 0}  # fmt: skip
    base.update(kw)
    return GpuHealth(index=i, **base)


def services(tmp_path: Path, fake: FakeSlurm, telemetry: str = "") -> Services:
    cfg = tmp_path / "lm.toml"
    cfg.write_text(
        "".join(f'[[nodes]]\nname = "gpu-00{i}"\nhost = "127.0.0.1"\n\n' for i in (1, 2, 3))
        + f'[state]\ndir = "{tmp_path / "state"}"\n\n'
        + f'[slurm]\nenabled = true\nbin_dir = "{fake.bin}"\ninterval = "30s"\n\n'
        + telemetry
    )
    return Services(load_config(cfg))


def test_no_prometheus_series_is_no_telemetry_not_missing_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu-001's exporter is scraped, gpu-002's is not: Slurm says gpu-002 has 8 GPUs and Prometheus
    has none of their series (before: "gpu-missing: 0 of 8 GPUs listed" and a drain command)."""

    async def read_health(settings: Any, inventory: Any, names: list[str]) -> dict[str, NodeHealth]:
        return {"gpu-001": NodeHealth("gpu-001", True, NOW, gpus=tuple(gpu(i) for i in range(8)))}

    monkeypatch.setattr(prometheus, "read_health", read_health)
    svc = services(tmp_path, FakeSlurm(tmp_path), '[telemetry]\nprometheus_url = "http://127.0.0.1:1"\n')
    report = asyncio.run(Operations(svc).triage.run(nodes=["gpu-[001-002]"], source="prometheus"))
    assert report.suspects == () and "gpu-002" not in " ".join(report.commands)
    by = {n.node: n for n in report.nodes}
    assert by["gpu-002"].gpu_status == "no-telemetry" and by["gpu-002"].expected_gpus == 8
    note = next(n for n in report.notes if n.startswith("gpu-002: "))
    assert note.startswith("gpu-002: no telemetry (Prometheus has no DCGM series for it")
    assert "nothing is held against it" in note
    text = render(report)
    row = next(ln for ln in text if ln.startswith("gpu-002"))
    assert "no telemetry" in row and "0/8" not in row
    assert not any("drain" in ln for ln in text if ln.startswith("  loadmaster"))
    assert report.as_json()["nodes"][1]["gpu_status"] == "no-telemetry"


@dataclass
class Answer:
    stdout: str
    stderr: str = ""
    rc: int = 0


class Transport:
    def __init__(self, stdout: str) -> None:
        self.stdout = stdout

    async def run(self, script: str, timeout: float | None = None, **kw: Any) -> Answer:
        return Answer(self.stdout)


def xid_line(code: int) -> str:
    stamp = datetime.fromtimestamp(NOW - 60, UTC).isoformat()
    return f"{stamp} n kernel: NVRM: Xid (PCI:0000:18:00): {code}, pid=1, GPU has fallen off the bus.\n"


def test_a_node_read_without_its_gpus_over_ssh_is_not_accused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu-001 has no nvidia-smi, gpu-002's answer was cut short before its GPU part: neither proves
    anything about their GPUs (before: "0 of 8 GPUs listed" and "nvidia-smi fails", both drained).
    gpu-003 has no nvidia-smi either but its kernel log holds an Xid 79: that alone accuses it."""
    answers = {
        "gpu-001": "@@gpu\n@@gpu-rc absent\n@@xid\n@@xid-rc 0\n",
        "gpu-002": "",
        "gpu-003": f"@@gpu\n@@gpu-rc absent\n@@xid\n{xid_line(79)}@@xid-rc 0\n",
    }
    svc = services(tmp_path, FakeSlurm(tmp_path))
    monkeypatch.setattr(svc.pool, "transport", lambda name: Transport(answers[name]))
    report = asyncio.run(Operations(svc).triage.run(nodes=["gpu-[001-003]"], source="ssh"))
    assert [(s.node, [e.kind for e in s.evidence]) for s in report.suspects] == [("gpu-003", ["xid"])]
    by = {n.node: n for n in report.nodes}
    assert {n: by[n].gpu_status for n in by} == dict.fromkeys(by, "no-telemetry")
    assert "nvidia-smi is not installed" in (by["gpu-001"].telemetry or "")
    assert by["gpu-002"].xid_error is not None  # no kernel log part either: not "no Xid"
    drains = [c for c in report.commands if c.startswith("loadmaster drain")]
    assert [c.split()[2] for c in drains] == ["gpu-003"]
    assert any(n.startswith("gpu-001: no telemetry (nvidia-smi is not installed") for n in report.notes)
    assert any(n.startswith("gpu-002: no telemetry (its answer has no GPU part") for n in report.notes)


# -- the invariant --------------------------------------------------------------------------------

GPU = st.builds(
    gpu,
    st.integers(0, 7),
    remap_pending=st.none() | st.booleans(),
    ecc_uncorrected=st.none() | st.integers(0, 5),
    sm_mhz=st.none() | st.floats(100, 2000),
    lost=st.booleans(),
)
UNTELEMETERED = st.builds(
    lambda i, expected, gpus, read, reachable, state: NodeHealth(
        f"dark-{i}",
        reachable,
        NOW,
        read=read,
        gpus=tuple(gpus),
        gpu_status="no-telemetry",
        telemetry="no series",
        expected_gpus=expected,
        slurm_state=state,
    ),  # fmt: skip
    st.integers(0, 3),
    st.none() | st.integers(0, 16),
    st.lists(GPU, max_size=8, unique_by=lambda g: g.index),
    st.booleans(),
    st.booleans(),
    st.sampled_from([None, "mixed", "idle", "drained", "down*"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(UNTELEMETERED, max_size=3, unique_by=lambda n: n.node), st.integers(0, 3))
def test_no_telemetry_never_accuses_drains_or_resumes(dark: list[NodeHealth], peers: int) -> None:
    """Whatever else the record says, a node without telemetry is never a suspect, never drained and
    never resumed: its note says the telemetry is missing."""
    lit = [NodeHealth(f"lit-{i}", True, NOW, gpus=tuple(gpu(g) for g in range(8))) for i in range(peers)]
    report = analyze([*dark, *lit])
    names = {n.node for n in dark}
    assert not names & {s.node for s in report.suspects}
    assert not any(c.split()[2:3] and c.split()[2] in names for c in report.commands if c.startswith("loadmaster"))
    for n in dark:
        assert any(note.startswith(f"{n.node}: no telemetry (no series)") for note in report.notes)


def test_an_xid_still_accuses_a_node_without_gpu_telemetry() -> None:
    x = XidSeen(-1, 79, NOW - 5, "GPU has fallen off the bus", "drain", True)
    dark = NodeHealth("dark", True, NOW, read=False, gpu_status="no-telemetry", xids=(x,), expected_gpus=8)
    report = analyze([dark])
    assert [(s.node, [e.kind for e in s.evidence]) for s in report.suspects] == [("dark", ["xid"])]
