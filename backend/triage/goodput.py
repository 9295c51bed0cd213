"""Goodput, the number the run lead asks for in the morning: effective training time over wall
time, the mean time between failures, and the checkpoint interval Young and Daly suggest
(``sqrt(2 x save time x MTBF)``) against the one in use.

Pure arithmetic on what loadmaster actually read, never on guesses:

- the run's full checkpoints, (step, time written, how long its files took to write) from the
  catalog: the pace (seconds per step, the lower median between consecutive checkpoints, so a
  restart's gap does not slow it, and with two intervals the healthy one counts), the interval in
  use (the median time between them), the save time (the median span of a step's files' write
  times: a lower bound, the first file's start is not known);
- the newest step proven resumable: steps after it are lost on a restart now;
- Slurm's record of the job (``scontrol show job``): how often it was restarted or requeued.

Wall time is the checkpoints' window (first to newest full step). Effective time is the steps kept
(the proven step minus the first) at the run's pace. An input that is missing leaves the figures
that need it unset, and ``missing`` says which and why.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class StepTime:
    """One full checkpoint: its step, when its newest file was written, and its files' write span
    in seconds (None: one file, or all written in the same second)."""

    step: int
    at: float
    save_s: float | None = None


@dataclass(frozen=True)
class Goodput:
    """The figures (None where an input was missing) and the inputs that were missing."""

    wall_s: float | None
    effective_s: float | None
    goodput: float | None
    failures: int | None
    mtbf_s: float | None
    #: True when no failure was recorded: ``mtbf_s`` and ``young_daly_s`` are lower bounds.
    mtbf_at_least: bool
    save_s: float | None
    interval_s: float | None
    young_daly_s: float | None
    sec_per_step: float | None
    steps_kept: int | None
    steps_lost: int | None
    checkpoints: int
    failures_from: str | None
    missing: tuple[str, ...]

    def as_json(self) -> dict[str, object]:
        d = asdict(self)
        d["missing"] = list(self.missing)
        return d


def young_daly(save_s: float, mtbf_s: float) -> float:
    """The first-order optimal checkpoint interval: ``sqrt(2 x save time x MTBF)``."""
    if save_s < 0 or mtbf_s < 0:
        raise ValueError("save time and MTBF must not be negative")
    return math.sqrt(2.0 * save_s * mtbf_s)


def compute(
    steps: Sequence[StepTime],
    *,
    proven_step: int | None,
    failures: int | None,
    newest_step: int | None = None,
    failures_from: str | None = None,
    why_no_failures: str = "no Slurm job given (--job): restarts and requeues unknown",
    why_no_steps: str = "the run has no full checkpoint with a step number",
) -> Goodput:
    """Goodput from the run's full checkpoints, the newest proven step and the failures counted
    (``newest_step``: the newest step of any kind, when newer than the newest full one)."""
    missing: list[str] = []
    pts = sorted({(s.step, s.at): s for s in steps}.values(), key=lambda s: (s.step, s.at))
    if not pts:
        missing.append(f"checkpoints: {why_no_steps}")
    pairs = [(b.step - a.step, b.at - a.at) for a, b in zip(pts, pts[1:], strict=False)]
    pairs = [(ds, dt) for ds, dt in pairs if ds > 0 and dt > 0]
    # The lower median: with two intervals, one of them a restart's gap, the healthy one is the pace.
    pace = statistics.median_low(dt / ds for ds, dt in pairs) if pairs else None
    interval = statistics.median(dt for _, dt in pairs) if pairs else None
    if pts and not pairs:
        missing.append(f"pace and interval: {len(pts)} full checkpoint(s) with a step and a time, two in order needed")
    spans = [s.save_s for s in pts if s.save_s is not None and s.save_s > 0]
    save = statistics.median(spans) if spans else None
    if pts and save is None:
        missing.append("save time: no full checkpoint whose files were written over a measurable span")
    wall = pts[-1].at - pts[0].at if len(pts) >= 2 and pts[-1].at > pts[0].at else None
    kept = lost = None
    effective = good = None
    if pts:
        # The newest step of any kind (an unfinished save counts as work done and lost).
        newest = max(pts[-1].step, newest_step if newest_step is not None else pts[-1].step)
        if proven_step is None:
            missing.append("steps kept: no step proves resumable")
        else:
            kept = max(0, proven_step - pts[0].step)
            lost = max(0, newest - proven_step)
    if wall is not None and pace is not None and kept is not None:
        effective = min(wall, kept * pace)
        good = effective / wall
    mtbf = None
    at_least = False
    if failures is None:
        missing.append(f"failures: {why_no_failures}")
    elif wall is not None:
        if failures > 0:
            mtbf = wall / failures
        else:
            mtbf, at_least = wall, True
    yd = young_daly(save, mtbf) if save is not None and mtbf is not None else None
    return Goodput(
        wall_s=wall,
        effective_s=effective,
        goodput=good,
        failures=failures,
        mtbf_s=mtbf,
        mtbf_at_least=at_least,
        save_s=save,
        interval_s=interval,
        young_daly_s=yd,
        sec_per_step=pace,
        steps_kept=kept,
        steps_lost=lost,
        checkpoints=len(pts),
        failures_from=failures_from,
        missing=tuple(missing),
    )


def _dur(s: float | None) -> str:
    if s is None:
        return "?"
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"


def lines(g: Goodput) -> list[str]:
    """The figures as a few short lines (80 columns), then what was missing."""
    if not g.checkpoints:
        head = "goodput: not computed"
        if g.failures is not None:
            head += f" ({g.failures} failures, {g.failures_from})"
        return [head, *(f"  missing: {m}" for m in g.missing)]
    pct = f"{g.goodput:.0%}" if g.goodput is not None else "?"
    ge = "≥" if g.mtbf_at_least else ""
    out = [
        f"goodput {pct}: {_dur(g.effective_s)} effective of {_dur(g.wall_s)} wall "
        f"({g.checkpoints} checkpoints, {g.steps_lost if g.steps_lost is not None else '?'} steps lost)",
        f"MTBF {ge}{_dur(g.mtbf_s)} ({g.failures if g.failures is not None else '?'} failures"
        + (f", {g.failures_from}" if g.failures_from else "")
        + f"); save {_dur(g.save_s)}",
        f"checkpoint every {_dur(g.interval_s)}; Young/Daly suggests {ge}{_dur(g.young_daly_s)}",
    ]
    out.extend(f"  missing: {m}" for m in g.missing)
    return out
