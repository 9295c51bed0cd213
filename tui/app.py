"""The loadmaster console: modes (one per feature screen), themes, help, errors, command palette.

Built by the composition root with the :class:`backend.services.Services` it hands in; nothing
here reaches for globals. Digits switch screens, ``?`` lists keys, ``e`` lists errors, ``ctrl+p``
opens the command palette, ``q`` quits and closes the services.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import logging
import os
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.geometry import Size
from textual.screen import Screen
from textual.timer import Timer
from textual.widget import AwaitMount
from textual.worker import Worker, WorkerState

from backend.errors import ConfigError, LoadmasterError
from backend.ops import Operations
from backend.ops.prefs import load_ui_prefs, update_ui_prefs
from backend.textfmt import safe_block, safe_text
from themes import stylesheets
from themes.palette import DEFAULT_THEME, THEMES, semantic_defaults
from themes.parsed import SharedParseStylesheet
from tui.screens.base import SCREEN_SPECS, ScreenSpec, UnavailableScreen
from tui.screens.errors import ErrorRecord, ErrorsScreen
from tui.screens.help import HelpScreen, binding_rows

if TYPE_CHECKING:
    from textual.notifications import SeverityLevel

    from backend.services import Services

#: How many errors the in-memory log keeps (oldest dropped first).
MAX_ERRORS = 200
#: Longest notification text (a toast quoting a node's error is cut here).
NOTIFY_LIMIT = 2000
#: Seconds of quiet before the console builds the next screen ahead of time (after the first
#: paint, after each build, after the operator's own switch): a key pressed meanwhile is handled
#: before the next build starts.
PREBUILD_PAUSE_S = 0.3
#: Seconds between the app's reads of the site's alerts (the Fleet screen's marks), made only
#: with ``[alerts] alertmanager_url`` set and when the Alerts screen has not just read them.
SITE_ALERTS_EVERY = 15.0

log = logging.getLogger(__name__)

#: The screen whose key hints are being built while it is not shown (built ahead of time): the
#: app's keys that depend on the screen (T, triage) are enabled as they will be on that screen.
#: A context variable: only the task building it sees it, never the screen on show.
_BINDINGS_OF: contextvars.ContextVar[Screen[Any] | None] = contextvars.ContextVar("bindings_of", default=None)


class LoadmasterCommands(Provider):
    """Command palette entries: switch screen, theme, help, errors, quit, and each screen's
    ``PALETTE_COMMANDS`` (run on that screen after switching to it)."""

    def _commands(self) -> list[tuple[str, str, Callable[[], Any]]]:
        app = self.app
        assert isinstance(app, LoadmasterApp)
        out: list[tuple[str, str, Callable[[], Any]]] = []
        for spec in SCREEN_SPECS:
            out.append(
                (
                    f"Screen: {spec.title}",
                    f"Switch to the {spec.title} screen (key {spec.key})",
                    partial(app.switch_mode, spec.mode),
                )
            )
        for name in THEMES:
            out.append((f"Theme: {name}", "Use this theme (remembered for next time)", partial(app.set_theme, name)))
        out.append(("Help: keys", "List every key binding (key ?)", app.action_help))
        out.append(("Errors", "Recent errors with details (key e)", app.action_errors))
        out.append(("Audit log", "Every operator's guarded and destructive actions (key L)", app.action_audit))
        out.append(("Triage: a Slurm job or nodes", "Suspects, evidence, exact commands (key T)", app.open_triage))
        out.append(("Quit", "Close the console (key q)", app.action_quit))
        for spec in SCREEN_SPECS:
            cls = app.screen_class(spec)
            commands = getattr(cls, "palette_commands", None)
            for title, help_text, action in commands() if commands is not None else ():
                out.append((f"{spec.title}: {title}", help_text, partial(app.run_screen_action, spec.mode, action)))
        return out

    async def discover(self) -> Hits:
        for title, help_text, callback in self._commands():
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, callback in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)


class LoadmasterApp(App[int]):
    """The operations console. Construct with the services from the composition root."""

    TITLE = "loadmaster"
    SHUTDOWN_GRACE_S: ClassVar[float] = 1.0
    """How long quitting waits for the services to close (SSH, samplers) before leaving anyway
    (quitting takes under 2 s whatever is down: see :func:`run_console`)."""
    CSS_PATH: ClassVar[list[Any]] = stylesheets()  # type: ignore[assignment]
    COMMANDS = App.COMMANDS | {LoadmasterCommands}

    BINDINGS: ClassVar[list[BindingType]] = [
        *(Binding(s.key, f"switch_mode('{s.mode}')", s.title, show=False) for s in SCREEN_SPECS),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("e", "errors", "Errors"),
        Binding("L", "audit", "Audit log", show=False),
        Binding("T", "triage", "Triage"),
        Binding("ctrl+t", "cycle_theme", "Next theme", show=False),
        Binding("escape", "back", "Back", show=False),
        Binding("q", "quit", "Quit"),
        Binding("ctrl+q", "quit", "Quit", show=False, priority=True),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | 1-7 | Fleet, Transfers, Checkpoints, Retention, Egress, Shards, Alerts. |
    | ? | Keys of the console and the current screen. |
    | e | Recent errors with details. |
    | L | The audit log: every operator's guarded and destructive actions. |
    | T | Triage what is selected: the node (node detail, Fleet), the alert's node or Slurm job. |
    | ctrl+t | Next loadmaster theme (remembered). |
    | ctrl+p | Command palette. |
    | escape | Close a pushed screen (help, errors, dialogs). |
    | q, ctrl+q | Quit. |
    """

    def __init__(
        self, services: Services, *, theme: str | None = None, mode: str = "fleet", prebuild: bool = False
    ) -> None:
        """Create the console.

        Args:
            services: Everything built by the composition root (config, db, pool, ...).
            theme: A theme name from ``--theme``; beats the remembered one and the config's.
            mode: The screen to open first (a mode name such as ``fleet`` or ``transfers``).
            prebuild: Build the other screens ahead of time, one at a time while the console is
                idle, so a first visit costs what a return does (the console does; tests that
                look at one screen need not pay for the others).
        """
        super().__init__()
        # Parsed rules shared across stylesheets (themes.parsed): a start parses each source once.
        self.stylesheet = SharedParseStylesheet(variables=self.get_css_variables())
        self.services = services
        #: The console's one operation layer: every screen acts and reads through it (one Slurm
        #: snapshot cache for all of them).
        self.ops = Operations(services)
        self.errors: list[ErrorRecord] = []
        self._recorded_workers: weakref.WeakSet[Worker[Any]] = weakref.WeakSet()
        self._screen_classes: dict[str, type[Screen[Any]] | None] = {}
        self._screen_import_errors: dict[str, BaseException] = {}
        if mode not in {s.mode for s in SCREEN_SPECS}:
            known = ", ".join(s.mode for s in SCREEN_SPECS)
            raise ConfigError(f"no screen called {mode!r} (known: {known})")
        self._initial_mode = mode
        self._prebuild = prebuild
        #: Set once the start-up heap is frozen (``_freeze_heap``, after building ahead).
        self.heap_frozen = False
        self._prebuild_timer: Timer | None = None
        #: The screens built ahead so far, in order (what a visit to them no longer waits for).
        self.built_ahead: list[str] = []
        #: Node -> alertnames of its active, unsilenced site alerts (Alertmanager's), which the
        #: Fleet screen marks. Replaced, never changed in place: a screen sees a change by identity.
        self.site_alerts: dict[str, list[str]] = {}
        #: Node -> alertnames of its silenced site alerts (the Fleet says a silenced page is one).
        self.site_silenced: dict[str, list[str]] = {}
        self._site_alerts_at: float | None = None
        for t in THEMES.values():
            self.register_theme(t)
        self.theme = self._choose_theme(theme)
        # Only a change made in this session is remembered, never the --theme of one run.
        self._remembered_theme = self.theme
        for spec in SCREEN_SPECS:
            self.add_mode(spec.mode, partial(self._make_screen, spec))
        source = services.config.source
        self.sub_title = f"READ-ONLY · {source}" if services.readonly else source
        self.set_class(services.readonly, "-readonly")

    # ----------------------------------------------------------------- themes

    def _choose_theme(self, flag: str | None) -> str:
        """--theme flag > remembered > config ui.theme > default."""
        if flag:
            if flag not in self.available_themes:
                raise ConfigError(f"unknown theme {flag!r} (available: {', '.join(THEMES)})", key="--theme")
            return flag
        remembered = load_ui_prefs().get("theme")
        if isinstance(remembered, str) and remembered in self.available_themes:
            return remembered
        configured = self.services.config.ui.theme
        if configured:
            if configured not in self.available_themes:
                raise ConfigError(
                    f"unknown theme {configured!r} (available: {', '.join(THEMES)})",
                    file=self.services.config.source,
                    key="ui.theme",
                )
            return configured
        return DEFAULT_THEME

    def get_theme_variable_defaults(self) -> dict[str, str]:
        # Textual's own themes lack the semantic variables; without defaults the tcss would not parse.
        return semantic_defaults()

    def set_theme(self, name: str) -> None:
        """Switch to a registered theme (remembered for the next run)."""
        self.theme = name

    def watch_theme(self, name: str) -> None:
        if not self.is_running or name == self._remembered_theme:
            return
        self._remembered_theme = name
        try:
            update_ui_prefs(theme=name)
        except LoadmasterError as exc:
            self.report_error("Could not remember the theme", exc)

    def action_cycle_theme(self) -> None:
        """Next loadmaster theme."""
        names = list(THEMES)
        i = names.index(self.theme) + 1 if self.theme in names else 0
        self.set_theme(names[i % len(names)])
        self.notify(f"Theme: {self.theme}", timeout=2)

    def refresh_css(self, animate: bool = True) -> None:
        """Restyle for the present CSS count; re-parse only when the variables may have changed.

        After a theme change Textual (8.x ``switch_mode``) calls this for every screen shown
        again that was styled before it, and each call re-parses every stylesheet from scratch
        (~0.4 s) although the theme's change already did, with the same variables: the
        count only moves with the theme (``_invalidate_css``). Once parsed for the present
        count, the shown screen, and any below it that missed the change, are restyled alone.
        """
        count = self._css_update_count
        stale = [s for s in self.screen_stack if s._css_update_count != count] if self._screen_stack else []
        if getattr(self, "_css_parsed_at", None) != count or not stale:
            super().refresh_css(animate)
            self._css_parsed_at = count
            return
        for screen in stale:
            self.stylesheet.update(screen, animate=animate)
            screen._css_update_count = count
        if self.screen.is_mounted:
            self.screen._refresh_layout(self.size)

    # ----------------------------------------------------------------- screens

    def screen_class(self, spec: ScreenSpec) -> type[Screen[Any]] | None:
        """The class of a feature screen, or None when its module is missing or broken."""
        if spec.mode not in self._screen_classes:
            try:
                module = importlib.import_module(spec.module)
                self._screen_classes[spec.mode] = getattr(module, spec.class_name)
            except Exception as exc:  # noqa: BLE001 - one broken screen must not take the console down
                self._screen_classes[spec.mode] = None
                self._screen_import_errors[spec.mode] = exc
        return self._screen_classes[spec.mode]

    def _make_screen(self, spec: ScreenSpec) -> Screen[Any]:
        screen = self._build_screen(spec)
        # A new screen is styled from the current stylesheet as it is registered; without this
        # stamp Textual (8.x: App._init_mode, then switch_mode) re-parses every stylesheet from
        # scratch and restyles the whole app, twice, on each first visit (~0.7 s of a ~0.9 s
        # switch). A theme change after this bumps the app's count, so the screen is refreshed then.
        if hasattr(screen, "_css_update_count"):
            screen._css_update_count = self._css_update_count
        self._preset_breakpoints(screen)
        return screen

    def _preset_breakpoints(self, screen: Screen[Any]) -> None:
        """Give a new screen its breakpoint classes (``-narrow`` ...) for the present size before
        it is styled, as Textual's first resize of it would: set then, they restyle every widget
        of the screen once more (a third of a first visit to Transfers, Egress or Shards)."""
        for points, extent in (
            (_first_set(screen.HORIZONTAL_BREAKPOINTS, self.HORIZONTAL_BREAKPOINTS), self.size.width),
            (_first_set(screen.VERTICAL_BREAKPOINTS, self.VERTICAL_BREAKPOINTS), self.size.height),
        ):
            hit = next((name for at, name in sorted(points, reverse=True) if extent >= at), None)
            screen.update_classes({name: name == hit for _at, name in points}, update=False)

    def _build_screen(self, spec: ScreenSpec) -> Screen[Any]:
        cls = self.screen_class(spec)
        if cls is not None:
            try:
                return cls(self.services)  # type: ignore[call-arg,arg-type]  # feature screens take Services
            except Exception as exc:  # noqa: BLE001 - see screen_class
                self.report_error(f"{spec.title} screen failed to open", exc)
                return UnavailableScreen(self.services, title=spec.title, reason=_one_line(exc))
        err = self._screen_import_errors[spec.mode]
        self.report_error(f"{spec.title} screen failed to load", err)
        return UnavailableScreen(self.services, title=spec.title, reason=_one_line(err))

    # ----------------------------------------------------------------- building screens ahead

    def _schedule_prebuild(self) -> None:
        """Build the next unbuilt screen after ``PREBUILD_PAUSE_S`` of quiet (a switch restarts
        the wait: the operator's own switch comes first)."""
        if self._prebuild_timer is not None:
            self._prebuild_timer.stop()
            self._prebuild_timer = None
        if self._prebuild and self._next_prebuild() is not None:
            self._prebuild_timer = self.set_timer(PREBUILD_PAUSE_S, self._prebuild_next, name="prebuild")
        elif self._prebuild and not self.heap_frozen:
            self._freeze_heap()

    def _freeze_heap(self) -> None:
        """Once every screen is built: collect, then move what the console holds from its start
        (modules, classes, screens, widgets: ~130,000 objects) out of the garbage collector's
        reach, so its full collections scan only what refreshes make. At 1,024 nodes from
        Prometheus that cut collection from 0.19 to 0.08 s a refresh (BENCHMARKS.md #33). The
        cost: an object of that start-up heap that later becomes garbage in a cycle is never
        freed; screens and widgets live as long as the console does."""
        import gc

        gc.collect()
        gc.freeze()
        self.heap_frozen = True

    def _next_prebuild(self) -> str | None:
        """The next screen to build ahead: the first in digit order not built yet whose module
        loads (a broken one is reported when the operator visits it, not in the background)."""
        return next(
            (s.mode for s in SCREEN_SPECS if s.mode not in self._screen_stacks and self.screen_class(s) is not None),
            None,
        )

    async def _prebuild_next(self) -> None:
        """Build (compose, style, mount), lay out and render one screen without showing it; its
        reads wait until it is first shown (``LoadmasterScreen.start_reads``). Then wait for quiet
        before the next. Each step is short and keys are handled between them (this runs in the
        timer's task, not the app's message loop)."""
        self._prebuild_timer = None
        mode = self._next_prebuild()
        if mode is None or not self.is_running:
            return
        log.debug("building the %s screen ahead", mode)
        await self._init_mode(mode)  # Textual's own first step of switch_mode, without the switch
        screen = self.get_screen_stack(mode)[0]
        build_ahead = getattr(screen, "build_ahead", None)
        if build_ahead is not None:
            token = _BINDINGS_OF.set(screen)  # its footer's hints are the ones it will show
            try:
                await build_ahead()
            finally:
                _BINDINGS_OF.reset(token)
        # Twice: the widgets answer the first layout's Resize (table columns, widths) with changes.
        for _ in range(2):
            await asyncio.sleep(PREBUILD_PAUSE_S)  # the new widgets' own messages go first
            if screen.is_current or not self.is_running:
                break  # the operator went there meanwhile: Textual paints it as usual
            _paint_hidden(screen, self.size)
        self.built_ahead.append(mode)
        self.call_after_refresh(self._schedule_prebuild)

    def switch_mode(self, mode: str) -> AwaitMount:
        """Switch screens (see Textual's); a build ahead waits for quiet again after it."""
        await_mount = super().switch_mode(mode)
        if self._prebuild_timer is not None:
            self._schedule_prebuild()
        return await_mount

    async def run_screen_action(self, mode: str, action: str) -> None:
        """Switch to ``mode`` and run ``action`` on its screen (palette commands use this)."""
        await self.switch_mode(mode)
        await self.screen.run_action(action)

    def on_mount(self) -> None:
        from backend.ops.types import AlertSettings

        self.switch_mode(self._initial_mode)
        if self._prebuild:
            self.call_after_refresh(self._schedule_prebuild)
        if self.services.config.section(AlertSettings).alertmanager_url:
            self.set_interval(SITE_ALERTS_EVERY, self._poll_site_alerts)
            self._poll_site_alerts()

    # ----------------------------------------------------------------- the site's alerts

    def set_site_alerts(self, alerts: dict[str, list[str]], *, silenced: dict[str, list[str]] | None = None) -> None:
        """The nodes with an active, unsilenced site alert (and the silenced ones), from a fresh
        read (the Alerts screen's or the app's own); the screen on show re-reads them when they
        changed."""
        first = self._site_alerts_at is None
        self._site_alerts_at = time.monotonic()
        silenced = silenced or {}
        if alerts == self.site_alerts and silenced == self.site_silenced and not first:
            return
        self.site_alerts = alerts
        self.site_silenced = silenced
        changed = getattr(self.screen, "site_alerts_changed", None)
        if changed is not None:
            changed()

    @property
    def site_alerts_read(self) -> bool:
        """Whether Alertmanager's alerts were read at least once (until then none are known)."""
        return self._site_alerts_at is not None

    def _poll_site_alerts(self) -> None:
        fresh = self._site_alerts_at is not None and time.monotonic() - self._site_alerts_at < SITE_ALERTS_EVERY / 2
        if not fresh and not any(w.group == "site-alerts" and w.is_running for w in self.workers):
            self._read_site_alerts()

    @work(exclusive=True, group="site-alerts", exit_on_error=False)
    async def _read_site_alerts(self) -> None:
        from tui.screens.alerts import alerted_nodes, silenced_nodes

        try:
            alerts = await self.ops.alerts.site()
        except LoadmasterError as exc:
            # The Alerts screen says why; the Fleet keeps the marks of the last read meanwhile.
            log.info("reading the site's alerts failed: %s", exc)
            return
        self.set_site_alerts(alerted_nodes(alerts), silenced=silenced_nodes(alerts))

    async def on_unmount(self) -> None:
        # An unreachable node or a stuck sampler must not turn "q" into a hang: wait a little,
        # then leave; whatever is left is cancelled with the event loop.
        closing = asyncio.ensure_future(self.services.aclose())
        done, _ = await asyncio.wait({closing}, timeout=self.SHUTDOWN_GRACE_S)
        if not done:
            log.warning("services did not close within %.0fs; leaving anyway", self.SHUTDOWN_GRACE_S)
        elif closing.exception() is not None:
            log.warning("closing the services failed: %r", closing.exception())

    def action_help(self) -> None:
        """Show every key binding of the app and of the active screen."""
        if isinstance(self.screen, HelpScreen):
            return
        screen = self.screen
        title = getattr(screen, "SCREEN_TITLE", "") or type(screen).__name__
        sections: list[tuple[str, list[tuple[str, str]]]] = [
            (f"Screen: {title}", binding_rows(screen, self)),
        ]
        app_rows = binding_rows(self, self)
        if self.ENABLE_COMMAND_PALETTE:
            app_rows.append((self.get_key_display(Binding(self.COMMAND_PALETTE_BINDING, "")), "Command palette"))
        sections.append(("Console", app_rows))
        # The focused widget's keys (table cursor, input editing) last: useful, but the longest.
        focused = self.focused
        if focused is not None and focused is not screen:
            rows = binding_rows(focused, self)
            if rows:
                sections.append((f"Focused: {type(focused).__name__}", rows))
        self.push_screen(HelpScreen(sections))

    def action_errors(self) -> None:
        """Show recent errors with their details."""
        if not isinstance(self.screen, ErrorsScreen):
            self.push_screen(ErrorsScreen(self.errors))

    def action_audit(self) -> None:
        """Show the audit log (the team's, with a shared state database)."""
        from tui.screens.audit import AuditScreen

        if not isinstance(self.screen, AuditScreen):
            self.push_screen(AuditScreen(self.services))

    def open_triage(self, job: str | None = None, nodes: str | None = None, run: str | None = None) -> None:
        """Push the Triage screen for a Slurm job or nodes (with neither, it asks which)."""
        from tui.screens.triage import TriageScreen

        self.push_screen(TriageScreen(self.services, job=job, nodes=nodes, run=run))

    def triage_target(self) -> dict[str, str] | None:
        """What the active screen would triage: its ``triage_target()``, its ``selected_node()``,
        or the node a node detail shows; None when it names nothing."""
        screen = self.screen
        for hook in ("triage_target", "selected_node"):
            fn = getattr(screen, hook, None)
            if callable(fn):
                got = fn()
                return ({"nodes": got} if isinstance(got, str) else got) or None
        name = getattr(screen, "node_name", None)
        return {"nodes": name} if isinstance(name, str) and name else None

    def action_triage(self) -> None:
        """Triage what the active screen has selected (key T)."""
        from tui.screens.triage import TriageScreen

        if isinstance(self.screen, TriageScreen):
            return
        target = self.triage_target()
        if target is None:
            self.notify("nothing selected to triage: pick a node or an alert", severity="warning")
            return
        self.open_triage(**target)

    async def action_back(self) -> None:
        """Close the top pushed screen (never the screen of a mode)."""
        if len(self.screen_stack) > 1:
            self.pop_screen()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "back":
            # Let escape reach widgets (inputs, tables) when there is nothing to go back from.
            return len(self.screen_stack) > 1
        if action == "triage":
            # Shown only where a screen can say what to triage (see triage_target).
            s = _BINDINGS_OF.get() or self.screen
            return any(hasattr(s, h) for h in ("triage_target", "selected_node", "node_name"))
        return True

    def get_system_commands(self, screen: Screen[Any]) -> Any:
        # LoadmasterCommands already offers quit; keep Textual's others (theme picker, keys, ...).
        for command in super().get_system_commands(screen):
            if isinstance(command, SystemCommand) and command.title == "Quit":
                continue
            yield command

    # ----------------------------------------------------------------- safety and errors

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """A toast, always plain text: a notification quotes what a node, Slurm or a store said
        (an error, a job's state), and Textual would read it as markup (``[@click=...]`` binds
        an action); no notification of loadmaster's is markup, so ``markup`` is ignored. The
        text is cleaned of escape sequences and controls (:func:`backend.textfmt.safe_block`)."""
        del markup  # Widget.notify passes markup=True by default: never honoured here
        kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        super().notify(
            safe_block(message, NOTIFY_LIMIT),
            title=safe_text(title, 200),
            severity=severity,
            markup=False,
            **kwargs,
        )

    def require_writable(self, what: str) -> bool:
        """False, with a warning naming ``what``, when the console runs read-only."""
        if self.services.readonly:
            self.notify(f"Read-only mode: cannot {what}", severity="warning", markup=False)
            return False
        return True

    def report_error(self, title: str, error: BaseException | str) -> ErrorRecord:
        """Record a handled error in the error log and notify the operator."""
        if isinstance(error, BaseException):
            summary = _one_line(error)
            if isinstance(error, LoadmasterError):
                detail = str(error)  # a user-facing message already says what to fix
            else:
                detail = "".join(traceback.format_exception(error)).rstrip()
        else:
            summary = error.splitlines()[0] if error else title
            detail = error
        record = ErrorRecord(when=datetime.now(), source=title, summary=summary, detail=detail)
        self.errors.append(record)
        del self.errors[:-MAX_ERRORS]
        self.notify(f"{title}: {summary} (press e for details)", severity="error", title="Error", markup=False)
        return record

    def record_worker_failure(self, worker: Worker[Any]) -> ErrorRecord | None:
        """Record a failed worker once (screens forward theirs here)."""
        if worker in self._recorded_workers or worker.error is None:
            return None
        self._recorded_workers.add(worker)
        where = worker.group if worker.group and worker.group != "default" else ""
        name = worker.name or "background task"
        source = f"{name} ({where})" if where else name
        return self.report_error(source, worker.error)

    @on(Worker.StateChanged)
    def _worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            self.record_worker_failure(event.worker)


