"""A store that rejects botocore's checksum headers, as R2 and older S3-compatible stores did,
and reports per-key errors from DeleteObjects: the hostile responder answers 400 to any
``x-amz-checksum-*`` header and enforces R2's equal-part rule (no real server here does that on
cue; SeaweedFS accepts everything)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from backend.checkpoints.upload import MiB, UploadError, UploadSettings, upload_dir
from backend.config import StoreProfile
from backend.storage import S3Store
from backend.storage.multipart import upload_client, upload_file
from tests.security.hostile_s3 import HostileS3, multipart_etag


def _store(server: HostileS3, checksum: str | None = None) -> S3Store:
    kwargs = {"checksum": checksum} if checksum else {}
    return S3Store(
        "s3://evil",
        StoreProfile(
            url="s3://evil",
            endpoint_url=server.endpoint,
            region="us-east-1",
            addressing_style="path",
            name="hostile",
            **kwargs,
        ),
    )


@pytest.fixture
def step(tmp_path: Path) -> Path:
    d = tmp_path / "step-10"
    d.mkdir()
    (d / "__0_0.distcp").write_bytes(os.urandom(13 * MiB))  # parts of 5, 5 and 3 MiB
    (d / ".metadata").write_bytes(b"marker")
    return d


async def test_default_profile_takes_a_verified_upload_with_equal_parts(hostile_s3: HostileS3, step: Path) -> None:
    hostile_s3.reject_checksums = True
    async with _store(hostile_s3) as store:  # the profile's default: checksum = "when_supported"
        res = await upload_dir(store, step, "run/step-10", settings=UploadSettings(part_size=5 * MiB))
    big = next(o for o in res.objects if o.key.endswith("__0_0.distcp"))
    body = (step / "__0_0.distcp").read_bytes()
    assert big.parts == 3 and big.etag == multipart_etag([body[: 5 * MiB], body[5 * MiB : 10 * MiB], body[10 * MiB :]])
    assert hostile_s3.objects[("evil", "run/step-10/__0_0.distcp")].body == body
    assert hostile_s3.rejected == []
    sent = [h for _m, _p, _q, h in hostile_s3.requests]
    assert not [k for h in sent for k in h if k.startswith("x-amz-checksum-")]


async def test_the_responder_really_rejects_checksums_and_unequal_parts(hostile_s3: HostileS3, step: Path) -> None:
    hostile_s3.reject_checksums = True
    async with _store(hostile_s3) as store:
        with pytest.raises(UploadError, match="unsupported checksum header"):  # botocore's own CRC32 asked for
            await upload_file(
                store, step / "__0_0.distcp", "x/big", settings=UploadSettings(part_size=5 * MiB, sdk_checksum=True)
            )
        settings = UploadSettings(part_size=5 * MiB)
        async with upload_client(store, settings) as client:
            uid = (await client.create_multipart_upload(Bucket="evil", Key="x/uneven"))["UploadId"]
            parts = []
            for n, size in enumerate((6 * MiB, 5 * MiB, 1 * MiB), start=1):
                r = await client.upload_part(
                    Bucket="evil", Key="x/uneven", UploadId=uid, PartNumber=n, Body=b"u" * size
                )
                parts.append({"PartNumber": n, "ETag": r["ETag"]})
            with pytest.raises(Exception, match="same length"):
                await client.complete_multipart_upload(
                    Bucket="evil", Key="x/uneven", UploadId=uid, MultipartUpload={"Parts": parts}
                )


async def test_delete_objects_errors_are_parsed_from_the_wire_and_reported(hostile_s3: HostileS3) -> None:
    hostile_s3.reject_checksums = True
    for k in ("run/a", "run/b", "run/c"):
        hostile_s3.put("evil", k, b"x")
    hostile_s3.delete_errors["run/b"] = ("AccessDenied", "Access Denied by bucket policy")
    async with _store(hostile_s3, checksum="when_required") as store:
        res = await store.delete_many(["run/a", "run/b", "run/c"])
    assert res.deleted == ("run/a", "run/c")
    assert res.errors == {"run/b": "AccessDenied: Access Denied by bucket policy"} and not res.ok
    assert ("evil", "run/b") in hostile_s3.objects and ("evil", "run/a") not in hostile_s3.objects
    [(_m, _p, _q, headers)] = [r for r in hostile_s3.requests if r[0] == "POST"]
    assert "content-md5" in headers and not [k for k in headers if k.startswith("x-amz-checksum-")]
    # The profile's default sends botocore's CRC32: such a store refuses it, and every key says why.
    async with _store(hostile_s3) as store:
        res = await store.delete_many(["run/c2"])
    assert "unsupported checksum header" in res.errors["run/c2"] and res.deleted == ()
