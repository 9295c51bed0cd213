"""End to end: ``loadmaster lab up``, then the console in a real terminal (tmux), driven by keys.

The sandbox is started exactly as an operator would (``loadmaster lab up --dir``, a subprocess),
the command it prints is typed into a shell inside a private tmux server, and every assertion
reads the captured screen text. ``lab down`` and the tmux server are always stopped, and no lab
process may survive ``down``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.sshd import lab_processes
from tests.e2e.tmux import Tmux, deadline_poll

pytestmark = [pytest.mark.lab, pytest.mark.slow]

VENV_BIN = Path(sys.executable).parent
LOADMASTER = VENV_BIN / "loadmaster"
# Generous: the machine is shared, lab up seeds real DCP checkpoints, sampling needs SSH logins.
UP_TIMEOUT = 240
SCREEN_TIMEOUT = 90
PROMPT = "lm-e2e$ "


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PATH": f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}",
            "LOADMASTER_DATA_DIR": str(tmp_path / "data"),
            "LOADMASTER_CONFIG_DIR": str(tmp_path / "config"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            # A console that dies of a signal prints every thread's stack where the test reads it.
            "PYTHONFAULTHANDLER": "1",
        }
    )
    env.pop("LOADMASTER_CONFIG", None)
    env.pop("LOADMASTER_SSH_PERSIST", None)  # as an operator has it: commands keep connections
    env.pop("TMUX", None)
    # The printed command must carry its own credentials; do not leak the test lab's.
    env.pop("AWS_SHARED_CREDENTIALS_FILE", None)
    env.pop("AWS_CONFIG_FILE", None)
    return env


def _lab(env: dict[str, str], *args: str, timeout: float = UP_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LOADMASTER), "lab", *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, dict[str, str]]]:
    """``loadmaster lab up --dir``: yields (lab dir, the printed console command, env)."""
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed: apt-get install -y tmux")
    tmp_path = tmp_path_factory.mktemp("e2e")
    root = tmp_path / "lab"
    env = _env(tmp_path)
    try:
        up = _lab(env, "up", "--dir", str(root))
        assert up.returncode == 0, f"lab up failed:\n{up.stderr}"
        command = up.stdout.strip().splitlines()[-1]
        assert "loadmaster --config" in command, up.stdout
        assert "open the console on the sandbox with (again later: loadmaster lab env):" in up.stderr
        yield root, command, env
    finally:
        down = _lab(env, "down", "--dir", str(root), timeout=60)
        assert down.returncode == 0, down.stderr
        # weed gets SIGTERM and may take a moment to go; nothing at all may stay.
        deadline_poll(
            lambda: not lab_processes(root),
            timeout=30,
            what="every lab process to stop after 'lab down'",
            describe=lambda: f"still running: {lab_processes(root)}",
        )
        # The connection keeper the command line started for the lab's config is stopped too.
        deadline_poll(
            lambda: not _keepers(root),
            timeout=30,
            what="the lab's keeper to stop",
            describe=lambda: f"still running: {_keepers(root)}",
        )


def _keepers(root: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", "backend.nodes.keeper_server"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(root) in line]


@pytest.fixture
def term(sandbox: tuple[Path, str, dict[str, str]], tmp_path: Path) -> Iterator[Tmux]:
    _root, _command, env = sandbox
    tmux = Tmux(env=env, width=120, height=36, cwd=str(tmp_path), prompt=PROMPT).start()
    try:
        yield tmux
    finally:
        tmux.kill()


def _in_text_field(term: Tmux) -> bool:
    """Whether a text input has the focus: the footer then hides the printable keys (? Help)."""
    return "? Help" not in term.screen().rstrip().splitlines()[-1]


def _fill(term: Tmux, text: str) -> None:
    """Type into the focused input and wait until its end is on screen."""
    term.type(text)
    term.wait_for(text[-12:], timeout=30, what=f"{text!r} in the focused field")


def _quit(term: Tmux) -> str:
    """Press q and return the screen once the shell printed the console's exit status (0)."""
    term.send("q")
    term.wait_for(lambda s: s.rstrip().endswith(PROMPT.strip()), timeout=60, what="the shell prompt after q")
    term.type("echo console-exit=$?")
    term.send("Enter")
    # The typed command holds "console-exit=" too: wait for the line the shell printed.
    screen = term.wait_for(lambda s: re.search(r"^console-exit=\d", s, re.M), timeout=30, what="the exit code")
    assert re.search(r"^console-exit=0$", screen, re.M), screen
    return screen


