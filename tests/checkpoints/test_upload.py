"""Upload step directories to the lab's real SeaweedFS S3: verified, markers last, no orphans."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.agent.context import JobContext
from backend.checkpoints.catalog import list_checkpoints
from backend.checkpoints.upload import (
    MiB,
    UploadCancelled,
    UploadError,
    UploadSettings,
    list_multipart,
    store_params,
    upload_dir,
)
from backend.checkpoints.upload.job import run_upload_job, upload_params
from backend.config import data_dir
from backend.storage import S3Store
from tests.helpers import lab_bucket_store

PART = 5 * MiB
SMALL = UploadSettings(part_size=PART, concurrency=4, retries=2)


@pytest.fixture
def bucket_store(lab, s3):  # type: ignore[no-untyped-def]
    return lab_bucket_store(lab, s3, "ckpt")


@pytest.fixture
def step_dir(tmp_path: Path, tiny_full_dcp: tuple[Path, dict]) -> Path:
    """The tiny DCP step plus a 13 MiB rank file, so it needs 3 parts of 5 MiB."""
    d = tmp_path / "step-10"
    shutil.copytree(tiny_full_dcp[0], d)
    (d / "__1_0.distcp").write_bytes(os.urandom(13 * MiB))
    return d


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def local_digests(local: Path) -> dict[str, str]:
    return {f.name: sha(f.read_bytes()) for f in local.iterdir()}


async def assert_same(store: S3Store, local: Path, prefix: str) -> None:
    for name, digest in local_digests(local).items():
        assert sha(await store.get_bytes(f"{prefix}/{name}")) == digest, name


async def test_upload_verified_and_metadata_last(bucket_store: S3Store, step_dir: Path) -> None:
    calls: list[str] = []

    def spy(key: str, part: int, attempt: int, data: bytes) -> bytes:
        calls.append(key)
        return data

    async with bucket_store as store:
        res = await upload_dir(store, step_dir, "run1/step-10", settings=SMALL, fault=spy)
        assert {o.key for o in res.objects} == {f"run1/step-10/{n}" for n in local_digests(step_dir)}
        big = next(o for o in res.objects if o.key.endswith("__1_0.distcp"))
        assert big.parts == 3 and big.etag.endswith("-3")
        await assert_same(store, step_dir, "run1/step-10")
        # the commit marker goes up after every data part
        assert calls[-1] == "run1/step-10/.metadata" and calls.count("run1/step-10/.metadata") == 1
        cat = await list_checkpoints(store, "run1")
        assert [(s.step, s.layout, s.kind) for s in cat.steps] == [(10, "dcp", "full")]
        assert await list_multipart(store) == []


async def test_truncated_part_is_retried(bucket_store: S3Store, step_dir: Path) -> None:
    hits: list[tuple[int, int]] = []

    def truncate_once(key: str, part: int, attempt: int, data: bytes) -> bytes:
        if key.endswith("__1_0.distcp") and part == 2 and attempt == 0:
            hits.append((part, attempt))
            return data[: len(data) // 2]
        return data

    async with bucket_store as store:
        await upload_dir(store, step_dir, "r/step-10", settings=SMALL, fault=truncate_once)
        assert hits == [(2, 0)]
        await assert_same(store, step_dir, "r/step-10")


async def test_persistent_fault_fails_and_aborts(bucket_store: S3Store, step_dir: Path) -> None:
    def always_short(key: str, part: int, attempt: int, data: bytes) -> bytes:
        return data[:-1] if key.endswith("__1_0.distcp") and part == 3 else data

    async with bucket_store as store:
        with pytest.raises(UploadError, match="part 3 failed after 3 attempts"):
            await upload_dir(store, step_dir, "r/step-10", settings=SMALL, fault=always_short)
        assert await list_multipart(store) == []
        # the marker never went up, so the catalog shows the step as incomplete, not full
        assert await store.stat("r/step-10/.metadata") is None
        assert (await list_checkpoints(store, "r")).steps[0].kind == "incomplete"


async def test_cancel_aborts_multipart(bucket_store: S3Store, step_dir: Path) -> None:
    parts: list[int] = []

    def count(key: str, part: int, attempt: int, data: bytes) -> bytes:
        parts.append(part)
        return data

    async with bucket_store as store:
        with pytest.raises(UploadCancelled):
            await upload_dir(
                store,
                step_dir,
                "c/step-10",
                settings=UploadSettings(part_size=PART, concurrency=1),
                fault=count,
                cancelled=lambda: len(parts) >= 1,
            )
        assert await list_multipart(store) == []
        assert await store.stat("c/step-10/.metadata") is None


KILLED = """
import asyncio, json, sys, time
from pathlib import Path
from backend.checkpoints.upload import MultipartJournal, UploadSettings, open_store_params, upload_dir
params = json.loads(sys.argv[1])
def slow(key, part, attempt, data):
    if part >= 2:
        print("PART", part, flush=True)
        time.sleep(60)
    return data
