"""Deterministic POSIX ustar member headers, built fast for the common case.

Every member gets the same metadata (mode 0644, uid/gid 0, empty uname/gname, mtime 0) so the
same input always gives byte-identical shards. Short names (<= 100 bytes) and sizes under 8 GiB
take a precomputed template; anything else falls back to :mod:`tarfile` (ustar with a prefix
split, else a pax header), which produces the same bytes for the fast cases (a test checks it).
"""

from __future__ import annotations

import tarfile

BLOCK = 512
#: End of archive: two zero blocks, then padding to a 10 KiB record as tarfile and GNU tar do.
RECORD = 20 * BLOCK
MODE = 0o644
MTIME = 0
_MAX_FAST_SIZE = 8**11 - 1  # 11 octal digits

_MODE_UID_GID = b"0000644\x000000000\x000000000\x00"
_MTIME = b"%011o\x00" % MTIME
_CHK_SPACES = b" " * 8
# typeflag, linkname[100], magic "ustar\0", version "00", uname[32], gname[32],
# devmajor[8], devminor[8] (empty for regular files, as tarfile writes them), prefix[155], pad[12]
_TAIL = b"0" + b"\x00" * 100 + b"ustar\x0000" + b"\x00" * (64 + 16 + 167)
_FIXED_SUM = sum(_MODE_UID_GID) + sum(_MTIME) + sum(_CHK_SPACES) + sum(_TAIL)
_ZERO_NAME_PAD = b"\x00" * 100


def padding(size: int) -> int:
    """Zero bytes after ``size`` bytes of member data (to the next 512-byte block)."""
    return -size % BLOCK


def member_bytes(name: str, size: int) -> int:
    """Bytes one member takes in the archive (header + data + padding), exactly."""
    if size <= _MAX_FAST_SIZE and len(name) <= 25 and name.isascii():
        return BLOCK + size + padding(size)  # surely the fast path: skip encoding
    return len(header(name, size)) + size + padding(size)


def archive_end(size_so_far: int) -> int:
    """Bytes of end-of-archive zeros after ``size_so_far`` bytes of members."""
    total = size_so_far + 2 * BLOCK
    return 2 * BLOCK + (-total % RECORD)


def header(name: str, size: int) -> bytes:
    """The ustar header block(s) of one regular-file member with fixed metadata."""
    raw = name.encode("utf-8")
    if len(raw) <= 100 and size <= _MAX_FAST_SIZE and "\x00" not in name:
        size_field = b"%011o\x00" % size
        chk = _FIXED_SUM + sum(raw) + sum(size_field)
        return b"".join((raw, _ZERO_NAME_PAD[len(raw) :], _MODE_UID_GID, size_field, _MTIME, b"%06o\x00 " % chk, _TAIL))
    return slow_header(name, size)


def slow_header(name: str, size: int) -> bytes:
    """The same header through :mod:`tarfile` (long names, huge members)."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = MTIME
    info.mode = MODE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    try:
        return info.tobuf(format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="strict")
    except ValueError:
        return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")