def _paint_hidden(screen: Screen[Any], size: Size) -> None:
    """Lay out and render a screen that is not shown, discarding the picture: what Textual's
    update timer does for the screen on show (``Screen._on_timer_update``), so each widget's
    arrangement and rendered lines are cached and the first show only composites (two thirds of
    a first visit's CPU: render_lines of 150-200 widgets and the reflow)."""
    screen._refresh_layout(size)
    screen._layout_required = False
    screen._dirty_widgets.clear()
    screen._compositor.render_update(full=True)


def _first_set(own: list[tuple[int, str]] | None, app: list[tuple[int, str]] | None) -> list[tuple[int, str]]:
    """A screen's breakpoints where it sets them (even none), else the app's (Textual's rule)."""
    return (own if own is not None else app) or []


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (
        f"{type(exc).__name__}: {text[0]}"
        if text and not isinstance(exc, LoadmasterError)
        else (text[0] if text else type(exc).__name__)
    )


#: After the console has left the screen, how long its leftover work (a listing of an unreachable
#: store, a thread connecting to a database that is down) may take to finish once cancelled.
LEFTOVER_GRACE_S = 0.5


def run_console(services: Services, *, theme: str | None = None) -> NoReturn:
    """Open the console on ``services`` until the operator quits; its exit code.

    Quitting takes under 2 s whatever is down: the services get ``SHUTDOWN_GRACE_S`` to close,
    then work still running is cancelled and given ``LEFTOVER_GRACE_S``; what is left after that
    (a request that ignores cancellation, a thread blocked in a connect) does not keep the process
    alive (``asyncio.run`` would wait for all of it: 30 s and more was seen), and the process
    ends without the interpreter's teardown. It does not return.
    """
    app = LoadmasterApp(services, theme=theme, prebuild=True)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        app.run(loop=loop)
    finally:
        stuck = _cancel_leftovers(loop, LEFTOVER_GRACE_S)
    code = int(app.return_code or 0)
    if stuck:
        log.warning("leaving with %d task(s) or thread(s) still running", stuck)
    # The services are closed and the terminal restored: nothing is left to do but the
    # interpreter's teardown of every imported library (torch, botocore: 5 s was measured on a
    # busy machine after the console had already left). Leave now.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(code)


def _cancel_leftovers(loop: asyncio.AbstractEventLoop, grace: float) -> int:
    """Cancel the tasks still on ``loop`` and wait up to ``grace`` seconds for them; how many
    tasks and worker threads are still running after that."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.wait(tasks, timeout=grace))
    running = sum(1 for t in tasks if not t.done())
    # Idle executor threads end at once; one blocked in a connect does not (it is counted).
    with contextlib.suppress(Exception):
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_default_executor(), grace))
    threads = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    return running + len(threads)
