"""A state database that cannot be reached is one line in the shell's status area on every screen
(Fleet says it in its own conditions line instead, not twice), and the console still quits
promptly: in-process, and as a real process in a terminal (tmux), measured."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import pytest

from backend.config import Config, Node, StateSettings
from backend.services import Services
from tests.e2e.test_console_tmux import _env
from tests.e2e.tmux import Tmux
from tests.firsthour.screen_text import screen_lines
from tests.helpers import wait_until
from tui.app import LoadmasterApp

PROMPT = "lm-db$ "


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _down_url() -> str:
    return f"postgresql://oncall@127.0.0.1:{_closed_port()}/loadmaster"


def _said(lines: list[str]) -> list[str]:
    return [line for line in lines if "database" in line.lower()]


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("LOADMASTER_DATA_DIR", str(tmp_path / "data"))
    return tmp_path


async def test_state_database_down_is_one_line_on_every_screen_and_quit_leaves(dirs: Path) -> None:
    nodes = (Node(name="gpu-01", host="127.0.0.1", port=_closed_port()),)
    config = Config(nodes=nodes, stores={}, state=StateSettings(dir=str(dirs / "state"), url=_down_url()))
    app = LoadmasterApp(Services(config=config), mode="transfers")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: _said(screen_lines(app)), rounds=3000, delay=0.02)
        said = _said(screen_lines(app))
        assert len(said) == 1 and "STATE DATABASE DOWN" in said[0] and "127.0.0.1" in said[0], said
        for key in "34":  # other screens: the same one line
            await pilot.press(key)
            await wait_until(pilot, lambda: _said(screen_lines(app)), rounds=3000, delay=0.02)
            assert len(_said(screen_lines(app))) == 1, screen_lines(app)
        await pilot.press("q")
        await pilot.pause()
    assert not app.is_running


def test_the_console_quits_promptly_with_the_state_database_down(tmp_path: Path) -> None:
    cfg = tmp_path / "down.toml"
    port = _closed_port()
    cfg.write_text(
        f'[[nodes]]\nname = "gpu-01"\nhost = "127.0.0.1"\nport = {port}\n\n'
        f'[state]\ndir = "{tmp_path / "state"}"\nurl = "{_down_url()}"\n'
    )
    env = _env(tmp_path)  # the walkthrough's terminal environment
    term = Tmux(env=env, width=80, height=24, cwd=str(tmp_path), prompt=PROMPT).start()
    try:
        term.type(f"clear; loadmaster --config {cfg}")
        term.send("Enter")
        screen = term.wait_for("STATE DATABASE DOWN", timeout=120, what="the Fleet's state database line")
        assert len(_said(screen.splitlines())) == 1, screen
        term.send("2")  # Transfers: the shell's line
        screen = term.wait_for(
            lambda s: "Transfers" in s and "STATE DATABASE DOWN, nothing recorded" in s and s,
            timeout=120,
            what="the shell's state database line on Transfers",
        )
        assert len(_said(str(screen).splitlines())) == 1, screen
        (tmp_path / "screen-80x24.txt").write_text(screen)
        started = time.monotonic()
        term.send("q")
        term.wait_for(lambda s: s.rstrip().endswith(PROMPT.strip()), timeout=60, what="the prompt after q")
        took = time.monotonic() - started
        print(f"quit with the state database down: {took:.2f}s (includes tmux polling, 0.25 s steps)")
        term.type("echo console-exit=$?")
        term.send("Enter")
        screen = term.wait_for(lambda s: re.search(r"^console-exit=\d", s, re.M), timeout=30, what="the exit")
        assert re.search(r"^console-exit=0$", screen, re.M), screen
    finally:
        term.kill()
