"""The one-line bar of console screens under the header: ``1 Fleet  2 Transfers ...``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.events import Click
from textual.message import Message
from textual.widget import Widget


class ModeBar(Widget):
    """Shows the console's screens with their digit keys, the active one highlighted.

    Clicking a name posts :class:`ModeBar.Selected`; the app switches to it.

    | Class | Description |
    | :- | :- |
    | `mode-bar--key` | The digit of each screen. |
    | `mode-bar--active` | The active screen's entry. |
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {"mode-bar--key", "mode-bar--active"}

    BINDINGS: ClassVar[list] = []
    """The digits themselves are app bindings (see ``LoadmasterApp.BINDINGS``)."""

    DEFAULT_CSS = """
    ModeBar {
        height: 1;
    }
    """

    class Selected(Message):
        """The operator clicked a screen's name."""

        def __init__(self, mode_bar: ModeBar, mode: str) -> None:
            self.mode_bar = mode_bar
            self.mode = mode
            super().__init__()

        @property
        def control(self) -> ModeBar:
            """The bar that was clicked (alias of `mode_bar`)."""
            return self.mode_bar

    def __init__(
        self,
        modes: Sequence[tuple[str, str, str]],
        *,
        active: str | None = None,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        """Create the bar.

        Args:
            modes: ``(mode, key, title)`` for each screen, in display order.
            active: The mode to highlight.
        """
        super().__init__(name=name, id=id, classes=classes)
        self.modes = list(modes)
        self.active = active
        self._spans: list[tuple[int, int, str]] = []

    def render(self) -> Text:
        key_style = self.get_component_rich_style("mode-bar--key")
        active_style = self.get_component_rich_style("mode-bar--active")
        out = Text(no_wrap=True, overflow="ellipsis")
        self._spans = []
        for mode, key, title in self.modes:
            start = len(out)
            is_active = mode == self.active
            out.append(" ")
            out.append(key, active_style if is_active else key_style)
            out.append(f" {title} ", active_style if is_active else "")
            self._spans.append((start, len(out), mode))
        return out

    def on_click(self, event: Click) -> None:
        x = event.x - self.gutter.left
        for start, end, mode in self._spans:
            if start <= x < end:
                self.post_message(self.Selected(self, mode))
                return
