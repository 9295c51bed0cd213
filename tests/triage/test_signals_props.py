"""Property tests: the health parser over hostile cells, and the straggler finder's promise (an
outlier injected anywhere is found; noise within the healthy band is never flagged)."""

from __future__ import annotations

import math
import time
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from backend.triage.analyze import STRAGGLER_RATIO, NodeHealth, analyze, stragglers
from backend.triage.signals import HEALTH_FIELDS, GpuHealth, bitmask, parse_health, parse_xids

HOSTILE = st.one_of(
    st.sampled_from(["NaN", "nan", "inf", "-inf", "1e400", "-1", "[N/A]", "[Not Supported]", "", "²", "0x", "0xZZ"]),
    st.sampled_from(["1" * 40, "0x" + "f" * 17, "Yes", "No", "\x1b[31mred", "1,2", "\u202e9"]),
    st.text(max_size=12),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)
GOOD = ["0", "GPU-x", "00000000:18:00.0", "NVIDIA H100", "95", "650.00", "1980", "1980", "0x0000000000000000", "0"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(GOOD) - 1), HOSTILE), max_size=6), st.integers(1, 10))
def test_hostile_cells_never_crash_and_stay_in_range(edits: list[tuple[int, str]], missing: int) -> None:
    cells = list(GOOD)
    for pos, val in edits:
        cells[pos] = val.replace("\n", " ")
    line = ", ".join(cells[: len(cells) - (missing if missing < 4 else 0)])
    gpus = parse_health(line + "\n" + line, "GPU-x, " + ", ".join(v for _, v in edits[:3]))
    for g in gpus:
        assert 0 <= g.index < 64
        assert g.util_pct is None or (math.isfinite(g.util_pct) and 0 <= g.util_pct <= 100)
        assert g.sm_mhz is None or (math.isfinite(g.sm_mhz) and 1 <= g.sm_mhz <= 10000)
        assert g.power_w is None or 0 <= g.power_w <= 5000
        assert g.reasons is None or 0 <= g.reasons < 2**64
        assert g.ecc_uncorrected is None or g.ecc_uncorrected >= 0
        for text in (g.uuid, g.name, g.bus):  # no controls, escapes or bidi overrides reach a screen
            assert not any(unicodedata.category(c) == "Cc" or c in "\u202a\u202b\u202c\u202d\u202e" for c in text)


@settings(max_examples=60, deadline=None)
@given(st.lists(HOSTILE, min_size=len(HEALTH_FIELDS), max_size=len(HEALTH_FIELDS)))
def test_unreadable_values_accuse_nobody(cells: list[str]) -> None:
    """Cells that do not parse as positive evidence never make a suspect on their own."""
    cells = [c.replace("\n", " ").replace(",", " ") for c in cells]
    cells[0] = "0"
    gpus = parse_health(", ".join(cells))
    node = NodeHealth("n1", reachable=True, read_at=time.time(), gpus=gpus)
    report = analyze([node])
    for s in report.suspects:
        for e in s.evidence:
            # Only a parsed, ranged value can accuse: a reason bit, an ECC count, a remap flag.
            g = gpus[0]
            assert e.kind in ("clock-event", "ecc-uncorrected", "telemetry-missing")
            if e.kind == "clock-event":
                assert g.reasons is not None and g.reason_names
            if e.kind == "ecc-uncorrected":
                assert g.ecc_uncorrected


def _fleet(clocks: list[float]) -> list[tuple[str, GpuHealth]]:
    return [
        (f"node-{i // 8:03d}", GpuHealth(index=i % 8, util_pct=97.0, sm_mhz=c, reasons=0)) for i, c in enumerate(clocks)
    ]


