"""Shards screen (placeholder until the shards feature lands; the feature engineer replaces this file)."""

from __future__ import annotations

from typing import ClassVar

from tui.screens.base import PlaceholderScreen


class ShardsScreen(PlaceholderScreen):
    """Placeholder for the Shards screen."""

    SCREEN_TITLE: ClassVar[str] = "Shards"
    COMING: ClassVar[str] = (
        "WebDataset shard conversion — shard sizes, sample counts, validation and conversion jobs."
    )
