"""Upload never overwrites: a destination that already holds objects is refused (naming it and
``--overwrite``) by ``upload_dir``, before a node job is launched, and again by the job itself;
``overwrite=True`` replaces. Against the lab's real SeaweedFS."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from backend.agent.context import JobContext
from backend.checkpoints.upload import (
    MiB,
    UploadError,
    UploadSettings,
    upload_dir,
)
from backend.checkpoints.upload.job import launch_upload, run_upload_job, upload_params
from backend.config import load_config_file
from backend.services import Services
from backend.storage import S3Store
from lab import Lab
from tests.helpers import lab_bucket_store, write_lab_config

SMALL = UploadSettings(part_size=5 * MiB, concurrency=2)


@pytest.fixture
def store(lab, s3) -> S3Store:  # type: ignore[no-untyped-def]
    return lab_bucket_store(lab, s3, "ow")


def _step(root: Path, seed: bytes) -> Path:
    root.mkdir(parents=True)
    (root / "__0_0.distcp").write_bytes(seed * 1000)
    (root / ".metadata").write_bytes(b"meta-" + seed)
    return root


async def _digests(store: S3Store, prefix: str) -> dict[str, str]:
    return {o.key: hashlib.sha256(await store.get_bytes(o.key)).hexdigest() for o in await store.list(prefix)}


async def test_an_existing_step_is_refused_unless_overwrite(store: S3Store, tmp_path: Path) -> None:
    first, second = _step(tmp_path / "a" / "step-10", b"A"), _step(tmp_path / "b" / "step-10", b"B")
    async with store:
        await upload_dir(store, first, "run/step-10", settings=SMALL)
        before = await _digests(store, "run/step-10")
        with pytest.raises(UploadError) as err:
            await upload_dir(store, second, "run/step-10", settings=SMALL)
        msg = str(err.value)
        assert f"{store.url}/run/step-10 already holds 2 object(s)" in msg and "--overwrite" in msg, msg
        assert await _digests(store, "run/step-10") == before
        # A sibling whose name starts the same is another step, not a clash.
        await upload_dir(store, second, "run/step-1", settings=SMALL)
        res = await upload_dir(store, second, "run/step-10", settings=SMALL, overwrite=True)
        assert res.overwrote == 2 and any("overwrote" in n for n in res.notes())
        assert await store.get_bytes("run/step-10/.metadata") == b"meta-B"


async def test_a_node_job_is_refused_before_launch_and_rechecked_on_the_node(
    lab: Lab, store: S3Store, s3, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    step = _step(tmp_path / "step-20", b"C")
    svc = Services(config=load_config_file(write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state")))
    try:
        async with store:
            await store.put_bytes("run/step-20/__0_0.distcp", b"already here")
            with pytest.raises(UploadError, match="--overwrite"):
                await launch_upload(svc.jobs, "node-01", store, str(step), "run/step-20", settings=SMALL)
            assert svc.jobs.records() == []  # nothing was launched
            # The destination filled up after the launch: the job itself refuses on the node.
            params = upload_params(str(step), store, "run/step-21", settings=SMALL)
            await store.put_bytes("run/step-21/other", b"x")
            ctx = JobContext.in_process(
                "upload", params, secrets={"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
            )
            with pytest.raises(UploadError, match="already holds 1 object"):
                await asyncio.to_thread(run_upload_job, ctx)
            assert await store.get_bytes("run/step-21/other") == b"x"
            assert await store.stat("run/step-21/.metadata") is None
            # With overwrite the job goes through.
            ctx = JobContext.in_process(
                "upload",
                {**params, "overwrite": True},
                secrets={"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key},
            )
            result = await asyncio.to_thread(run_upload_job, ctx)
            assert result["overwrote"] == 1
    finally:
        await svc.aclose()