async def main():
    store = open_store_params(params)
    await upload_dir(store, sys.argv[2], sys.argv[4], settings=UploadSettings(part_size=5 << 20, concurrency=1),
                     fault=slow, journal=MultipartJournal(Path(sys.argv[3])) if sys.argv[3] else None)
asyncio.run(main())
"""


@contextlib.contextmanager
def hung_upload(
    s3,
    store: S3Store,
    step_dir: Path,
    journal: Path | None = None,  # type: ignore[no-untyped-def]
    prefix: str = "k/step-10",
) -> Iterator[None]:
    """An upload in a child process (journalled: ``journal``, else this machine's default for the
    destination), hung once part 1 of the big file is up; SIGKILLed when the block ends."""
    env = dict(os.environ, AWS_ACCESS_KEY_ID=s3.access_key, AWS_SECRET_ACCESS_KEY=s3.secret_key)
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED, json.dumps(store_params(store)), str(step_dir), str(journal or ""), prefix],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parents[2],
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b"PART 2")  # part 1 is up, the upload is mid-flight
        yield
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def kill_mid_upload(
    s3,
    store: S3Store,
    step_dir: Path,
    journal: Path | None = None,  # type: ignore[no-untyped-def]
    prefix: str = "k/step-10",
) -> None:
    """Run an upload in a child process and SIGKILL it once part 1 of the big file is up."""
    with hung_upload(s3, store, step_dir, journal, prefix):
        pass


async def test_killed_upload_leaves_no_orphans_after_rerun(s3, bucket_store: S3Store, step_dir: Path) -> None:  # type: ignore[no-untyped-def]
    # No journal named: the CLI's and the console's case (this machine's journal for the destination).
    with hung_upload(s3, bucket_store, step_dir):
        async with bucket_store as store:
            # While it runs, a second upload to the same destination is refused, not let loose on its parts.
            with pytest.raises(UploadError, match="another upload to .* is running on this machine"):
                await upload_dir(store, step_dir, "k/step-10", settings=SMALL, overwrite=True)
    async with bucket_store as store:
        # Someone else's upload in progress under the same prefix: never ours to abort.
        foreign = s3.client().create_multipart_upload(Bucket=store.bucket, Key="k/step-10/theirs.bin")["UploadId"]
        orphans = await list_multipart(store)
        assert sorted(k for k, _, _ in orphans) == ["k/step-10/__1_0.distcp", "k/step-10/theirs.bin"]
        res = await upload_dir(store, step_dir, "k/step-10", settings=SMALL, overwrite=True)
        assert res.aborted_stale == 1 and res.others_in_progress == 1
        assert any("left 1 multipart upload(s) under the destination alone" in n for n in res.notes())
        assert [uid for _, uid, _ in await list_multipart(store)] == [foreign]
        await assert_same(store, step_dir, "k/step-10")
    assert list((data_dir() / "uploads").iterdir()) == []  # a journal with nothing open is removed


def test_upload_job_runner_with_explicit_credentials(lab, s3, bucket_store: S3Store, step_dir: Path) -> None:  # type: ignore[no-untyped-def]
    profile = dataclasses.replace(bucket_store.profile, profile=None, checksum="when_required")
    store = S3Store(bucket_store.url, profile)
    params = upload_params(str(step_dir), store, "j/step-10", settings=SMALL, step=10)
    assert "SECRET" not in json.dumps(params).upper() and s3.secret_key not in json.dumps(params)
    points: list[dict] = []
    ctx = JobContext.in_process(
        "upload",
        params,
        on_progress=points.append,
        secrets={"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key},
    )
    result = run_upload_job(ctx)
    assert result["objects"] == len(list(step_dir.iterdir()))
    assert points[-1]["bytes_done"] == points[-1]["bytes_total"] == result["bytes"]
    assert points[-1]["step"] == 10 and points[-1]["items_done"] == points[-1]["items_total"] == 3