def test_on_call_session(sandbox: tuple[Path, str, dict[str, str]], term: Tmux) -> None:
    root, command, _env = sandbox
    bucket = json.loads((root / "lab.json").read_text())["bucket"]

    # -- open the console with the command lab up printed ------------------------------------
    term.wait_for(PROMPT.strip(), timeout=30, what="the shell prompt")
    term.type(command)
    term.send("Enter")

    # -- the fleet appears: all four nodes up ------------------------------------------------
    screen = term.wait_for(
        lambda s: "nodes 4/4 up" in s, timeout=SCREEN_TIMEOUT, what="all four sandbox nodes up on the Fleet screen"
    )
    for i in range(1, 5):
        assert re.search(rf"node-0{i}\s.*\bup\b", screen), f"node-0{i} is not shown up:\n{screen}"
    assert "1 Fleet" in screen and "6 Shards" in screen  # the mode bar with its digit keys

    # -- the starved node's alert, with its hint ----------------------------------------------
    title = "GPU starved (loadmaster's check): 1 active"
    screen = term.wait_for(title, timeout=SCREEN_TIMEOUT, what="the starved node's alert")
    alert_rows = [line for line in screen.split(title, 1)[1].splitlines() if re.search(r"\bnode-\d\d\b", line)]
    assert len(alert_rows) == 1, screen
    assert re.findall(r"\bnode-\d\d\b", alert_rows[0]) == ["node-02"], screen
    assert "active" in alert_rows[0]
    assert re.search(r"request-bound|input-bound|line rate unknown", alert_rows[0]), alert_rows[0]

    # -- Transfers: a pull with its egress quote, launched, completed ------------------------
    term.press("2")
    term.wait_for("job(s):", what="the Transfers screen")
    term.press("n")
    term.wait_for("New pull", what="the new-pull form")
    _fill(term, f"s3://{bucket}/datasets/laion-mini/shards/")
    term.press("Tab")
    _fill(term, "e2e-shards")
    term.press("Tab")
    _fill(term, "node-01")
    # store, preset, fan-out, workers, concurrency, part size, over-budget reason, then Estimate.
    for _ in range(8):
        term.press("Tab")
    term.send("Enter")
    screen = term.wait_for(
        lambda s: "month to date" in s, timeout=SCREEN_TIMEOUT, what="the pull estimate with its egress quote"
    )
    assert re.search(r"8 object\(s\), [\d.]+ MB", screen), screen
    assert re.search(r"node-01 .* fits ", screen), screen
    assert "egress:" in screen and "-> coreweave:us-east-04" in screen, screen
    assert "$" in screen.split("egress:", 1)[1], screen
    term.press("Tab")  # Launch
    term.send("Enter")
    # The job's row (columns in any order) and its detail, which names the final state in full.
    done = re.compile(r"pull job \S+ on node-01: succeeded")
    screen = term.wait_for(lambda s: done.search(s), timeout=SCREEN_TIMEOUT, what="the pull job to succeed")
    rows = [
        line
        for line in screen.splitlines()
        # The route is cut in the middle to fit (s3:/…/ -> /mnt…): its scheme still starts it.
        if re.search(r"\bnode-01\b", line) and re.search(r"\bpull\b", line) and "s3:/" in line
    ]
    assert len(rows) == 1 and "100%" in rows[0] and "fail" not in rows[0], screen

    # -- Retention: compute the plan, apply it with the typed confirmation -------------------
    # It opens on the lab's demo run, already listed: nothing to type for a first look.
    term.press("4")
    term.wait_for("Run folder", what="the Retention screen")
    screen = term.wait_for(
        lambda s: re.search(r"plan [0-9a-f]{12}", s), timeout=SCREEN_TIMEOUT, what="the retention plan"
    )
    assert f"s3://{bucket}/checkpoints/llama-demo" in screen, screen
    assert "verified resumable" in screen, screen
    # 12 steps, keep 2 full, milestones every 4000 stripped, 12000 still uploading.
    assert "2 keep-full  2 strip-to-weights  7 delete  1 skip" in screen, screen
    assert re.search(r"12000\s+skip", screen), screen
    term.press("a")
    term.wait_for("Type 'llama-demo' to confirm", what="the typed confirmation")
    _fill(term, "llama-demo")
    term.send("Enter")
    # The status line under the table (the toast says the same, clipped at the screen edge).
    status = re.compile(r"^\s*Applied plan [0-9a-f]{12}: (\S+)\. (\d+) done, .* (\d+) failed", re.MULTILINE)
    screen = term.wait_for(lambda s: status.search(s), timeout=SCREEN_TIMEOUT, what="the apply to finish")
    m = status.search(screen)
    assert m and m.groups() == ("ok", "9", "0"), screen

    # -- back to the fleet: still live, and its keys listed by ? -----------------------------
    assert not _in_text_field(term), "after applying, the focus should be on the steps table"
    term.press("1")
    screen = term.wait_for(
        lambda s: len(re.findall(r"^\s*node-0\d\s.*\bup\b", s, re.MULTILINE)) >= 4,
        timeout=SCREEN_TIMEOUT,
        what="the Fleet screen with every node again",
    )
    term.press("?")
    screen = term.wait_for("Keys", what="the help screen")
    assert "Filter" in screen and "Quit" in screen, screen
    term.press("Escape")
    # the Fleet's alerts show beside the help panel too: wait for the panel itself to go
    term.wait_for(
        lambda s: "loadmaster check:" in s and "Keys  (escape closes)" not in s,
        timeout=SCREEN_TIMEOUT,
        what="the Fleet screen after closing help",
    )

    # -- quit cleanly --------------------------------------------------------------------------
    screen = _quit(term)
    assert "Traceback" not in screen, screen

    # -- the same jobs from the command line, which keeps its connections (the default) -------
    term.type("clear; " + command + " jobs; echo jobs-exit=$?")
    term.send("Enter")
    # (the typed line itself says "jobs-exit=$?": wait for the printed status)
    screen = term.wait_for(lambda s: re.search(r"jobs-exit=\d", s), timeout=SCREEN_TIMEOUT, what="loadmaster jobs")
    assert "jobs-exit=0" in screen and re.search(r"\bpull\s+node-01\s+succeeded", screen), screen
    term.type("clear; " + command + " keeper status; echo keeper-exit=$?")
    term.send("Enter")
    screen = term.wait_for(
        lambda s: re.search(r"keeper-exit=\d", s), timeout=SCREEN_TIMEOUT, what="loadmaster keeper status"
    )
    assert "keeper-exit=0" in screen and re.search(r"node-01\s+up\s+yes", screen), screen


