"""Pilot tests of the console shell: screens, help, themes, read-only, errors, dialogs."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Button, DataTable, Header

from backend.config import UISettings, default_config
from backend.errors import StoreError
from backend.services import Services
from backend.ui_prefs import load_ui_prefs, prefs_path
from tests.helpers import Recorder, type_text, wait_until
from themes.palette import SEMANTIC_VARIABLES, THEMES
from tui.app import LoadmasterApp
from tui.screens.base import SCREEN_SPECS
from tui.screens.errors import ErrorsScreen
from tui.screens.help import HelpScreen
from tui.screens.transfers import TransfersScreen
from tui.widgets import ConfirmModal, ConfirmTyped, Gauge, ModeBar, Summary

SIZE = (100, 30)


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("LOADMASTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("LOADMASTER_CONFIG", raising=False)
    return tmp_path


@pytest.fixture
def services(dirs: Path) -> Services:
    return Services(config=default_config())


# ---------------------------------------------------------------------------- screens


async def test_digits_switch_screens(services: Services) -> None:
    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.current_mode == "transfers"
        for spec in SCREEN_SPECS:
            await pilot.press(spec.key)
            await pilot.pause()
            assert app.current_mode == spec.mode
            assert type(app.screen).__name__ == spec.class_name
            assert app.screen.query_one(ModeBar).active == spec.mode
        # Screens are kept per mode: coming back finds the same instance.
        await pilot.press("2")
        first = app.screen
        await pilot.press("3", "2")
        await pilot.pause()
        assert app.screen is first


async def test_console_opens_on_fleet_by_default(services: Services) -> None:
    app = LoadmasterApp(services)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.current_mode == "fleet"
        assert app.is_running


async def test_help_lists_app_and_screen_bindings_and_escape_goes_back(services: Services) -> None:
    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        help_screen = app.screen
        assert isinstance(help_screen, HelpScreen)
        sections = dict(help_screen.sections)
        console = dict((d, k) for k, d in sections["Console"])
        for binding in LoadmasterApp.BINDINGS:
            assert binding.description in console, binding  # type: ignore[union-attr]
        assert console["Help"] == "?"
        assert console["Quit"] == "q/^q"
        assert console["Command palette"] == "^p"
        assert "Screen: Transfers" in sections
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, TransfersScreen)

        # From the errors screen, help lists that screen's own keys.
        await pilot.press("e", "question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        screen_rows = dict((d, k) for k, d in dict(app.screen.sections)["Screen: ErrorsScreen"])
        assert screen_rows["Clear"] == "c"
        assert screen_rows["Back"] == "esc"
        await pilot.press("escape", "escape")
        await pilot.pause()
        assert isinstance(app.screen, TransfersScreen)


async def test_palette_lists_screen_commands_and_runs_them_on_that_screen(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[Any] = []
    monkeypatch.setattr(TransfersScreen, "PALETTE_COMMANDS", [("Refresh transfers", "re-list", "mark")])
    monkeypatch.setattr(TransfersScreen, "action_mark", lambda self: ran.append(self), raising=False)
    app = LoadmasterApp(services, mode="egress")
    async with app.run_test(size=SIZE) as pilot:
        await _run_palette(pilot, "Refresh transfers")
        await wait_until(pilot, lambda: ran)
        assert app.current_mode == "transfers"
        assert ran == [app.screen]

        await _run_palette(pilot, "Screen: Shards")
        await wait_until(pilot, lambda: app.current_mode == "shards")


async def _run_palette(pilot: Any, query: str) -> None:
    from textual.command import CommandList, CommandPalette

    app = pilot.app
    await pilot.press("ctrl+p")
    await wait_until(pilot, lambda: isinstance(app.screen, CommandPalette))
    await type_text(pilot, query)
    palette = app.screen

    def top_hit() -> str:
        commands = palette.query_one(CommandList)
        if not commands.option_count:
            return ""
        return str(commands.get_option_at_index(0).prompt)

    await wait_until(pilot, lambda: query.lower() in top_hit().lower())
    await pilot.press("enter")
    await wait_until(pilot, lambda: not isinstance(app.screen, CommandPalette))


# ---------------------------------------------------------------------------- themes


def test_every_theme_defines_every_semantic_variable() -> None:
    assert set(THEMES) == {"loadmaster-dark", "loadmaster-light", "loadmaster-contrast"}
    for theme in THEMES.values():
        assert set(SEMANTIC_VARIABLES) <= set(theme.variables), theme.name


async def test_theme_from_palette_is_remembered_across_runs(services: Services, dirs: Path) -> None:
    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=SIZE) as pilot:
        assert app.theme == "loadmaster-dark"
        await _run_palette(pilot, "Theme: loadmaster-light")
        await wait_until(pilot, lambda: app.theme == "loadmaster-light")
    assert prefs_path().parent == dirs / "cfg"
    assert json.loads(prefs_path().read_text())["theme"] == "loadmaster-light"

    # Second run: remembered beats the config's ui.theme ...
    cfg = dataclasses.replace(default_config(), ui=UISettings(theme="loadmaster-contrast"))
    again = LoadmasterApp(Services(config=cfg), mode="transfers")
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert again.theme == "loadmaster-light"
        assert again.get_css_variables()["node-up"] == THEMES["loadmaster-light"].variables["node-up"]

    # ... and the --theme flag beats both, without overwriting what is remembered.
    flagged = LoadmasterApp(Services(config=cfg), theme="loadmaster-contrast", mode="transfers")
    async with flagged.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert flagged.theme == "loadmaster-contrast"
    assert load_ui_prefs()["theme"] == "loadmaster-light"


async def test_config_theme_applies_when_nothing_is_remembered(dirs: Path) -> None:
    cfg = dataclasses.replace(default_config(), ui=UISettings(theme="loadmaster-contrast"))
    app = LoadmasterApp(Services(config=cfg), mode="transfers")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.theme == "loadmaster-contrast"
        await pilot.press("ctrl+t")  # cycles: contrast -> dark
        await wait_until(pilot, lambda: app.theme == "loadmaster-dark")
    assert load_ui_prefs()["theme"] == "loadmaster-dark"


def test_unknown_theme_is_a_clear_error(services: Services) -> None:
    from backend.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown theme 'solarized'.*loadmaster-light"):
        LoadmasterApp(services, theme="solarized")
    bad = dataclasses.replace(default_config(), ui=UISettings(theme="nope"))
    with pytest.raises(ConfigError, match=r"ui\.theme: unknown theme 'nope'"):
        LoadmasterApp(Services(config=bad))


async def test_corrupt_prefs_file_does_not_block_start(services: Services) -> None:
    prefs_path().parent.mkdir(parents=True, exist_ok=True)
    prefs_path().write_text("{not json")
    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.theme == "loadmaster-dark"


# ---------------------------------------------------------------------------- read-only


async def test_require_writable_warns_and_refuses_in_readonly_mode(dirs: Path) -> None:
    hook = Recorder()
    app = LoadmasterApp(Services(config=default_config(), readonly=True), mode="transfers")
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await pilot.pause()
        assert app.require_writable("delete 3 checkpoints") is False
        assert app.screen.require_writable("cancel the pull") is False  # type: ignore[attr-defined]
        await pilot.pause()
        assert ("warning", "Read-only mode: cannot delete 3 checkpoints") in hook.notes()
        assert ("warning", "Read-only mode: cannot cancel the pull") in hook.notes()
        header = app.screen.query_one(Header)
        assert "READ-ONLY" in header.screen_sub_title
        assert app.has_class("-readonly")


async def test_require_writable_allows_when_writable(services: Services) -> None:
    hook = Recorder()
    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        assert app.require_writable("delete 3 checkpoints") is True
        await pilot.pause()
        assert not [n for n in hook.notes() if "Read-only" in n[1]]
        assert "READ-ONLY" not in app.screen.query_one(Header).screen_sub_title


# ---------------------------------------------------------------------------- errors


async def test_failing_workers_are_shown_and_the_console_keeps_running(services: Services) -> None:
    hook = Recorder()

    async def boom() -> None:
        raise RuntimeError("s3 listing exploded")

    async def screen_boom() -> None:
        raise StoreError("bucket 'ckpt' does not exist")

    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await pilot.pause()
        app.run_worker(boom(), name="_list_checkpoints", group="checkpoints", exit_on_error=False)
        app.screen.run_worker(screen_boom(), name="_list_pulls", group="transfers", exit_on_error=False)
        await wait_until(pilot, lambda: len(app.errors) == 2)
        assert app.is_running
        notes = [msg for sev, msg in hook.notes() if sev == "error"]
        assert any("s3 listing exploded" in m and "(press e for details)" in m for m in notes)
        assert any("bucket 'ckpt' does not exist" in m for m in notes)
        by_source = {e.source: e for e in app.errors}
        assert "RuntimeError: s3 listing exploded" == by_source["_list_checkpoints (checkpoints)"].summary
        assert "Traceback" in by_source["_list_checkpoints (checkpoints)"].detail
        # A LoadmasterError already says what to fix: no traceback for it.
        assert by_source["_list_pulls (transfers)"].detail == "bucket 'ckpt' does not exist"

        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, ErrorsScreen)
        table = app.screen.query_one(DataTable)
        assert table.row_count == 2
        detail = str(app.screen.query_one("#error-detail").render())
        assert "bucket 'ckpt' does not exist" in detail or "s3 listing exploded" in detail
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, TransfersScreen)
        await pilot.press("4")
        await pilot.pause()
        assert app.current_mode == "retention"


async def test_report_error_records_handled_errors(services: Services) -> None:
    hook = Recorder()
    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        app.screen.report_error("Retention plan", "3 checkpoints could not be listed")  # type: ignore[attr-defined]
        await pilot.pause()
        assert app.errors[-1].source == "Retention plan"
        assert ("error", "Retention plan: 3 checkpoints could not be listed (press e for details)") in hook.notes()
        await pilot.press("e", "c")
        await pilot.pause()
        assert app.errors == []
        assert app.screen.query_one(DataTable).row_count == 0


# ---------------------------------------------------------------------------- dialogs and widgets


async def test_confirm_typed_accepts_only_the_exact_phrase(services: Services) -> None:
    app = LoadmasterApp(services, mode="transfers")
    results: list[bool | None] = []
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(
            ConfirmTyped(
                title="Delete 3 checkpoints", phrase="delete 3 checkpoints", body="step-1000\nstep-2000\nstep-3000"
            ),
            results.append,
        )
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, ConfirmTyped)
        confirm = dialog.query_one("#confirm", Button)
        await type_text(pilot, "delete 3 checkpoint")
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is dialog and results == [] and confirm.disabled
        await pilot.press("s")
        await pilot.pause()
        assert not confirm.disabled
        await pilot.press("enter")
        await pilot.pause()
        assert results == [True]

        # Case counts, and escape answers False.
        app.push_screen(ConfirmTyped(title="Cancel pull", phrase="cancel pull-7"), results.append)
        await pilot.pause()
        await type_text(pilot, "CANCEL pull-7")
        await pilot.pause()
        assert app.screen.query_one("#confirm", Button).disabled
        await pilot.press("enter", "escape")
        await pilot.pause()
        assert results == [True, False]
        assert isinstance(app.screen, TransfersScreen)


async def test_confirm_modal_defaults_to_no(services: Services) -> None:
    app = LoadmasterApp(services, mode="transfers")
    results: list[bool | None] = []
    async with app.run_test(size=SIZE) as pilot:
        for keys in (("enter",), ("y",), ("n",), ("escape",)):
            app.push_screen(ConfirmModal(title="Stop telemetry?"), results.append)
            await pilot.pause()
            await pilot.press(*keys)
            await pilot.pause()
        assert results == [False, True, False, False]


async def test_gauge_levels_and_summary(services: Services) -> None:
    hook = Recorder()
    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        gauge = Gauge("gpu0 mem", value=10, total=80, id="g")
        summary = Summary({"nodes": 16, "up": 15}, id="s")
        await app.screen.mount(gauge, summary)
        await pilot.pause()
        assert gauge.has_class("-ok") and gauge.level == "ok"
        gauge.update(value=70)
        await pilot.pause()
        assert gauge.has_class("-warn") and not gauge.has_class("-ok")
        gauge.update(value=90)
        await pilot.pause()
        assert gauge.has_class("-over")
        levels = [(m.control, m.level) for m in hook.of(Gauge.LevelChanged)]
        assert levels == [(gauge, "warn"), (gauge, "over")]
        assert "█" in str(gauge.render()) and "112.5%" in str(gauge.render())
        summary.set_items([("nodes", 16), ("up", 14), ("down", 2)])
        await pilot.pause()
        assert summary.plain == "nodes 16   up 14   down 2"
        assert [m.control for m in hook.of(Summary.Changed)] == [summary]
        gauge.update(total=0)
        assert gauge.fraction == 0.0


# ---------------------------------------------------------------------------- life cycle and layout


async def test_quit_closes_the_services(services: Services) -> None:
    db = services.db  # opened, so aclose has something to close
    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await pilot.pause()
    assert not app.is_running
    with pytest.raises(sqlite3.ProgrammingError):
        db.query("SELECT 1")


@pytest.mark.parametrize("spec", [s for s in SCREEN_SPECS if s.mode != "fleet"], ids=lambda s: s.mode)
async def test_shell_fits_80x24(dirs: Path, spec: Any) -> None:
    app = LoadmasterApp(Services(config=default_config(), readonly=True), mode=spec.mode)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        bar = app.screen.query_one(ModeBar)
        assert bar.region.width == 80
        assert len(str(bar.render()).rstrip()) <= 80  # every screen name is visible
        header = app.screen.query_one(Header)
        assert header.region.y == 0 and header.region.height >= 1
        assert bar.region.y >= header.region.bottom  # the mode bar never hides the header
        title = app.format_title(header.screen_title, header.screen_sub_title)
        assert "READ-ONLY" in str(title) and len(str(title)) < 80 - 10


class _StuckServices(Services):
    """Real services whose closing never finishes (a sampler that ignores cancellation)."""

    async def aclose(self) -> None:
        await asyncio.Event().wait()


async def test_quit_does_not_hang_when_services_never_close(dirs: Path) -> None:
    app = LoadmasterApp(_StuckServices(config=default_config()), mode="transfers")
    app.SHUTDOWN_GRACE_S = 0.1  # type: ignore[misc]
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
    assert not app.is_running


async def test_theme_that_cannot_be_saved_is_reported_not_fatal(services: Services, dirs: Path) -> None:
    (dirs / "cfg").write_text("a file where the config dir should be")
    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+t")
        await wait_until(pilot, lambda: app.errors)
        assert app.theme == "loadmaster-light" and app.is_running
        assert app.errors[-1].source == "Could not remember the theme"
        assert "cannot save UI preferences" in app.errors[-1].summary


async def test_every_screen_survives_every_theme(services: Services) -> None:
    """Switch theme on one screen, then visit all others: each restyles without crashing."""
    app = LoadmasterApp(services)
    async with app.run_test(size=SIZE) as pilot:
        for _ in THEMES:
            await pilot.press("ctrl+t")
            for spec in SCREEN_SPECS:
                await pilot.press(spec.key)
                await pilot.pause()
                assert app.current_mode == spec.mode
                ticks = getattr(app.screen, "apply_times", None)
                if ticks is not None:
                    # The fleet restyles on the first telemetry tick after a theme change: wait
                    # for one (bounded by rounds, not asserted on time).
                    seen = len(ticks)
                    for _round in range(600):
                        if len(ticks) > seen:
                            break
                        await pilot.pause(0.05)
                    assert len(ticks) > seen, "no telemetry tick reached the fleet screen"
        assert app.is_running


async def test_footer_keys_are_styled_once_on_a_screens_first_show(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key takes the footer's compact value before it is mounted: no restyle flips it back
    (each key was restyled twice more on every first show), and it still looks as Textual's."""
    from textual.widgets import Footer
    from textual.widgets._footer import FooterKey

    restyled: list[FooterKey] = []
    original = FooterKey.update_node_styles

    def counted(self: FooterKey, animate: bool = True) -> None:
        restyled.append(self)
        original(self, animate)

    monkeypatch.setattr(FooterKey, "update_node_styles", counted)
    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=SIZE) as pilot:
        for key in ("", "5"):
            if key:
                await pilot.press(key)
            await pilot.pause()
            screen = app.screen
            footer = screen.query_one(Footer)
            keys = list(screen.query(FooterKey))
            assert len(keys) > 3
            for key in keys:
                palette = key.has_class("-command-palette")
                assert key.compact is (True if palette else footer.compact), key.key
                assert key.has_class("-compact") is key.compact, key.key
    assert restyled == []


async def test_clicking_the_mode_bar_switches_screens(services: Services) -> None:
    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        text = str(app.screen.query_one(ModeBar).render())
        x = text.index("Shards")
        await pilot.click(ModeBar, offset=(x, 0))
        await wait_until(pilot, lambda: app.current_mode == "shards")
        assert app.screen.query_one(ModeBar).active == "shards"


def test_quitting_leaves_work_that_ignores_cancellation_behind() -> None:
    """A request that swallows its cancellation (an S3 listing was seen to) must not keep the
    console's process alive after the operator quit: it is counted, and run_console leaves."""
    import asyncio

    from tui.app import _cancel_leftovers

    loop = asyncio.new_event_loop()

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # ignores cancellation

    async def polite() -> None:
        await asyncio.sleep(3600)

    tasks = [loop.create_task(stubborn()), loop.create_task(polite())]
    loop.run_until_complete(asyncio.sleep(0.01))  # both started
    assert _cancel_leftovers(loop, 0.2) == 1
    assert tasks[1].cancelled() and not tasks[0].done()
