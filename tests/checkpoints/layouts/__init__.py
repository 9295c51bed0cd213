"""Checkpoint runs written by the real training libraries, for the retention and strip tests.

Each builder writes one *run folder* the way its library writes it (its own save function where
it installs on CPU, else its documented file set with real ``torch.save`` contents) and returns
what a correct classifier must say about every step in it. Builders never guess: the expected
``kind`` of each step is what the library's own loader would make of it.

``build(layout, root, steps, states=...)`` is the one entry point; ``LAYOUTS`` lists the ids.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: What one step of a run is, as its training library would load it.
#:   full       -- resumable: model and optimizer state, commit marker present
#:   weights    -- committed, provably no optimizer state (an export, a model-only save)
#:   incomplete -- in flight: the library's commit marker for it is not written yet
#:   corrupt    -- committed, but its files do not match the marker (truncated, missing, empty)
KINDS = ("full", "weights", "incomplete", "corrupt")


@dataclass(frozen=True)
class StepSpec:
    """One step a builder wrote, and what a correct classifier must say about it."""

    name: str  # folder (or file, e.g. Lightning's "epoch=0-step=100.ckpt") relative to the run root
    step: int
    layout: str  # the catalog's layout id (see EXPECTED_LAYOUT below)
    kind: str  # one of KINDS
    marker: str | None  # the commit marker's path relative to the run root; None if the layout has none
    best: bool = False  # the Trainer's best_model_checkpoint (protected like a pin)


@dataclass(frozen=True)
class BuiltRun:
    """A run folder and its steps, oldest first."""

    root: Path
    layout: str  # builder id (a key of LAYOUTS)
    steps: tuple[StepSpec, ...]

    def spec(self, step: int) -> StepSpec:
        return next(s for s in self.steps if s.step == step)


#: builder id -> callable(root, steps, states) -> BuiltRun; filled by the builder modules.
Builder = Callable[[Path, Sequence[int], Mapping[int, str]], BuiltRun]
LAYOUTS: dict[str, Builder] = {}


def register(name: str) -> Callable[[Builder], Builder]:
    def deco(fn: Builder) -> Builder:
        LAYOUTS[name] = fn
        return fn

    return deco


def build(layout: str, root: Path, steps: Sequence[int], *, states: Mapping[int, str] | None = None) -> BuiltRun:
    """Write a run of ``layout`` under ``root`` (created) with one step per number in ``steps``.

    ``states`` maps a step number to one of KINDS (default ``full``; ``weights`` only where the
    layout has a model-only save). The run-level files the library writes (``latest``,
    ``latest_checkpointed_iteration.txt``, ...) are written as the library would after the
    newest *committed* step.
    """
    from tests.checkpoints.layouts import dcp_family, frameworks, more_layouts  # noqa: F401 - they register

    root.mkdir(parents=True, exist_ok=True)
    return LAYOUTS[layout](root, tuple(steps), dict(states or {}))