def test_readonly_console_refuses_and_errors_are_one_key_away(
    sandbox: tuple[Path, str, dict[str, str]], term: Tmux
) -> None:
    _root, command, _env = sandbox
    term.wait_for(PROMPT.strip(), timeout=30, what="the shell prompt")
    term.type(command.replace("loadmaster --config", "loadmaster --readonly --config"))
    term.send("Enter")
    term.wait_for("READ-ONLY", timeout=SCREEN_TIMEOUT, what="the read-only console")
    term.wait_for("nodes 4/4 up", timeout=SCREEN_TIMEOUT, what="monitoring in read-only mode")

    # Attempted actions say why they are refused.
    term.press("2")
    term.wait_for("job(s):", what="the Transfers screen")
    term.press("c")
    term.wait_for("Read-only mode: cannot cancel a job", what="the refusal to cancel")
    # The same refusal through the command palette (it switches to the screen and runs the action),
    # once Retention has listed the run it opens on (the refusal's toast must not expire unseen
    # while the listing keeps a loaded machine busy).
    term.press("4")
    term.wait_for(lambda s: re.search(r"plan [0-9a-f]{12}", s), timeout=SCREEN_TIMEOUT, what="the retention plan")
    term.press("C-p")
    _fill(term, "apply retention")
    term.wait_for("Retention: Apply retention plan", what="the palette's apply command")
    term.send("Enter")
    term.wait_for("Read-only mode: cannot apply a retention plan", what="the refusal to apply")
    term.wait_for("Run folder", what="the Retention screen")

    # A failing background task: a notification, the console stays up, the detail behind e.
    term.press("o")
    term.send("Home")
    term.press("C-k")
    _fill(term, "s3://no-such-bucket-e2e/run")
    term.send("Enter")
    term.wait_for("press e for details", timeout=SCREEN_TIMEOUT, what="the error notification")
    # Escape leaves the text field (letters typed there are text), then e is the errors key.
    term.press("Escape")
    # press() returns on the first change on screen; under load the footer follows a moment later.
    term.wait_for(
        lambda s: "? Help" in s.rstrip().splitlines()[-1], timeout=30, what="the footer's keys (out of the text field)"
    )
    assert not _in_text_field(term), term.screen()
    term.press("e")
    screen = term.wait_for("Listing s3://no-such-bucket-e2e/run", what="the errors screen")
    assert "no-such-bucket-e2e" in screen.split("Listing", 2)[-1], screen
    term.press("Escape")
    term.wait_for("Run folder", what="back on the Retention screen")

    _quit(term)
