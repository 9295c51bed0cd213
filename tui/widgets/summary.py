"""A key–value summary line (``nodes 16  up 15  down 1``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar

from rich.text import Text
from textual.message import Message
from textual.widget import Widget

from backend.textfmt import safe_text

Items = Mapping[str, object] | Iterable[tuple[str, object]]


class Summary(Widget):
    """One line (wrapping when narrow) of ``key value`` pairs, keys muted and values bold.

    | Class | Description |
    | :- | :- |
    | `summary--key` | The keys. |
    | `summary--value` | The values. |
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {"summary--key", "summary--value"}

    BINDINGS: ClassVar[list] = []
    """A summary is display-only: it has no key bindings."""

    DEFAULT_CSS = """
    Summary {
        height: auto;
    }
    """

    class Changed(Message):
        """Posted after the items were replaced."""

        def __init__(self, summary: Summary) -> None:
            self.summary = summary
            super().__init__()

        @property
        def control(self) -> Summary:
            """The summary that changed (alias of `summary`)."""
            return self.summary

    def __init__(
        self,
        items: Items = (),
        *,
        separator: str = "   ",
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
        disabled: bool = False,
    ) -> None:
        """Create a summary line.

        Args:
            items: ``{key: value}`` or ``[(key, value), ...]``; values are shown with ``str()``.
            separator: What separates the pairs.
        """
        super().__init__(name=name, id=id, classes=classes, disabled=disabled)
        self.separator = separator
        self._items: list[tuple[str, str]] = _normalise(items)

    @property
    def items(self) -> list[tuple[str, str]]:
        """The pairs shown, as strings."""
        return list(self._items)

    def set_items(self, items: Items) -> None:
        """Replace the pairs shown."""
        new = _normalise(items)
        if new != self._items:
            self._items = new
            self.refresh(layout=True)
            self.post_message(self.Changed(self))

    def render(self) -> Text:
        key_style = self.get_component_rich_style("summary--key")
        value_style = self.get_component_rich_style("summary--value")
        out = Text()
        for i, (key, value) in enumerate(self._items):
            if i:
                out.append(self.separator)
            out.append(f"{key} ", key_style)
            out.append(value, value_style)
        return out

    @property
    def plain(self) -> str:
        """The text shown, without styles (handy in tests and logs)."""
        return self.separator.join(f"{k} {v}" for k, v in self._items)


def _normalise(items: Items) -> list[tuple[str, str]]:
    pairs = items.items() if isinstance(items, Mapping) else items
    # a value can quote a file or a node (outside text): one printable line each
    return [(safe_text(k, None), safe_text(v, None)) for k, v in pairs]
