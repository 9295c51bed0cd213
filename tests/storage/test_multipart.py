"""The multipart uploader's cost cuts keep its guarantees: one MD5 per part (botocore's CRC32
only on request), part buffers reused, bodies that botocore can still hash when asked to."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from backend.storage import S3Store, multipart
from backend.storage.multipart import (
    MiB,
    PartBody,
    UploadError,
    UploadSettings,
    upload_client,
    upload_file,
)
from tests.helpers import lab_bucket_store

PART = 5 * MiB


@pytest.fixture
def store(lab, s3):  # type: ignore[no-untyped-def]
    return lab_bucket_store(lab, s3, "mp")


@pytest.fixture
def big(tmp_path: Path) -> Path:
    f = tmp_path / "big.bin"
    f.write_bytes(os.urandom(3 * PART + 12345))  # 4 parts, the last one short
    return f


async def upload_seeing_headers(
    store: S3Store, path: Path, key: str, settings: UploadSettings
) -> tuple[multipart.UploadedObject, list[dict[str, str]]]:
    seen: list[dict[str, str]] = []

    def spy(request: Any, **_: Any) -> None:
        seen.append({k.lower(): v for k, v in request.headers.items()})

    async with upload_client(store, settings) as client:
        client.meta.events.register("before-send.s3.UploadPart", spy)
        obj = await upload_file(store, path, key, settings=settings, client=client)
    return obj, seen


async def test_parts_carry_md5_only_by_default(store: S3Store, big: Path) -> None:
    async with store:
        obj, seen = await upload_seeing_headers(store, big, "a/big.bin", UploadSettings(part_size=PART))
        assert obj.parts == 4 and len(seen) == 4
        for h in seen:
            assert "content-md5" in h
            assert not [k for k in h if k.startswith("x-amz-checksum-")], h
        assert await store.get_bytes("a/big.bin") == await asyncio.to_thread(big.read_bytes)


async def test_sdk_checksum_and_payload_signing_still_work(store: S3Store, big: Path) -> None:
    """The compatibility paths: botocore reads the part body itself (CRC32, signed SHA-256)."""
    async with store:
        settings = UploadSettings(part_size=PART, sdk_checksum=True, sign_payload=True)
        obj, seen = await upload_seeing_headers(store, big, "b/big.bin", settings)
        assert obj.parts == 4
        for h in seen:
            assert "x-amz-checksum-crc32" in h and "content-md5" in h
            assert h["x-amz-content-sha256"] not in ("UNSIGNED-PAYLOAD", "")
        assert await store.get_bytes("b/big.bin") == await asyncio.to_thread(big.read_bytes)


async def test_when_required_profile_never_gets_crc32(store: S3Store, big: Path) -> None:
    """R2-style profiles (checksum="when_required") get no CRC32 even with sdk_checksum on."""
    assert store.profile is not None
    r2ish = S3Store(store.url, dataclasses.replace(store.profile, checksum="when_required"))
    async with r2ish:
        _, seen = await upload_seeing_headers(
            r2ish, big, "c/big.bin", UploadSettings(part_size=PART, sdk_checksum=True)
        )
        assert seen and all(not [k for k in h if k.startswith("x-amz-checksum-")] for h in seen)


async def test_part_buffers_are_reused(store: S3Store, big: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[int] = []
    real = multipart._take_buffer

    def take(sem: asyncio.Semaphore, length: int) -> bytearray:
        buf = real(sem, length)
        taken.append(id(buf))
        return buf

    monkeypatch.setattr(multipart, "_take_buffer", take)
    sem = asyncio.Semaphore(2)
    async with store:
        async with upload_client(store, UploadSettings()) as client:
            for i in range(2):
                await upload_file(
                    store,
                    big,
                    f"d/{i}.bin",
                    settings=UploadSettings(part_size=PART, concurrency=2),
                    parts_sem=sem,
                    client=client,
                )
    assert len(taken) == 8 and len(set(taken)) <= 2  # 8 parts through at most 2 buffers
    assert len(multipart._BUFFERS[sem]) <= 2


def test_read_part_hashes_what_it_read_and_rejects_short_files(tmp_path: Path) -> None:
    f = tmp_path / "f"
    data = os.urandom(3 * MiB + 7)
    f.write_bytes(data)
    buf = bytearray(2 * MiB)
    digest = multipart._read_part(f, MiB, memoryview(buf))
    assert bytes(buf) == data[MiB : 3 * MiB] and digest == hashlib.md5(data[MiB : 3 * MiB]).digest()
    with pytest.raises(UploadError, match="short read"):
        multipart._read_part(f, 2 * MiB, memoryview(buf))  # only 1 MiB + 7 left


def test_part_body_is_a_seekable_file_of_its_view() -> None:
    body = PartBody(memoryview(b"0123456789")[2:8])
    assert len(body) == 6 and body.read(4) == b"2345" and body.tell() == 4
    assert body.read() == b"67" and body.read(1) == b""
    body.seek(0)
    assert body.read(-1) == b"234567"
    assert body.seek(-2, 2) == 4 and body.read() == b"67"
