"""A pull proves each object with what the real store (SeaweedFS) keeps for it, and says which.

Objects are written the ways stores hold them today: a full-object CRC64NVME (AWS's default),
CRC32C, the SDK's default CRC32, SHA-256, a multipart upload with a full-object CRC64NVME, one
with per-part (composite) CRC32s, one with no checksum at all (its multipart ETag, the part size
recovered from HEAD partNumber=1), and a small single-part object proven by its MD5 ETag alone,
without a HEAD. Real jobs on a lab node with the real s5cmd.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from backend.services import Services
from lab import Lab
from lab.seed import put_multipart, put_object
from tests.pulls_helpers import launch_pull, plan_pull

pytestmark = pytest.mark.timeout(240)
MiB = 1 << 20


async def _pull(svc: Services, lab: Lab, src: str) -> tuple[str, str | None, dict, Path]:  # type: ignore[type-arg]
    dest = lab.node("node-01").scratch / f"pulls/proofs-{secrets.token_hex(3)}"
    plan = await plan_pull(svc, src, str(dest), ["node-01"])
    [rec] = await launch_pull(svc, plan)
    final = await svc.jobs.wait(rec.id, timeout=120)
    return final.state, final.error, final.result or {}, dest


async def test_each_object_is_proven_by_the_cheapest_proof_the_store_keeps(lab: Lab, s3, services: Services) -> None:  # type: ignore[no-untyped-def]
    client = s3.client()
    prefix = f"proofs/run-{secrets.token_hex(3)}"
    bodies = {name: os.urandom(5 * MiB + 17) for name in ("crc64.bin", "crc32c.bin", "crc32.bin", "sha 256 ü+.bin")}
    for name, alg in zip(bodies, ("CRC64NVME", "CRC32C", "CRC32", "SHA256"), strict=True):
        put_object(client, lab.bucket, f"{prefix}/{name}", bodies[name], checksum=alg)
    for name, alg, kind in (
        ("mp-full.bin", "CRC64NVME", "FULL_OBJECT"),
        ("mp-composite.bin", "CRC32", "COMPOSITE"),
        ("mp-none.bin", None, "FULL_OBJECT"),
    ):
        bodies[name] = os.urandom(11 * MiB + 3)
        put_multipart(
            client, lab.bucket, f"{prefix}/{name}", bodies[name], part_size=5 * MiB, checksum=alg, checksum_type=kind
        )
    bodies["small.json"] = b'{"ok": true}\n'
    put_object(client, lab.bucket, f"{prefix}/small.json", bodies["small.json"])

    state, error, result, dest = await _pull(services, lab, f"s3://{lab.bucket}/{prefix}/")
    assert state == "succeeded", error
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == bodies
    assert result["proofs"] == {
        "crc64.bin": "crc64nvme",
        "crc32c.bin": "crc32c",
        "crc32.bin": "crc32",
        "sha 256 ü+.bin": "sha256",
        "mp-full.bin": "crc64nvme",
        "mp-composite.bin": "crc32-composite",
        "mp-none.bin": "md5-multipart",
        "small.json": "md5",
    }
    assert result["verified"] == "bytes" and "every object's bytes proven" in result["verified_text"]
    # One HEAD for each object past the MD5 threshold, one more for each part size recovered.
    assert result["store_heads"] == 7 + 2
    assert result["verify_cpu_s"] >= 0 and result["md5_verified"] == 2
