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
which release the GIL too, so a few threads hash a few files at once. A file is hashed where
it lies in the page cache, through a read-only map held under a read lease (:class:`FileBytes`:
no copy into a buffer, half the CPU), and read into a buffer where no lease is granted.

Node side (the pull runner): imports nothing but the standard library (and ``awscrt``
when a CRC64NVME or CRC32C must be computed).
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import mmap
import os
import re
import signal
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


_BUFFERS = threading.local()


def _buffer() -> memoryview:
    """This thread's read buffer (:data:`CHUNK` bytes), reused: a fresh 2 MiB buffer (and a
    buffered reader) per file cost as much CPU as reading and CRC64NVME-ing a 1 MiB file from the
    page cache (bench/verify_cost.py, #33)."""
    view: memoryview | None = getattr(_BUFFERS, "view", None)
    if view is None:
        view = _BUFFERS.view = memoryview(bytearray(CHUNK))
    return view


#: Bytes of the file mapped at a time (a multiple of the allocation granularity).
MAP_WINDOW = 64 << 20
#: Smaller files are read, not mapped: with two threads hashing 1 MiB files, unmapping (a TLB
#: shootdown to the other core) and the lease's system calls cost what the copy saves; from
#: 4 MiB on a map takes half the CPU (measured 2026-12-02, bench numbers in BENCHMARKS.md).
MAP_MIN = 4 << 20
#: The least ``/proc/sys/fs/lease-break-time`` (seconds) under which files are mapped: the time a
#: truncation waits for our lease, far longer than hashing one window takes on any machine.
MIN_LEASE_BREAK_S = 10
_LEASE_SIGNAL = signal.SIGWINCH  # its default action is to ignore: a lease break must not kill us
_leases_usable: bool | None = None


def _leases_allowed() -> bool:
    """Whether this kernel grants read leases and lets a breaker wait long enough for them."""
    global _leases_usable
    if _leases_usable is None:
        try:
            enabled = Path("/proc/sys/fs/leases-enable").read_text().strip() == "1"
            wait = int(Path("/proc/sys/fs/lease-break-time").read_text())
        except (OSError, ValueError):
            enabled, wait = False, 0
        _leases_usable = enabled and wait >= MIN_LEASE_BREAK_S and hasattr(fcntl, "F_SETLEASE")
    return _leases_usable


class FileBytes:
    """The bytes of an open file, handed to a hash in consecutive pieces.

    Where a read lease can be taken on a file of :data:`MAP_MIN` bytes or more, it is hashed where
    it lies, through a read-only map of the page cache: half the CPU of ``read()`` into a buffer
    (the copy is most of the cost of CRC64NVME, bench/verify_cost.py). The lease is what makes the map safe: the kernel grants it
    only while no one has the file open for writing (so the writer, s5cmd, has closed it), and an
    open for writing or a truncation by anyone else waits for us to let go (up to
    ``lease-break-time``), so a page of the map can never vanish under the hash (which would kill
    the process with SIGBUS). Before each window the lease is checked again; once a break is
    pending, or where no lease is granted (another writer, a file system without leases, a file
    owned by someone else), the rest is read into this thread's buffer as before. A disk error
    while reading a mapped page that is not in the page cache ends the process (SIGBUS) where
    ``read()`` would raise: the pull then ends unproven, never passed.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map: mmap.mmap | None = None
        self._map_at = 0
        self.size = os.fstat(fd).st_size
        self.leased = self.size >= MAP_MIN and _leases_allowed() and self._lease()
        if self.leased:
            self.size = os.fstat(fd).st_size  # again under the lease: from now on nobody can change it
        #: Whether windows of the file are mapped (else read into this thread's buffer).
        self.mapped = self.leased and self.size > 0

    def _lease(self) -> bool:
        try:
            fcntl.fcntl(self.fd, fcntl.F_SETSIG, _LEASE_SIGNAL)
            fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        except OSError:  # EAGAIN: open for writing somewhere; EACCES, EINVAL: not ours, no leases
            return False
        return True

    def _mappable(self) -> bool:
        """Whether the next window may be mapped: the lease is held and no break is pending."""
        if self.mapped and fcntl.fcntl(self.fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK:
            # Someone waits to write or truncate. The lease is kept until close (they wait up to
            # lease-break-time, and the rest is read consistently meanwhile), but nothing more is
            # mapped: past that time the kernel lets them go ahead, and read() fails where a map
            # would kill the process.
            self._unmap()
            self.mapped = False
        return self.mapped

    def _unmap(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def close(self) -> None:
        self._unmap()
        self.mapped = False
        if self.leased:
            self.leased = False
            try:
                fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
            except OSError:
                pass

    def feed(self, start: int, length: int | None, update: Callable[[Bytes], object]) -> int:
        """Hand bytes ``start`` to ``start + length`` (None: to the end) to ``update`` in order;
        returns how many there were (fewer at the end of the file)."""
        fed = 0
        while length is None or fed < length:
            if not self._mappable():
                return fed + self._read(start + fed, None if length is None else length - fed, update)
            pos = start + fed
            stop = self.size if length is None else min(self.size, start + length)
            if pos >= stop:
                break
            window = self._window(pos)
            stop = min(stop, self._map_at + len(window))
            with memoryview(window) as mv, mv[pos - self._map_at : stop - self._map_at] as piece:
                update(piece)
            fed += stop - pos
        return fed

    def _window(self, pos: int) -> mmap.mmap:
        at = pos - pos % MAP_WINDOW
        if self._map is None or self._map_at != at:
            if self._map is not None:
                self._map.close()
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self._map = mmap.mmap(self.fd, min(MAP_WINDOW, self.size - at), flags, mmap.PROT_READ, offset=at)
            self._map_at = at
        return self._map

    def _read(self, pos: int, length: int | None, update: Callable[[Bytes], object]) -> int:
        view, fed = _buffer(), 0
        while length is None or fed < length:
            want = CHUNK if length is None else min(CHUNK, length - fed)
            n = os.preadv(self.fd, [view[:want]], pos + fed)
            if n == 0:
                break
            update(view[:n])
            fed += n
        return fed

    def more_after(self, end: int) -> bool:
        """Whether the file has bytes past ``end``."""
        return bool(os.pread(self.fd, 1, end))


def digest_file(path: Path, proof: Proof, part_sizes: Sequence[int] | None = None) -> bytes | str:
    """What ``path`` gives under ``proof``: the checksum (full or composite) as bytes, or for the
    MD5 methods the ETag text. ``part_sizes`` overrides equal parts of ``proof.part_size``."""
    assert proof.algorithm is not None
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOCTTY", 0))
    data = None
    try:
        data = FileBytes(fd)
        if proof.part_size is None and proof.method != MD5_MULTIPART:
            h = new_hasher(proof.algorithm)
            data.feed(0, None, h.update)
            return h.hexdigest() if proof.method == MD5 else h.digest()  # type: ignore[attr-defined]
        sizes = list(part_sizes) if part_sizes is not None else None
        if sizes is None:
            sizes = equal_part_sizes(data.size, proof.part_size or 0, proof.parts or 0) or [data.size]
        outer = new_hasher(proof.algorithm)
        pos = 0
        for length in sizes:
            h = new_hasher(proof.algorithm)
            pos += data.feed(pos, length, h.update)
            outer.update(h.digest())
        tail = data.more_after(pos)
    finally:
        if data is not None:
            data.close()
        os.close(fd)
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
