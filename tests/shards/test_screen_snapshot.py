"""SVG snapshot of the Shards screen with a previewed conversion (deterministic data, 80x24).

Regenerate after an intended change: ``pytest tests/shards/test_screen_snapshot.py --snapshot-update``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input

from backend.config import default_config
from backend.services import Services
from tests.shards.conftest import make_dataset
from tui.app import LoadmasterApp
from tui.screens.shards import ShardsScreen


@pytest.mark.parametrize("theme", ["loadmaster-dark", "loadmaster-light"], ids=["dark", "light"])
def test_shards_screen_with_preview(
    snap_compare: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, theme: str
) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths keep the picture the same on every machine
    make_dataset(tmp_path / "images", n=24, seed=9)

    async def fill(pilot: Any) -> None:
        await pilot.pause()
        screen = pilot.app.screen
        assert isinstance(screen, ShardsScreen)
        for key, value in (("src", "images"), ("dest", "shards"), ("shard-size", "16KB")):
            screen.query_one(f"#shards-{key}", Input).value = value
        for _ in range(400):
            await pilot.pause(0.01)
            if screen.preview is not None:
                break
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        # No animated scrolling: a snapshot taken mid-animation would differ run to run.
        screen.query_one("#shards-start").focus(scroll_visible=False)
        screen.query_one("#shards-form").scroll_end(animate=False)
        await pilot.pause()
        await pilot.pause()

    app = LoadmasterApp(Services(config=default_config()), theme=theme, mode="shards")
    assert snap_compare(app, terminal_size=(80, 24), run_before=fill)
