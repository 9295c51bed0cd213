"""End to end: ``loadmaster lab up``, then the console in a real terminal (tmux), driven by keys.

The sandbox is started exactly as an operator would (``loadmaster lab up --dir``, a subprocess),
the command it prints is typed into a shell inside a private tmux server, and every assertion
reads the captured screen text. ``lab down`` and the tmux server are always stopped, and no lab
process may survive ``down``.

One lab serves the module's tests (the walkthrough's at 80x24 among them: its own module paid a
second ``lab up``); each test starts on it as on a new lab (:func:`as_new`): the last test's jobs,
ledger, audit and node job folders moved aside as ``lab up`` does, the demo run restored when a
test changed it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import seed
from lab.fleet import stop_lab_keeper
from lab.sshd import lab_processes
from tests.e2e.tmux import Tmux, deadline_poll
from tui.cli.lab import forget_previous_lab

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
        _shorter_starvation_window(root / "loadmaster.toml")
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


#: The starvation window these tests' consoles run with (the sandbox's own is 10 s): the starved
#: node's alert and its STARVED row still need a whole window of low samples, only a shorter one.
STARVED_WINDOW = "4s"


def _shorter_starvation_window(config: Path) -> None:
    """Edit the lab's ``[telemetry] starved_window`` as an operator edits a config (the sandbox's
    10 s cost every test that waits for the starved node a console start plus 10 s)."""
    text = config.read_text()
    line = re.search(r'^starved_window = "[^"]*"$', text, re.MULTILINE)
    assert line, f"no [telemetry] starved_window in {config}:\n{text}"
    config.write_text(text[: line.start()] + f'starved_window = "{STARVED_WINDOW}"' + text[line.end() :])


def _keepers(root: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", "backend.nodes.keeper_server"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(root) in line]


@pytest.fixture(scope="module")
def seeded_run(sandbox: tuple[Path, str, dict[str, str]]) -> dict[str, tuple[int, str]]:
    """The demo run's objects (size, ETag) as ``lab up`` seeded them, before any test."""
    root = sandbox[0]
    bucket = json.loads((root / "lab.json").read_text())["bucket"]
    return seed.list_objects(seed.lab_client(root), bucket, f"{seed.CHECKPOINT_RUN}/")


@pytest.fixture
def as_new(
    sandbox: tuple[Path, str, dict[str, str]], seeded_run: dict[str, tuple[int, str]], monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, str, dict[str, str]]:
    """The module's lab as a new one: what an earlier test left (a command's keeper stopped; the
    state database's jobs, ledger and audit, the nodes' job folders, the remembered run moved
    aside) gone the way ``lab down`` and ``lab up`` do it, and the demo run seeded again if a test
    pruned it. Nothing to do on a lab no test used yet (``lab up`` leaves no state folder)."""
    root, _command, env = sandbox
    if (root / "state").exists():
        # As 'lab down' then 'lab up': the keeper a command started goes first (its socket is in
        # the state folder), then the state.
        stop_lab_keeper(root / "loadmaster.toml")
        monkeypatch.setenv("LOADMASTER_CONFIG_DIR", env["LOADMASTER_CONFIG_DIR"])  # the remembered run's file
        forget_previous_lab(root)
    client = seed.lab_client(root)
    bucket = json.loads((root / "lab.json").read_text())["bucket"]
    run = f"{seed.CHECKPOINT_RUN}/"
    if seed.list_objects(client, bucket, run) != seeded_run:
        for key in seed.list_objects(client, bucket, run):
            client.delete_object(Bucket=bucket, Key=key)
        seed.seed_checkpoints(client, bucket)
        assert seed.list_objects(client, bucket, run) == seeded_run
    return sandbox


def _term(sandbox: tuple[Path, str, dict[str, str]], tmp_path: Path, width: int, height: int) -> Iterator[Tmux]:
    tmux = Tmux(env=sandbox[2], width=width, height=height, cwd=str(tmp_path), prompt=PROMPT).start()
    try:
        yield tmux
    finally:
        tmux.kill()


@pytest.fixture
def term(as_new: tuple[Path, str, dict[str, str]], tmp_path: Path) -> Iterator[Tmux]:
    yield from _term(as_new, tmp_path, 120, 36)


#: What the Retention screen's empty run folder field shows.
RUN_FOLDER_PLACEHOLDER = "s3://bucket/run, a store name or a directory"


def _footer_keys(screen: str) -> bool:
    """Whether the footer lists the printable keys (? Help): no text input has the focus."""
    lines = screen.rstrip().splitlines()
    return bool(lines) and "? Help" in lines[-1]


def _in_text_field(term: Tmux) -> bool:
    """Whether a text input has the focus: the footer then hides the printable keys (? Help)."""
    return not _footer_keys(term.screen())


