"""Triage on partial and odd inputs: nodes Slurm knows but telemetry does not, GPUs whose series are
missing, values that are NaN, negative or huge, too few GPUs to compare. Triage says what it could
not prove (``notes``) and proposes an action only where what it read proves it applies."""

from __future__ import annotations

import math
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from backend.triage.analyze import MIN_PEERS, NodeHealth, analyze
from backend.triage.signals import GpuHealth

NOW = time.time()


def gpu(i: int, **kw: object) -> GpuHealth:
    base: dict[str, object] = {"bus": f"0000:{0x18 + i:02X}:00.0", "name": "NVIDIA H100", "util_pct": 95.0,
                               "power_w": 650.0, "sm_mhz": 1980.0, "reasons": 0, "ecc_uncorrected": 0}  # fmt: skip
    base.update(kw)
    return GpuHealth(index=i, **base)  # type: ignore[arg-type]


def node(name: str, gpus: tuple[GpuHealth, ...] = (), **kw: object) -> NodeHealth:
    return NodeHealth(name, reachable=True, read_at=NOW, gpus=gpus, **kw)  # type: ignore[arg-type]


def healthy(name: str, n: int = 8, **kw: object) -> NodeHealth:
    return node(name, tuple(gpu(i) for i in range(n)), **kw)


WILD = st.one_of(
    st.just(math.nan), st.just(math.inf), st.just(-math.inf), st.floats(-1e12, -1e-9), st.floats(1e6, 1e300)
)
WILD_INT = st.one_of(st.integers(-(2**70), -1), st.integers(2**64, 2**80))


@settings(max_examples=120, deadline=None)
@given(
    st.sampled_from(["util_pct", "power_w", "sm_mhz", "sm_max_mhz"]),
    WILD,
    st.sampled_from(["reasons", "ecc_uncorrected", "pcie_replays", "nvlink_crc"]),
    WILD_INT,
    st.integers(0, 7),
)
def test_unbelievable_values_accuse_nobody(fname: str, fval: float, iname: str, ival: int, at: int) -> None:
    """A record from any source: a NaN clock, a negative ECC count or a reasons mask of -1 is not
    evidence (before: -1 set every clock-event bit, -5 ECC errors accused, a NaN clock bent the median)."""
    sick = list(gpu(i) for i in range(8))
    sick[at] = gpu(at, **{fname: fval, iname: ival})
    report = analyze([node("a", tuple(sick)), healthy("b"), healthy("c")])
    assert report.suspects == () and report.commands == ()
    for s in report.slowest:
        assert math.isfinite(s.sm_ratio) and 0 < s.sm_ratio


def test_remap_flags_that_are_not_booleans_are_unknown() -> None:
    g = gpu(0, remap_pending=float("nan"), remap_failed=1.0)
    report = analyze([node("a", (g, *(gpu(i) for i in range(1, 8))))])
    assert report.suspects == ()
    assert report.nodes[0].gpus[0].remap_pending is None and report.nodes[0].gpus[0].remap_failed is None


def test_no_nodes_says_so() -> None:
    report = analyze([])
    assert report.suspects == () and report.commands == ()
    assert report.notes == ("no nodes read: nothing to triage",)


def test_too_few_busy_gpus_to_compare_is_said() -> None:
    """One slow GPU among three busy ones: no straggler can be proven, and the report says why."""
    slow = node("a", (gpu(0), gpu(1), gpu(2, sm_mhz=1500.0)))
    report = analyze([slow])
    assert report.suspects == ()
    assert any("SM clocks not compared" in n and f"{MIN_PEERS} needed" in n for n in report.notes)


def test_nodes_unknown_to_telemetry_are_notes_not_suspects() -> None:
    unread = NodeHealth("ghost", reachable=True, read_at=NOW, read=False, gpu_status="not in the inventory: not read",
                        expected_gpus=8, slurm_state="drained")  # fmt: skip
    report = analyze([unread, healthy("b"), healthy("c")])
    assert report.suspects == () and report.commands == ()
    assert "ghost: not in the inventory: not read" in report.notes


def test_expected_gpus_that_are_not_a_count_are_unknown() -> None:
    for bad in (-1, 4294967294, True):
        report = analyze([node("a", (), gpu_status="absent", expected_gpus=bad)])  # type: ignore[arg-type]
        assert report.suspects == (), bad


def test_resume_is_proposed_only_when_every_check_was_read() -> None:
    """A drained node that passes what was read, but whose kernel log could not be read (or whose
    GPUs Slurm expects and nobody listed), gets no resume command: the Xid check is unproven."""
    log_unread = healthy(
        "a", slurm_state="drained", xid_error="dmesg: read kernel buffer failed: Operation not permitted"
    )
    no_listing = node("b", (), gpu_status="absent", expected_gpus=0, slurm_state="down")
    proven = healthy("c", slurm_state="drained*")
    report = analyze([log_unread, no_listing, proven, healthy("d")])
    assert report.suspects == ()
    assert report.commands == ("loadmaster resume b", "loadmaster resume c")
    assert any(n.startswith("a: drained in Slurm, not every check could be read") for n in report.notes)


def test_a_node_slurm_has_drained_already_is_not_drained_again() -> None:
    """The drain would replace who drained it and why; it is still excluded."""
    sick = node("a", (gpu(0, remap_pending=True), *(gpu(i) for i in range(1, 8))), slurm_state="draining")
    fresh = node("b", (gpu(0, ecc_uncorrected=3), *(gpu(i) for i in range(1, 8))), slurm_state="mixed")
    report = analyze([sick, fresh, healthy("c")])
    assert [s.node for s in report.suspects] == ["a", "b"]
    assert report.commands[0] == "--exclude=a,b"
    assert [c.split()[2] for c in report.commands[1:]] == ["b"]
    assert "a: already draining in Slurm: no drain proposed" in report.notes
