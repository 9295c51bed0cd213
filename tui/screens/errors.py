"""The ``e`` screen: recent errors (failed workers and reported errors) with their details."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from tui.widgets.plain import PlainStatic, PlainTable
from tui.widgets.transfers_format import short


@dataclass(frozen=True)
class ErrorRecord:
    """One error the console met: when, where it came from, one line, and the full detail."""

    when: datetime
    source: str
    summary: str
    detail: str


class ErrorsScreen(Screen[None]):
    """Recent errors, newest first; the highlighted one's detail below the table."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Back"),
        Binding("c", "clear", "Clear"),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | escape | Back to the screen you came from. |
    | c | Forget the listed errors. |
    """

    def __init__(
        self,
        errors: Sequence[ErrorRecord],
        *,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        """Create the screen.

        Args:
            errors: The app's error log (oldest first); shown newest first. The list object is
                kept, so clearing here clears the app's log.
        """
        super().__init__(name=name, id=id, classes=classes)
        self.errors = errors

    def compose(self) -> ComposeResult:
        yield Header()
        if not self.errors:
            yield Static("No errors recorded in this session.", classes="placeholder")
        yield PlainTable(cursor_type="row", zebra_stripes=True, id="error-table")
        yield PlainStatic("", id="error-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"Errors ({len(self.errors)})"
        tables = list(self.query(DataTable))
        if not tables:  # opened while the console was closing: nothing was composed
            return
        table = tables[0]
        table.add_columns("time", "source", "error")
        # the source gives way (shortened in the middle) so the error itself shows at 80 columns
        source_width = max(20, (self.size.width or self.app.size.width) // 3)
        for i, rec in enumerate(reversed(self.errors)):
            table.add_row(rec.when.strftime("%H:%M:%S"), short(rec.source, source_width), rec.summary, key=str(i))
        if self.errors:
            self._show(0)
            table.focus()

    def _show(self, index: int) -> None:
        newest_first = list(reversed(self.errors))
        if 0 <= index < len(newest_first):
            rec = newest_first[index]
            text = f"{rec.when.isoformat(timespec='seconds')}  {rec.source}\n\n{rec.detail}"
        else:
            text = ""
        self.query_one("#error-detail", Static).update(text)

    @on(DataTable.RowHighlighted)
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show(event.cursor_row)

    def action_clear(self) -> None:
        clear = getattr(self.errors, "clear", None)
        if clear is not None:
            clear()
        self.query_one(DataTable).clear()
        self._show(-1)
        self.title = "Errors (0)"

    def action_close(self) -> None:
        self.dismiss(None)