def _fill(term: Tmux, text: str) -> None:
    """Type into the focused input and wait until its end is on screen."""
    term.type(text)
    term.wait_for(text[-12:], timeout=30, what=f"{text!r} in the focused field")


def _after_label(term: Tmux, label: str) -> str | None:
    """The styled rest of the first row that shows ``label``: the field the label names (and, on
    a wide form, the fields right of it), with its colours and cursor."""
    return next((line.split(label, 1)[1] for line in term.screen(styled=True).splitlines() if label in line), None)


def _tab_into(term: Tmux, label: str) -> None:
    """Tab into the field ``label`` names and wait until that field shows the focus. Any change
    on screen (press) is not enough: the focused field's cursor blinks, and the letters typed
    after a Tab the console has not acted on yet land in the field it leaves."""
    before = _after_label(term, label)
    assert before is not None, f"no {label!r} on screen:\n{term.screen()}"
    term.send("Tab")
    deadline_poll(
        lambda: _after_label(term, label) != before,
        timeout=30,
        what=f"the focus in the {label} field (Tab)",
        describe=term.screen,
    )


def _new_pull(term: Tmux, bucket: str, dest: str, nodes: str) -> None:
    """Transfers, its new-pull form, the lab's shards as the source, ``dest`` and ``nodes`` typed
    into their fields (each where it belongs: a Tab lost would put both in one field)."""
    term.press("2")
    term.wait_for("job(s):", what="the Transfers screen")
    term.press("n")
    term.wait_for("New pull", what="the new-pull form")
    _fill(term, f"s3://{bucket}/datasets/laion-mini/shards/")
    _tab_into(term, "Destination")
    _fill(term, dest)
    _tab_into(term, "Nodes")
    _fill(term, nodes)
    row = re.compile(rf"Destination\s+{re.escape(dest)}\s+Nodes\s+{re.escape(nodes)}\s")
    term.wait_for(lambda s: row.search(s), timeout=30, what=f"{dest!r} and {nodes!r} in their own fields")


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

    # -- Retention, first shown: it lists the lab's demo run and plans it in the background while
    # -- the alert is read and the pull runs (the plan is read after the pull) ------------------
    term.press("4")
    term.wait_for("Run folder", what="the Retention screen")

    # -- the starved node's alert, with its hint ----------------------------------------------
    # (before the pull form: a Tab pressed as the alert came up once left the focus where it was)
    term.press("1")
    title = "GPU starved (loadmaster's check): 1 active"
    screen = term.wait_for(title, timeout=SCREEN_TIMEOUT, what="the starved node's alert")
    alert_rows = [line for line in screen.split(title, 1)[1].splitlines() if re.search(r"\bnode-\d\d\b", line)]
    assert len(alert_rows) == 1, screen
    assert re.findall(r"\bnode-\d\d\b", alert_rows[0]) == ["node-02"], screen
    assert "active" in alert_rows[0]
    assert re.search(r"request-bound|input-bound|line rate unknown", alert_rows[0]), alert_rows[0]

    # -- Transfers: a pull with its egress quote, launched, completed ------------------------
    _new_pull(term, bucket, "e2e-shards", "node-01")
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

    # -- Retention: the plan its first show started (the walkthrough applies it, at 80x24) -----
    # It opened on the lab's demo run, already listed: nothing to type for a first look. The
    # screen is read once it is drawn whole (the switch from Transfers paints in parts): the plan,
    # the in-flight step's row and the Transfers job's detail gone.
    term.press("4")
    screen = term.wait_for(
        lambda s: re.search(r"plan [0-9a-f]{12}", s) and re.search(r"^\s*12000\s", s, re.M) and not done.search(s),
        timeout=SCREEN_TIMEOUT,
        what="the retention plan, drawn whole",
    )
    assert f"s3://{bucket}/checkpoints/llama-demo" in screen, screen
    assert "verified resumable" in screen, screen
    # 12 steps, keep 2 full, milestones every 4000 stripped, 12000 still uploading.
    assert "2 keep-full  2 strip-to-weights  7 delete  1 skip" in screen, screen
    assert re.search(r"12000\s+skip", screen), screen

    # -- back to the fleet: still live, and its keys listed by ? -----------------------------
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
    # Retention shown once: it lists the run it opens on (and plans it) while Transfers refuses.
    term.press("4")
    term.wait_for("Run folder", what="the Retention screen")

    # Attempted actions say why they are refused.
    term.press("2")
    term.wait_for("job(s):", what="the Transfers screen")
    term.press("c")
    term.wait_for("Read-only mode: cannot cancel a job", what="the refusal to cancel")
    # The same refusal through the command palette (it switches to the screen and runs the action),
    # once Retention has listed the run it opens on (the refusal's toast must not expire unseen
    # while the listing keeps a loaded machine busy); the listing started when it was first shown.
    term.press("4")
    term.wait_for(lambda s: re.search(r"plan [0-9a-f]{12}", s), timeout=SCREEN_TIMEOUT, what="the retention plan")
    term.press("C-p")
    _fill(term, "apply retention")
    term.wait_for("Retention: Apply retention plan", what="the palette's apply command")
    term.send("Enter")
    term.wait_for("Read-only mode: cannot apply a retention plan", what="the refusal to apply")
    # The palette gone, the focus back on the screen: its letters are keys again.
    term.wait_for(
        lambda s: "Run folder" in s and "Retention: Apply retention plan" not in s and _footer_keys(s),
        timeout=30,
        what="the Retention screen's keys (the palette closed)",
    )

    # A failing background task: a notification, the console stays up, the detail behind e.
    # Each edit waits for its own effect: press() returns on any change (a toast coming or
    # going), and a letter of the URL reaching the table instead of the field is a screen key.
    url = "s3://no-such-bucket-e2e/run"
    term.press("o")
    term.wait_for(lambda s: not _footer_keys(s), timeout=30, what="the run folder's text field focused (o)")
    term.send("Home")
    term.press("C-k")
    term.wait_for(RUN_FOLDER_PLACEHOLDER, timeout=30, what="the run folder field emptied (Home, ctrl+k)")
    _fill(term, url)
    term.send("Enter")
    term.wait_for("press e for details", timeout=SCREEN_TIMEOUT, what="the error notification")
    # and the screen's own summary, which stays after the notification goes
    term.wait_for(f"Could not list {url}", timeout=SCREEN_TIMEOUT, what="the listing's failure in the summary")
    # Escape leaves the text field (letters typed there are text), then e is the errors key.
    term.press("Escape")
    # press() returns on the first change on screen; under load the footer follows a moment later.
    term.wait_for(_footer_keys, timeout=30, what="the footer's keys (out of the text field)")
    assert not _in_text_field(term), term.screen()
    term.press("e")
    screen = term.wait_for("Listing s3://no-such-bucket-e2e/run", what="the errors screen")
    assert "no-such-bucket-e2e" in screen.split("Listing", 2)[-1], screen
    term.press("Escape")
    term.wait_for("Run folder", what="back on the Retention screen")

    _quit(term)


