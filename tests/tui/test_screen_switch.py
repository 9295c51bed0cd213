"""What a screen switch costs, counted rather than timed: a first visit does not re-parse the
stylesheets, a return to a built screen neither restyles it nor rebuilds its footer, and a theme
change still reaches the screens that were hidden when it happened (#29: switches within 100 ms;
the times are in bench/console_speed.py and BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.css.stylesheet import Stylesheet
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from backend.config import default_config
from backend.services import Services
from themes.palette import THEMES
from tui.app import LoadmasterApp
from tui.widgets.footer import SteadyFooter

SIZE = (100, 30)


@pytest.fixture
def services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Services:
    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("LOADMASTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("LOADMASTER_CONFIG", raising=False)
    return Services(config=default_config())


class Counter:
    """Counts the calls of a method of the app's stylesheet (and still makes them): on its own
    class, which overrides ``reparse`` (themes.parsed)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, app: App[Any], name: str) -> None:
        self.calls = 0
        cls = type(app.stylesheet)
        real = getattr(cls, name)

        def counted(sheet: Stylesheet, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(sheet, *args, **kwargs)

        monkeypatch.setattr(cls, name, counted)


async def test_a_first_visit_does_not_reparse_the_stylesheets(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = LoadmasterApp(services, mode="fleet")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        reparses = Counter(monkeypatch, app, "reparse")
        for mode in ("checkpoints", "retention", "egress"):
            await app.switch_mode(mode)
            await pilot.pause()
            assert app.current_mode == mode
        # Textual would re-parse every stylesheet from scratch twice per new screen.
        assert reparses.calls == 0


async def test_a_return_neither_restyles_the_screen_nor_rebuilds_its_footer(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = LoadmasterApp(services, mode="checkpoints")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        screen = app.screen
        keys = list(screen.query(FooterKey))
        assert keys and isinstance(screen.query_one(Footer), SteadyFooter)
        await app.switch_mode("egress")
        await pilot.pause()
        applies = Counter(monkeypatch, app, "apply")
        await app.switch_mode("checkpoints")
        await pilot.pause()
        assert app.screen is screen
        # The same key hints, not new ones built and styled again.
        assert list(screen.query(FooterKey)) == keys
        # A full restyle applies the stylesheet to every node of the screen.
        nodes = len(list(screen.walk_children(with_self=True)))
        assert applies.calls < nodes / 2, (applies.calls, nodes)


async def test_a_theme_changed_elsewhere_reaches_a_hidden_screen(services: Services) -> None:
    app = LoadmasterApp(services, mode="checkpoints")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        before = screen.styles.background
        await app.switch_mode("egress")
        await pilot.pause()
        shown = app.screen
        app.theme = next(n for n, t in THEMES.items() if t.background != THEMES[app.theme].background)
        await pilot.pause()
        assert shown.styles.background != before  # the screen on show took the theme
        await app.switch_mode("checkpoints")
        await pilot.pause()
        assert screen.styles.background == shown.styles.background


async def test_screens_shown_after_a_theme_change_take_it_from_one_parse(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = LoadmasterApp(services, mode="checkpoints")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        hidden = [app.screen]
        for mode in ("retention", "egress"):
            await app.switch_mode(mode)
            await pilot.pause()
            hidden.append(app.screen)
        before = hidden[0].styles.background
        reparses = Counter(monkeypatch, app, "reparse")
        app.theme = next(n for n, t in THEMES.items() if t.background != THEMES[app.theme].background)
        await pilot.pause()
        assert reparses.calls == 1  # the theme's own
        for mode, screen in zip(("checkpoints", "retention"), hidden, strict=False):
            await app.switch_mode(mode)
            await pilot.pause()
            assert app.screen is screen and screen.styles.background != before, mode
        # Textual would re-parse every stylesheet again for each screen shown after the change.
        assert reparses.calls == 1


async def test_parsed_rules_are_shared_by_every_console_of_the_process(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parsing is a function of the CSS and the variables (themes.parsed): once a console showed
    a theme, another console started after it, and a change back to that theme, parse nothing;
    and the rules they use are the ones Textual's own parse gives."""
    import textual.css.stylesheet as sheets

    dark = "loadmaster-dark"
    light = next(n for n, t in THEMES.items() if t.background != THEMES[dark].background)
    first = LoadmasterApp(services, theme=dark, mode="checkpoints")
    async with first.run_test(size=SIZE) as pilot:
        await pilot.pause()
        first.theme = light
        await pilot.pause()
    parses = 0
    real = sheets.parse

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal parses
        parses += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(sheets, "parse", counted)
    app = LoadmasterApp(services, theme=dark, mode="checkpoints")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.theme = light
        await pilot.pause()
        app.theme = dark
        await pilot.pause()
        assert parses == 0
        plain = Stylesheet(variables=app.stylesheet._variables)
        plain.source = dict(app.stylesheet.source)
        plain.parse()
        # (repr: a parse makes new layout objects, which compare by identity)
        assert parses > 0 and [repr(r) for r in plain.rules] == [repr(r) for r in app.stylesheet.rules]


class Toggled(App[None]):
    """A key hint shown only while ``on`` is set (its check_action), for the footer's rebuilds."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("x", "thing", "Thing"), Binding("y", "other", "Other")]

    def __init__(self) -> None:
        super().__init__()
        self.on = False

    def compose(self) -> ComposeResult:
        yield SteadyFooter()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.on if action == "thing" else True

    def action_thing(self) -> None:
        pass

    def action_other(self) -> None:
        pass


async def test_the_footer_is_rebuilt_when_its_hints_change() -> None:
    app = Toggled()
    async with app.run_test(size=(60, 5)) as pilot:
        await pilot.pause()
        shown = [k.description for k in app.query(FooterKey)]
        assert "Other" in shown and "Thing" not in shown
        first = list(app.query(FooterKey))
        app.screen.refresh_bindings()  # nothing changed: kept
        await pilot.pause()
        assert list(app.query(FooterKey)) == first
        app.on = True
        app.screen.refresh_bindings()
        await pilot.pause()
        assert [k.description for k in app.query(FooterKey)][:2] == ["Thing", "Other"]
