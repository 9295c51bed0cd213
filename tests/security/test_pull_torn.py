"""Downloads are checked against the listing: an object that changes during a pull (a new ETag
with the same size between ranged GETs, a version put back by the end, a new size) fails the
job and its file is removed; untouched objects stay.

Real jobs on a lab node with the real s5cmd; the hostile responder plays the bucket whose object
changes between two ranged GETs of one download (no real server does that on cue).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from backend.services import Services
from lab import Lab
from tests.pulls_helpers import launch_pull, plan_pull
from tests.security.hostile_s3 import HostileS3

pytestmark = pytest.mark.timeout(240)
MiB = 1024 * 1024


@pytest.fixture
def bodies(hostile_s3: HostileS3) -> dict[str, bytes]:
    """A 12 MiB object (three 5 MiB ranged GETs) and a small one, both single-part (MD5 ETags)."""
    out = {"big.bin": os.urandom(12 * MiB), "small.bin": os.urandom(4096)}
    for name, body in out.items():
        hostile_s3.put("evil", f"data/{name}", body)
    return out


async def _pull(svc: Services, lab: Lab, after_plan=None) -> tuple[str, str | None, Path]:  # type: ignore[no-untyped-def]
    dest = lab.node("node-01").scratch / f"pulls/sec-torn-{secrets.token_hex(3)}"
    plan = await plan_pull(svc, "s3://evil/data/", str(dest), ["node-01"], store="hostile")
    if after_plan is not None:
        after_plan()
    [rec] = await launch_pull(svc, plan)
    final = await svc.jobs.wait(rec.id, timeout=120)
    return final.state, final.error, dest


def _files(dest: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in dest.iterdir() if p.is_file()} if dest.exists() else {}


async def test_an_unchanged_pull_is_verified_byte_for_byte(
    hostile_services: Services, lab: Lab, bodies: dict[str, bytes]
) -> None:
    state, error, dest = await _pull(hostile_services, lab)
    assert state == "succeeded", error
    assert _files(dest) == bodies
    [rec] = hostile_services.jobs.records()
    assert rec.result is not None and rec.result["md5_verified"] == 2


async def test_new_etag_between_ranged_gets_fails_and_the_torn_file_is_removed(
    hostile_s3: HostileS3, hostile_services: Services, lab: Lab, bodies: dict[str, bytes]
) -> None:
    other = os.urandom(12 * MiB)
    state, error, dest = await _pull(
        hostile_services, lab, lambda: hostile_s3.swap_after_first_get("evil", "data/big.bin", other)
    )
    assert state == "failed", error
    assert "big.bin changed in the bucket during the pull" in (error or "") and "\n" not in (error or "")
    # The torn file is gone; the object that did not change is kept, verified.
    assert _files(dest) == {"small.bin": bodies["small.bin"]}


async def test_a_version_put_back_before_the_end_is_caught_by_the_md5(
    hostile_s3: HostileS3, hostile_services: Services, lab: Lab, bodies: dict[str, bytes]
) -> None:
    # GET 1 from the listed version, GETs 2-3 from another, then the listed version is back:
    # the ETag at the end equals the listing's, so only the bytes can tell.
    other = os.urandom(12 * MiB)
    state, error, dest = await _pull(
        hostile_services, lab, lambda: hostile_s3.swap_after_first_get("evil", "data/big.bin", other, restore_after=3)
    )
    assert state == "failed", error
    assert "big.bin has MD5" in (error or "") and "torn" in (error or ""), error
    assert _files(dest) == {"small.bin": bodies["small.bin"]}


async def test_an_object_resized_after_the_listing_fails(
    hostile_s3: HostileS3, hostile_services: Services, lab: Lab, bodies: dict[str, bytes]
) -> None:
    state, error, dest = await _pull(
        hostile_services, lab, lambda: hostile_s3.put("evil", "data/big.bin", os.urandom(13 * MiB))
    )
    assert state == "failed", error
    assert f"big.bin is {13 * MiB} bytes, the listing says {12 * MiB}" in (error or ""), error
    assert _files(dest) == {"small.bin": bodies["small.bin"]}
