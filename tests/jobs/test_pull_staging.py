"""Staged pulls against the real lab (sshd nodes, SeaweedFS S3, the real s5cmd): a pull of many
objects is one wildcard ``s5cmd cp`` into a private folder inside DEST, and only the planned
objects, each proven, are renamed into place (:mod:`backend.pulls.staging`).

An object added to the prefix after the plan is copied by s5cmd all the same: under the cap
(1% of the planned bytes, at most 64 MiB) the job succeeds, says what it moved and never puts
the object in DEST; over it, s5cmd is stopped and the job fails naming the key.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from backend.pulls.staging import MIN_OBJECTS, STAGING_PREFIX
from backend.services import Services
from lab import Lab
from tests.pulls_helpers import launch_pull, plan_pull

pytestmark = pytest.mark.timeout(240)


def _seed(s3: Any, bucket: str, n: int) -> tuple[str, dict[str, bytes]]:
    prefix = "staged/run-" + secrets.token_hex(3)
    objects = {f"{'ab'[i % 2]}/obj-{i:03d}.bin": os.urandom(2048 + i) for i in range(n)}
    client = s3.client()
    for name, body in objects.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=body)
    return prefix, objects


def _files(dest: Path) -> dict[str, str]:
    return {
        p.relative_to(dest).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in dest.rglob("*")
        if p.is_file()
    }


def _digests(objects: dict[str, bytes]) -> dict[str, str]:
    return {k: hashlib.sha256(v).hexdigest() for k, v in objects.items()}


async def test_many_objects_are_staged_and_every_byte_lands(lab: Lab, s3: Any, services: Services) -> None:
    assert lab.bucket
    prefix, objects = _seed(s3, lab.bucket, MIN_OBJECTS + 6)
    dest = lab.node("node-01").scratch / f"pulls/staged-{secrets.token_hex(3)}"
    plan = await plan_pull(services, f"s3://{lab.bucket}/{prefix}/", str(dest), ["node-01"])
    [rec] = await launch_pull(services, plan)
    final = await services.jobs.wait(rec.id, timeout=180)
    assert final.state == "succeeded", final.error
    result = final.result or {}
    assert result["copy_mode"] == "staging" and result["unplanned_objects"] == 0
    assert result["verified"] == "bytes" and result["objects"] == len(objects)
    assert _files(dest) == _digests(objects)  # nothing else: the staging folder is gone
    assert not [p for p in dest.iterdir() if p.name.startswith(STAGING_PREFIX)]
    log, _ = await services.jobs.read_log(rec.id)
    assert "copy mode: staging" in log


async def test_a_few_objects_are_copied_one_command_each_and_say_why(lab: Lab, s3: Any, services: Services) -> None:
    assert lab.bucket
    prefix, objects = _seed(s3, lab.bucket, 3)
    dest = lab.node("node-01").scratch / f"pulls/few-{secrets.token_hex(3)}"
    plan = await plan_pull(services, f"s3://{lab.bucket}/{prefix}/", str(dest), ["node-01"])
    [rec] = await launch_pull(services, plan)
    final = await services.jobs.wait(rec.id, timeout=180)
    assert final.state == "succeeded", final.error
    assert (final.result or {})["copy_mode"] == "per-object"
    assert f"staged from {MIN_OBJECTS}" in (final.result or {})["copy_mode_why"]
    assert _files(dest) == _digests(objects)


@pytest.mark.parametrize("late_size", [16, 512 * 1024])
async def test_an_object_added_after_the_plan_never_reaches_dest(
    lab: Lab, s3: Any, services: Services, late_size: int
) -> None:
    """16 bytes is under the cap (1% of ~150 KiB planned): the job succeeds and reports them;
    512 KiB is over it: s5cmd is stopped and the job fails naming the key. Either way the late
    object is not in DEST, and the bytes it cost are in what the job reports (the ledger's)."""
    assert lab.bucket
    prefix, objects = _seed(s3, lab.bucket, MIN_OBJECTS + 6)
    dest = lab.node("node-01").scratch / f"pulls/late-{secrets.token_hex(3)}"
    plan = await plan_pull(services, f"s3://{lab.bucket}/{prefix}/", str(dest), ["node-01"])
    s3.client().put_object(Bucket=lab.bucket, Key=f"{prefix}/a/late.bin", Body=os.urandom(late_size))
    [rec] = await launch_pull(services, plan)
    final = await services.jobs.wait(rec.id, timeout=180)
    files = _files(dest) if dest.exists() else {}
    assert "a/late.bin" not in files
    assert not [p for p in dest.iterdir() if p.name.startswith(STAGING_PREFIX)]
    if late_size == 16:
        assert final.state == "succeeded", final.error
        result = final.result or {}
        assert result["unplanned_objects"] == 1 and result["unplanned_bytes"] == 16
        assert result["unplanned_keys"] == [f"{prefix}/a/late.bin"]
        assert files == _digests(objects)
    else:
        assert final.state == "failed"
        assert f"the first '{prefix}/a/late.bin'" in (final.error or "") and "over the cap" in (final.error or "")
        assert final.progress is not None and final.progress.extra["unplanned_bytes"] == late_size
        assert set(files) <= set(objects)  # what landed is planned (and proven)
        assert all(objects_digest == files[k] for k, objects_digest in _digests(objects).items() if k in files)
