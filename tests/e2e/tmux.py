"""Drive a program in a real terminal: a private tmux server, keys in, screen text out."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping

#: Polling steps while waiting for the screen: short for the first second (most waits are one
#: key's redraw, a few tens of ms), then coarser; the deadline, not these, bounds a wait.
POLL_FIRST, POLL_FIRST_FOR, POLL = 0.02, 1.0, 0.1
#: How long a matching screen must hold still before a wait returns it (see ``Tmux.wait_for``).
SETTLE = 0.1


class ScreenTimeout(AssertionError):
    """The screen never showed what a test waited for (the message carries the last screen)."""


def deadline_poll(
    check: Callable[[], object],
    *,
    timeout: float,
    what: str,
    describe: Callable[[], str] = lambda: "",
    every: float | None = None,
) -> object:
    """Call ``check`` until it returns something truthy; raise ScreenTimeout after ``timeout`` s.
    ``every``: a fixed step for a check that costs a process of its own (a Slurm command), which
    the screen's fast first second would spawn 50 times while the console under test starts."""
    start = time.monotonic()
    end = start + timeout
    while True:
        value = check()
        if value:
            return value
        now = time.monotonic()
        if now > end:
            raise ScreenTimeout(f"timed out after {timeout:.0f}s waiting for {what}\n{describe()}")
        time.sleep(every or (POLL_FIRST if now - start < POLL_FIRST_FOR else POLL))


class Tmux:
    """One tmux server on its own socket (``tmux -L``) with one window running a plain shell."""

    def __init__(
        self, *, env: Mapping[str, str], width: int = 120, height: int = 36, cwd: str, prompt: str = "lm-e2e$ "
    ) -> None:
        self.socket = f"lm-e2e-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.env = dict(env)
        self.width, self.height = width, height
        self.cwd = cwd
        self.prompt = prompt
        self.started = False

    def _tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            check=check,
            timeout=30,
        )

    def start(self) -> Tmux:
        """Start the server with a bare shell whose only setting is a known prompt."""
        rc = os.path.join(self.cwd, f".{self.socket}.bashrc")
        with open(rc, "w") as f:
            f.write(f"PS1={shlex.quote(self.prompt)}\n")
        self._tmux(
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "e2e",
            "-x",
            str(self.width),
            "-y",
            str(self.height),
            f"bash --noprofile --rcfile {shlex.quote(rc)}",
        )
        self.started = True
        # Keep the pane after the shell exits so a crash can still be read.
        self._tmux("set-option", "-t", "e2e", "remain-on-exit", "on")
        return self

    def send(self, *keys: str) -> None:
        """tmux key names (``Enter``, ``Escape``, ``C-p``) or literal characters."""
        self._tmux("send-keys", "-t", "e2e", *keys)

    def type(self, text: str, *, timeout: float = 30.0) -> None:
        """Type ``text`` literally (no key-name lookup) and wait until the screen reacts."""
        before = self.screen(styled=True)
        self._tmux("send-keys", "-t", "e2e", "-l", text)
        deadline_poll(
            lambda: self.screen(styled=True) != before,
            timeout=timeout,
            what=f"the screen to show {text!r} being typed",
            describe=self.screen,
        )

    def screen(self, *, styled: bool = False) -> str:
        """The visible pane as text, one line per row (wrapped lines joined); ``styled`` keeps
        colours and attributes (so a focus change, invisible in plain text, shows)."""
        return self._tmux("capture-pane", "-p", "-J", *(["-e"] if styled else []), "-t", "e2e").stdout

    def press(self, key: str, *, timeout: float = 30.0) -> None:
        """Send one key and wait until the screen reacts (a keypress that changes nothing, such
        as Tab onto a widget that looks the same focused, would time out: don't use it there).

        A terminal app reads a burst of bytes at once; waiting for each key's effect keeps Tab
        from racing the text typed before it, and Escape from merging with the next key (alt+).
        """
        before = self.screen(styled=True)
        self.send(key)
        deadline_poll(
            lambda: self.screen(styled=True) != before,
            timeout=timeout,
            what=f"the screen to react to {key!r}",
            describe=self.screen,
        )

    def wait_for(self, needle: str | Callable[[str], object], *, timeout: float = 60.0, what: str | None = None) -> str:
        """Poll the screen until it contains ``needle`` (or ``needle(screen)`` holds) and has
        settled: the same text twice in a row, ``SETTLE`` s apart.

        A capture can land mid-frame (tmux has applied part of the app's write) or between two
        layout passes (a dialog's title drawn, its body not yet), so the first screen that matches
        is not yet the screen the user reads; what a test asserts next must come from a whole one.
        A screen that matches but never holds still (a ticking clock) is returned at the deadline.
        """
        last, matched = [""], [""]

        def check() -> str | None:
            screen = self.screen()
            ok = needle in screen if isinstance(needle, str) else needle(screen)
            settled = ok and screen == matched[0]
            last[0], matched[0] = screen, screen if ok else ""
            if ok and not settled:
                time.sleep(SETTLE)
                return None
            return screen if settled else None

        try:
            out = deadline_poll(
                check, timeout=timeout, what=what or repr(needle), describe=lambda: "---- last screen ----\n" + last[0]
            )
        except ScreenTimeout:
            if matched[0]:
                return matched[0]
            raise
        assert isinstance(out, str)
        return out

    def kill(self) -> None:
        """Stop the server and everything running in it."""
        if self.started:
            self._tmux("kill-server", check=False)
            self.started = False
