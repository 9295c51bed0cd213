"""The ``?`` screen: every key binding of the app and of the screen it was opened from.

Built from the ``BINDINGS`` of the classes involved at the moment it opens, so it can never
drift from what the keys actually do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.dom import DOMNode
from textual.screen import ModalScreen
from textual.widgets import Label

from tui.widgets.plain import PlainLabel, PlainStatic

#: (key display, description) rows under a section title.
HelpSection = tuple[str, Sequence[tuple[str, str]]]


def binding_rows(node: DOMNode | type[DOMNode], app: App | None = None) -> list[tuple[str, str]]:
    """(keys, description) for every binding a node's class declares, base classes included.

    A subclass's binding for a key hides its base class's one, as it does at run time. Keys
    bound to the same action and description are shown together (``j/down``).
    """
    cls = node if isinstance(node, type) else type(node)
    seen_keys: set[str] = set()
    grouped: dict[tuple[str, str], list[str]] = {}
    for klass in cls.__mro__:
        declared: Iterable[BindingType] = klass.__dict__.get("BINDINGS", ())
        for binding in Binding.make_bindings(declared):
            if binding.key in seen_keys:
                continue
            seen_keys.add(binding.key)
            label = binding.description or _humanize(binding.action)
            display = app.get_key_display(binding) if app is not None else binding.key
            grouped.setdefault((binding.action, label), []).append(display)
    return [("/".join(keys), label) for (_action, label), keys in grouped.items()]


class HelpScreen(ModalScreen[None]):
    """Lists key bindings by section; escape, q or ? closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "close", "Close"),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | escape, q, ? | Close the help screen. |
    """

    def __init__(
        self,
        sections: Sequence[HelpSection],
        *,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        """Create the help screen.

        Args:
            sections: ``(title, [(keys, description), ...])`` in display order.
        """
        super().__init__(name=name, id=id, classes=classes)
        self.sections = [(title, list(rows)) for title, rows in sections]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Keys  (escape closes)", classes="dialog--title")
            with VerticalScroll():
                for title, rows in self.sections:
                    if not rows:
                        continue
                    yield PlainLabel(title, classes="help--section")
                    width = max(len(k) for k, _ in rows)
                    text = "\n".join(f"  {k.ljust(width)}  {d}" for k, d in rows)
                    yield PlainStatic(text, classes="help--rows")

    @property
    def plain(self) -> str:
        """All rows as plain text (for logs and tests)."""
        return "\n".join(f"{title}\n" + "\n".join(f"{k} {d}" for k, d in rows) for title, rows in self.sections)

    def action_close(self) -> None:
        self.dismiss(None)


def _humanize(action: str) -> str:
    # Textual's own bindings sometimes have no description ("help_quit"): show the action.
    name = action.split("(", 1)[0].rsplit(".", 1)[-1]
    return name.replace("_", " ").capitalize()
