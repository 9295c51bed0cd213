"""The detail of one table row (a retention step, a conversion, an egress route), opened with enter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen

from tui.widgets.plain import PlainLabel, PlainStatic


class DetailModal(ModalScreen[None]):
    """Every field of one row, untruncated, as ``name: value`` lines; escape or enter closes it.

    The tables cut long paths and reasons to fit 80 columns; this is where they are read whole.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,enter,q", "close", "Close", show=True),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | escape, enter, q | Close the detail. |
    """

    def __init__(self, title: str, fields: Sequence[tuple[str, str]], *, hint: str = "") -> None:
        """Create the dialog.

        Args:
            title: What the row is (``step 48000``).
            fields: (name, value) pairs, shown in order as plain text, never markup.
            hint: One line under the fields, e.g. the keys that act on this row.
        """
        super().__init__()
        self.heading = title
        self.fields = list(fields)
        self.hint = hint

    def compose(self) -> ComposeResult:
        width = max((len(k) for k, _ in self.fields), default=0)
        body = "\n".join(f"{k.rjust(width)}  {v}" for k, v in self.fields)
        with Vertical(classes="dialog"):
            yield PlainLabel(self.heading, classes="dialog--title")
            with VerticalScroll(classes="detail--scroll"):
                yield PlainStatic(body, classes="detail--body")
            if self.hint:
                yield PlainStatic(self.hint, classes="detail--hint")

    def action_close(self) -> None:
        self.dismiss(None)
