"""What a job kind's runner sees: progress, log, cancellation and secrets, on a node or in-process.

A runner is ``def run(ctx: JobContext) -> dict``; it never touches the job directory itself, so the
same runner works detached on a node (``loadmaster agent run JOBDIR``) and inside a test or the
console (:meth:`JobContext.in_process`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any, TypeVar

PP = TypeVar("PP", bound=PurePath)

#: File names inside a job directory (shared with backend.jobs, which reads them remotely).
SPEC_FILE = "spec.json"
PID_FILE = "pid"
HEARTBEAT_FILE = "heartbeat"
PROGRESS_FILE = "progress.jsonl"
LOG_FILE = "log"
RESULT_FILE = "result.json"
SECRETS_FILE = "secrets.json"
CANCEL_FILE = "cancel"


def done_fifo(job_dir: PP) -> PP:
    """The FIFO the runner opens after writing its result, so a waiting follower wakes at once.

    A hidden sibling of the job directory (``jobs/.ID.done``), not inside it: a job directory
    holds only regular files, so reading all of them never blocks on a FIFO.
    """
    return job_dir.parent / f".{job_dir.name}.done"


#: Progress lines are coalesced to at most this many per second (the final one always lands).
PROGRESS_MAX_RATE = 4.0


class JobContext:
    """The runner's handle on its job: report progress, log, check cancellation, read secrets."""

    def __init__(
        self,
        *,
        job_id: str,
        kind: str,
        params: dict[str, Any],
        job_dir: Path | None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        on_log: Callable[[str], None] | None = None,
        secrets: dict[str, str] | None = None,
    ) -> None:
        self.job_id = job_id
        self.kind = kind
        self.params = params
        self.job_dir = job_dir
        self._on_progress = on_progress
        self._on_log = on_log
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._last_emit = 0.0
        self._pending: dict[str, Any] | None = None
        self._final_key: tuple[Any, ...] | None = None
        self._secrets: dict[str, str] | None = dict(secrets) if secrets is not None else None
        self.last_progress: dict[str, Any] | None = None

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def in_process(
        cls,
        kind: str,
        params: dict[str, Any],
        *,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        on_log: Callable[[str], None] | None = None,
        secrets: dict[str, str] | None = None,
        job_id: str | None = None,
    ) -> JobContext:
        """A context with no job directory: progress and log go to the callbacks (tests, console)."""
        return cls(
            job_id=job_id or f"inproc-{os.getpid()}-{int(time.time() * 1000)}",
            kind=kind,
            params=dict(params),
            job_dir=None,
            on_progress=on_progress,
            on_log=on_log,
            secrets=secrets if secrets is not None else {},
        )

    @classmethod
    def from_job_dir(cls, job_dir: Path) -> JobContext:
        """The context of a detached job, from the spec in its directory (used by the agent)."""
        spec = json.loads((job_dir / SPEC_FILE).read_text())
        return cls(job_id=spec["id"], kind=spec["kind"], params=spec.get("params", {}), job_dir=job_dir)

    # -- reporting ----------------------------------------------------------------------------

    def progress(
        self,
        *,
        bytes_done: int,
        bytes_total: int | None = None,
        items_done: int = 0,
        items_total: int | None = None,
        **extra: Any,
    ) -> None:
        """Record one progress point (coalesced to <= ~4 lines/s; the last one is always kept)."""
        line = {
            "t": time.time(),
            "bytes_done": int(bytes_done),
            "bytes_total": None if bytes_total is None else int(bytes_total),
            "items_done": int(items_done),
            "items_total": None if items_total is None else int(items_total),
            **extra,
        }
        final = bool(extra.get("final")) or (
            bytes_total is not None
            and bytes_done >= bytes_total
            and (items_total is None or items_done >= items_total)
            and (bytes_total > 0 or bool(items_total))
        )
        key = (line["bytes_done"], line["bytes_total"], line["items_done"], line["items_total"])
        with self._lock:
            self.last_progress = line
            now = time.monotonic()
            # A "complete" point is written at once, but only once: a runner that keeps reporting
            # a finished (or zero-sized) total is coalesced like any other.
            final = final and key != self._final_key
            if final:
                self._final_key = key
            if final or now - self._last_emit >= 1.0 / PROGRESS_MAX_RATE:
                self._pending = None
                self._last_emit = now
                self._emit(line)
            else:
                # Kept so flush() (called by the heartbeat thread and at exit) writes it later.
                self._pending = line

    def flush(self) -> None:
        """Write a coalesced progress point that has not been written yet."""
        with self._lock:
            line, self._pending = self._pending, None
            if line is not None:
                self._last_emit = time.monotonic()
                self._emit(line)

    def _emit(self, line: dict[str, Any]) -> None:
        if self.job_dir is not None:
            with open(self.job_dir / PROGRESS_FILE, "a") as f:
                f.write(json.dumps(line, default=str) + "\n")
        if self._on_progress is not None:
            self._on_progress(line)

    def log(self, message: str) -> None:
        """Append one line to the job log (never pass secrets)."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        text = f"{stamp} {message.rstrip()}"
        if self.job_dir is not None:
            with open(self.job_dir / LOG_FILE, "a") as f:
                f.write(text + "\n")
        if self._on_log is not None:
            self._on_log(message)

    # -- cancellation -------------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """True once SIGTERM / a cancel was requested; runners stop at the next safe point."""
        if self._cancel.is_set():
            return True
        if self.job_dir is not None and (self.job_dir / CANCEL_FILE).exists():
            self._cancel.set()
        return self._cancel.is_set()

    def request_cancel(self) -> None:
        """Ask the runner to stop (signal handler, console, tests)."""
        self._cancel.set()

    def wait_cancelled(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, waking early on cancel; returns :attr:`cancelled`."""
        self._cancel.wait(timeout)
        return self.cancelled

    # -- secrets ------------------------------------------------------------------------------

    def secret_env(self) -> dict[str, str]:
        """Env vars delivered via the job's 0600 secrets file (read once, then the file is deleted)."""
        if self._secrets is None:
            self._secrets = {}
            if self.job_dir is not None:
                path = self.job_dir / SECRETS_FILE
                try:
                    data = json.loads(path.read_text())
                except FileNotFoundError:
                    data = {}
                finally:
                    try:
                        path.unlink()
                    except FileNotFoundError:
                        pass
                self._secrets = {str(k): str(v) for k, v in data.items()}
        return dict(self._secrets)
