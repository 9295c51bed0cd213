"""End to end: a new operator's first console, in a real terminal (tmux), from an empty HOME.

No config file, no loadmaster environment variables, the virtualenv's ``bin`` not on PATH (a
clean clone runs ``.venv/bin/loadmaster``): the embedded default (this machine alone) must come
up with nothing to fix that the operator did not cause. Every screen is visited, the local
node's detail is opened, and the errors screen must say no background task failed.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.tmux import Tmux

pytestmark = [pytest.mark.slow]

LOADMASTER = Path(sys.executable).parent / "loadmaster"
PROMPT = "lm-first$ "
SCREEN_TIMEOUT = 90
#: Text that would mean the console shows a problem (the operator changed nothing yet).
PROBLEMS = (
    "missing",
    "MISSING",
    "not found",
    "does not exist",
    "failed",
    "unreachable",
    "Traceback",
    "No such",
    "refused",
    "cannot",
    "no credentials",
)


def _clean_env(home: Path) -> dict[str, str]:
    """What a new user's login shell has: HOME, a system PATH, a UTF-8 locale; nothing of ours."""
    env = {
        "HOME": str(home),
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONFAULTHANDLER": "1",
    }
    for keep in ("USER", "LOGNAME"):
        if keep in os.environ:
            env[keep] = os.environ[keep]
    return env


@pytest.fixture
def term(tmp_path: Path) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed: apt-get install -y tmux")
    home = tmp_path / "home"
    home.mkdir()
    cwd = tmp_path / "clone"  # no ./loadmaster.toml here
    cwd.mkdir()
    # 250 columns: every column of the Fleet table (Last error included) is on screen.
    tmux = Tmux(env=_clean_env(home), width=250, height=40, cwd=str(cwd), prompt=PROMPT).start()
    try:
        yield tmux
    finally:
        tmux.kill()


def _problems(screen: str) -> list[str]:
    return [line.strip() for line in screen.splitlines() if any(p in line for p in PROBLEMS)]


def test_first_screen_shows_no_problem_the_operator_did_not_cause(term: Tmux, tmp_path: Path) -> None:
    home = tmp_path / "home"
    term.wait_for(PROMPT.strip(), timeout=30, what="the shell prompt")
    term.type(str(LOADMASTER))
    term.send("Enter")

    # -- Fleet: this machine, up, sampled (its disk rate needs two samples) ----------------------
    screen = term.wait_for(
        lambda s: "nodes 1/1 up" in s and "<embedded default>" in s,
        timeout=SCREEN_TIMEOUT,
        what="the Fleet screen with this machine up",
    )
    name = socket.gethostname().split(".")[0][:10]  # the embedded default's node (cut to its column)
    rows = [line for line in screen.splitlines() if line.strip().startswith(name)]
    assert len(rows) == 1, screen
    assert " up " in rows[0] and "local" in rows[0], rows[0]  # the SSH column says local: no SSH
    assert not _problems(screen), "\n".join(_problems(screen)) + "\n" + screen

    # -- the node's detail: no SSH latency for a local node, the scratch directory exists --------
    term.press("Enter")
    screen = term.wait_for("GB free", timeout=SCREEN_TIMEOUT, what="the node detail with scratch space")
    header = screen.splitlines()[2]
    assert "local, no SSH" in header and not re.search(r"SSH \d+ ms", header), screen
    assert str(home / ".local/share/loadmaster/scratch") in header, screen
    assert not _problems(screen), "\n".join(_problems(screen)) + "\n" + screen
    term.press("Escape")
    term.wait_for("nodes 1/1 up", timeout=30, what="back on the Fleet screen")

    # -- every other screen opens clean -----------------------------------------------------------
    for key, marker in (
        ("2", "job(s):"),
        ("3", "Run prefix"),
        ("4", "Run folder"),
        ("5", "Calculator"),
        ("6", "New conversion"),
    ):
        term.press(key)
        screen = term.wait_for(marker, timeout=SCREEN_TIMEOUT, what=f"screen {key}")
        assert not _problems(screen), f"screen {key}:\n" + "\n".join(_problems(screen)) + "\n" + screen

    # -- and nothing failed in the background meanwhile ------------------------------------------
    term.press("1")
    term.wait_for("nodes 1/1 up", timeout=30, what="back on the Fleet screen")
    term.press("e")
    screen = term.wait_for("No errors recorded in this session.", timeout=30, what="an empty errors screen")
    term.press("Escape")
    term.wait_for("nodes 1/1 up", timeout=30, what="back on the Fleet screen")

    term.send("q")
    term.wait_for(lambda s: s.rstrip().endswith(PROMPT.strip()), timeout=60, what="the shell prompt after q")
    term.type("echo console-exit=$?")
    term.send("Enter")
    # The typed command holds "console-exit=" too: wait for the line the shell printed.
    screen = term.wait_for(lambda s: re.search(r"^console-exit=\d", s, re.M), timeout=30, what="the exit code")
    assert re.search(r"^console-exit=0$", screen, re.M), screen
    # The embedded default is ready as it is: its scratch directory was made on first use.
    assert (home / ".local/share/loadmaster/scratch").is_dir()
