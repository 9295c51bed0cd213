"""Transfers screen (placeholder until the transfers feature lands; the feature engineer replaces this file)."""

from __future__ import annotations

from typing import ClassVar

from tui.screens.base import PlaceholderScreen


class TransfersScreen(PlaceholderScreen):
    """Placeholder for the Transfers screen."""

    SCREEN_TITLE: ClassVar[str] = "Transfers"
    COMING: ClassVar[str] = (
        "s5cmd pulls and uploads running on the nodes — progress, throughput, ETA, cancel (typed confirmation) and re-attach after a console restart."
    )
