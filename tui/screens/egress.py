"""Egress screen (placeholder until the egress feature lands; the feature engineer replaces this file)."""

from __future__ import annotations

from typing import ClassVar

from tui.screens.base import PlaceholderScreen


class EgressScreen(PlaceholderScreen):
    """Placeholder for the Egress screen."""

    SCREEN_TITLE: ClassVar[str] = "Egress"
    COMING: ClassVar[str] = (
        "the egress price of planned transfers between sites, month-to-date spend against the budget, and allow / warn / confirm / block decisions."
    )
