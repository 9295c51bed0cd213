"""An upload aborts only the multipart uploads it started (their ids are journalled as S3 hands
them out) and says so; a lost upload job's cleanup gets its credentials again (the 0600 secrets
file, never argv) and aborts exactly its own uploads.

The lab's real SeaweedFS for uploads that finish, fail, are cancelled or are killed in a child
process; the hostile responder holds an upload job's parts on cue so its runner can be killed
mid-upload on a real lab node.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from backend.agent.context import JobContext
from backend.checkpoints.upload import (
    JOURNAL_FILE,
    MiB,
    UploadCancelled,
    UploadError,
    UploadSettings,
    list_multipart,
    upload_dir,
)
from backend.checkpoints.upload.job import cleanup, launch_upload, upload_params
from backend.services import Services
from backend.storage import S3Store
from lab import Lab
from tests.checkpoints.test_upload import kill_mid_upload
from tests.helpers import lab_bucket_store
from tests.jobs.test_pull_lab import quick_lost
from tests.security.conftest import HOSTILE_SECRET
from tests.security.hostile_s3 import HostileS3

pytestmark = pytest.mark.timeout(240)
SMALL = UploadSettings(part_size=5 * MiB, concurrency=2, retries=1)


@pytest.fixture
def step(tmp_path: Path) -> Path:
    d = tmp_path / "step-10"
    d.mkdir()
    (d / "__0_0.distcp").write_bytes(os.urandom(11 * MiB))
    (d / ".metadata").write_bytes(b"marker")
    return d


@pytest.fixture
def store(lab, s3) -> S3Store:  # type: ignore[no-untyped-def]
    return lab_bucket_store(lab, s3, "ids")


def _foreign(s3, store: S3Store, keys: list[str]) -> set[str]:  # type: ignore[no-untyped-def]
    """Multipart uploads someone else has in progress (started with a plain S3 client)."""
    return {s3.client().create_multipart_upload(Bucket=store.bucket, Key=k)["UploadId"] for k in keys}


async def _ids(store: S3Store) -> set[str]:
    return {uid for _k, uid, _t in await list_multipart(store)}


async def test_finished_failed_and_cancelled_uploads_abort_only_their_own(
    s3,
    store: S3Store,  # type: ignore[no-untyped-def]
    step: Path,
) -> None:
    theirs = _foreign(s3, store, ["run/step-10/theirs.bin", "another-run/step-5/x.distcp"])
    async with store:
        res = await upload_dir(store, step, "run/step-10", settings=SMALL)
        assert res.others_in_progress == 1 and res.aborted_stale == 0
        assert res.notes() == ["left 1 multipart upload(s) under the destination alone: not started by this upload"]

        def broken(key: str, part: int, attempt: int, data: bytes) -> bytes:
            return data[:-1] if part == 2 else data

        with pytest.raises(UploadError, match="part 2 failed"):
            await upload_dir(store, step, "run/step-11", settings=SMALL, fault=broken)
        seen: list[int] = []
        with pytest.raises(UploadCancelled):
            await upload_dir(
                store,
                step,
                "run/step-12",
                settings=SMALL,
                fault=lambda k, p, a, d: seen.append(p) or d,
                cancelled=lambda: len(seen) >= 1,
            )
        assert await _ids(store) == theirs


async def test_a_killed_jobs_cleanup_aborts_its_own_not_the_buckets(
    s3,
    lab: Lab,
    step: Path,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    # The store is the bucket root and the prefix empty: the old sweep aborted every upload in it.
    store = lab_bucket_store(lab, s3, "root")
    theirs = _foreign(s3, store, ["theirs.bin", "deep/down/other.bin"])
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    kill_mid_upload(s3, store, step, job_dir / JOURNAL_FILE, prefix="")
    async with store:
        mine = await _ids(store) - theirs
        assert len(mine) == 1
    logs: list[str] = []
    ctx = JobContext(
        job_id="j",
        kind="upload",
        params=upload_params(str(step), store, ""),
        job_dir=job_dir,
        on_log=logs.append,
        secrets={"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key},
    )
    await asyncio.to_thread(cleanup, ctx)
    assert any(f"aborted 1 multipart upload(s) this job had started: {mine.pop()}" in m for m in logs), logs
    async with store:
        assert await _ids(store) == theirs
    # Without credentials the cleanup says what it could not do (never a traceback, never a guess).
    logs.clear()
    (job_dir / JOURNAL_FILE).write_text(
        json.dumps({"op": "start", "bucket": store.bucket, "key": "k", "upload_id": "left-open"}) + "\n"
    )
    ctx = JobContext(
        job_id="j",
        kind="upload",
        params=upload_params(str(step), store, ""),
        job_dir=job_dir,
        on_log=logs.append,
        secrets={},
    )
    await asyncio.to_thread(cleanup, ctx)
    assert any("no credentials reached the cleanup; ids: left-open" in m for m in logs), logs


async def test_a_lost_upload_job_is_cleaned_up_with_its_credentials(
    lab: Lab, hostile_s3: HostileS3, hostile_services: Services, step: Path
) -> None:
    """A real upload job on a lab node, its runner SIGKILLed while a part is in flight."""
    hostile_s3.uploads.clear()
    theirs = "their-upload-id"
    from tests.security.hostile_s3 import Upload

    hostile_s3.uploads[theirs] = Upload("evil", "run/step-10/theirs.bin", 0.0)
    store = S3Store("s3://evil", hostile_services.config.stores["hostile"])
    local = lab.node("node-01").scratch / "upload-src" / step.name
    shutil.copytree(step, local)
    hostile_s3.hold_parts()
    try:
        rec = await launch_upload(hostile_services.jobs, "node-01", store, str(local), "run/step-10", settings=SMALL)
        job_dir = Path(rec.job_dir or "")
        while not ((job_dir / JOURNAL_FILE).exists() and hostile_s3.held_parts >= 1 and (job_dir / "pid").exists()):
            await asyncio.sleep(0.05)  # bounded by the test's timeout
        [mine] = [json.loads(x)["upload_id"] for x in (job_dir / JOURNAL_FILE).read_text().splitlines()]  # noqa: ASYNC240
        assert mine in hostile_s3.uploads
        assert not (job_dir / "secrets.json").exists()  # the runner took its secrets and deleted them
        os.kill(json.loads((job_dir / "pid").read_text())["pid"], signal.SIGKILL)  # noqa: ASYNC240
        quick_lost(hostile_services)
        final = await hostile_services.jobs.wait(rec.id, timeout=120)
    finally:
        hostile_s3.release()
    await store.close()
    assert final.state == "lost", final.error
    assert mine not in hostile_s3.uploads and theirs in hostile_s3.uploads
    log = (job_dir / "log").read_text()  # noqa: ASYNC240
    assert f"aborted 1 multipart upload(s) this job had started: {mine}" in log, log
    assert not (job_dir / "secrets.json").exists() and HOSTILE_SECRET not in log
    # The abort was made with the store's keys, re-supplied by the console (the only credentials
    # the node ever had were deleted by the runner at its start).
    aborts = [h for m, p, q, h in hostile_s3.requests if m == "DELETE" and q.get("uploadId") == [mine]]
    assert aborts and "HOSTILEKEYID" in aborts[0].get("authorization", "")
