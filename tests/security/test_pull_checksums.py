"""A store whose bytes do not match what it says of them: every proof a pull can use catches it.

The hostile responder serves, for each object, the checksum (or ETag) of one body and the bytes of
another: the same bytes with one bit flipped (torn in transit), the bytes less the last one
(truncated: listed at that size too, so only the proof can tell), or another object's bytes of
the same size (swapped). No real server does that on cue. Each object is proven by a different method
(full-object CRC64NVME, CRC32C, CRC32, SHA-256, SHA-1, a composite CRC32C over three parts, the
MD5 ETag, the multipart ETag over three parts): the job fails, every wrong file is removed and
its log names each object with the method that caught it. A store that answers no checksum and
no MD5 ETag gets a pull that succeeds and says ``size-only``, never ``verified``.
"""

from __future__ import annotations

import base64
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backend.pulls.integrity import new_hasher
from backend.services import Services
from lab import Lab
from tests.pulls_helpers import launch_pull, plan_pull
from tests.security.conftest import HOSTILE_KEY_ID, HOSTILE_SECRET
from tests.security.hostile_s3 import HostileS3, StoredObject, _Handler, _QuietServer, md5_etag, multipart_etag

pytestmark = pytest.mark.timeout(240)
MiB = 1 << 20
PART = 5 * MiB


def _raw(alg: str, data: bytes) -> bytes:
    h = new_hasher(alg)  # checked against independent implementations in tests/jobs/test_integrity_units.py
    h.update(data)
    return h.digest()


class _ChecksumHandler(_Handler):
    s3: ChecksumHostileS3

    def _obj_headers(self, body: bytes, etag: str, obj: StoredObject) -> dict[str, str]:
        return {**super()._obj_headers(body, etag, obj), **self.s3.claims.get(id(obj), {})}

    def _head_object(self, bucket: str, key: str, q: dict[str, list[str]]) -> None:
        if self.s3.deny_heads or (self.s3.deny_checksum_mode and self.headers.get("x-amz-checksum-mode")):
            self._error(403, "AccessDenied", "HEAD is not for you")
            return
        sizes = self.s3.parts.get((bucket, key))
        if "partNumber" not in q or not sizes:
            super()._head_object(bucket, key, q)
            return
        n = int(q["partNumber"][0])
        self._send(200, headers={"Content-Length": str(sizes[n - 1]), "x-amz-mp-parts-count": str(len(sizes))})


class ChecksumHostileS3(HostileS3):
    """:class:`HostileS3` that also answers checksum headers (what the store claims, per object)
    and the length of a part on ``HEAD ?partNumber=N``."""

    def __init__(self) -> None:
        super().__init__()
        self.claims: dict[int, dict[str, str]] = {}
        self.parts: dict[tuple[str, str], list[int]] = {}
        #: Refuse every HEAD (s5cmd's downloads need none: they work from the listing).
        self.deny_heads = False
        #: Refuse a HEAD that asks for checksums (as a key policy without kms:Decrypt does).
        self.deny_checksum_mode = False

    def start(self) -> ChecksumHostileS3:
        import threading

        state = self

        class Handler(_ChecksumHandler):
            s3 = state

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="hostile-s3-sums", daemon=True)
        self.thread.start()
        return self

    def claim(self, key: str, served: bytes, method: str, truth: bytes) -> None:
        """Serve ``served`` at ``key`` while claiming, by ``method``, the checksum of ``truth``."""
        parts = [truth[i : i + PART] for i in range(0, len(truth), PART)]
        alg, _, composite = method.partition("-")
        etag = multipart_etag(parts)  # not a plain MD5: only the claimed checksum can prove it
        headers: dict[str, str] = {}
        if method == "md5":
            etag = md5_etag(truth)
        elif method != "md5-multipart":
            value = _raw(alg, b"".join(_raw(alg, p) for p in parts) if composite else truth)
            headers = {
                f"x-amz-checksum-{alg}": base64.b64encode(value).decode() + (f"-{len(parts)}" if composite else ""),
                "x-amz-checksum-type": "COMPOSITE" if composite else "FULL_OBJECT",
            }
        obj = self.put("evil", key, served, etag=etag)
        self.claims[id(obj)] = headers
        if method.endswith("composite") or method == "md5-multipart":
            self.parts[("evil", key)] = [len(p) for p in parts]


