"""The proof a pull checks each object with (backend/pulls/integrity.py), on real files: every
method accepts the right bytes and catches a torn, a truncated and a swapped file; header values
from the store are untrusted (property tests: anything at all parses to a well-formed checksum or
to nothing, never an exception)."""

from __future__ import annotations

import base64
import hashlib
import os
import zlib
from pathlib import Path

import pytest
from awscrt import checksums as crt
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.pulls.integrity import (
    ALGORITHMS,
    MD5,
    MD5_MULTIPART,
    SIZE_ONLY,
    StoreChecksum,
    choose_proof,
    equal_part_sizes,
    parse_checksum_headers,
    parse_checksum_value,
    proof_holds,
)
from backend.pulls.verify import ObjectCheck, summarize

MiB = 1 << 20


def raw(alg: str, data: bytes) -> bytes:
    """The algorithm's digest of ``data``, computed here independently of the module under test."""
    if alg == "crc64nvme":
        return crt.crc64nvme(data, 0).to_bytes(8, "big")
    if alg == "crc32c":
        return crt.crc32c(data, 0).to_bytes(4, "big")
    if alg == "crc32":
        return zlib.crc32(data).to_bytes(4, "big")
    return hashlib.new(alg, data).digest()


def b64(d: bytes) -> str:
    return base64.b64encode(d).decode()


def split(body: bytes, part: int) -> list[bytes]:
    return [body[i : i + part] for i in range(0, len(body), part)] or [b""]


def headers_for(method: str, body: bytes, part: int) -> tuple[dict[str, str], str]:
    """What a store would send for ``body`` under ``method``, and the object's ETag."""
    parts = split(body, part)
    mp_etag = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + f"-{len(parts)}"
    if method == MD5:
        return {}, hashlib.md5(body).hexdigest()
    if method == MD5_MULTIPART:
        return {}, mp_etag
    alg, _, composite = method.partition("-")
    if composite:
        inner = b"".join(raw(alg, p) for p in parts)
        return {f"x-amz-checksum-{alg}": f"{b64(raw(alg, inner))}-{len(parts)}", "x-amz-checksum-type": "COMPOSITE"}, (
            mp_etag
        )
    return {f"x-amz-checksum-{alg}": b64(raw(alg, body)), "x-amz-checksum-type": "FULL_OBJECT"}, mp_etag


METHODS = [*ALGORITHMS, *(f"{a}-composite" for a in ALGORITHMS), MD5, MD5_MULTIPART]


@pytest.mark.parametrize("method", METHODS)
def test_every_method_accepts_the_bytes_and_catches_torn_truncated_and_swapped_files(
    method: str, tmp_path: Path
) -> None:
    part = 5 * MiB
    body = os.urandom(11 * MiB + 7)  # three parts: 5, 5 and 1 MiB + 7
    headers, etag = headers_for(method, body, part)
    proof = choose_proof(len(body), etag, parse_checksum_headers(headers), part_size=part)
    assert proof.method == method and proof.verifies_bytes
    f = tmp_path / "obj"
    f.write_bytes(body)
    assert proof_holds(f, proof)[0]
    torn = bytearray(body)
    torn[6 * MiB] ^= 0x01  # one bit, in the middle part
    f.write_bytes(bytes(torn))
    ok, detail = proof_holds(f, proof)
    assert not ok and "but the" in detail
    f.write_bytes(body[:-1])  # truncated (the size check names it first; the proof holds its own)
    assert not proof_holds(f, proof)[0]
    f.write_bytes(body + b"\0")  # a byte too many
    assert not proof_holds(f, proof)[0]
    f.write_bytes(os.urandom(len(body)))  # another object of the same size, swapped in
    assert not proof_holds(f, proof)[0]


def test_the_cheapest_proof_is_chosen_and_weaker_ones_are_never_called_verified() -> None:
    crc64 = StoreChecksum("crc64nvme", b"\0" * 8)
    sha = StoreChecksum("sha256", b"\1" * 32)
    comp = StoreChecksum("crc32", b"\2" * 4, parts=3)
    md5 = "0" * 32
    assert choose_proof(10, md5, [crc64, sha]).method == "crc64nvme"
    assert choose_proof(10, md5, [sha]).method == "sha256"
    # A full-object value wins over a composite; a composite needs its part boundaries.
    assert choose_proof(11 * MiB, "a" * 32 + "-3", [comp, sha]).method == "sha256"
    assert choose_proof(11 * MiB, "a" * 32 + "-3", [comp], part_size=5 * MiB).method == "crc32-composite"
    assert choose_proof(11 * MiB, "a" * 32 + "-3", [comp], part_size=3 * MiB).method == SIZE_ONLY
    # Without awscrt the CRC64NVME cannot be computed: the MD5 ETag is the proof, or nothing.
    assert choose_proof(10, md5, [crc64], crt=False).method == MD5
    weak = choose_proof(10, "a" * 32 + "-2", [crc64], crt=False)
    assert weak.method == SIZE_ONLY and "awscrt" in weak.why
    kms = choose_proof(10, md5, [], kms=True)
    assert kms.method == SIZE_ONLY and "SSE-KMS" in kms.why and not kms.verifies_bytes
    assert "part size" in choose_proof(11 * MiB, "a" * 32 + "-3").why
    assert "no checksum" in choose_proof(10, None).why


