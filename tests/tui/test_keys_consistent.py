"""One key means one thing on every screen, and every screen action is in the command palette.

The rules (README, "The console"): ``/`` filters the screen's table, ``enter`` opens the selected
row's detail, ``escape`` steps back, ``r`` reloads, ``n`` opens a "new" form, ``c`` cancels the
selected job, ``o`` edits the run folder; every key binding of a screen is also a palette command.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from textual.binding import Binding
from textual.widgets import DataTable, Input

from backend.config import default_config
from backend.services import Services
from tui.app import LoadmasterApp
from tui.screens.base import SCREEN_SPECS, LoadmasterScreen

#: key -> the only actions it may run on any screen.
KEY_MEANINGS = {
    "slash": {"filter"},
    "r": {"reload", "refresh", "refresh_jobs"},
    "ctrl+r": {"reload"},
    "c": {"cancel", "cancel_job"},
    "n": {"new_pull", "new_conversion"},
    "o": {"focus_url"},
    "ctrl+s": {"start", "launch_pull"},
    "escape": {"escape"},
}
#: Actions that are navigation, not commands: they need no palette entry.
NOT_COMMANDS = {"escape"}


def screen_classes() -> list[type[LoadmasterScreen]]:
    return [getattr(importlib.import_module(s.module), s.class_name) for s in SCREEN_SPECS]


def bindings(cls: type[LoadmasterScreen]) -> list[Binding]:
    """The screen's own keys and the shared ones of LoadmasterScreen (not Textual's tab/copy)."""
    out: list[Binding] = []
    for klass in cls.__mro__:
        if isinstance(klass, type) and issubclass(klass, LoadmasterScreen):
            out += list(Binding.make_bindings(klass.__dict__.get("BINDINGS", ())))
    return out


@pytest.mark.parametrize("cls", screen_classes(), ids=lambda c: c.__name__)
def test_shared_keys_mean_the_same_everywhere(cls: type[LoadmasterScreen]) -> None:
    for b in bindings(cls):
        for key in b.key.split(","):
            allowed = KEY_MEANINGS.get(key.strip())
            assert allowed is None or b.action in allowed, f"{cls.__name__}: {key} runs {b.action}, not {allowed}"


@pytest.mark.parametrize("cls", screen_classes(), ids=lambda c: c.__name__)
def test_every_screen_has_a_filter_and_every_key_is_in_the_palette(cls: type[LoadmasterScreen]) -> None:
    assert cls.FILTER_HINT, f"{cls.__name__} has a table but no / filter"
    assert any(b.key == "slash" and b.action == "filter" for b in bindings(cls))
    palette = {action for _title, _help, action in cls.palette_commands()}
    for b in bindings(cls):
        if b.action not in NOT_COMMANDS:
            assert b.action in palette, f"{cls.__name__}: key {b.key} ({b.action}) is not in the command palette"
    for action in palette:
        assert callable(getattr(cls, f"action_{action}", None)), f"{cls.__name__}: palette runs missing {action}"


@pytest.fixture
def services(tmp_path: Path) -> Services:
    (tmp_path / "lm-data" / "checkpoints").mkdir(parents=True)
    return Services(config=default_config())


def notes(app: LoadmasterApp) -> list[str]:
    return [n.message for n in app._notifications]


async def test_escape_closes_the_pull_form_and_ctrl_s_explains_itself(services: Services) -> None:
    from tui.widgets.transfers_form import PullForm

    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=(120, 34)) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+s")  # no form open: says how to get one
        await pilot.pause()
        assert any("Open the new-pull form first (n)" in m for m in notes(app))
        await pilot.press("n")
        await pilot.pause()
        form = app.screen.query_one(PullForm)
        assert not form.has_class("-hidden") and isinstance(app.focused, Input)
        await pilot.press("ctrl+s")  # no estimate yet: Launch stays out of reach
        await pilot.pause()
        assert any("Launch needs a fresh estimate" in m for m in notes(app))
        await pilot.press("escape")  # straight out of the form, even from a text field
        await pilot.pause()
        assert form.has_class("-hidden") and isinstance(app.focused, DataTable)
        await pilot.press("n")  # n toggles the form: the second n closes it and gives the keys back
        await pilot.pause()
        app.screen.query_one("#pull-estimate").focus()  # a button: n is not text there
        await pilot.press("n")
        await pilot.pause()
        assert form.has_class("-hidden") and isinstance(app.focused, DataTable)
        await pilot.press("3")
        await pilot.pause()
        assert app.current_mode == "checkpoints"


async def test_readonly_refusal_comes_before_any_other_complaint(services: Services) -> None:
    services.readonly = True
    app = LoadmasterApp(services, mode="checkpoints")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("s", "u")
        await pilot.pause()
        messages = notes(app)
        assert "Read-only mode: cannot strip a checkpoint" in messages
        assert "Read-only mode: cannot upload a checkpoint" in messages
        assert not any("select a step" in m.lower() for m in messages)


async def test_palette_lists_every_screen_action(services: Services) -> None:
    from tui.app import LoadmasterCommands

    app = LoadmasterApp(services)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        provider: Any = LoadmasterCommands(app.screen)
        titles = [t for t, _h, _cb in provider._commands()]
        for cls, spec in zip(screen_classes(), SCREEN_SPECS, strict=True):
            for title, _help, _action in cls.palette_commands():
                assert f"{spec.title}: {title}" in titles


async def test_errors_key_while_quitting_does_not_crash(services: Services) -> None:
    from tui.screens.errors import ErrorsScreen

    screen = ErrorsScreen([])
    screen.on_mount()  # never composed (the app was closing): no NoMatches, nothing to show
    assert screen.title == "Errors (0)"