@pytest.fixture
def hostile_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChecksumHostileS3]:
    """The responder that claims checksums (replaces the plain one for this file's tests)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", HOSTILE_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", HOSTILE_SECRET)
    server = ChecksumHostileS3().start()
    server.bucket("evil")
    try:
        yield server
    finally:
        server.stop()


METHODS = (
    "crc64nvme",
    "crc32c",
    "crc32",
    "sha256",
    "sha1",
    "crc32c-composite",
    "md5",
    "md5-multipart",
)


async def _pull(svc: Services, lab: Lab, prefix: str) -> tuple[Any, Path]:
    dest = lab.node("node-01").scratch / f"pulls/sec-sums-{secrets.token_hex(3)}"
    plan = await plan_pull(svc, f"s3://evil/{prefix}/", str(dest), ["node-01"], store="hostile")
    [rec] = await launch_pull(svc, plan)
    return await svc.jobs.wait(rec.id, timeout=120), dest


@pytest.mark.parametrize("attack", ["torn", "truncated", "swapped"])
async def test_every_method_catches_bytes_that_are_not_the_claimed_ones(
    hostile_s3: ChecksumHostileS3, hostile_services: Services, lab: Lab, attack: str
) -> None:
    good = os.urandom(64 * 1024)
    hostile_s3.put("evil", "d/good.bin", good)  # a plain MD5 ETag, true: stays
    for method in METHODS:
        truth = os.urandom(11 * MiB + 5 if method != "md5" else 256 * 1024)
        if attack == "torn":
            served = bytearray(truth)
            served[len(truth) // 2] ^= 0x04
        elif attack == "truncated":  # listed and served one byte short, the checksum of the whole
            served = bytearray(truth[:-1])
        else:
            served = bytearray(os.urandom(len(truth)))
        hostile_s3.claim(f"d/{method}.bin", bytes(served), method, truth)
    final, dest = await _pull(hostile_services, lab, "d")
    assert final.state == "failed"
    assert f"{len(METHODS)} of {len(METHODS) + 1} objects wrong (removed)" in (final.error or ""), final.error
    assert [p.name for p in dest.iterdir()] == ["good.bin"] and (dest / "good.bin").read_bytes() == good
    log, _ = await hostile_services.jobs.read_log(final.id)
    wrong = {line.split("wrong: ", 1)[1].split(" ", 1)[0]: line for line in log.splitlines() if "wrong: " in line}
    assert sorted(wrong) == sorted(f"{m}.bin" for m in METHODS)
    for method in METHODS:
        alg = method.partition("-")[0]
        said = "MD5" if method.startswith("md5") else alg.upper()
        assert f" {said}" in wrong[f"{method}.bin"] and "torn or corrupted in transit" in wrong[f"{method}.bin"]


async def test_a_store_with_no_checksum_and_no_md5_etag_is_size_only_said_plainly(
    hostile_s3: ChecksumHostileS3, hostile_services: Services, lab: Lab
) -> None:
    body = os.urandom(2 * MiB)
    hostile_s3.put("evil", "w/opaque.bin", body, etag="not-an-md5-" + secrets.token_hex(4))
    hostile_s3.put("evil", "w/plain.bin", b"x" * 1000)
    # Objects worth a HEAD, were there a checksum to find: after a few HEADs with none, the pull
    # learns that this store keeps none and proves the rest by their MD5 ETags without asking.
    for i in range(16):
        hostile_s3.put("evil", f"w/mid-{i:02d}.bin", os.urandom(600 * 1024))
    final, dest = await _pull(hostile_services, lab, "w")
    assert final.state == "succeeded", final.error
    r = final.result or {}
    assert r["proofs"] == {
        "opaque.bin": "size-only",
        "plain.bin": "md5",
        **{f"mid-{i:02d}.bin": "md5" for i in range(16)},
    }
    assert r["verified"] == "partly" and r["verification"] == {"size-only": 1, "md5": 17}
    assert r["verified_text"].startswith("verified: size-only for 1 of 18 objects (the store gave no checksum")
    assert r["verified_text"].endswith("bytes proven for the rest (md5 x17)")
    assert (dest / "opaque.bin").read_bytes() == body
    assert 8 <= r["store_heads"] < 17  # the 17 objects past the MD5 threshold were not all asked


async def test_a_store_that_refuses_the_verifiers_heads_gets_the_md5_proof_or_size_only_said_why(
    hostile_s3: ChecksumHostileS3, hostile_services: Services, lab: Lab
) -> None:
    hostile_s3.deny_heads = True
    plain, multi = os.urandom(MiB), os.urandom(MiB)
    hostile_s3.put("evil", "h/plain.bin", plain)
    hostile_s3.put("evil", "h/multi.bin", multi, etag=multipart_etag([multi[: MiB // 2], multi[MiB // 2 :]]))
    more = {f"more-{i}.bin": os.urandom(600 * 1024) for i in range(8)}
    for name, body in more.items():
        hostile_s3.put("evil", f"h/{name}", body)
    final, dest = await _pull(hostile_services, lab, "h")
    assert final.state == "succeeded", final.error
    r = final.result or {}
    assert r["proofs"] == {"multi.bin": "size-only", "plain.bin": "md5", **dict.fromkeys(more, "md5")}
    # Three refusals in a row and the pull stops asking (one more may race in on the second thread).
    assert 3 <= r["store_heads"] <= 4
    assert "(the store's HEAD failed (HEAD h/" in r["verified_text"] and ": HTTP 403))" in r["verified_text"]
    assert (dest / "plain.bin").read_bytes() == plain and (dest / "multi.bin").read_bytes() == multi


async def test_sse_kms_objects_whose_etag_is_no_md5_are_size_only_with_the_reason(
    hostile_s3: ChecksumHostileS3, hostile_services: Services, lab: Lab
) -> None:
    hostile_s3.deny_checksum_mode = True
    bodies = {"big.bin": os.urandom(MiB), "small.bin": os.urandom(4096)}
    for name, body in bodies.items():
        # SSE-KMS: the ETag looks like an MD5 and is not the MD5 of the bytes.
        obj = hostile_s3.put("evil", f"k/{name}", body, etag=secrets.token_hex(16))
        hostile_s3.claims[id(obj)] = {"x-amz-server-side-encryption": "aws:kms"}
    final, dest = await _pull(hostile_services, lab, "k")
    assert final.state == "succeeded", final.error
    r = final.result or {}
    assert r["proofs"] == {"big.bin": "size-only", "small.bin": "size-only"} and r["verified"] == "size-only"
    assert "SSE-KMS" in r["verified_text"] and r["verified_text"].startswith("verified: size-only for 2 of 2")
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == bodies
