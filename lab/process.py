"""How the lab runs a real server as a plain process: started in its own session with its output in
a log file, waited for until it answers, stopped with its whole process group.

:class:`ManagedProcess` is that life cycle once (start with argv, env and a log file; a readiness
probe; stop with SIGTERM to the group, SIGKILL after a grace); each server (SeaweedFS, sshd,
Prometheus, node_exporter, Alertmanager, the dcgm stand-in, Slurm's daemons) is a small subclass
that says what to run and how it answers. PostgreSQL is the exception: ``pg_ctl`` starts and stops
it (:mod:`lab.postgres`). The functions below stop what another process started, from the pids a
lab recorded (``loadmaster lab down``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Self

from backend.errors import LoadmasterError


def start_logged(
    args: list[str], log_path: Path, cwd: Path | None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``args`` in a session of its own (``stop_group`` stops it and its children), stdout and
    stderr appended to ``log_path``."""
    log = open(log_path, "ab")  # noqa: SIM115 - owned by the child
    try:
        return subprocess.Popen(
            args, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd, env=env
        )
    finally:
        log.close()


def log_tail(path: Path, lines: int = 3) -> str:
    """The last non-empty lines of a log, joined for a one-line error."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "no log"
    tail = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
    return " | ".join(tail) or "no output"


def stop_group(proc: subprocess.Popen[bytes] | None, timeout: float = 20.0) -> None:
    """SIGTERM the process's group, SIGKILL it after ``timeout``; nothing is left running."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def write_json_config(path: Path, doc: dict[str, Any]) -> Path:
    """Write a config (JSON, which YAML reads) atomically: a reload never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def http_ok(url: str) -> bool:
    """Whether ``url`` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_port(ip: str, port: int, timeout: float = 10.0) -> bool:
    """Poll until ``ip:port`` accepts a TCP connection (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((ip, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def alive(pid: int | None) -> bool:
    """Whether ``pid`` runs (someone else's process counts; a zombie does not)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def wait_gone(pids: Iterable[int], timeout: float) -> None:
    """Wait until every pid has exited (gone, or a zombie left for init to reap)."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                break
            if state in ("Z", "X"):
                break
            time.sleep(0.01)


def children(pid: int) -> list[int]:
    """All descendants of ``pid`` (walks /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in parents.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def stop_pid_groups(pids: Iterable[int], grace: float = 20.0) -> None:
    """SIGTERM the process groups a lab started (their leaders' pids, recorded by another process);
    SIGKILL what is left of them once the leaders are gone or ``grace`` has passed."""
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    wait_gone(pids, grace)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


class ManagedProcess:
    """One real server the lab runs as a plain child process, in a session of its own.

    A subclass says what to run (:meth:`args`, :meth:`env`, :attr:`cwd`), what to write first
    (:meth:`before_start`), when it is ready (:meth:`ready`, polled while the process lives) and what a
    failed start says (:meth:`start_failure`); :meth:`start` and :meth:`stop` are the same for
    all. It needs ``root`` (the server's directory) and ``log_path``."""

    root: Path
    proc: subprocess.Popen[bytes] | None = None
    #: What a failed start raises.
    error: ClassVar[type[LoadmasterError]] = LoadmasterError
    #: Seconds between SIGTERM to the process group and SIGKILL, on :meth:`stop`.
    stop_grace: ClassVar[float] = 20.0
    #: Seconds between two readiness probes.
    poll_every: ClassVar[float] = 0.05
    #: Default seconds :meth:`start` waits for :meth:`ready`.
    start_timeout: ClassVar[float] = 30.0

    @property
    def log_path(self) -> Path:
        raise NotImplementedError

    @property
    def cwd(self) -> Path | None:
        """The child's working directory (None: this process's)."""
        return self.root

    def args(self) -> list[str]:
        """The command line (finds the binary: a missing one raises its install hint)."""
        raise NotImplementedError

    def env(self) -> dict[str, str] | None:
        """The child's environment (None: this process's)."""
        return None

    def before_start(self) -> None:
        """Write what the server reads at start (config, directories)."""
        self.root.mkdir(parents=True, exist_ok=True)

    def ready(self) -> bool:
        """Whether the started server answers (polled every :attr:`poll_every` seconds)."""
        return True

    def start_failure(self) -> str:
        """The first half of a failed start's one-line error (the log's tail follows)."""
        return f"{type(self).__name__} did not start in {self.root}"

    def failure_detail(self) -> str:
        """The second half: the tail of the log."""
        return log_tail(self.log_path)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launch(self) -> subprocess.Popen[bytes]:
        """Start the process without waiting for it to be ready."""
        args = self.args()  # first: a missing binary writes nothing
        self.before_start()
        self.proc = start_logged(args, self.log_path, self.cwd, self.env())
        return self.proc

    def start(self, timeout: float | None = None) -> Self:
        """Start it and wait until :meth:`ready`; a start that fails (the process exits, or
        ``timeout`` passes) stops what it started and raises :attr:`error` with the log's tail."""
        if self.running:
            return self
        self.launch()
        return self.wait_ready(timeout)

    def wait_ready(self, timeout: float | None = None) -> Self:
        """Wait until the :meth:`launch`-ed process is :meth:`ready` (several servers launched
        first, then waited for, start side by side); what :meth:`start` says on a failure."""
        proc = self.proc
        if proc is None:
            raise self.error(f"{self.start_failure()}: not launched")
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        while time.monotonic() < deadline and proc.poll() is None:
            if self.ready():
                return self
            time.sleep(self.poll_every)
        detail = self.failure_detail()
        self.stop()
        raise self.error(f"{self.start_failure()}: {detail}")

    def stop(self) -> None:
        """SIGTERM its process group, SIGKILL after :attr:`stop_grace`; nothing is left running."""
        stop_group(self.proc, timeout=self.stop_grace)
        self.proc = None
