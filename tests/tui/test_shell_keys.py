"""Keys keep working after typing: escape leaves a text field, and digits switch screens again."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import DataTable, Input

from backend.config import default_config
from backend.services import Services
from tui.app import LoadmasterApp
from tui.screens.checkpoints import CheckpointsScreen
from tui.screens.transfers import TransfersScreen


@pytest.fixture
def services(tmp_path: Path) -> Services:
    (tmp_path / "lm-data" / "checkpoints").mkdir(parents=True)
    return Services(config=default_config())


async def test_escape_leaves_a_field_so_digits_switch_screens(services: Services) -> None:
    app = LoadmasterApp(services, mode="checkpoints")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, CheckpointsScreen)
        field = screen.query_one("#ckpt-url", Input)
        field.focus()
        await pilot.press("x")
        assert field.value.endswith("x")  # typing goes into the field ...
        before = field.value
        await pilot.press("escape")
        assert isinstance(app.focused, DataTable)  # ... escape hands the keys back to the screen
        await pilot.press("2")
        await pilot.pause()
        assert isinstance(app.screen, TransfersScreen)
        assert field.value == before  # "2" switched screens instead of landing in the field


async def test_submitting_a_run_prefix_moves_focus_to_the_steps(services: Services) -> None:
    app = LoadmasterApp(services, mode="checkpoints")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        field = app.screen.query_one("#ckpt-url", Input)
        field.focus()
        field.value = str(Path(services.config.stores["checkpoints"].url))
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.focused, DataTable)


async def test_enter_in_the_pull_form_asks_for_the_estimate(services: Services) -> None:
    from tui.widgets.transfers_form import PullForm

    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=(120, 34)) as pilot:
        await pilot.pause()
        await pilot.press("n")
        await pilot.pause()
        form = app.screen.query_one(PullForm)
        asked: list[object] = []
        original = form.post_message

        def spy(message):  # type: ignore[no-untyped-def]
            if isinstance(message, PullForm.EstimateRequested):
                asked.append(message)
            return original(message)

        form.post_message = spy  # type: ignore[method-assign]
        form.query_one("#pull-src", Input).focus()
        await pilot.press("s", "3", "enter")
        await pilot.pause()
        assert len(asked) == 1
