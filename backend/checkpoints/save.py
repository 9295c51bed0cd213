"""``save_and_upload``: DCP async_save to local NVMe, then a background upload to the object store.

For training scripts. The training loop resumes as soon as DCP has staged the state dict
(``handle.staged_seconds``); writing the step folder and uploading it happen in the background.
The upload is a durable-format job directory under ``$LOADMASTER_HOME/jobs/<id>/`` (spec, pid,
heartbeat, progress.jsonl, result.json), so the console on any machine shows
"step 48000: staged 1.8 s, uploading 61%, 9.40 Gbps" and raises the backlog alert when an upload
is still running at the next checkpoint. Uploads run one at a time, in step order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from backend.agent.context import HEARTBEAT_FILE, PID_FILE, RESULT_FILE, SPEC_FILE, JobContext
from backend.checkpoints.upload import (
    JOURNAL_FILE,
    MultipartJournal,
    UploadResult,
    UploadSettings,
    store_params,
    upload_dir,
    url_join,
)
from backend.config import StoreProfile
from backend.errors import LoadmasterError
from backend.state import actor
from backend.storage import LocalStore, ObjectStore, S3Store
from backend.units import bytes_text, gbps_text

_UPLOADER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lm-ckpt-upload")


def _jobs_home(home: str | Path | None) -> Path:
    base = Path(home or os.environ.get("LOADMASTER_HOME") or Path.home() / ".loadmaster")
    d = base / "jobs"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def _write_atomic(path: Path, data: str) -> None:
    from backend.agent.runner import write_atomic

    write_atomic(path, data)


@dataclass
class SaveHandle:
    """A checkpoint being written and uploaded in the background."""

    step: int
    local_path: Path
    dest_url: str
    staged_seconds: float
    future: concurrent.futures.Future[UploadResult]
    job_id: str | None = None
    job_dir: Path | None = None
    progress: dict[str, Any] = field(default_factory=dict)

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float | None = None) -> UploadResult:
        """Wait for the save and the verified upload; raises what failed."""
        return self.future.result(timeout)

    def status_line(self) -> str:
        """``step 48000: staged 1.8 s, uploading 61%, 9.40 Gbps`` (or uploaded/failed)."""
        head = f"step {self.step}: staged {self.staged_seconds:.1f} s"
        if self.future.done():
            exc = self.future.exception()
            if exc is not None:
                return f"{head}, upload failed: {exc}"
            r = self.future.result()
            return f"{head}, uploaded {bytes_text(r.bytes)} at {gbps_text(r.gbps)}, verified"
        p = self.progress
        if not p.get("bytes_total"):
            return f"{head}, writing/queued"
        return f"{head}, uploading {100 * p['bytes_done'] / p['bytes_total']:.0f}%, {gbps_text(p.get('gbps', 0.0))}"


def open_destination(store_url: str, profile: StoreProfile | None = None) -> ObjectStore:
    """A store for ``store_url``: the given profile, else the loadmaster config's, else env credentials."""
    if profile is not None:
        return S3Store(store_url, profile) if store_url.startswith("s3://") else LocalStore(store_url)
    try:
        from backend.config import load_config
        from backend.storage import StoreRegistry

        return StoreRegistry(load_config(None)).open(store_url)
    except LoadmasterError:
        return S3Store(store_url) if store_url.startswith("s3://") else LocalStore(store_url)


