"""Textual themes (:mod:`themes.palette`) and stylesheets (``*.tcss``) for the loadmaster console.

``app.tcss`` holds the shell's layout; each feature adds ``themes/<feature>.tcss`` and the app
loads every ``.tcss`` here (sorted, ``app.tcss`` first). Colours come only from theme variables.
"""

from __future__ import annotations

from pathlib import Path

THEMES_DIR = Path(__file__).parent


def stylesheets() -> list[Path]:
    """Every stylesheet the console loads: ``app.tcss`` first, then the others sorted by name."""
    others = sorted(p for p in THEMES_DIR.glob("*.tcss") if p.name != "app.tcss")
    return [THEMES_DIR / "app.tcss", *others]
