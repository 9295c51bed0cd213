"""The node-side job runner behind ``loadmaster agent run JOBDIR``.

It runs detached (setsid) in the job directory, writes its pid and process group, touches the
heartbeat every ~2 s from a thread, runs the kind's runner with a :class:`JobContext`, and writes
the final result tmp-then-rename. SIGTERM (``loadmaster job cancel``) sets ``ctx.cancelled``; the
kind stops at its next safe point, its ``cleanup`` removes partial output, and the result says
``cancelled``. A runner killed without a result is later seen by the console as ``lost``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from backend.agent.context import (
    HEARTBEAT_FILE,
    PID_FILE,
    RESULT_FILE,
    SPEC_FILE,
    JobContext,
    done_fifo,
)
from backend.agent.kinds import JobKind, kind
from backend.errors import LoadmasterError

HEARTBEAT_INTERVAL = 2.0


def write_atomic(path: Path, data: str, mode: int = 0o644) -> None:
    """Write ``path`` via a temporary file and rename (readers never see half a file).

    No fsync: on ext4 (data=ordered) it would wait for every dirty page the job just wrote,
    seconds after a large pull. A crash can then only lose or truncate the result, which the
    console reads as "lost", never as a false success.
    """
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(data)
    os.replace(tmp, path)


def _proc_starttime(pid: int | str = "self") -> int | None:
    """Field 22 of /proc/PID/stat: when the process started, in clock ticks since boot."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # the command name may hold spaces and ")"
    try:
        return int(fields[19])  # fields[0] is field 3 (state)
    except (IndexError, ValueError):
        return None


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def process_identity(job_id: str) -> dict[str, Any]:
    """What proves later that a process group is this job's: pid, group, start time, boot, job id.

    The console signals the group only when its leader still has this start time in this boot,
    or a member still carries ``LOADMASTER_JOB_ID`` = this job's id in its environment (set by
    the launch for the runner and everything it starts); after a reboot or pid reuse it is
    left alone.
    """
    return {
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "started": time.time(),
        "job_id": job_id,
        "starttime": _proc_starttime(),
        "boot_id": _boot_id(),
    }


def _make_done_fifo(path: Path) -> None:
    try:
        os.mkfifo(path, 0o600)
    except OSError:
        pass  # followers fall back to polling for the result file


def _wake_followers(path: Path, *, remove: bool = True) -> None:
    """Open-and-close the job's FIFO for writing: followers blocked opening it read EOF at once.

    Non-blocking, so with no follower waiting it fails at once (ENXIO) and nothing waits here.
    The FIFO is then removed: a follower that comes later finds the result file instead.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        pass
    else:
        os.close(fd)
    if remove:
        try:
            path.unlink()
        except OSError:
            pass


def _heartbeat(ctx: JobContext, path: Path, stop: threading.Event, interval: float) -> None:
    while not stop.is_set():
        try:
            path.write_text(f"{time.time():.3f}\n")
            ctx.flush()
        except OSError:
            pass  # a full disk must not kill the job; the console sees a stale heartbeat
        stop.wait(interval)


def run_job(job_dir: Path, *, heartbeat_interval: float = HEARTBEAT_INTERVAL) -> int:
    """Run the job in ``job_dir`` to its end and write ``result.json``; returns the exit status."""
    job_dir = Path(job_dir).resolve()
    if not (job_dir / SPEC_FILE).is_file():
        raise LoadmasterError(f"{job_dir}: no {SPEC_FILE}; not a loadmaster job directory")
    if (job_dir / RESULT_FILE).exists():
        raise LoadmasterError(f"{job_dir}: this job already finished (result.json exists)")
    ctx = JobContext.from_job_dir(job_dir)
    # Everything the job starts carries its id: the proof, later, that a process group is its own.
    os.environ["LOADMASTER_JOB_ID"] = ctx.job_id
    write_atomic(job_dir / PID_FILE, json.dumps(process_identity(ctx.job_id)) + "\n")
    _make_done_fifo(done_fifo(job_dir))
    # Secrets are read (and their file deleted) first thing, so they do not linger on disk.
    ctx.secret_env()

    def on_term(signum: int, _frame: Any) -> None:
        ctx.request_cancel()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    stop = threading.Event()
    beat = threading.Thread(
        target=_heartbeat, args=(ctx, job_dir / HEARTBEAT_FILE, stop, heartbeat_interval), name="heartbeat", daemon=True
    )
    beat.start()
    started = time.time()
    result: dict[str, Any] = {"id": ctx.job_id, "kind": ctx.kind, "started": started}
    job: JobKind | None = None
    try:
        job = kind(ctx.kind)
        ctx.log(f"job {ctx.job_id} ({ctx.kind}) started, pid {os.getpid()}")
        details = job.run(ctx)
        if ctx.cancelled:
            raise _Cancelled()
        result.update(state="succeeded", details=details or {})
        ctx.log("succeeded")
    except _Cancelled:
        result.update(state="cancelled", error="cancelled by request")
    except BaseException as exc:  # noqa: BLE001 - every failure must end in a result file
        if ctx.cancelled:
            result.update(state="cancelled", error="cancelled by request")
        else:
            msg = str(exc) if isinstance(exc, LoadmasterError) else f"{type(exc).__name__}: {exc}"
            result.update(state="failed", error=msg or type(exc).__name__)
            ctx.log(f"failed: {msg}")
            if not isinstance(exc, LoadmasterError):
                ctx.log(traceback.format_exc().rstrip())
    if result["state"] == "cancelled":
        ctx.log("cancelled; removing partial output")
        if job is not None:
            try:
                job.cleanup(ctx)
            except Exception as exc:  # noqa: BLE001
                ctx.log(f"cleanup failed: {type(exc).__name__}: {exc}")
    ctx.flush()
    stop.set()
    result["finished"] = time.time()
    if ctx.last_progress is not None:
        result["progress"] = ctx.last_progress
    write_atomic(job_dir / RESULT_FILE, json.dumps(result, default=str) + "\n")
    _wake_followers(done_fifo(job_dir))
    return {"succeeded": 0, "cancelled": 3}.get(result["state"], 1)


def cleanup_job(job_dir: Path) -> None:
    """Run the kind's cleanup for a job that died without a result (the console found it lost)."""
    job_dir = Path(job_dir).resolve()
    ctx = JobContext.from_job_dir(job_dir)
    job = kind(ctx.kind)
    ctx.log("job lost: removing partial output")
    job.cleanup(ctx)


class _Cancelled(Exception):
    pass
