"""Checkpoints screen (placeholder until the checkpoints feature lands; the feature engineer replaces this file)."""

from __future__ import annotations

from typing import ClassVar

from tui.screens.base import PlaceholderScreen


class CheckpointsScreen(PlaceholderScreen):
    """Placeholder for the Checkpoints screen."""

    SCREEN_TITLE: ClassVar[str] = "Checkpoints"
    COMING: ClassVar[str] = (
        "checkpoints in each store — steps, sizes, full (with AdamW optimizer state) versus stripped weights-only, upload and strip jobs."
    )
