"""After building every screen ahead, the console freezes its start-up heap (``gc.freeze``), so
the garbage collector's full collections scan only what refreshes make (#33: at 1,024 nodes the
collector was ~40% of a Prometheus refresh). A console that does not build ahead (tests, tools
that embed a screen) leaves the collector as it is."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

import tui.app
from backend.config import default_config
from backend.services import Services
from tui.app import LoadmasterApp


@pytest.fixture
def services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Services]:
    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("LOADMASTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("LOADMASTER_CONFIG", raising=False)
    yield Services(config=default_config())
    gc.unfreeze()  # the test worker's other tests keep a collector that frees everything


async def test_the_start_up_heap_is_frozen_once_every_screen_is_built(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tui.app, "PREBUILD_PAUSE_S", 0.02)
    gc.unfreeze()
    app = LoadmasterApp(services, mode="fleet", prebuild=True)
    async with app.run_test(size=(100, 30)) as pilot:
        for _ in range(300):
            if app.heap_frozen:
                break
            assert gc.get_freeze_count() == 0 or len(app.built_ahead) == 6  # not before the last build
            await pilot.pause(0.1)
        assert len(app.built_ahead) == 6 and app.heap_frozen
        assert gc.get_freeze_count() > 10_000  # the screens' widgets, the modules, the classes
        await pilot.press("3")  # the console keeps working with a frozen heap
        await pilot.pause()
        assert app.current_mode == "checkpoints"


async def test_a_console_that_does_not_build_ahead_leaves_the_collector_alone(services: Services) -> None:
    gc.unfreeze()
    app = LoadmasterApp(services, mode="fleet")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(0.3)
        assert not app.heap_frozen and gc.get_freeze_count() == 0
