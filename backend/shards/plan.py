"""From a listing of small files to a deterministic assignment of samples to shards.

Files are grouped into samples the way WebDataset groups tar members: the key is the path up to
the first dot of the file's base name, the extension is everything after it
(``webdataset.tariterators.base_plus_ext``: ``a/000123.seg.png`` -> key ``a/000123``, extension
``seg.png``). WebDataset lower-cases extensions when reading, so ``x.JPG`` and ``x.jpg`` collide.

The plan depends only on the listing (names and sizes), the shard size, the pattern and the seed;
that is what makes conversions reproducible and resumable shard by shard.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import operator
import os
import random
import re
import stat
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from backend.errors import LoadmasterError
from backend.shards import tarfmt
from backend.units import bytes_text

#: The same split as ``webdataset.tariterators.base_plus_ext``.
KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
#: Files and directories loadmaster itself writes next to shards (never source data).
STATE_DIR = ".loadmaster-shards"
EXAMPLES = 5
MB = 10**6
MIN_RECOMMENDED = 256 * MB
MAX_RECOMMENDED = 1000 * MB


class ShardError(LoadmasterError):
    """A shard conversion cannot proceed: bad input, a busy destination, a failed read or write."""


def split_key(path: str) -> tuple[str, str] | tuple[None, None]:
    """(key, extension) of a relative path as WebDataset splits it; (None, None) when it has none."""
    # The common case without the regex: a base name that starts with a non-dot and has a dot, in
    # a path without a newline. There the regex's greedy first try (everything up to the last
    # slash, then the base name up to its first dot) succeeds, so this is exactly its answer.
    start = path.rfind("/") + 1
    dot = path.find(".", start)
    if dot > start and "\n" not in path:
        return path[:dot], path[dot + 1 :]
    # Everything else through the regex itself: it has corner cases (``d/.h.json`` -> key ``d/``)
    # that a hand-written split would get "right" and so differently from the reader.
    m = KEY_RE.match(path)
    return (m.group(1), m.group(2)) if m else (None, None)


class SourceFile(NamedTuple):
    """One input file: its path relative to the source root and its size."""

    # A NamedTuple, not a dataclass: one is built per source file, and this is cheaper.
    rel: str
    size: int


class Sample(NamedTuple):
    """One sample: a key and its files as (extension, relative path, size), sorted by extension."""

    # A NamedTuple, not a dataclass: one is built per sample, and this is cheaper.
    key: str
    files: tuple[tuple[str, str, int], ...]

    @property
    def nbytes(self) -> int:
        return sum(f[2] for f in self.files)

    def tar_bytes(self) -> int:
        """Bytes this sample takes in a shard."""
        key = self.key
        member_bytes = tarfmt.member_bytes
        total = 0
        for ext, _rel, size in self.files:
            total += member_bytes(f"{key}.{ext}", size)
        return total


@dataclass(frozen=True)
class InputProblems:
    """Everything wrong with a source listing, each with a count and a few examples."""

    unkeyed: tuple[str, ...] = ()
    collisions: tuple[tuple[str, ...], ...] = ()
    incomplete: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (key, missing extensions)
    unreadable: tuple[tuple[str, str], ...] = ()  # (path, reason)
    expected_exts: tuple[str, ...] = ()

    def describe(self) -> list[str]:
        """One line per kind of problem, with its count and examples."""
        out = []
        if self.unreadable:
            ex = ", ".join(f"{p} ({why})" for p, why in self.unreadable[:EXAMPLES])
            out.append(f"{len(self.unreadable)} unreadable file(s), e.g. {ex}")
        if self.collisions:
            ex = "; ".join(" vs ".join(c) for c in self.collisions[:EXAMPLES])
            out.append(
                f"{len(self.collisions)} name collision(s) (two files map to the same "
                f"key and extension; WebDataset lower-cases extensions), e.g. {ex}"
            )
        if self.unkeyed:
            ex = ", ".join(self.unkeyed[:EXAMPLES])
            out.append(
                f"{len(self.unkeyed)} file(s) without a WebDataset key (no '.' after the "
                f"first character of the name), e.g. {ex}"
            )
        if self.incomplete:
            exp = ", ".join(self.expected_exts)
            ex = ", ".join(f"{k} (missing {'/'.join(m)})" for k, m in self.incomplete[:EXAMPLES])
            out.append(
                f"{len(self.incomplete)} sample(s) lack a partner file that most samples have ({exp}), e.g. {ex}"
            )
        return out

    def as_dict(self) -> dict[str, object]:
        return {
            "unkeyed": {"count": len(self.unkeyed), "examples": list(self.unkeyed[:EXAMPLES])},
            "collisions": {"count": len(self.collisions), "examples": [list(c) for c in self.collisions[:EXAMPLES]]},
            "incomplete": {
                "count": len(self.incomplete),
                "expected": list(self.expected_exts),
                "examples": [{"key": k, "missing": list(m)} for k, m in self.incomplete[:EXAMPLES]],
            },
            "unreadable": {
                "count": len(self.unreadable),
                "examples": [{"path": p, "reason": r} for p, r in self.unreadable[:EXAMPLES]],
            },
        }


def _read_permission() -> Callable[[os.stat_result], bool] | None:
    """Whether this process may read a file, from its stat (no access() syscall per file).

    None when it may read everything (root): then there is nothing to check per file.
    """
    euid = os.geteuid()
    if euid == 0:
        return None
    groups = set(os.getgroups()) | {os.getegid()}

    def readable(st: os.stat_result) -> bool:
        if st.st_uid == euid:
            return bool(st.st_mode & 0o400)
        if st.st_gid in groups:
            return bool(st.st_mode & 0o040)
        return bool(st.st_mode & 0o004)

    return readable


def inside(path: str, root_real: str) -> bool:
    """Whether the resolved ``path`` is ``root_real`` (a resolved directory) or below it."""
    return path == root_real or path.startswith(root_real.rstrip("/") + "/")


def _escapes(root: str, rel: str, root_real: str) -> str | None:
    """Where the symbolic link at ``rel`` leads when that is outside the source, else None."""
    target = os.path.realpath(os.path.join(root, rel))
    return None if inside(target, root_real) else target


def _scan_dir(
    dfd: int,
    sub: str,
    files: list[SourceFile],
    unreadable: list[tuple[str, str]],
    subdirs: list[str],
    readable: Callable[[os.stat_result], bool] | None,
    root: str = "",
    root_real: str = "",
) -> None:
    """The entries of one directory (open as ``dfd``, at ``sub`` under the root) into the lists."""
    prefix = f"{sub}/" if sub else ""
    is_reg = stat.S_ISREG
    append, new = files.append, tuple.__new__
    try:
        entries = list(os.scandir(dfd))
    except OSError as exc:
        unreadable.append((sub or ".", exc.strerror or str(exc)))
        return
    for e in entries:
        name = e.name
        if not sub and name == STATE_DIR:
            continue
        rel = prefix + name
        try:
            if e.is_dir(follow_symlinks=False):
                subdirs.append(rel)
                continue
            if e.is_symlink() and root_real:
                # A link out of the source (``000003.jpg -> ~/.aws/credentials``) would ship
                # that file inside a shard: refused, naming it. Links within the source are data.
                target = _escapes(root, rel, root_real)
                if target is not None:
                    unreadable.append((rel, f"symbolic link to {target}, outside the source: refused"))
                    continue
            st = e.stat()  # follows symlinks: a dangling link is unreadable
        except OSError as exc:
            unreadable.append((rel, exc.strerror or str(exc)))
            continue
        if not is_reg(st.st_mode):
            unreadable.append((rel, "not a regular file"))
        elif readable is not None and not readable(st):
            unreadable.append((rel, "permission denied"))
        else:
            append(new(SourceFile, (rel, st.st_size)))  # SourceFile(rel, size) without its Python __new__


def scan_local(root: str, *, ordered: bool = True) -> tuple[list[SourceFile], list[tuple[str, str]]]:
    """Every regular file under ``root`` (relative paths, sizes) and the ones that cannot be read.

    Sorted by path; with ``ordered=False`` the files come in the directories' own order (for
    :func:`group_samples`, whose answer does not depend on it: one sort of 20,000 paths less).
    """
    if not os.path.isdir(root):
        raise ShardError(f"source directory {root!r} does not exist (or is not a directory)")
    files: list[SourceFile] = []
    unreadable: list[tuple[str, str]] = []
    readable = _read_permission()
    root_real = os.path.realpath(root)
    stack = [""]
    while stack:
        sub = stack.pop()
        try:
            # Listed through a directory descriptor: each entry's stat() is then an fstatat()
            # relative to it, not a lookup of the whole path again.
            dfd = os.open(os.path.join(root, sub) if sub else root, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            unreadable.append((sub or ".", exc.strerror or str(exc)))
            continue
        try:
            _scan_dir(dfd, sub, files, unreadable, stack, readable, root, root_real)
        finally:
            os.close(dfd)
    if ordered:
        files.sort()  # by path: paths are unique, so the sizes are never compared
    unreadable.sort()
    return files, unreadable


def group_samples(files: Iterable[SourceFile], *, partner_share: float = 0.5) -> tuple[list[Sample], InputProblems]:
    """Group files into samples by key (sorted by key); report unkeyed, colliding, incomplete.

    The answer does not depend on the order of ``files``: where two files map to the same key
    and extension, the one with the smaller path is kept and each other one is reported with it,
    in path order (as a walk through the sorted listing meets them); unkeyed files are sorted.
    """
    by_key: dict[str, dict[str, tuple[str, str, int]]] = {}
    unkeyed: list[str] = []
    clashes: dict[tuple[str, str], list[str]] = {}  # (key, extension) -> every path that maps to it
    for rel, size in files:
        start = rel.rfind("/") + 1
        dot = rel.find(".", start)
        if dot > start and "\n" not in rel:  # split_key's fast path, inlined: once per file
            key, ext = rel[:dot], rel[dot + 1 :]
        else:
            parts = split_key(rel)
            if parts[0] is None or parts[1] is None:
                unkeyed.append(rel)
                continue
            key, ext = parts[0], parts[1]
        exts = by_key.get(key)
        if exts is None:
            by_key[key] = {ext.lower(): (ext, rel, size)}
            continue
        low = ext.lower()
        held = exts.get(low)
        if held is None:
            exts[low] = (ext, rel, size)
            continue
        clashes.setdefault((key, low), [held[1]]).append(rel)
        if rel < held[1]:  # the smaller path is kept, whatever order the files come in
            exts[low] = (ext, rel, size)
    collisions: list[tuple[str, ...]] = []
    for paths in clashes.values():
        paths.sort()
        collisions += [(paths[0], p) for p in paths[1:]]
    collisions.sort(key=operator.itemgetter(1))
    unkeyed.sort()
    counts = Counter(itertools.chain.from_iterable(by_key.values()))
    n = len(by_key)
    expected = tuple(sorted(e for e, c in counts.items() if n and c / n > partner_share))
    wanted = frozenset(expected)
    incomplete: list[tuple[str, tuple[str, ...]]] = []
    samples: list[Sample] = []
    append, new = samples.append, tuple.__new__
    for key in sorted(by_key):
        exts = by_key[key]
        if not exts.keys() >= wanted:
            incomplete.append((key, tuple(e for e in expected if e not in exts)))
        # Sample(key, files) without its Python __new__; one extension needs no sort
        append(new(Sample, (key, tuple(exts.values()) if len(exts) == 1 else tuple([exts[e] for e in sorted(exts)]))))
    problems = InputProblems(
        unkeyed=tuple(unkeyed),
        collisions=tuple(collisions),
        incomplete=tuple(incomplete),
        expected_exts=expected,
    )
    return samples, problems


@dataclass(frozen=True)
class PlannedShard:
    """One shard of the plan: its index, name, samples and exact size in bytes."""

    index: int
    name: str
    samples: tuple[Sample, ...]
    nbytes: int

    @property
    def files(self) -> int:
        return sum(len(s.files) for s in self.samples)


@dataclass(frozen=True)
class ShardPlan:
    """The deterministic assignment of every sample to a shard, and its fingerprint."""

    shards: tuple[PlannedShard, ...]
    shard_size: int
    pattern: str
    seed: int | None
    plan_hash: str
    files: int
    samples: int
    source_bytes: int
    warnings: tuple[str, ...] = field(default=())

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.shards)


def check_pattern(pattern: str) -> None:
    """Refuse a shard name pattern that would not give distinct ``.tar`` names in one directory."""
    convs = re.findall(r"%[-+ 0#]*\d*[a-zA-Z%]", pattern)
    ints = [c for c in convs if c[-1] in "di"]
    if len(ints) != 1 or len(convs) != 1:
        raise ShardError(
            f"shard pattern {pattern!r} must contain exactly one integer field like %06d (e.g. 'shard-%06d.tar')"
        )
    if "/" in pattern or not pattern.endswith(".tar"):
        raise ShardError(f"shard pattern {pattern!r} must be a plain file name ending in .tar")


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """A regex matching names the pattern produces."""
    before, conv, after = re.split(r"(%[-+ 0#]*\d*[di])", pattern, maxsplit=1)
    return re.compile(re.escape(before) + r"-?\d+" + re.escape(after) + "$")


def size_warnings(shard_size: int) -> list[str]:
    """Advice when the target shard size is outside the recommended 256 MB - 1 GB."""
    if shard_size < MIN_RECOMMENDED:
        return [
            f"shard size {bytes_text(shard_size)} is below the recommended 256 MB - 1 GB: "
            "more shards means more GETs per epoch"
        ]
    if shard_size > MAX_RECOMMENDED:
        return [
            f"shard size {bytes_text(shard_size)} is above the recommended 256 MB - 1 GB: "
            "large shards shuffle coarsely and restart slowly"
        ]
    return []


def plan_shards(samples: Sequence[Sample], *, shard_size: int, pattern: str, seed: int | None = None) -> ShardPlan:
    """Assign samples (sorted, or shuffled by ``seed``) to shards of at most ``shard_size`` bytes.

    A shard is closed before the sample that would push it over the target, so no shard exceeds
    it unless a single sample alone is larger (that sample then gets a shard of its own); no
    sample is ever split.
    """
    if shard_size <= 0:
        raise ShardError("shard size must be positive (e.g. --shard-size 512MB)")
    check_pattern(pattern)
    order = list(samples)
    if seed is not None:
        random.Random(seed).shuffle(order)
    shards: list[PlannedShard] = []
    current: list[Sample] = []
    used = files = source_bytes = 0
    archive_end = tarfmt.archive_end
    # What the plan hash covers, joined and hashed once (the same bytes as hashing piece by piece).
    fingerprint = [json.dumps({"v": 1, "size": shard_size, "pattern": pattern, "seed": seed})]

    def close() -> None:
        nonlocal current, used
        name = pattern % len(shards)
        shards.append(PlannedShard(len(shards), name, tuple(current), used + archive_end(used)))
        fingerprint.append(f"#{name}\n")
        current, used = [], 0

    for s in order:
        nb = s.tar_bytes()
        if current and used + nb + archive_end(used + nb) > shard_size:
            close()
        current.append(s)
        used += nb
        files += len(s.files)
        for _ext, rel, size in s.files:
            fingerprint.append(f"{rel}\0{size}\n")
            source_bytes += size
    if current:
        close()
    names = {s.name for s in shards}
    if len(names) != len(shards):
        raise ShardError(f"shard pattern {pattern!r} gives duplicate names for {len(shards)} shards")
    return ShardPlan(
        shards=tuple(shards),
        shard_size=shard_size,
        pattern=pattern,
        seed=seed,
        plan_hash=hashlib.sha256("".join(fingerprint).encode()).hexdigest(),
        files=files,
        samples=len(order),
        source_bytes=source_bytes,
        warnings=tuple(size_warnings(shard_size)),
    )