def save_and_upload(
    state_dict: dict[str, Any],
    step: int,
    local_dir: str | Path,
    store_url: str,
    *,
    profile: StoreProfile | None = None,
    settings: UploadSettings | None = None,
    process_group: Any = None,
    jobs_home: str | Path | None = None,
    step_name: str = "step-{step}",
    overwrite: bool = False,
) -> SaveHandle:
    """DCP async_save ``state_dict`` to ``local_dir/step-N`` and upload it to ``store_url/step-N``.

    Returns once DCP has staged the tensors (the training loop may continue); ``handle.future``
    completes with the verified :class:`UploadResult`. A destination step that already holds
    objects fails the upload unless ``overwrite`` (a re-run of a step never replaces it silently).
    """
    import torch.distributed.checkpoint as dcp

    name = step_name.format(step=step)
    local = Path(local_dir) / name
    dest_url = url_join(store_url, name)
    t0 = time.monotonic()
    resp = dcp.async_save(state_dict, checkpoint_id=str(local), process_group=process_group)
    # torch >= 2.9 may return an AsyncSaveResponse (staging_completion, upload_completion)
    staging = getattr(resp, "staging_completion", None)
    if staging is not None:
        staging.result()
    write_done = cast("concurrent.futures.Future[Any]", getattr(resp, "upload_completion", resp))
    staged = time.monotonic() - t0
    rank0 = True
    try:
        import torch.distributed as dist

        rank0 = not (dist.is_available() and dist.is_initialized()) or dist.get_rank(process_group) == 0
    except Exception:  # noqa: BLE001,S110 - no process group: a single-process save
        pass

    job_id = job_dir = None
    store = open_destination(dest_url, profile)
    params = {
        "src": str(local),
        "dest": dest_url,
        "store": store_params(store),
        "prefix": "",
        "step": step,
        "staged_seconds": round(staged, 3),
    }
    if rank0:
        from backend.jobs.records import new_job_id

        job_id = new_job_id()
        job_dir = _jobs_home(jobs_home) / job_id
        job_dir.mkdir(mode=0o700)
        _write_atomic(
            job_dir / SPEC_FILE,
            json.dumps(
                {
                    "id": job_id,
                    "kind": "upload",
                    "node": socket.gethostname(),
                    "label": f"save+upload {name}",
                    "params": params,
                    "created": time.time(),
                    "launched_by": actor(),
                    "launched_from": socket.gethostname(),
                }
            ),
        )
        _write_atomic(
            job_dir / PID_FILE, json.dumps({"pid": os.getpid(), "pgid": os.getpgid(0), "started": time.time()}) + "\n"
        )
    handle = SaveHandle(step, local, dest_url, staged, concurrent.futures.Future(), job_id, job_dir)
    stop = threading.Event()
    if job_dir is not None:
        threading.Thread(target=_beat, args=(job_dir, stop), daemon=True, name="lm-ckpt-heartbeat").start()

    def work() -> UploadResult:
        t_start = time.monotonic()
        ctx = JobContext(job_id=job_id or "", kind="upload", params=params, job_dir=job_dir)
        try:
            write_done.result()  # DCP finished writing the step folder (.metadata last)
            if not rank0:
                return UploadResult(store.url, "", (), 0, 0.0)

            def on_progress(done: int, total: int, files: int, nfiles: int) -> None:
                secs = max(1e-6, time.monotonic() - t_start)
                handle.progress = {"bytes_done": done, "bytes_total": total, "gbps": done * 8 / 1e9 / secs}
                ctx.progress(
                    bytes_done=done,
                    bytes_total=total,
                    items_done=files,
                    items_total=nfiles,
                    step=step,
                    staged_seconds=round(staged, 3),
                )

            async def go() -> UploadResult:
                try:
                    # the job directory's journal lets a lost job's cleanup abort exactly its uploads
                    journal = MultipartJournal(job_dir / JOURNAL_FILE) if job_dir is not None else None
                    return await upload_dir(
                        store,
                        local,
                        "",
                        settings=settings,
                        progress=on_progress,
                        cancelled=lambda: ctx.cancelled,
                        overwrite=overwrite,
                        journal=journal,
                    )
                finally:
                    await store.close()

            res = asyncio.run(go())
            ctx.log(
                f"step {step}: uploaded {res.bytes} bytes to {dest_url} in {res.seconds:.1f}s "
                f"({gbps_text(res.gbps)}), verified"
            )
            outcome: dict[str, Any] = {"state": "succeeded", "details": res.as_dict()}
            return res
        except BaseException as exc:
            outcome = {"state": "cancelled" if ctx.cancelled else "failed", "error": str(exc) or type(exc).__name__}
            ctx.log(f"step {step}: upload failed: {exc}")
            raise
        finally:
            stop.set()
            if job_dir is not None:
                ctx.flush()
                outcome.update(id=job_id, kind="upload", finished=time.time())
                if ctx.last_progress is not None:
                    outcome["progress"] = ctx.last_progress
                _write_atomic(job_dir / RESULT_FILE, json.dumps(outcome, default=str) + "\n")

    def run_into_handle() -> None:
        try:
            handle.future.set_result(work())
        except BaseException as exc:  # noqa: BLE001 - delivered through the future
            handle.future.set_exception(exc)

    _UPLOADER.submit(run_into_handle)
    return handle


def _beat(job_dir: Path, stop: threading.Event, interval: float = 2.0) -> None:
    while not stop.is_set():
        try:
            (job_dir / HEARTBEAT_FILE).write_text(f"{time.time():.3f}\n")
        except OSError:
            pass
        stop.wait(interval)
