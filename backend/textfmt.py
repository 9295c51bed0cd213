"""Plain-text tables for the CLI: columns padded to their widest cell, two spaces apart."""

from __future__ import annotations

from collections.abc import Sequence


def align_columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """One line per row, each column left-aligned to its widest cell (trailing spaces dropped)."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
