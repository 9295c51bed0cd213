"""Text from outside, shown as it is: never read as markup, never a terminal control.

Much of what the console shows was written by someone else: a node's hostname and its
nvidia-smi fields, Slurm's job names, users and reasons, Alertmanager's labels and annotations,
object keys, checkpoint folder names, a job's log. Textual reads a ``str`` handed to a
DataTable cell, a Static or a notification as *markup*: ``[bold red]FAKE ALERT[/]`` would be
styled, ``[@click=app.quit]x[/]`` would bind an action to a click, ``[link=...]`` would plant a
hyperlink; and a raw escape sequence (``\\x1b[2J``, an OSC 52 clipboard write) or a ``\\r`` can
rewrite the terminal or the line around it.

So every such path goes through here: :func:`plain` / :func:`plain_block` turn text into a Rich
``Text`` (a renderable, which no widget parses as markup) after :func:`backend.textfmt.safe_text`
/ :func:`~backend.textfmt.safe_block` removed escape sequences, control characters and bidi
overrides and redacted secrets; :class:`PlainTable`, :class:`PlainStatic` and
:class:`PlainLabel` do it for every cell and every update, so a screen cannot forget.
loadmaster's own markup (there is little) is not touched: it is never built from these.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.content import Content
from textual.widgets import DataTable, Label, Static

from backend.textfmt import LINE_LIMIT, safe_block, safe_text

__all__ = [
    "PlainCell",
    "PlainLabel",
    "PlainStatic",
    "PlainTable",
    "plain",
    "plain_block",
    "plain_cell",
    "plain_visual",
]

#: Longest text a :class:`PlainStatic` shows (a job's log tail, a plan's lines).
BLOCK_LIMIT = 64 * LINE_LIMIT


def plain(value: Any, limit: int | None = LINE_LIMIT, *, style: str = "") -> Text:
    """``value`` as one printable line of Text (never markup): escape sequences and controls
    removed (a line break or tab becomes a space), secrets redacted, cut to ``limit``."""
    return Text(safe_text(value, limit), style=style, end="")


def plain_block(value: Any, limit: int | None = BLOCK_LIMIT, *, style: str = "") -> Text:
    """``value`` as Text that keeps its lines (never markup), cleaned as :func:`plain`."""
    return Text(safe_block(value, limit), style=style, end="")


def _clean_text(text: Text, block: bool) -> Text:
    """A Text whose characters are all printable as it is; else its text cleaned, its style
    kept (its spans dropped: their offsets no longer hold)."""
    raw = text.plain
    if raw.isprintable() or (block and raw.replace("\n", "").replace("\t", "").isprintable()):
        return text
    clean = safe_block(raw, None) if block else safe_text(raw, None)
    return Text(
        clean, style=text.style, justify=text.justify, overflow=text.overflow, no_wrap=text.no_wrap, end=text.end
    )


class PlainCell(Text):
    """The Text a ``str`` table cell becomes: shown literally, and equal to its text as the ``str``
    it stands for was (a caller reading a cell back, a sort by its text, sees no difference)."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return self.plain == other
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]  # as Text: mutable


def plain_cell(cell: Any) -> Any:
    """A table cell as shown literally: a ``str`` becomes a :class:`PlainCell` (DataTable reads a
    ``str`` as markup), a Text with a control character is cleaned; anything else is kept."""
    if isinstance(cell, str):
        return PlainCell(safe_text(cell, None), end="")
    if isinstance(cell, Text):
        return _clean_text(cell, block=False)
    return cell


def plain_visual(content: Any) -> Any:
    """What a :class:`PlainStatic` shows for ``content``: a ``str`` cleaned (lines kept), a Text
    or Content with a control character cleaned; any other renderable as it is."""
    if isinstance(content, str):
        return safe_block(content, BLOCK_LIMIT)
    if isinstance(content, Text):
        return _clean_text(content, block=True)
    if isinstance(content, Content):
        raw = content.plain
        if raw.replace("\n", "").replace("\t", "").isprintable():
            return content
        return Content(safe_block(raw, None))
    return content


class PlainTable(DataTable[Any]):
    """A DataTable that shows every cell, row label and column label literally (:func:`plain_cell`).

    DataTable renders a ``str`` cell as markup: a Slurm job named ``[@click=app.quit]x`` would
    quit the console on a click. Every console table is one of these (or a subclass).
    """

    def add_column(self, label: Any, *, width: int | None = None, key: str | None = None, default: Any = None) -> Any:
        return super().add_column(plain_cell(label), width=width, key=key, default=default)

    def add_row(self, *cells: Any, height: int | None = 1, key: str | None = None, label: Any = None) -> Any:
        return super().add_row(
            *(plain_cell(c) for c in cells), height=height, key=key, label=None if label is None else plain_cell(label)
        )

    def update_cell(self, row_key: Any, column_key: Any, value: Any, *, update_width: bool = False) -> None:
        super().update_cell(row_key, column_key, plain_cell(value), update_width=update_width)

    def update_cell_at(self, coordinate: Any, value: Any, *, update_width: bool = False) -> None:
        super().update_cell_at(coordinate, plain_cell(value), update_width=update_width)


class PlainStatic(Static):
    """A Static that never reads markup and shows text from outside cleaned (:func:`plain_visual`),
    lines kept: from the constructor, :meth:`update` and ``content`` alike."""

    def __init__(self, content: Any = "", **kwargs: Any) -> None:
        kwargs["markup"] = False
        super().__init__(plain_visual(content), **kwargs)

    def update(self, content: Any = "", *, layout: bool = True) -> None:
        super().update(plain_visual(content), layout=layout)

    @property
    def content(self) -> Any:
        """What is shown (text from outside as cleaned)."""
        return Static.content.fget(self)  # type: ignore[attr-defined]

    @content.setter
    def content(self, content: Any) -> None:
        Static.content.fset(self, plain_visual(content))  # type: ignore[attr-defined]


class PlainLabel(PlainStatic, Label):
    """A Label that shows its text literally, as :class:`PlainStatic` does."""
