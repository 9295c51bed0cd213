"""What every console screen shares: the frame (header, mode bar, footer) and app helpers.

A feature screen subclasses :class:`LoadmasterScreen`, sets ``SCREEN_TITLE`` (and optionally
``PALETTE_COMMANDS``), and yields its content from :meth:`compose_body`. Worker failures on the
screen are forwarded to the app's error log, so screens need no handler of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.events import Mount, Resize, ScreenResume
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static
from textual.worker import Worker, WorkerState

from tui.widgets.footer import SteadyFooter
from tui.widgets.mode_bar import ModeBar
from tui.widgets.plain import PlainStatic
from tui.widgets.text_filter import text_matches

if TYPE_CHECKING:
    from backend.ops import Operations
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
    ScreenSpec("alerts", "7", "Alerts", "tui.screens.alerts", "AlertsScreen"),
)

#: The ``/`` key of a screen that has a filter (it lists it in its BINDINGS and sets FILTER_HINT).
FILTER_BINDING = Binding("slash", "filter", "Filter", key_display="/", show=False)

#: The keys of a screen that lists a run folder (Checkpoints, Retention): reload it, edit it. In
#: help; kept out of the footer so the screen's own keys fit 80 columns.
RUN_FOLDER_BINDINGS = (
    Binding("r", "reload", "Reload", show=False),
    Binding("ctrl+r", "reload", "Reload", show=False),  # also while typing in a field
    Binding("o", "focus_url", "Run folder", show=False),
)

#: A palette command a screen offers: (title, help, action name run on the screen).
PaletteCommand = tuple[str, str, str]


class _ConsoleApp(Protocol):
    """What a screen reads from the app that shows it (``tui.app.LoadmasterApp``, which imports
    this module)."""

    ops: Operations


def console_ops(screen: Screen[Any]) -> Operations:
    """The console's operation layer (``LoadmasterApp.ops``) for ``screen`` (a feature screen, a
    pushed one or a dialog): one for every screen, so what one screen caches (the Slurm snapshot)
    is what the next one reads."""
    return cast(_ConsoleApp, screen.app).ops


class LoadmasterScreen(Screen[None]):
    """Base class of the console's feature screens.

    Subclasses set ``SCREEN_TITLE``, may set ``PALETTE_COMMANDS`` and ``BINDINGS`` (listed by the
    help screen and the footer), and implement :meth:`compose_body`.

    Keys every screen shares, so they mean the same everywhere: ``/`` filters the screen's main
    table (screens that set ``FILTER_HINT`` and implement :meth:`apply_filter`), ``enter`` on a row
    opens its detail, ``escape`` steps back one level (leave the filter or a text field, close a
    form or a detail pane, clear the filter; then the app closes a pushed screen), ``r`` reloads,
    ``n`` opens a "new" form, ``c`` cancels the selected job, ``o`` edits the run folder.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "escape", "Back", show=False),
    ]

    FILTER_HINT: ClassVar[str] = ""
    """Placeholder of the ``/`` filter box; screens without one have no filter."""

    SCREEN_TITLE: ClassVar[str] = ""
    """Short name shown in the mode bar and the help screen."""

    PALETTE_COMMANDS: ClassVar[list[PaletteCommand]] = []
    """Commands the app's command palette offers for this screen: (title, help, action name)."""

    OWN_STATE_LINE: ClassVar[bool] = False
    """The screen says a state database that cannot be reached in its own summary (Fleet): the
    shell's status line stays off there, so it is said once."""

    STATE_CHECK_EVERY: ClassVar[float] = 15.0
    """Seconds between checks, while the screen is shown, that ``[state] url`` answers."""

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
        #: What the ``/`` filter box holds (stripped); screens show only rows matching it.
        self.filter_text = ""
        #: Whether the screen was shown once (its reads started then: :meth:`start_reads`).
        self.shown = False

    @property
    def ops(self) -> Operations:
        """The console's operation layer (:func:`console_ops`)."""
        return console_ops(self)

    @classmethod
    def palette_commands(cls) -> list[PaletteCommand]:
        """The screen's palette commands, plus the shared filter commands where it has a filter."""
        shared: list[PaletteCommand] = []
        if cls.FILTER_HINT:
            what = cls.SCREEN_TITLE or "rows"
            shared = [
                (f"Filter {what.lower()}", f"Show only matching rows: {cls.FILTER_HINT} (key /)", "filter"),
                ("Clear filter", "Show every row again (key escape)", "clear_filter"),
            ]
        return [*cls.PALETTE_COMMANDS, *shared]

    def compose(self) -> ComposeResult:
        yield Header()
        yield ModeBar([(s.mode, s.key, s.title) for s in SCREEN_SPECS], id="mode-bar")
        # One line for what is down for the whole console (the state database); hidden when all is well.
        status = PlainStatic("", id="shell-status")
        status.styles.height = 1
        status.styles.text_wrap = "nowrap"
        status.styles.text_overflow = "ellipsis"
        status.display = False
        yield status
        if self.FILTER_HINT:
            yield Input(
                placeholder=f"filter: {self.FILTER_HINT} (enter keeps it, escape clears it)",
                id="screen-filter",
                compact=True,
            )
        yield from self.compose_body()
        # Compact from the start where the terminal is narrow: set later (on_resize), the footer
        # restyles every key hint once more on a screen's first visit (~0.6 s on a loaded machine).
        yield SteadyFooter(compact=self.app.size.width < self.COMPACT_FOOTER_BELOW)

    def compose_body(self) -> ComposeResult:
        """The screen's own content, between the mode bar and the footer."""
        yield from ()

    #: Below this width the footer drops its padding so more key hints fit.
    COMPACT_FOOTER_BELOW: ClassVar[int] = 100

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "escape":
            # Only when there is a step back on this screen: otherwise escape goes on to the app
            # (which closes a pushed screen).
            return self._escape_step() is not None
        return True

    # -- escape: one level back ------------------------------------------------------------------

    def escape_hook(self) -> Callable[[], None] | None:
        """A screen's own step back (close a form or a detail pane), or None. Runs after leaving
        the filter box and before leaving a text field."""
        return None

    def _escape_step(self) -> Callable[[], None] | None:
        box = self._filter_box()
        focused = self.focused
        if box is not None and focused is box:
            return self.action_clear_filter
        step = self.escape_hook()
        if step is not None:
            return step
        if focused is not None and not isinstance(focused, DataTable):
            return self.action_leave_input  # a text field, a select or a button of a form
        if box is not None and (self.filter_text or box.display):
            return self.action_clear_filter
        return None

    def action_escape(self) -> None:
        """Step back one level (see the class docstring)."""
        step = self._escape_step()
        if step is not None:
            step()

    def action_leave_input(self) -> None:
        """Leave a form field so the screen keys (digits, /, ?) work again: focus the main table."""
        table = self.main_table()
        if table is not None:
            table.focus()
        else:
            self.set_focus(None)

    def main_table(self) -> DataTable[Any] | None:
        """The table the screen's row keys act on: the first one, unless a screen says otherwise."""
        tables = list(self.query(DataTable))
        return tables[0] if tables else None

    # -- the / filter ----------------------------------------------------------------------------

    def _filter_box(self) -> Input | None:
        if not self.FILTER_HINT:
            return None
        boxes = list(self.query("#screen-filter").results(Input))
        return boxes[0] if boxes else None

    def action_filter(self) -> None:
        """Show the filter box and type into it."""
        box = self._filter_box()
        if box is not None:
            box.display = True
            box.focus()

    def action_clear_filter(self) -> None:
        """Empty and hide the filter box; every row shows again."""
        box = self._filter_box()
        if box is None:
            return
        box.value = ""
        box.display = False
        self._set_filter("")
        self.action_leave_input()

    def _set_filter(self, text: str) -> None:
        if text != self.filter_text:
            self.filter_text = text
            self.apply_filter()

    def apply_filter(self) -> None:
        """Show only the rows matching :attr:`filter_text` (screens with a filter implement it)."""

    def filter_matches(self, *hay: str) -> bool:
        """Whether a row with these texts passes the filter."""
        return text_matches(self.filter_text, *hay)

    @on(Input.Changed, "#screen-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._set_filter(event.value.strip())

    @on(Input.Submitted, "#screen-filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if not event.value.strip():
            event.input.display = False
        self.action_leave_input()

    def on_resize(self, event: Resize) -> None:
        compact = event.size.width < self.COMPACT_FOOTER_BELOW
        for footer in self.query(Footer):
            if footer.compact != compact:
                footer.compact = compact

    @on(ScreenResume)
    def _keep_styles(self, event: ScreenResume) -> None:
        # Textual restyles every widget of a screen each time it is shown (twice on a first visit),
        # although its styles are kept up to date while it is hidden (classes, focus, hover,
        # order) and a theme change restyles it on the switch (the app's CSS count, see
        # LoadmasterApp._make_screen). Skipped while the screen was styled for the current count:
        # a third of a return to a built screen.
        count = getattr(self, "_css_update_count", None)
        if count is not None and count == getattr(self.app, "_css_update_count", None):
            event.refresh_styles = False

    def on_screen_resume(self) -> None:
        if not self.is_current:
            return  # built ahead of time (Textual resumes a mode's screen as it builds it): not shown
        # The app's current mode is only final once the screen is shown, not when composed.
        for bar in self.query(ModeBar):
            bar.active = self.app.current_mode
            bar.refresh()
        self._check_state_db()
        if not self.shown:
            self.shown = True
            self.start_reads()

    async def build_ahead(self) -> None:
        """What the screen's first show would build, done while it is built ahead of time (by
        ``LoadmasterApp``'s prebuilding): the footer's key hints."""
        for footer in self.query(SteadyFooter):
            await footer.build_ahead()

    def start_reads(self) -> None:
        """Start the screen's reads (listings, polls of nodes, stores, Alertmanager, the ledger):
        once, when the screen is first shown, never when it is built. The console builds its
        screens ahead of time (``LoadmasterApp`` prebuilding), so one that is never visited never
        reads; screens override this instead of reading in ``on_mount``."""

    @on(Mount)
    def _watch_state_db(self) -> None:
        if self.services.config.state.url and not self.OWN_STATE_LINE:
            self.set_interval(self.STATE_CHECK_EVERY, self._check_state_db)

    def _check_state_db(self) -> None:
        if self.services.config.state.url and not self.OWN_STATE_LINE and self.is_current:
            self._state_db_worker()

    @work(exclusive=True, group="shell-state", thread=True, exit_on_error=False)
    def _state_db_worker(self) -> None:
        """Whether the team's state database answers (in a thread: a connect may take seconds)."""
        available = getattr(self.services.db, "available", None)
        down = available() if available is not None else None
        self.app.call_from_thread(self.note_state_down, str(down) if down is not None else None)

    def note_state_down(self, why: str | None) -> None:
        """Say (``why``) or stop saying that the state database cannot be reached: one line."""
        if self.OWN_STATE_LINE:
            return
        for line in self.query("#shell-status").results(Static):
            if why:
                where = why.split(";")[0].removeprefix("state database ").removeprefix("postgresql://")
                line.update(f"STATE DATABASE DOWN, nothing recorded: {where}")
            line.display = bool(why)

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


class UnavailableScreen(LoadmasterScreen):
    """Stands in for a screen that could not be loaded, so the rest of the console still works."""

    def __init__(self, services: Services, *, title: str, reason: str, **kwargs: Any) -> None:
        super().__init__(services, **kwargs)
        self.SCREEN_TITLE = title  # type: ignore[misc]
        self.reason = reason

    def compose_body(self) -> ComposeResult:
        yield PlainStatic(
            f"{self.SCREEN_TITLE} is not available: {self.reason}\n\nPress e for details.",
            classes="placeholder screen-body",
        )
