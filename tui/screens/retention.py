"""Retention screen (placeholder until the retention feature lands; the feature engineer replaces this file)."""

from __future__ import annotations

from typing import ClassVar

from tui.screens.base import PlaceholderScreen


class RetentionScreen(PlaceholderScreen):
    """Placeholder for the Retention screen."""

    SCREEN_TITLE: ClassVar[str] = "Retention"
    COMING: ClassVar[str] = (
        "the retention plan — which checkpoints to keep full, strip to BF16 weights or delete, the bytes and money saved, and a typed confirmation before it runs."
    )
