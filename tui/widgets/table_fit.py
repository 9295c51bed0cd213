"""Cells that fit a table: the column that gives way is cut with ``…``, never at the screen edge.

A DataTable wider than its widget scrolls sideways, and what the edge cuts reads as whole
("verified resumabl"). A screen whose last column is free text (a reason, a summary) gives that
column the room the others leave and cuts it here, so a cut always shows. Paths are cut in the
middle (:func:`backend.ops.types.middle`): both ends carry meaning.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.text import Text
from textual.widgets import DataTable

#: Narrower than this, a free-text column is not worth showing cut; it keeps this much.
LEAST_ROOM = 8


def cut_end(text: str | Text, width: int) -> str | Text:
    """``text`` in ``width`` cells, its end replaced by ``…`` when cut (styles kept)."""
    if isinstance(text, Text):
        if text.cell_len <= width:
            return text
        out = text.copy()
        out.truncate(max(width, 1), overflow="ellipsis")
        return out
    if len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + "…"


def cell_width(cell: str | Text) -> int:
    """Cells a table cell takes (its longest line)."""
    plain = cell.plain if isinstance(cell, Text) else cell
    return max((len(line) for line in plain.splitlines()), default=0)


def room_for(
    table: DataTable[Any],
    headers: Sequence[str],
    rows: Iterable[Sequence[str | Text]],
    flex: int,
    width: int | None = None,
) -> int:
    """Cells left for column ``flex`` once every other column takes its widest cell or header.

    ``width`` is the table's width (default: its laid-out width). Each column is padded by the
    table's cell padding on both sides; a vertical scrollbar is always allowed for (rows come
    and go), so the column fits with or without one.
    """
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            if i != flex:
                widths[i] = max(widths[i], cell_width(cell))
    pad = 2 * table.cell_padding
    total = width if width is not None else table.size.width
    others = sum(w + pad for i, w in enumerate(widths) if i != flex)
    return max(total - others - pad - table.styles.scrollbar_size_vertical, LEAST_ROOM, len(headers[flex]))
