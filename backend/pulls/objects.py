"""What the console and the node's runner of a pull both use: source patterns, the objects of a
pull and where each may land under DEST, and reading s5cmd's output.

Pure helpers (no I/O): :mod:`backend.pulls.plan` (the console: plan and launch) and
:mod:`backend.pulls.job` (the node: copy and verify) both check every key with
:func:`check_objects` and read s5cmd's listings and errors the same way.
"""

from __future__ import annotations

import fnmatch
import json
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import NamedTuple

from backend.errors import JobError, StoreError

WILDCARDS = "*?["
CREDS_PROFILE = "loadmaster"
CREDS_FILE = "aws-credentials"


# -- source patterns --------------------------------------------------------------------------


@dataclass(frozen=True)
class SourcePattern:
    """An ``s3://`` source as s5cmd takes it: bucket, listing prefix and key pattern."""

    url: str  # what s5cmd is given (a bare prefix ending in / gets a "*")
    bucket: str
    base: str  # key prefix up to the last "/" before the first wildcard (destination root)
    pattern: str | None  # fnmatch pattern over full keys; None for a single object

    def rel(self, key: str) -> str:
        """Where ``key`` lands under the destination directory (as s5cmd places it)."""
        if self.pattern is None:
            return PurePosixPath(key).name
        return key[len(self.base) :]

    def key_of(self, rel: str) -> str:
        """The key that lands at ``rel`` (the inverse of :meth:`rel`)."""
        return self.base if self.pattern is None else self.base + rel

    def matches(self, key: str) -> bool:
        if self.pattern is None:
            return key == self.base
        return key.startswith(self.base) and fnmatch.fnmatchcase(key, self.pattern)


def parse_source(src: str) -> SourcePattern:
    """Parse a pull source: ``s3://b/prefix/`` (everything under it), ``s3://b/p/*.tar`` or one object."""
    if not src.startswith("s3://"):
        raise StoreError(f"not an s3:// URL: {src!r}")
    bucket = src[5:].partition("/")[0]
    if not bucket:
        raise StoreError(f"no bucket in {src!r} (expected s3://bucket/prefix)")
    key = src[5 + len(bucket) :].lstrip("/")
    if key == "" or key.endswith("/"):
        key += "*"
    first = min((key.index(c) for c in WILDCARDS if c in key), default=-1)
    if first < 0:
        return SourcePattern(url=f"s3://{bucket}/{key}", bucket=bucket, base=key, pattern=None)
    base = key[: key.rfind("/", 0, first) + 1]
    return SourcePattern(url=f"s3://{bucket}/{key}", bucket=bucket, base=base, pattern=key)


# -- what a key may become under DEST -----------------------------------------------------------


class PulledObject(NamedTuple):
    """One object of a pull: where it lands under DEST, its size and ETag in the listing."""

    rel: str
    size: int
    etag: str | None = None


#: Unicode categories refused in a destination name: control characters (C0, DEL, C1) break
#: s5cmd's command lines and the operator's terminal; line and paragraph separators split lines.
_BAD_CATEGORIES = frozenset({"Cc", "Zl", "Zp"})
_NAME_MAX = 255


def rel_problem(rel: str) -> str | None:
    """Why ``rel`` is not a plain relative path that stays inside DEST, or None when it is."""
    if not rel:
        return "names no file"
    if rel.startswith("/"):
        return "is an absolute path"
    if any(unicodedata.category(c) in _BAD_CATEGORIES for c in rel):
        return "contains a control character"
    parts = rel.split("/")
    if ".." in parts:
        return "has a '..' segment"
    if "." in parts:
        return "has a '.' segment"
    if "" in parts:
        return "has an empty segment ('//' or a trailing '/')"
    if any(len(p.encode("utf-8", "surrogateescape")) > _NAME_MAX for p in parts):
        return f"has a name longer than {_NAME_MAX} bytes"
    return None


def is_folder_marker(key: str, size: int) -> bool:
    """A zero-byte key ending in '/': a console's "folder", not data (skipped, never written)."""
    return size == 0 and key.endswith("/")


def check_objects(src: SourcePattern, objects: list[PulledObject]) -> None:
    """Refuse a listing with any key that would land outside DEST or collide with another."""
    bad = [(o.rel, why) for o in objects if (why := rel_problem(o.rel))]
    if not bad:
        seen = {o.rel for o in objects}
        dup = len(seen) != len(objects)
        bad = [
            (o.rel, "is also a folder of other keys (a file and a folder cannot share a path)")
            for o in objects
            if any(p in seen for p in _parents(o.rel))
        ]
        if not bad and dup:
            bad = [(next(r for r in seen if sum(o.rel == r for o in objects) > 1), "is listed twice")]
    if bad:
        rel, why = bad[0]
        more = f" (and {len(bad) - 1} more such keys)" if len(bad) > 1 else ""
        raise StoreError(
            f"refusing to pull {src.url}: key {src.key_of(rel)!r} {why}; it would be written "
            f"outside DEST or over another object{more}. Rename or remove it, or narrow the source"
        )


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def parse_expected(raw: Sequence[object]) -> list[PulledObject]:
    """The spec's expected objects ([rel, size] or [rel, size, etag] each)."""
    out = []
    for item in raw:
        if not isinstance(item, list | tuple) or len(item) not in (2, 3):
            raise JobError(f"malformed expected object in the job spec: {str(item)[:80]!r}")
        etag = item[2] if len(item) == 3 and item[2] else None
        out.append(PulledObject(str(item[0]), int(item[1]), None if etag is None else str(etag)))
    return out


def s5cmd_error(line: str) -> str | None:
    """The error in one line of s5cmd output (JSON or text), or None."""
    s = line.strip()
    if not s:
        return None
    if s.startswith("{"):
        try:
            d = json.loads(s)
        except ValueError:
            return s if "ERROR" in s else None
        if d.get("error"):
            return f"{d.get('operation', 's5cmd')} {d.get('source') or d.get('command') or ''}: {d['error']}".strip()
        if d.get("success") is False:
            return f"{d.get('operation', 's5cmd')} {d.get('source', '')}: failed"
        return None
    return s if "ERROR" in s or s.lower().startswith("error") else None


def parse_s5cmd_listing(src: SourcePattern, stdout: str) -> list[PulledObject]:
    """The objects ``src`` matches in ``s5cmd --json ls`` output (folder markers skipped)."""
    prefix = f"s3://{src.bucket}/"
    out = []
    for line in stdout.split("\n"):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        k = d.get("key") or ""
        # s5cmd lists a key ending in "/" as a "directory": with bytes in it, it is an object the
        # pull cannot write as a file, and is refused like any other such key.
        if d.get("type") not in ("file", "directory") or not k.startswith(prefix):
            continue
        key, size = k[len(prefix) :], int(d.get("size", 0))
        if d.get("type") == "directory" and (size == 0 or not key.endswith("/")):
            continue
        if src.matches(key) and not is_folder_marker(key, size):  # a bare key is listed as a prefix
            out.append(PulledObject(src.rel(key), size, str(d.get("etag") or "").strip('"') or None))
    return sorted(out)
