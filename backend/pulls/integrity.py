"""The proof that a file on disk holds the bytes of an object in the store, and its check.

A pull proves each object with the cheapest evidence the store gives for it, strongest first:

1. the store's own full-object checksum (S3 additional checksums: CRC64NVME, CRC32C, CRC32,
   SHA-256, SHA-1, read with ``x-amz-checksum-mode: ENABLED`` on HEAD), recomputed over the file;
2. a composite checksum (``value-N``: the checksum of the N part checksums), recomputed over the
   same part boundaries;
3. the ETag of a single-part object (the MD5 of its bytes), or of a multipart upload (the MD5 of
   the parts' MD5s, ``-N``) where the part size is known;
4. nothing about the bytes: size and ETag stability only, reported as ``size-only``, never as
   verified.

Header values are untrusted: :func:`parse_checksum_headers` keeps only well-formed values (strict
base64 of the algorithm's width, a part count in S3's range) and drops the rest. The CRCs come
from ``awscrt`` (AWS's common runtime: hardware-accelerated CRC64NVME and CRC32C, the GIL
released for every chunk read here); CRC32 from zlib, the SHAs and MD5 from hashlib, all of
which release the GIL too, so a few threads hash a few files at once.

Node side (the pull runner): imports nothing but the standard library (and ``awscrt``
when a CRC64NVME or CRC32C must be computed).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

#: S3's additional checksum algorithms, cheapest per byte first (the order a proof is chosen in),
#: with their width in bytes.
ALGORITHMS: dict[str, int] = {"crc64nvme": 8, "crc32c": 4, "crc32": 4, "sha256": 32, "sha1": 20}
#: S3 allows at most 10,000 parts in a multipart upload.
MAX_PARTS = 10_000
#: Bytes read (and hashed) at a time: large enough that the GIL is released for nearly all of it,
#: small enough to stay in the CPU's cache between the read and the hash.
CHUNK = 2 << 20

FULL = "full"
COMPOSITE = "composite"
MD5 = "md5"
MD5_MULTIPART = "md5-multipart"
SIZE_ONLY = "size-only"

_MD5_HEX = re.compile(r"[0-9a-f]{32}")
_MULTIPART_ETAG = re.compile(r"([0-9a-f]{32})-([1-9][0-9]{0,4})")


#: What a hasher takes: the bytes of a read, or a view of the buffer they were read into.
Bytes = bytes | bytearray | memoryview


class Hasher(Protocol):
    def update(self, data: Bytes, /) -> None: ...

    def digest(self) -> bytes: ...


class _Crc:
    """A running CRC (``fn(data, previous) -> int``) with hashlib's update/digest."""

    def __init__(self, fn: Callable[[Bytes, int], int], width: int) -> None:
        self._fn, self._width, self._value = fn, width, 0

    def update(self, data: Bytes, /) -> None:
        self._value = self._fn(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(self._width, "big")


class ChecksumUnavailable(Exception):
    """The library for an algorithm is not installed here (the object falls back to a weaker proof)."""


def crt_available() -> bool:
    """Whether ``awscrt`` (CRC64NVME, CRC32C) can be imported here."""
    try:
        import awscrt.checksums  # noqa: F401
    except ImportError:
        return False
    return True


def new_hasher(algorithm: str) -> Hasher:
    """A fresh running checksum for ``algorithm`` (a key of :data:`ALGORITHMS`, or "md5")."""
    if algorithm in ("crc64nvme", "crc32c"):
        try:
            from awscrt import checksums
        except ImportError:
            raise ChecksumUnavailable(f"{algorithm} needs the awscrt package (pip install awscrt)") from None
        fn = checksums.crc64nvme if algorithm == "crc64nvme" else checksums.crc32c
        return _Crc(fn, ALGORITHMS[algorithm])
    if algorithm == "crc32":
        return _Crc(zlib.crc32, 4)
    if algorithm in ("sha256", "sha1", "md5"):
        return hashlib.new(algorithm, usedforsecurity=False)
    raise ChecksumUnavailable(f"unknown checksum algorithm {algorithm!r}")


# -- what the store says --------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreChecksum:
    """One checksum the store holds for an object: over the whole object, or over its N parts."""

    algorithm: str
    digest: bytes
    parts: int | None = None  # None: the full object; N: composite over N parts

    @property
    def method(self) -> str:
        return self.algorithm if self.parts is None else f"{self.algorithm}-composite"

    def text(self) -> str:
        """As S3 writes it: base64, ``-N`` for a composite."""
        b64 = base64.b64encode(self.digest).decode()
        return b64 if self.parts is None else f"{b64}-{self.parts}"


def parse_checksum_value(algorithm: str, value: str, kind: str | None) -> StoreChecksum | None:
    """``value`` of an ``x-amz-checksum-<algorithm>`` header, or None when it is malformed: not
    strict base64 of the algorithm's width, a part count outside 1..10,000, or a suffix that
    contradicts ``x-amz-checksum-type`` (``kind``)."""
    width = ALGORITHMS.get(algorithm)
    if width is None or not isinstance(value, str) or len(value) > 128:
        return None
    b64, sep, count = value.strip().partition("-")
    parts: int | None = None
    if sep:
        if not (count.isascii() and count.isdigit()) or count.startswith("0") or not 1 <= int(count) <= MAX_PARTS:
            return None
        parts = int(count)
    kind = (kind or "").strip().upper()
    if kind not in ("", "FULL_OBJECT", "COMPOSITE") or (kind == "FULL_OBJECT" and parts is not None):
        return None
    if kind == "COMPOSITE" and parts is None:
        return None  # a composite value without its part count cannot be recomputed
    try:
        digest = base64.b64decode(b64.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None
    if len(digest) != width:
        return None
    return StoreChecksum(algorithm, digest, parts)


def parse_checksum_headers(headers: Mapping[str, object]) -> list[StoreChecksum]:
    """The well-formed checksums in an object's response headers, cheapest algorithm first."""
    lower = {str(k).lower(): v for k, v in headers.items()}
    kind = lower.get("x-amz-checksum-type")
    out = []
    for alg in ALGORITHMS:
        v = lower.get(f"x-amz-checksum-{alg}")
        if isinstance(v, str) and (c := parse_checksum_value(alg, v, kind if isinstance(kind, str) else None)):
            out.append(c)
    return out


def plain_md5_etag(etag: str | None) -> bool:
    """An ETag that is (for a plainly stored single-part object) the MD5 of its bytes."""
    return bool(etag) and _MD5_HEX.fullmatch(str(etag)) is not None


def multipart_etag_parts(etag: str | None) -> int | None:
    """N of a multipart ETag (``md5-N``), or None."""
    m = _MULTIPART_ETAG.fullmatch(str(etag or ""))
    return int(m.group(2)) if m and int(m.group(2)) <= MAX_PARTS else None


# -- the proof chosen for one object ---------------------------------------------------------------


@dataclass(frozen=True)
class Proof:
    """How one object's bytes on disk are checked, and the value they must give.

    ``method``: "crc64nvme" (or another algorithm: the store's full-object checksum),
    "crc64nvme-composite" (per-part checksums over ``part_size`` boundaries), "md5" (single-part
    ETag), "md5-multipart" (multipart ETag over ``part_size`` boundaries) or "size-only".
    """

    method: str
    algorithm: str | None = None
    expected: bytes | str | None = None  # digest bytes, or the ETag text for the MD5 methods
    part_size: int | None = None
    parts: int | None = None
    why: str = ""  # for "size-only": why nothing stronger was to be had

    @property
    def verifies_bytes(self) -> bool:
        return self.method != SIZE_ONLY


def equal_part_sizes(size: int, part_size: int, parts: int) -> list[int] | None:
    """The part lengths of a ``size``-byte upload in ``parts`` parts of ``part_size`` (the last
    one shorter), or None when those numbers do not fit together."""
    if part_size <= 0 or parts < 1 or parts > MAX_PARTS:
        return None
    if -(-size // part_size) != parts or (size == 0 and parts != 1):
        return None
    if parts == 1:
        return [size]
    return [part_size] * (parts - 1) + [size - part_size * (parts - 1)]


def choose_proof(
    size: int,
    etag: str | None,
    checksums: Sequence[StoreChecksum] = (),
    *,
    part_size: int | None = None,
    kms: bool = False,
    crt: bool = True,
) -> Proof:
    """The cheapest proof for an object of ``size`` bytes: a full-object checksum, a composite one
    (with ``part_size`` known), the MD5 ETag (single-part, not SSE-KMS; multipart with
    ``part_size``), else size-only with the reason."""
    usable = [c for c in checksums if crt or c.algorithm not in ("crc64nvme", "crc32c")]
    for c in usable:
        if c.parts is None:
            return Proof(c.method, c.algorithm, c.digest)
    for c in usable:
        assert c.parts is not None
        if part_size and equal_part_sizes(size, part_size, c.parts):
            return Proof(c.method, c.algorithm, c.digest, part_size, c.parts)
    if etag and not kms:
        if plain_md5_etag(etag):
            return Proof(MD5, "md5", etag)
        n = multipart_etag_parts(etag)
        if n is not None and part_size and equal_part_sizes(size, part_size, n):
            return Proof(MD5_MULTIPART, "md5", etag, part_size, n)
    if kms:
        why = "SSE-KMS: the ETag is not an MD5 of the bytes, and the store gave no checksum"
    elif checksums and not usable:
        why = "the store's checksum needs awscrt, which is not installed on the node"
    elif multipart_etag_parts(etag) is not None or any(c.parts for c in checksums):
        why = "multipart, and its part size could not be recovered"
    else:
        why = "the store gave no checksum and no MD5 ETag"
    return Proof(SIZE_ONLY, why=why)


# -- checking a file --------------------------------------------------------------------------------


class _Readable(Protocol):
    def readinto(self, buffer: memoryview, /) -> int | None: ...


def _read_into(f: _Readable, view: memoryview, n: int) -> int:
    got = 0
    while got < n:
        r = f.readinto(view[got:n])
        if not r:
            break
        got += r
    return got


_BUFFERS = threading.local()


def _buffer() -> memoryview:
    """This thread's read buffer (:data:`CHUNK` bytes), reused: a fresh 2 MiB buffer (and a
    buffered reader) per file cost as much CPU as reading and CRC64NVME-ing a 1 MiB file from the
    page cache (bench/verify_cost.py, #33)."""
    view: memoryview | None = getattr(_BUFFERS, "view", None)
    if view is None:
        view = _BUFFERS.view = memoryview(bytearray(CHUNK))
    return view


def digest_file(path: Path, proof: Proof, part_sizes: Sequence[int] | None = None) -> bytes | str:
    """What ``path`` gives under ``proof``: the checksum (full or composite) as bytes, or for the
    MD5 methods the ETag text. ``part_sizes`` overrides equal parts of ``proof.part_size``."""
    assert proof.algorithm is not None
    view = _buffer()
    with open(path, "rb", buffering=0) as f:
        if proof.part_size is None and proof.method != MD5_MULTIPART:
            h = new_hasher(proof.algorithm)
            while n := f.readinto(view):
                h.update(view[:n])
            return h.hexdigest() if proof.method == MD5 else h.digest()  # type: ignore[attr-defined]
        size = Path(path).stat().st_size
        sizes = list(part_sizes) if part_sizes is not None else None
        if sizes is None:
            sizes = equal_part_sizes(size, proof.part_size or 0, proof.parts or 0) or [size]
        outer = new_hasher(proof.algorithm)
        for length in sizes:
            h = new_hasher(proof.algorithm)
            left = length
            while left > 0:
                n = _read_into(f, view, min(left, CHUNK))
                if n == 0:
                    break
                h.update(view[:n])
                left -= n
            outer.update(h.digest())
        tail = f.read(1)
    d = outer.digest()
    if proof.method == MD5_MULTIPART:
        return f"{d.hex()}-{len(sizes)}" + ("+" if tail else "")
    return d + (b"+" if tail else b"")  # bytes past the last part never match


def proof_holds(path: Path, proof: Proof, part_sizes: Sequence[int] | None = None) -> tuple[bool, str]:
    """Whether ``path`` matches ``proof``, and what it gave (text for a message)."""
    if not proof.verifies_bytes:
        return True, ""
    got = digest_file(path, proof, part_sizes)
    if isinstance(got, bytes):
        ok = isinstance(proof.expected, bytes) and got == proof.expected
        shown = base64.b64encode(got).decode()
        want = base64.b64encode(proof.expected).decode() if isinstance(proof.expected, bytes) else "?"
    else:
        ok = got == proof.expected
        shown, want = got, str(proof.expected)
    if proof.method in (MD5, MD5_MULTIPART):
        what = "MD5" if proof.method == MD5 else f"multipart MD5 over {proof.parts} parts"
        return ok, f"{what} {shown} but the object's ETag is {want}"
    what = (proof.algorithm or "").upper() + (f" over {proof.parts} parts" if proof.parts else "")
    return ok, f"{what} {shown} but the store's checksum is {want}"