def test_the_result_says_size_only_plainly() -> None:
    checks = {
        0: ObjectCheck("a", "crc64nvme", True),
        1: ObjectCheck("b", SIZE_ONLY, True, "the store gave no checksum and no MD5 ETag"),
    }
    s = summarize(checks, 2)
    assert s["verified"] == "partly" and s["verification"] == {"crc64nvme": 1, SIZE_ONLY: 1}
    assert s["verified_text"].startswith("verified: size-only for 1 of 2 objects (the store gave no checksum")
    assert summarize({1: checks[1]}, 1)["verified"] == "size-only"
    assert summarize({0: checks[0]}, 1) == {
        "verified": "bytes",
        "verification": {"crc64nvme": 1},
        "verified_text": "every object's bytes proven (crc64nvme x1)",
    }


def test_well_formed_values_parse() -> None:
    c = parse_checksum_value("crc32", "AAAAAA==", None)
    assert c is not None and c.digest == b"\0\0\0\0" and c.parts is None and c.text() == "AAAAAA=="
    c = parse_checksum_value("crc32", "AAAAAA==-3", "composite")
    assert c is not None and c.parts == 3 and c.method == "crc32-composite"
    [c] = parse_checksum_headers({"X-Amz-Checksum-CRC64NVME": b64(bytes(8)), "X-Amz-Checksum-Type": "FULL_OBJECT"})
    assert c.algorithm == "crc64nvme"


@pytest.mark.parametrize(
    ("alg", "value", "kind"),
    [
        ("crc32", "AAAA", None),  # 3 bytes: not the algorithm's width
        ("crc64nvme", "AAAAAA==", None),  # 4 bytes for an 8-byte CRC
        ("crc32", "AAAAAA", None),  # no padding: not strict base64
        ("crc32", "AA AAAA==", None),
        ("crc32", "AAAAAA==-0", "COMPOSITE"),
        ("crc32", "AAAAAA==-10001", "COMPOSITE"),
        ("crc32", "AAAAAA==-01", "COMPOSITE"),
        ("crc32", "AAAAAA==-3", "FULL_OBJECT"),  # a part count on a full-object value
        ("crc32", "AAAAAA==", "COMPOSITE"),  # a composite without its part count
        ("crc32", "AAAAAA==", "SOMETHING"),
        ("md5", "AAAAAA==", None),  # not an S3 checksum algorithm
        ("crc32", "\u0661AAAAA==", None),
    ],
)
def test_a_malformed_value_is_dropped(alg: str, value: str, kind: str | None) -> None:
    assert parse_checksum_value(alg, value, kind) is None


@given(st.dictionaries(st.text(max_size=40), st.one_of(st.text(max_size=200), st.integers(), st.none()), max_size=8))
@settings(max_examples=300, deadline=None)
def test_any_headers_give_well_formed_checksums_or_none(headers: dict[str, object]) -> None:
    for c in parse_checksum_headers(headers):
        assert c.algorithm in ALGORITHMS and len(c.digest) == ALGORITHMS[c.algorithm]
        assert c.parts is None or 1 <= c.parts <= 10_000


@given(
    alg=st.sampled_from(list(ALGORITHMS)),
    digest=st.binary(min_size=1, max_size=40),
    parts=st.one_of(st.none(), st.integers(min_value=-5, max_value=20_000)),
)
@settings(max_examples=300, deadline=None)
def test_a_value_parses_exactly_when_it_is_the_right_width_and_part_count(
    alg: str, digest: bytes, parts: int | None
) -> None:
    value = b64(digest) + ("" if parts is None else f"-{parts}")
    c = parse_checksum_value(alg, value, None)
    good = len(digest) == ALGORITHMS[alg] and (parts is None or 1 <= parts <= 10_000)
    assert (c is not None) == good
    if c is not None:
        assert c.digest == digest and c.parts == parts and c.text() == value


@given(size=st.integers(min_value=0, max_value=1 << 40), part=st.integers(min_value=1, max_value=1 << 34))
@settings(max_examples=300, deadline=None)
def test_equal_parts_cover_the_object_exactly(size: int, part: int) -> None:
    n = max(1, -(-size // part))
    sizes = equal_part_sizes(size, part, n) if n <= 10_000 else None
    if sizes is not None:
        assert sum(sizes) == size and len(sizes) == n and all(0 < s <= part for s in sizes[:-1])
        assert sizes[-1] <= part
    assert equal_part_sizes(size, part, n + 1) is None


@given(
    body=st.binary(max_size=3000), part=st.integers(min_value=1, max_value=700), alg=st.sampled_from(list(ALGORITHMS))
)
@settings(max_examples=150, deadline=None)
def test_composite_and_multipart_recompute_over_any_part_size(
    body: bytes, part: int, alg: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    f = tmp_path_factory.mktemp("c") / "obj"
    f.write_bytes(body)
    for method in (f"{alg}-composite", MD5_MULTIPART):
        headers, etag = headers_for(method, body, part)
        if len(split(body, part)) > 10_000:
            continue
        proof = choose_proof(len(body), etag, parse_checksum_headers(headers), part_size=part)
        if not body:
            continue  # an empty object is never multipart in S3
        assert proof.method == method
        assert proof_holds(f, proof)[0]


def test_heads_go_path_style_to_an_endpoint_and_virtual_host_style_to_aws() -> None:
    from backend.pulls.verify import StoreHeads

    secrets_env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    lab = StoreHeads({"endpoint_url": "http://127.0.0.1:8333", "region": "auto"}, secrets_env, "b")
    assert lab._url("a dir/ü+x.bin") == ("http", "127.0.0.1:8333", "/b/a%20dir/%C3%BC%2Bx.bin")
    assert lab.region == "us-east-1"
    aws = StoreHeads({"region": "eu-west-1"}, secrets_env, "data")
    assert aws._url("k") == ("https", "data.s3.eu-west-1.amazonaws.com", "/k")
    dotted = StoreHeads({"region": "eu-west-1"}, secrets_env, "my.data")
    assert dotted._url("k") == ("https", "s3.eu-west-1.amazonaws.com", "/my.data/k")
