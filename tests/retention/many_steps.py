"""A long run made from the session's real DCP run: its complete steps copied under more step
numbers (real DCP files, each step as resumable as the one it was copied from)."""

from __future__ import annotations

import shutil
from pathlib import Path

from retention_helpers import IN_FLIGHT, STEPS, DcpRun  # type: ignore[import-not-found]


def many_step_run(template: DcpRun, dest: Path, steps: int = 64, every: int = 500) -> Path:
    """A run folder of ``steps`` complete DCP steps (``every``, 2*``every`` ...) under ``dest``."""
    complete = [s for s in STEPS if s != IN_FLIGHT]
    dest.mkdir(parents=True)
    for i in range(1, steps + 1):
        src = template.root / f"step-{complete[(i - 1) % len(complete)]}"
        shutil.copytree(src, dest / f"step-{i * every}")
    return dest
