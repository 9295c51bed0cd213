"""How the lab runs a real server as a plain process: started in its own session with its output in
a log file, waited for until it answers, stopped with its whole process group."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def start_logged(
    args: list[str], log_path: Path, cwd: Path, env: dict[str, str] | None = None
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


def wait_http_ready(proc: subprocess.Popen[bytes], url: str, timeout: float, every: float = 0.05) -> bool:
    """Poll ``url`` until it answers 200 (True), the process exits or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(every)
    return False


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