@settings(max_examples=80, deadline=None)
@given(
    st.integers(4, 64).flatmap(
        lambda n: st.tuples(
            st.lists(st.floats(-0.015, 0.015), min_size=n, max_size=n),
            st.integers(0, n - 1),
            st.floats(0.50, 0.955),
        )
    )
)
def test_outlier_anywhere_is_found_noise_never(case: tuple[list[float], int, float]) -> None:
    noise, at, slow = case
    healthy = [1980.0 * (1 + e) for e in noise]
    assert stragglers(_fleet(healthy)) == []
    clocks = list(healthy)
    clocks[at] = 1980.0 * slow
    found = stragglers(_fleet(clocks))
    assert found and (found[0][0], found[0][1].index) == (f"node-{at // 8:03d}", at % 8)
    assert found[0][2] < STRAGGLER_RATIO


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6).flatmap(lambda n: st.lists(st.floats(-0.015, 0.015), min_size=8 * n, max_size=8 * n)))
def test_healthy_fleet_with_noise_has_no_suspects(noise: list[float]) -> None:
    now = time.time()
    nodes = []
    for k in range(0, len(noise), 8):
        gpus = tuple(
            GpuHealth(
                index=i, uuid=f"GPU-{k + i}", bus=f"0000:{i:02X}:00.0", name="H100", util_pct=96.0,
                power_w=650.0, sm_mhz=1980.0 * (1 + e), sm_max_mhz=1980.0, reasons=0x4,
                ecc_uncorrected=0, remap_pending=False, remap_failed=False,
            )
            for i, e in enumerate(noise[k : k + 8])
        )  # fmt: skip
        nodes.append(NodeHealth(f"node-{k:03d}", reachable=True, read_at=now, gpus=gpus))
    report = analyze(nodes)
    assert report.suspects == () and report.commands == ()


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=300))
def test_kernel_log_text_never_crashes(text: str) -> None:
    gpus = (GpuHealth(index=0, bus="00000000:18:00.0"),)
    line = f"2026-01-01T00:00:00,000000+00:00 h kernel: NVRM: Xid (PCI:{text[:20]}): 79, x\n{text}"
    for x in parse_xids(line, gpus, 0.0):
        assert x.code >= 0 and x.gpu in (-1, 0)


def test_bitmask_forms() -> None:
    assert bitmask("0x0000000000000008") == 8 and bitmask("8") == 8
    assert bitmask("0x") is None and bitmask("0x" + "f" * 17) is None and bitmask("NaN") is None


def test_smaller_node_of_the_same_model_is_not_missing_gpus() -> None:
    """Two 8-GPU nodes and one built with 4: the small one is not accused; one 7 of 8 is."""
    now = time.time()

    def node(name: str, n: int, skip: int | None = None) -> NodeHealth:
        gpus = tuple(
            GpuHealth(index=k, bus=f"0000:{i:02X}:00.0", name="H100", util_pct=96.0, sm_mhz=1980.0, reasons=0)
            for k, i in enumerate(i for i in range(n) if i != skip)
        )
        return NodeHealth(name, reachable=True, read_at=now, gpus=gpus)

    assert analyze([node("a", 8), node("b", 8), node("c", 4)]).suspects == ()
    got = analyze([node("a", 8), node("b", 8), node("c", 8, skip=5)]).suspects
    assert [(s.node, s.gpus, s.evidence[0].kind) for s in got] == [("c", (5,), "gpu-missing")]


@settings(max_examples=40, deadline=None)
@given(
    st.integers(8, 48).flatmap(
        lambda n: st.tuples(
            st.lists(st.floats(-0.015, 0.015), min_size=n, max_size=n), st.integers(0, n - 1), st.floats(0.5, 0.96)
        )
    )
)
def test_slowest_ranking_puts_the_outlier_first_with_its_reasons(case: tuple[list[float], int, float]) -> None:
    from backend.triage.analyze import slowest

    noise, at, slow = case
    pool = [
        (
            f"node-{i // 8:03d}",
            GpuHealth(
                index=i % 8, util_pct=97.0, power_w=650.0, sm_mhz=1980.0 * (slow if i == at else 1 + e),
                reasons=0x8 if i == at else 0,
            ),
        )
        for i, e in enumerate(noise)
    ]  # fmt: skip
    top = slowest(pool)[0]
    assert (top.node, top.gpu) == (f"node-{at // 8:03d}", at % 8)
    assert top.reasons == ("HW slowdown",) and top.util_ratio == 1.0 and top.power_ratio == 1.0


def test_unreachable_node_since_when_slurm_lost_it() -> None:
    now = time.time()
    down = NodeHealth(
        "n9", reachable=False, read_at=now, error="connection refused", slurm_state="down*",
        slurm_reason="Not responding", slurm_reason_at=now - 3600,
    )  # fmt: skip
    (s,) = analyze([down]).suspects
    assert s.since == now - 3600 and "(Slurm: down*, Not responding)" in s.evidence[0].detail
    up_in_slurm = NodeHealth("n8", reachable=False, read_at=now, error="timed out", slurm_state="mixed")
    assert analyze([up_in_slurm]).suspects[0].since == now
