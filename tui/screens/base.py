"""What every console screen shares: the frame (header, mode bar, footer) and app helpers.

A feature screen subclasses :class:`LoadmasterScreen`, sets ``SCREEN_TITLE`` (and optionally
``PALETTE_COMMANDS``), and yields its content from :meth:`compose_body`. Worker failures on the
screen are forwarded to the app's error log, so screens need no handler of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.events import Resize
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static
from textual.worker import Worker, WorkerState

from tui.widgets.mode_bar import ModeBar

if TYPE_CHECKING:
    from backend.services import Services


@dataclass(frozen=True)
class ScreenSpec:
    """One console screen: its mode name, digit key, title and where its class lives."""

    mode: str
    key: str
    title: str
    module: str
    class_name: str


#: The console's screens in digit order.
SCREEN_SPECS: tuple[ScreenSpec, ...] = (
    ScreenSpec("fleet", "1", "Fleet", "tui.screens.fleet", "FleetScreen"),
    ScreenSpec("transfers", "2", "Transfers", "tui.screens.transfers", "TransfersScreen"),
    ScreenSpec("checkpoints", "3", "Checkpoints", "tui.screens.checkpoints", "CheckpointsScreen"),
    ScreenSpec("retention", "4", "Retention", "tui.screens.retention", "RetentionScreen"),
    ScreenSpec("egress", "5", "Egress", "tui.screens.egress", "EgressScreen"),
    ScreenSpec("shards", "6", "Shards", "tui.screens.shards", "ShardsScreen"),
)

#: A palette command a screen offers: (title, help, action name run on the screen).
PaletteCommand = tuple[str, str, str]


class LoadmasterScreen(Screen[None]):
    """Base class of the console's feature screens.

    Subclasses set ``SCREEN_TITLE``, may set ``PALETTE_COMMANDS`` and ``BINDINGS`` (listed by the
    help screen and the footer), and implement :meth:`compose_body`.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "leave_input", "Leave field", show=False),
    ]

    SCREEN_TITLE: ClassVar[str] = ""
    """Short name shown in the mode bar and the help screen."""

    PALETTE_COMMANDS: ClassVar[list[PaletteCommand]] = []
    """Commands the app's command palette offers for this screen: (title, help, action name)."""

    def __init__(
        self,
        services: Services,
        *,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.services = services

    def compose(self) -> ComposeResult:
        yield Header()
        yield ModeBar([(s.mode, s.key, s.title) for s in SCREEN_SPECS], id="mode-bar")
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> ComposeResult:
        """The screen's own content, between the mode bar and the footer."""
        yield from ()

    #: Below this width the footer drops its padding so more key hints fit.
    COMPACT_FOOTER_BELOW: ClassVar[int] = 100

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "leave_input":
            # Only while typing: otherwise escape goes on to the app (close a pushed screen).
            return isinstance(self.focused, Input)
        return True

    def action_leave_input(self) -> None:
        """Leave a text field so the screen keys (digits, /, ?) work again: focus the main table."""
        tables = list(self.query(DataTable))
        if tables:
            tables[0].focus()
        else:
            self.set_focus(None)

    def on_resize(self, event: Resize) -> None:
        for footer in self.query(Footer):
            footer.compact = event.size.width < self.COMPACT_FOOTER_BELOW

    def on_screen_resume(self) -> None:
        # The app's current mode is only final once the screen is shown, not when composed.
        for bar in self.query(ModeBar):
            bar.active = self.app.current_mode
            bar.refresh()

    @on(ModeBar.Selected)
    def _mode_selected(self, event: ModeBar.Selected) -> None:
        event.stop()
        self.app.switch_mode(event.mode)

    @on(Worker.StateChanged)
    def _forward_worker_failure(self, event: Worker.StateChanged) -> None:
        # Worker.StateChanged does not bubble, so the app would never see a screen's failures.
        if event.state == WorkerState.ERROR:
            record = getattr(self.app, "record_worker_failure", None)
            if record is not None:
                record(event.worker)

    # Conveniences so feature code reads `self.require_writable("cancel the pull")`.

    def require_writable(self, what: str) -> bool:
        """False (and a warning) when the console is read-only; see the app's method."""
        check = getattr(self.app, "require_writable", None)
        return True if check is None else bool(check(what))

    def report_error(self, title: str, error: BaseException | str) -> None:
        """Record a handled error in the app's error log and notify the operator."""
        report = getattr(self.app, "report_error", None)
        if report is not None:
            report(title, error)
        else:
            self.notify(f"{title}: {error}", severity="error", markup=False)


class PlaceholderScreen(LoadmasterScreen):
    """A screen whose feature has not landed yet: says what is coming."""

    COMING: ClassVar[str] = ""
    """What this screen will show, in a sentence or two."""

    def compose_body(self) -> ComposeResult:
        yield Static(
            f"{self.SCREEN_TITLE}\n\nComing: {self.COMING}",
            classes="placeholder screen-body",
            markup=False,
        )


class UnavailableScreen(LoadmasterScreen):
    """Stands in for a screen that could not be loaded, so the rest of the console still works."""

    def __init__(self, services: Services, *, title: str, reason: str, **kwargs: Any) -> None:
        super().__init__(services, **kwargs)
        self.SCREEN_TITLE = title  # type: ignore[misc]
        self.reason = reason

    def compose_body(self) -> ComposeResult:
        yield Static(
            f"{self.SCREEN_TITLE} is not available: {self.reason}\n\nPress e for details.",
            classes="placeholder screen-body",
            markup=False,
        )
