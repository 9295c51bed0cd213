"""Screens built ahead of time (#29: switches within 100 ms): the console builds the other screens
in idle time after its first paint, one at a time; a screen built ahead reads nothing (no jobs
from the nodes, no listing of the run, no Alertmanager, no ledger) until it is first shown, and a
key pressed while the console is building switches before the next build starts.

The reads are counted on the console's real operation layer (each call still made)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tui.app
from backend.config import default_config
from backend.retention.runs import remember_run
from backend.services import Services
from tui.app import LoadmasterApp

SIZE = (100, 30)

#: The first read each screen starts (operation, method), by the mode that starts it.
READS = {
    "transfers": ("jobs", "listing"),
    "checkpoints": ("checkpoints", "listing"),
    "retention": ("retention", "listing"),
    "egress": ("egress", "report"),
    "alerts": ("alerts", "site"),
}


@pytest.fixture
def services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Services:
    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("LOADMASTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("LOADMASTER_CONFIG", raising=False)
    config = default_config()
    run = tmp_path / "run"
    run.mkdir()
    remember_run(config, str(run))  # Checkpoints and Retention open on it and would list it
    return Services(config=config)


def count_reads(app: LoadmasterApp, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Calls of each screen's first read, by mode (each call still made)."""
    calls = dict.fromkeys(READS, 0)
    for mode, (op, method) in READS.items():
        target = getattr(app.ops, op)
        real = getattr(target, method)
        monkeypatch.setattr(target, method, _counted(real, calls, mode))
    return calls


#: The modes whose read was called on the console's own thread (its event loop).
ON_THE_LOOP: set[str] = set()


def _counted(real: Callable[..., Any], calls: dict[str, int], mode: str) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[mode] += 1
        if threading.current_thread() is threading.main_thread():
            ON_THE_LOOP.add(mode)
        return real(*args, **kwargs)

    return counted


async def test_a_screen_built_ahead_reads_nothing_until_it_is_shown(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The quiet before each build is not what this test is about: six of them, shortened.
    monkeypatch.setattr(tui.app, "PREBUILD_PAUSE_S", 0.02)
    app = LoadmasterApp(services, mode="fleet", prebuild=True)
    calls = count_reads(app, monkeypatch)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(300):
            if len(app.built_ahead) == 6:
                break
            await pilot.pause(0.1)
        assert app.built_ahead == ["transfers", "checkpoints", "retention", "egress", "shards", "alerts"]
        await pilot.pause()
        assert calls == dict.fromkeys(READS, 0)  # built, styled and mounted, and nothing read
        screen = app.get_screen_stack("retention")[0]
        await pilot.press("4")
        await pilot.pause()
        assert app.screen is screen  # the screen built ahead, not a new one
        await app.workers.wait_for_complete()
        assert calls == {**dict.fromkeys(READS, 0), "retention": 1}  # its reads start on show
        # Listing a run (and planning it) never holds up the keys: it runs in a thread.
        assert "retention" not in ON_THE_LOOP
        await pilot.press("1")
        await pilot.pause()
        await pilot.press("4")
        await pilot.pause()
        assert calls["retention"] == 1  # once: a return does not list the run again
        await pilot.press("3")
        await pilot.pause()
        await app.workers.wait_for_complete()
        assert calls["checkpoints"] == 1 and "checkpoints" not in ON_THE_LOOP


async def test_a_key_pressed_while_building_ahead_switches_before_the_next_build(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = LoadmasterApp(services, mode="fleet", prebuild=True)
    calls = count_reads(app, monkeypatch)
    events: list[str] = []
    real_switch, real_init = app.switch_mode, app._init_mode

    def switch(mode: str) -> Any:
        events.append(f"switch {mode}")
        return real_switch(mode)

    def init(mode: str) -> Any:
        events.append(f"build {mode}")
        return real_init(mode)

    monkeypatch.setattr(app, "switch_mode", switch)
    monkeypatch.setattr(app, "_init_mode", init)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(300):
            if app.built_ahead:
                break
            await pilot.pause(0.05)
        assert app.built_ahead == ["transfers"]  # one built, five to go
        events.append("key 7")
        await pilot.press("7")
        await pilot.pause()
        assert app.current_mode == "alerts"
        # The key has been handled between two builds: the quiet before each later one can be short.
        monkeypatch.setattr(tui.app, "PREBUILD_PAUSE_S", 0.02)
        for _ in range(300):
            if len(app.built_ahead) == 5:
                break
            await pilot.pause(0.1)
        after = events[events.index("key 7") + 1 :]
        # The switch first (at most a build already due when the key came goes before it), the
        # switch builds its screen, and building ahead goes on with the screens still unbuilt.
        due = ["checkpoints"] if after[0] == "build checkpoints" else []
        assert after[len(due) : len(due) + 2] == ["switch alerts", "build alerts"], events
        builds = [e.removeprefix("build ") for e in after if e.startswith("build ")]
        rest = [m for m in ("checkpoints", "retention", "egress", "shards") if m not in due]
        assert builds == [*due, "alerts", *rest], events
        assert app.built_ahead == ["transfers", "checkpoints", "retention", "egress", "shards"]
        await app.workers.wait_for_complete()
        assert calls["alerts"] == 1  # the screen shown read; the ones built ahead did not
        assert all(calls[m] == 0 for m in READS if m != "alerts"), calls
