"""Confirmation dialogs: yes/no, and "type this exact phrase" for destructive actions."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input

from tui.widgets.plain import PlainLabel, PlainStatic


class ConfirmModal(ModalScreen[bool]):
    """Ask a yes/no question; dismisses with True (yes) or False (no / escape).

    Push it with a callback or await it from a worker::

        if await self.app.push_screen_wait(ConfirmModal(title="Cancel pull?", body=plan)):
            ...
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes", show=True),
        Binding("n", "answer(False)", "No", show=True),
        Binding("escape", "answer(False)", "Cancel", show=False),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | y | Answer yes. |
    | n | Answer no. |
    | escape | Answer no. |
    """

    def __init__(
        self,
        *,
        title: str,
        body: str = "",
        yes_label: str = "Yes",
        no_label: str = "No",
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        """Create the dialog.

        Args:
            title: The question.
            body: What will happen (shown as plain text, not markup).
            yes_label: Label of the button that answers True.
            no_label: Label of the button that answers False (focused first).
        """
        super().__init__(name=name, id=id, classes=classes)
        self.question = title
        self.body = body
        self.yes_label = yes_label
        self.no_label = no_label

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield PlainLabel(self.question, classes="dialog--title")
            if self.body:
                yield PlainStatic(self.body, classes="dialog--body")
            with Horizontal(classes="dialog--buttons"):
                yield Button(self.yes_label, id="yes", variant="primary")
                yield Button(self.no_label, id="no")

    def on_mount(self) -> None:
        # The safe answer is the default: a stray Enter must not confirm.
        self.query_one("#no", Button).focus()

    @on(Button.Pressed)
    def _button(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class ConfirmTyped(ModalScreen[bool]):
    """Ask the operator to type an exact phrase before something destructive.

    The confirm button stays disabled until the input equals ``phrase`` exactly (case and
    spaces count); Enter confirms only then. Dismisses with True when confirmed, False on
    cancel / escape. Used before retention deletes and cancelling pulls.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", show=True),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | escape | Cancel (dismiss with False). |
    | enter | In the input: confirm, only when the phrase matches exactly. |
    """

    def __init__(
        self,
        *,
        title: str,
        phrase: str,
        body: str = "",
        confirm_label: str = "Confirm",
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        """Create the dialog.

        Args:
            title: What is about to happen, in a few words.
            phrase: The exact text the operator must type (e.g. ``delete 14 checkpoints``).
            body: The plan being confirmed (plain text, not markup).
            confirm_label: Label of the confirm button.
        """
        if not phrase:
            raise ValueError("ConfirmTyped needs a non-empty phrase")
        super().__init__(name=name, id=id, classes=classes)
        self.question = title
        self.phrase = phrase
        self.body = body
        self.confirm_label = confirm_label

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield PlainLabel(self.question, classes="dialog--title")
            if self.body:
                yield PlainStatic(self.body, classes="dialog--body")
            yield PlainLabel(f"Type '{self.phrase}' to confirm:", classes="dialog--prompt")
            yield Input(placeholder=self.phrase, id="phrase")
            with Horizontal(classes="dialog--buttons"):
                yield Button(self.confirm_label, id="confirm", variant="error", disabled=True)
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#phrase", Input).focus()

    @property
    def matches(self) -> bool:
        """Whether the typed text is exactly the phrase."""
        return self.query_one("#phrase", Input).value == self.phrase

    @on(Input.Changed, "#phrase")
    def _typed(self, event: Input.Changed) -> None:
        event.stop()
        self.query_one("#confirm", Button).disabled = not self.matches

    @on(Input.Submitted, "#phrase")
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self.matches:
            self.dismiss(True)
        else:
            self.app.bell()
            self.notify(
                f"Type exactly '{self.phrase}' to confirm, or press escape to cancel.", severity="warning", markup=False
            )

    @on(Button.Pressed, "#confirm")
    def _confirm(self, event: Button.Pressed) -> None:
        event.stop()
        if self.matches:
            self.dismiss(True)

    @on(Button.Pressed, "#cancel")
    def _cancel(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(False)

    def action_cancel(self) -> None:
        self.dismiss(False)