# -- the walkthrough (docs/walkthrough.md) at 80x24 ----------------------------------------------
# The walkthrough's path (docs/walkthrough.md) in a real 80x24 terminal, as a new user takes it.
#
# ``loadmaster lab up``, then the console it prints, driven by keys in tmux at 80 columns by 24
# rows, the smallest terminal the console supports. Every assertion reads the captured screen, so
# what the operator decides on must be on it, not below the fold or behind a cut-off column:
#
# 1. Fleet: the starved node's row says STARVED;
# 2. Transfers: a pull to all four nodes, and the egress guard's decision (ALLOW/CONFIRM/BLOCK) above
#    the fold with its ``^s Launch`` key;
# 3. the launch, held mid-pull by a store that answers slowly (SeaweedFS stopped and continued,
#    then stopped: a stalled path, as in tests/jobs/test_pull_lab.py), cancelled from Transfers as
#    one thing: ``c`` on any of its jobs, one typed confirmation, every job of it cancelled;
# 4. Retention on the lab's demo run: the plan's keep rows, the typed confirmation, the result.
#
# The final screen of each step is written to ``walkthrough-80x24.txt`` in the test's directory (and
# printed: ``pytest -s`` shows them).

WIDTH, HEIGHT = 80, 24
NODES = ("node-01", "node-02", "node-03", "node-04")

#: The two latest complete steps of the lab's demo run: kept whole.
KEPT = ("10000", "11000")


@pytest.fixture
def term80(as_new: tuple[Path, str, dict[str, str]], tmp_path: Path) -> Iterator[Tmux]:
    yield from _term(as_new, tmp_path, WIDTH, HEIGHT)


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


def test_walkthrough_at_80x24(sandbox: tuple[Path, str, dict[str, str]], term80: Tmux, tmp_path: Path) -> None:
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
    _new_pull(term, bucket, "walkthrough-shards", "node-[01-04]")
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
        screen = term.wait_for(
            lambda s: "Cancel this launch?" in s and f"launch {launch}: 4 running" in s,
            what="the launch's whole confirmation",
        )
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
    assert not _in_text_field(term), "after applying, the focus should be on the steps table"
    keep("4c. Retention: the plan applied", screen)

    screen = _quit(term)
    assert "Traceback" not in screen, screen
