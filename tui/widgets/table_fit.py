"""Cells that fit a table: the column that gives way is cut with ``…``, never at the screen edge.

A DataTable wider than its widget scrolls sideways, and what the edge cuts reads as whole
("verified resumabl", a GPU list ``0,1,2,3,4,5,`` of a node whose 8 GPUs starve, a header ``ET``).
A screen whose last column is free text (a reason, a summary) gives that column the room the
others leave and cuts it here, so a cut always shows. Paths are cut in the middle
(:func:`backend.ops.types.middle`): both ends carry meaning. :class:`FittedTable` lays out its
columns by priority (:func:`fit_columns`): the last one on screen fits whole or is not shown.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from tui.widgets.plain import PlainTable
from tui.widgets.table_cursor import cursor_row_key

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


#: A cell, or a cell made for its column's width (two paths, each cut in the middle to fit).
Cell = str | Text
CellFor = Cell | Callable[[int], Cell]


@dataclass(frozen=True)
class FitColumn:
    """A column of a :class:`FittedTable`.

    ``width``: its natural width (None: its widest cell or header). ``least``: the narrowest it
    may get, its cells cut with ``…`` below the natural width (None: never cut below it).
    """

    key: str
    label: str
    width: int | None = None
    least: int | None = None


def fit_columns(wanted: Sequence[tuple[str, int, int]], width: int, *, padding: int = 1) -> tuple[tuple[str, int], ...]:
    """The leading columns that fit whole in ``width`` cells, with their widths.

    ``wanted``: (key, natural width, least width) in display order, the most decisive first.
    Columns are taken in order while their least width (and the cell padding either side) fits;
    the first that does not is left out with every column after it, so the edge never cuts one
    (a header cut to ``ET`` reads as something else). What is left widens the shown columns
    toward their natural width, in order. The first column is always shown.
    """
    pad = 2 * padding
    chosen: list[tuple[str, int, int]] = []
    used = 0
    for key, natural, least in wanted:
        least = min(least, natural)
        if chosen and used + least + pad > width:
            break
        chosen.append((key, natural, least))
        used += least + pad
    out = []
    for key, natural, least in chosen:
        grow = max(0, min(natural - least, width - used))
        used += grow
        out.append((key, least + grow))
    return tuple(out)


def _identity(cell: Cell) -> Hashable:
    """What a cell's rendering depends on (rich's Text equality ignores the base style)."""
    if isinstance(cell, Text):
        return (cell.plain, str(cell.style), tuple(cell.spans), cell.justify, cell.overflow)
    return cell


class FittedTable(PlainTable):
    """A DataTable whose columns fit its width: laid out by :func:`fit_columns` on each resize
    and each :meth:`set_rows`, every cell cut to its column (:func:`cut_end`, or the cell's own
    function of the width). The cursor stays on its row's key across updates.
    """

    def __init__(self, columns: Sequence[FitColumn], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fit_spec: tuple[FitColumn, ...] = tuple(columns)
        self._rows_in: list[tuple[str, Sequence[CellFor]]] = []
        self._layout: tuple[tuple[str, int], ...] = ()
        self._shown: dict[str, tuple[Cell, ...]] = {}

    @property
    def shown_columns(self) -> tuple[str, ...]:
        """The keys of the columns on screen, in display order."""
        return tuple(key for key, _w in self._layout)

    def on_mount(self) -> None:
        self._refit()

    def on_resize(self) -> None:
        self._refit()

    def set_rows(
        self, rows: Sequence[tuple[str, Sequence[CellFor]]], *, columns: Sequence[FitColumn] | None = None
    ) -> None:
        """Show exactly ``rows`` ((key, a cell per column of the spec)), in order; ``columns``
        replaces the spec (a column whose natural width follows the data)."""
        self._rows_in = list(rows)
        if columns is not None:
            self.fit_spec = tuple(columns)
        self._refit()

    def _room(self) -> int:
        width = self.size.width or self.app.size.width
        height = self.size.height
        if height and len(self._rows_in) > height - self.header_height:
            width -= self.styles.scrollbar_size_vertical  # more rows than lines: a scrollbar
        return width

    def _wanted(self) -> list[tuple[str, int, int]]:
        out = []
        for i, col in enumerate(self.fit_spec):
            natural = col.width
            if natural is None:
                cells = (row[i] for _key, row in self._rows_in)
                natural = max([len(col.label), *(cell_width(c) for c in cells if not callable(c))])
            natural = max(natural, len(col.label))
            least = max(len(col.label), natural if col.least is None else col.least)
            out.append((col.key, natural, least))
        return out

    def _fitted(self, row: Sequence[CellFor]) -> tuple[Cell, ...]:
        index = {col.key: i for i, col in enumerate(self.fit_spec)}
        out = []
        for key, width in self._layout:
            cell = row[index[key]]
            out.append(cut_end(cell(width) if callable(cell) else cell, width))
        return tuple(out)

    def _refit(self) -> None:
        if not self.is_mounted:
            return
        layout = fit_columns(self._wanted(), self._room(), padding=self.cell_padding)
        selected = cursor_row_key(self)
        if layout != self._layout:
            self._layout = layout
            labels = {col.key: col.label for col in self.fit_spec}
            self.clear(columns=True)
            self._shown = {}
            for key, width in layout:
                self.add_column(labels[key], key=key, width=width)
        rows = {key: self._fitted(row) for key, row in self._rows_in}
        if list(rows) != list(self._shown):
            self.clear()
            for key, cells in rows.items():
                self.add_row(*cells, key=key)
            if selected in rows:
                self.move_cursor(row=list(rows).index(selected))
        else:
            for key, cells in rows.items():
                old = self._shown[key]
                for (col, _w), a, b in zip(self._layout, old, cells, strict=True):
                    if _identity(a) != _identity(b):
                        self.update_cell(key, col, b)
        self._shown = rows
