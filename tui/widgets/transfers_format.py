"""Small text formatters shared by the Transfers widgets (no colours: styles come from themes)."""

from __future__ import annotations

from backend.ops.types import middle

__all__ = ["bar", "short"]


def bar(fraction: float | None, width: int = 12) -> str:
    """A text progress bar with its percentage: ``█████░░░░░░░  42%``."""
    if fraction is None:
        return "░" * width + "    ?"
    fraction = max(0.0, min(1.0, fraction))
    full = int(round(fraction * width))
    return "█" * full + "░" * (width - full) + f" {fraction * 100:3.0f}%"


def short(text: str, width: int) -> str:
    """``text`` cut in the middle to ``width`` characters (both ends of a path carry meaning)."""
    return middle(text, width)
