"""Goodput arithmetic: effective over wall time, MTBF, Young/Daly, and what is missing said so."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.triage.goodput import StepTime, compute, lines, young_daly


def regular(n: int, *, every: int = 100, pace: float = 10.0, save: float | None = 30.0) -> list[StepTime]:
    return [StepTime(i * every, 1000.0 + i * every * pace, save) for i in range(n)]


def test_young_daly_is_sqrt_two_save_mtbf() -> None:
    assert young_daly(30.0, 86400.0) == pytest.approx(math.sqrt(2 * 30 * 86400))
    assert young_daly(0.0, 5.0) == 0.0
    with pytest.raises(ValueError):
        young_daly(-1.0, 5.0)


def test_a_steady_run_with_nothing_lost_has_goodput_one() -> None:
    g = compute(regular(5), proven_step=400, failures=0, failures_from="slurm")
    assert g.goodput == pytest.approx(1.0) and g.wall_s == 4000.0 and g.sec_per_step == 10.0
    assert g.interval_s == 1000.0 and g.save_s == 30.0 and g.steps_lost == 0 and g.steps_kept == 400
    # No failure recorded: MTBF and Young/Daly are lower bounds (the window), and say so.
    assert g.mtbf_s == 4000.0 and g.mtbf_at_least and g.young_daly_s == pytest.approx(math.sqrt(2 * 30 * 4000))
    assert g.missing == ()
    assert any("≥" in ln for ln in lines(g))


def test_a_restart_gap_and_lost_steps_lower_it() -> None:
    steps = [*regular(3), StepTime(300, 1000.0 + 2000 + 3000, 30.0), StepTime(400, 1000.0 + 2000 + 3000 + 1000, 30.0)]
    g = compute(steps, proven_step=300, failures=2)
    # pace 10 s/step (the gap does not count), wall 6000 s, 300 steps kept (100 lost): 3000 s.
    assert g.sec_per_step == 10.0 and g.wall_s == 6000.0 and g.steps_kept == 300 and g.steps_lost == 100
    assert g.goodput == pytest.approx(0.5)
    assert g.mtbf_s == 3000.0 and not g.mtbf_at_least
    assert g.young_daly_s == pytest.approx(math.sqrt(2 * 30 * 3000))


def test_missing_inputs_are_named_not_invented() -> None:
    g = compute(regular(4, save=None), proven_step=None, failures=None, why_no_failures="no Slurm job given")
    assert g.goodput is None and g.steps_kept is None and g.mtbf_s is None and g.young_daly_s is None
    assert g.save_s is None and g.sec_per_step == 10.0
    kinds = [m.split(":", 1)[0] for m in g.missing]
    assert kinds == ["save time", "steps kept", "failures"]
    assert "no Slurm job given" in g.missing[-1]
    one = compute(regular(1), proven_step=0, failures=1)
    assert one.wall_s is None and one.goodput is None and one.mtbf_s is None
    assert one.missing and one.missing[0].startswith("pace and interval")
    none = compute([], proven_step=None, failures=3, why_no_steps="no run given")
    assert none.missing == ("checkpoints: no run given",) and none.failures == 3
    assert lines(none)[0].startswith("goodput: not computed")


times = st.floats(min_value=0, max_value=1e7, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(
    pts=st.lists(st.tuples(st.integers(0, 10**6), times, st.none() | st.floats(0, 1e4, allow_nan=False)), max_size=12),
    proven=st.none() | st.integers(0, 10**6),
    failures=st.none() | st.integers(0, 50),
)
def test_figures_stay_in_their_bounds_for_any_input(
    pts: list[tuple[int, float, float | None]], proven: int | None, failures: int | None
) -> None:
    g = compute([StepTime(*p) for p in pts], proven_step=proven, failures=failures)
    if g.goodput is not None:
        assert 0.0 <= g.goodput <= 1.0
        assert g.effective_s is not None and g.wall_s is not None and g.effective_s <= g.wall_s
    if g.mtbf_s is not None and failures:
        assert g.wall_s is not None and g.mtbf_s * failures == pytest.approx(g.wall_s)
    if g.young_daly_s is not None:
        assert g.save_s is not None and g.mtbf_s is not None
        assert g.young_daly_s**2 == pytest.approx(2 * g.save_s * g.mtbf_s)
    if g.steps_kept is not None and g.steps_lost is not None and proven is not None:
        first, newest = min(p[0] for p in pts), max(p[0] for p in pts)
        if first <= proven <= newest:
            assert g.steps_kept + g.steps_lost == newest - first
    # Every figure left unset has its input named in missing.
    assert (g.goodput is None) <= bool(g.missing) or g.wall_s is None


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(4, 30),
    every=st.integers(1, 5000),
    pace=st.floats(0.01, 100.0),
    stall_at=st.integers(0, 100),
    stall=st.floats(1.0, 1e6),
)
def test_one_stall_costs_exactly_its_share_of_the_wall(
    n: int, every: int, pace: float, stall_at: int, stall: float
) -> None:
    """A steady run with one interval stalled by S seconds: goodput W / (W + S), whatever the
    position of the stall (the pace is the healthy intervals' median)."""
    steps = regular(n, every=every, pace=pace)
    k = 1 + stall_at % (n - 1)
    stalled = [StepTime(s.step, s.at + (stall if i >= k else 0.0), s.save_s) for i, s in enumerate(steps)]
    wall = steps[-1].at - steps[0].at
    g = compute(stalled, proven_step=steps[-1].step, failures=1)
    assert g.sec_per_step == pytest.approx(pace)
    assert g.goodput == pytest.approx(wall / (wall + stall), rel=1e-9)
    assert g.steps_lost == 0 and g.mtbf_s == pytest.approx(wall + stall)


def test_an_unfinished_newer_save_counts_as_steps_lost() -> None:
    g = compute(regular(4), proven_step=300, newest_step=450, failures=1)
    assert g.steps_lost == 150 and g.steps_kept == 300 and g.goodput == pytest.approx(1.0)
