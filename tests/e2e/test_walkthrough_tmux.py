"""The walkthrough's path (docs/walkthrough.md) in a real 80x24 terminal, as a new user takes it.

``loadmaster lab up``, then the console it prints, driven by keys in tmux at 80 columns by 24
rows, the smallest terminal the console supports. Every assertion reads the captured screen, so
what the operator decides on must be on it, not below the fold or behind a cut-off column:

1. Fleet: the starved node's row says STARVED;
2. Transfers: a pull to all four nodes, and the egress guard's decision (ALLOW/CONFIRM/BLOCK) above
   the fold with its ``^s Launch`` key;
3. the launch, held mid-pull by a store that answers slowly (SeaweedFS stopped and continued,
   then stopped: a stalled path, as in tests/jobs/test_pull_lab.py), cancelled from Transfers as
   one thing: ``c`` on any of its jobs, one typed confirmation, every job of it cancelled;
4. Retention on the lab's demo run: the plan's keep rows, the typed confirmation, the result.

The final screen of each step is written to ``walkthrough-80x24.txt`` in the test's directory (and
printed: ``pytest -s`` shows them).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_console_tmux import PROMPT, SCREEN_TIMEOUT, _fill, _quit, sandbox  # noqa: F401 - the fixture
from tests.e2e.tmux import Tmux

pytestmark = [pytest.mark.lab, pytest.mark.slow]

WIDTH, HEIGHT = 80, 24
NODES = ("node-01", "node-02", "node-03", "node-04")

#: The two latest complete steps of the lab's demo run: kept whole.
KEPT = ("10000", "11000")


@pytest.fixture
def term80(sandbox: tuple[Path, str, dict[str, str]], tmp_path: Path) -> Iterator[Tmux]:  # noqa: F811
    _root, _command, env = sandbox
    tmux = Tmux(env=env, width=WIDTH, height=HEIGHT, cwd=str(tmp_path), prompt=PROMPT).start()
    try:
        yield tmux
    finally:
        tmux.kill()


@contextlib.contextmanager
def slow_store(pid: int) -> Iterator[threading.Event]:
    """SeaweedFS runs 20 ms of every 500 (SIGSTOP/SIGCONT): a listing still answers within a few
    cycles, while a pull's bytes crawl. Setting the yielded event stops it outright (a stalled
    path: s5cmd holds its requests). Always continued at the end."""
    stall = threading.Event()
    done = threading.Event()

    def duty() -> None:
        while not done.is_set():
            os.kill(pid, signal.SIGCONT)
            if done.wait(0.02):
                break
            os.kill(pid, signal.SIGSTOP)
            if stall.is_set():
                done.wait()
                break
            done.wait(0.48)

    thread = threading.Thread(target=duty, name="slow-store", daemon=True)
    thread.start()
    try:
        yield stall
    finally:
        done.set()
        thread.join(timeout=10)
        os.kill(pid, signal.SIGCONT)


def _fits(screen: str) -> None:
    """Nothing scrolled or wrapped past the terminal: tmux gives exactly the 24 rows it shows."""
    lines = screen.rstrip("\n").split("\n")
    assert len(lines) <= HEIGHT and all(len(line) <= WIDTH for line in lines), screen


def test_walkthrough_at_80x24(sandbox: tuple[Path, str, dict[str, str]], term80: Tmux, tmp_path: Path) -> None:  # noqa: F811
    root, command, _env = sandbox
    lab = json.loads((root / "lab.json").read_text())
    bucket, weed = lab["bucket"], int(lab["s3"]["pid"])
    term = term80
    captures: list[tuple[str, str]] = []

    def keep(title: str, screen: str) -> None:
        _fits(screen)
        captures.append((title, screen))
        (tmp_path / "walkthrough-80x24.txt").write_text(
            "".join(f"==== {t} ====\n{s.rstrip()}\n" for t, s in captures), encoding="utf-8"
        )
        print(f"==== {title} ====\n{screen.rstrip()}")

    term.wait_for(PROMPT.strip(), timeout=30, what="the shell prompt")
    term.type(command)
    term.send("Enter")

    # -- 1. Fleet: the starved node's row says so -------------------------------------------
    starved_row = re.compile(r"^\s*node-02\s.*\bSTARVED\b", re.MULTILINE)
    screen = term.wait_for(
        lambda s: "nodes 4/4 up" in s and starved_row.search(s),
        timeout=SCREEN_TIMEOUT,
        what="node-02's row saying STARVED on the Fleet screen",
    )
    for node in ("node-01", "node-03", "node-04"):
        row = re.search(rf"^\s*{node}\s.*$", screen, re.MULTILINE)
        assert row and "STARVED" not in row.group(0), screen
    keep("1. Fleet: the starved node", screen)

    # -- 2. Transfers: a pull to four nodes and the guard's decision above the fold -----------
    term.press("2")
    term.wait_for("job(s):", what="the Transfers screen")
    term.press("n")
    term.wait_for("New pull", what="the new-pull form")
    _fill(term, f"s3://{bucket}/datasets/laion-mini/shards/")
    term.press("Tab")
    _fill(term, "walkthrough-shards")
    term.press("Tab")
    _fill(term, "node-[01-04]")
    term.send("Enter")  # enter in a field of the form: the estimate
    decision = re.compile(r"\b(ALLOW|CONFIRM|BLOCK)\b: lab \(aws:us-east-1\) -> ")
    screen = term.wait_for(
        lambda s: decision.search(s) and "4 nodes: 4 fit" in s,
        timeout=SCREEN_TIMEOUT,
        what="the estimate of a four-node pull with the guard's decision",
    )
    m = decision.search(screen)
    assert m and m.group(1) == "ALLOW", screen  # 134 MB inside AWS's free tier, no budget set
    assert "8 object(s), 33.6 MB" in screen, screen
    assert screen.rstrip().splitlines()[-1].lstrip().startswith("^s Launch"), screen
    keep("2. Transfers: the estimate of a 4-node pull", screen)

    # -- 3. Launch, then cancel the launch as one thing --------------------------------------
    with slow_store(weed) as stall:
        term.send("C-s")
        running = re.compile(r"^\s*node-0\d\s+\S+\.[1-4]\s+running\b", re.MULTILINE)
        screen = term.wait_for(
            lambda s: "4 job(s): 4 running" in s and len(running.findall(s)) == 4,
            timeout=SCREEN_TIMEOUT,
            what="the launch's 4 jobs running in the table",
        )
        stall.set()
        # The table's rows (the launch's toast names the same ids)
        ids = re.findall(r"^\s*node-0\d\s+(\d{4}-\d{6}-[0-9a-f]{4})\.([1-4])\s", screen, re.MULTILINE)
        launches = {launch for launch, _n in ids}
        assert len(launches) == 1 and sorted(n for _l, n in ids) == ["1", "2", "3", "4"], screen
        (launch,) = launches
        for node in NODES:  # each row: its node and its job's whole id
            assert re.search(rf"^\s*{node}\s+{re.escape(launch)}\.[1-4]\s", screen, re.MULTILINE), screen
        term.press("c")
        screen = term.wait_for("Cancel this launch?", what="the launch's confirmation")
        assert f"launch {launch}: 4 running pull job(s) on" in screen, screen
        keep("3a. Transfers: cancel the launch (one confirmation)", screen)
        _fill(term, "cancel")
        term.send("Enter")
        cancelled = re.compile(rf"^\s*node-0\d\s+{re.escape(launch)}\.[1-4]\s+cancelled\b", re.MULTILINE)
        screen = term.wait_for(
            lambda s: len(cancelled.findall(s)) == 4 and "4 job(s): 0 running" in s,
            timeout=SCREEN_TIMEOUT,
            what="every job of the launch cancelled",
        )
    assert "Cancel this launch?" not in screen, screen
    keep("3b. Transfers: the launch cancelled", screen)

    # -- 4. Retention: the plan's keep rows, the confirmation, the result --------------------
    term.press("4")
    term.wait_for("Run folder", what="the Retention screen")
    screen = term.wait_for(
        # The plan and its kept rows' reasons in full: the launch's notices (toasts over the right
        # of the table) time out first.
        lambda s: (
            re.search(r"plan [0-9a-f]{12}", s)
            and all(re.search(rf"^\s*{step}\s+keep-full\s.*latest 2 complete", s, re.MULTILINE) for step in KEPT)
            and re.search(r"^\s*12000\s+skip\s.*in flight", s, re.MULTILINE)
        ),
        timeout=SCREEN_TIMEOUT,
        what="the retention plan with its kept rows and the in-flight step's reason",
    )
    assert f"s3://{bucket}/checkpoints/llama-demo" in screen, screen
    assert "2 keep-full  2 strip-to-weights  7 delete  1 skip" in screen, screen
    for step in ("10000", "11000"):  # the two latest complete steps, kept whole, and why
        assert re.search(rf"^\s*{step}\s+keep-full\s.*latest 2 complete", screen, re.MULTILINE), screen
    for step in ("4000", "8000"):
        assert re.search(rf"^\s*{step}\s+strip-to-weights\s.*milestone", screen, re.MULTILINE), screen
    assert re.search(r"^\s*12000\s+skip\s.*in flight", screen, re.MULTILINE), screen
    keep("4a. Retention: the plan", screen)
    term.press("a")
    screen = term.wait_for("Type 'llama-demo' to confirm", what="the typed confirmation")
    keep("4b. Retention: the typed confirmation", screen)
    _fill(term, "llama-demo")
    term.send("Enter")
    status = re.compile(r"^\s*Applied plan [0-9a-f]{12}: (\S+)\. (\d+) done, .* (\d+) failed", re.MULTILINE)
    screen = term.wait_for(lambda s: status.search(s), timeout=SCREEN_TIMEOUT, what="the apply to finish")
    m = status.search(screen)
    assert m and m.groups() == ("ok", "9", "0"), screen
    keep("4c. Retention: the plan applied", screen)

    screen = _quit(term)
    assert "Traceback" not in screen, screen
