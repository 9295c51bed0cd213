"""Relay receivers prove each object with the method a direct pull would choose (#28, #33).

Where the spec carries the store's full-object checksum (CRC64NVME, CRC32C, CRC32, SHA-256, SHA-1),
a receiver checks the bytes it got against it; else against a single-part object's MD5 ETag. A
hostile upstream that holds the secret (its MACs and per-hop SHA-256s are right) sends torn,
truncated and swapped objects: each is caught by each method, removed, and fatal, never renamed.
The console's side reads the checksums from the real store (the lab's SeaweedFS).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from backend.pulls.integrity import new_hasher
from backend.pulls.objects import PulledObject
from backend.pulls.relay.checksums import full_object_checksum, listing_checksums
from backend.pulls.relay.node import CorruptObject, ObjectProof, receiver_proofs
from backend.pulls.relay.protocol import FrameCodec
from tests.security.test_hostile_relay import EvilUpstream, _receiver

METHODS = ["md5", "crc64nvme", "crc32c", "crc32", "sha256", "sha1"]
SIZE = 100_000


def _md5(b: bytes) -> str:
    return hashlib.md5(b, usedforsecurity=False).hexdigest()


def _sum(alg: str, body: bytes) -> str:
    h = new_hasher(alg)
    h.update(body)
    return base64.b64encode(h.digest()).decode()


def _listing(method: str, bodies: list[bytes]) -> tuple[list[PulledObject], list[str | None]]:
    """The spec's objects (with their MD5 ETags) and, for a checksum method, the store's checksums."""
    objects = [PulledObject(f"obj-{i}", len(b), _md5(b)) for i, b in enumerate(bodies)]
    checksums = [None if method == "md5" else f"{method}:{_sum(method, b)}" for b in bodies]
    return objects, checksums


def _sender(sent: list[bytes]) -> Any:
    def script(conn: socket.socket, codec: FrameCodec) -> None:
        for i, body in enumerate(sent):
            for off in range(0, len(body), 40_000):
                conn.sendall(codec.chunk(i, off, body[off : off + 40_000]))
        conn.sendall(codec.ctrl({"t": "end", "listing": "x", "md5_verified": len(sent)}))

    return script


def _forged(case: str, a: bytes, b: bytes) -> list[bytes]:
    if case == "torn":  # one byte changed in the middle
        return [a[: SIZE // 2] + bytes([a[SIZE // 2] ^ 0xFF]) + a[SIZE // 2 + 1 :], b]
    if case == "truncated":  # the end missing, padded to the listed size
        return [a[:60_000] + bytes(SIZE - 60_000), b]
    return [b, a]  # swapped: two objects of one size, each sent as the other


@pytest.mark.parametrize("case", ["torn", "truncated", "swapped"])
@pytest.mark.parametrize("method", METHODS)
def test_each_method_catches_torn_truncated_and_swapped_objects(tmp_path: Path, method: str, case: str) -> None:
    a, b = os.urandom(SIZE), os.urandom(SIZE)
    objects, checksums = _listing(method, [a, b])
    proofs = receiver_proofs(objects, checksums)
    assert [p.algorithm if p else None for p in proofs] == [method, method]  # the checksum first, as a pull
    sent = _forged(case, a, b)
    with EvilUpstream(_sender(sent)) as evil:
        recv = _receiver(tmp_path / "dest", objects, evil.port, proofs=proofs)
        with pytest.raises(CorruptObject) as info:
            recv.run()
        recv.close()
    msg = str(info.value)
    if method == "md5":
        assert msg.startswith(f"obj-0 has MD5 {_md5(sent[0])} but the listing's ETag is {_md5(a)}")
    else:
        assert msg.startswith(f"obj-0 has {method.upper()} {_sum(method, sent[0])} but the store's checksum is ")
        assert _sum(method, a) in msg
    assert "\n" not in msg
    assert not (tmp_path / "dest" / "obj-0").exists()  # never renamed into place
    assert not [p for p in (tmp_path / "dest").iterdir() if p.name.startswith("obj-0")]  # nor left as a temporary
    assert evil.connections == 1  # fatal: not re-attached to the forger


@pytest.mark.parametrize("method", METHODS)
def test_the_true_bytes_pass_each_method_and_are_counted_by_it(tmp_path: Path, method: str) -> None:
    bodies = [os.urandom(SIZE), os.urandom(3_000)]
    objects, checksums = _listing(method, bodies)
    with EvilUpstream(_sender(bodies)) as honest:
        recv = _receiver(tmp_path / "dest", objects, honest.port, proofs=receiver_proofs(objects, checksums))
        recv.run()
        recv.close()
    assert recv.verified == {method: 2}
    assert recv.md5_verified == (2 if method == "md5" else 0)
    assert [(tmp_path / "dest" / o.rel).read_bytes() for o in objects] == bodies


@pytest.mark.parametrize(
    "entry",
    ["crc64nvme:not base64!", "crc64nvme:" + base64.b64encode(b"12").decode(), "md4:AAAA", "crc64nvme", 7, None],
    ids=["not-base64", "wrong-width", "unknown-algorithm", "no-value", "not-text", "none"],
)
def test_a_malformed_checksum_in_the_spec_falls_back_to_the_md5(entry: Any) -> None:
    body = os.urandom(1000)
    [proof] = receiver_proofs([PulledObject("o", len(body), _md5(body))], [entry])
    assert proof == ObjectProof("md5", _md5(body))
    # A multipart ETag and no checksum: no per-object proof here (the per-hop SHA-256 alone).
    assert receiver_proofs([PulledObject("o", 10, "0" * 32 + "-2")], [entry]) == [None]


def test_a_checksum_list_of_the_wrong_length_is_ignored() -> None:
    body = os.urandom(10)
    objects = [PulledObject("o", len(body), _md5(body))]
    assert receiver_proofs(objects, [f"sha256:{_sum('sha256', body)}", None]) == [ObjectProof("md5", _md5(body))]


def test_only_full_object_checksums_are_taken_from_a_head() -> None:
    crc = _sum("crc64nvme", b"x")
    assert full_object_checksum({"ChecksumCRC64NVME": crc, "ChecksumType": "FULL_OBJECT"}) == f"crc64nvme:{crc}"
    assert full_object_checksum({"ChecksumCRC32C": "AAAAAA==-3", "ChecksumType": "COMPOSITE"}) is None
    assert full_object_checksum({"ChecksumSHA256": "garbage", "ChecksumType": "FULL_OBJECT"}) is None
    assert full_object_checksum({"ETag": '"abc"'}) is None


@pytest.mark.lab
def test_the_console_reads_the_store_s_checksums_and_a_receiver_catches_a_forger_with_them(
    lab: Any, s3: Any, tmp_path: Path
) -> None:
    from lab.seed import put_object
    from tests.helpers import lab_bucket_store

    store = lab_bucket_store(lab, s3, "relaysum")
    client = s3.client()
    bodies = {alg: os.urandom(SIZE) for alg in ("CRC64NVME", "CRC32C", "SHA256")}
    for alg, body in bodies.items():
        put_object(client, store.bucket, f"obj-{alg}", body, checksum=alg)

    async def read() -> list[str | None]:
        try:
            return await listing_checksums(store, [f"obj-{alg}" for alg in bodies] + ["missing"])
        finally:
            await store.close()

    got = asyncio.run(read())
    assert got[:3] == [f"{alg.lower()}:{_sum(alg.lower(), b)}" for alg, b in bodies.items()]
    assert got[3] is None  # a HEAD that fails: no checksum, never a failed launch
    objects = [PulledObject(f"obj-{alg}", SIZE, _md5(b)) for alg, b in bodies.items()]
    proofs = receiver_proofs(objects, got[:3])
    assert [p.algorithm if p else None for p in proofs] == ["crc64nvme", "crc32c", "sha256"]
    real = list(bodies.values())
    with EvilUpstream(_sender([real[0], real[2], real[1]])) as evil:  # the last two swapped
        recv = _receiver(tmp_path / "dest", objects, evil.port, proofs=proofs)
        with pytest.raises(CorruptObject, match=r"^obj-CRC32C has CRC32C .* but the store's checksum is "):
            recv.run()
        recv.close()
    assert recv.verified == {"crc64nvme": 1}


# -- multipart objects without a full-object checksum (#audit: a peer could send any bytes) ---------


def _multipart_etag(body: bytes, part_size: int) -> str:
    parts = [body[i : i + part_size] for i in range(0, len(body), part_size)]
    inner = b"".join(hashlib.md5(p, usedforsecurity=False).digest() for p in parts)
    return f"{hashlib.md5(inner, usedforsecurity=False).hexdigest()}-{len(parts)}"


@pytest.mark.parametrize("case", ["torn", "truncated", "swapped"])
def test_a_multipart_object_is_proven_by_its_etag_over_the_console_s_part_size(tmp_path: Path, case: str) -> None:
    """A hostile upstream (its MACs and per-hop SHA-256s right) forges a multipart object that has
    no full-object checksum. With the part size the console read from the store, the receiver
    proves it by its multipart ETag, as a direct pull does: caught, removed, never renamed.
    (Before: no proof at all for such an object, and the forged bytes were renamed into place.)"""
    a, b = os.urandom(SIZE), os.urandom(SIZE)
    part = 30_000
    objects = [PulledObject(f"obj-{i}", SIZE, _multipart_etag(body, part)) for i, body in enumerate((a, b))]
    proofs = receiver_proofs(objects, [None, None], [part, part])
    assert [p.algorithm if p else None for p in proofs] == ["md5-multipart", "md5-multipart"]
    sent = _forged(case, a, b)
    with EvilUpstream(_sender(sent)) as evil:
        recv = _receiver(tmp_path / "dest", objects, evil.port, proofs=proofs)
        with pytest.raises(CorruptObject, match=r"^obj-0 has multipart MD5 [0-9a-f]{32}-4 but the listing's ETag is "):
            recv.run()
        recv.close()
    assert not (tmp_path / "dest" / "obj-0").exists()
    assert not [p for p in (tmp_path / "dest").iterdir() if p.name.startswith("obj-0")]
    assert evil.connections == 1


def test_the_true_bytes_of_a_multipart_object_pass_its_etag(tmp_path: Path) -> None:
    bodies = [os.urandom(SIZE), os.urandom(3 * 25_000)]  # the last part short; parts exactly filled
    objects = [PulledObject(f"obj-{i}", len(b), _multipart_etag(b, 25_000)) for i, b in enumerate(bodies)]
    with EvilUpstream(_sender(bodies)) as honest:
        recv = _receiver(
            tmp_path / "dest", objects, honest.port, proofs=receiver_proofs(objects, None, [25_000, 25_000])
        )
        recv.run()
        recv.close()
    assert recv.verified == {"md5-multipart": 2}
    assert [(tmp_path / "dest" / o.rel).read_bytes() for o in objects] == bodies


@pytest.mark.parametrize("entry", [None, 0, -5, 7.0, "30000", True, 10**9, [1]])
def test_a_part_size_that_does_not_fit_the_etag_is_no_proof(entry: Any) -> None:
    body = os.urandom(SIZE)
    etag = _multipart_etag(body, 30_000)
    assert receiver_proofs([PulledObject("o", SIZE, etag)], None, [entry]) == [None]
    assert receiver_proofs([PulledObject("o", SIZE, etag)], None, [30_000, 1]) == [None]  # wrong length: ignored


@pytest.mark.lab
def test_the_console_reads_a_multipart_part_size_from_the_store_and_a_receiver_catches_a_forger(
    lab: Any, s3: Any, tmp_path: Path
) -> None:
    from backend.pulls.relay.checksums import listing_part_sizes
    from tests.helpers import lab_bucket_store

    store = lab_bucket_store(lab, s3, "relaymp")
    client = s3.client()
    part = 5 << 20
    body = os.urandom(2 * part + 1000)
    up = client.create_multipart_upload(Bucket=store.bucket, Key="big")
    etags = []
    for n, off in enumerate(range(0, len(body), part), start=1):
        r = client.upload_part(
            Bucket=store.bucket, Key="big", UploadId=up["UploadId"], PartNumber=n, Body=body[off : off + part]
        )
        etags.append({"ETag": r["ETag"], "PartNumber": n})
    client.complete_multipart_upload(
        Bucket=store.bucket, Key="big", UploadId=up["UploadId"], MultipartUpload={"Parts": etags}
    )
    etag = client.head_object(Bucket=store.bucket, Key="big")["ETag"].strip('"')
    assert etag == _multipart_etag(body, part)
    small = os.urandom(100)
    client.put_object(Bucket=store.bucket, Key="small", Body=small)

    async def read() -> list[int | None]:
        try:
            sums = await listing_checksums(store, ["big", "small"])
            return await listing_part_sizes(store, ["big", "small"], [etag, _md5(small)], sums)
        finally:
            await store.close()

    assert asyncio.run(read()) == [part, None]  # only a multipart ETag asks for its part size
    objects = [PulledObject("big", len(body), etag)]
    proofs = receiver_proofs(objects, None, [part])
    assert proofs == [ObjectProof("md5-multipart", etag, part)]
    forged = body[:part] + bytes([body[part] ^ 1]) + body[part + 1 :]
    with EvilUpstream(_sender([forged])) as evil:
        recv = _receiver(tmp_path / "dest", objects, evil.port, proofs=proofs)
        with pytest.raises(CorruptObject, match=r"^big has multipart MD5 "):
            recv.run()
        recv.close()
    assert not (tmp_path / "dest" / "big").exists()
