"""What a pull's runner checks and tracks in DEST on the node: paths that would lead out of it,
s5cmd's temporary files (this job's, told from look-alikes that were there before), free space.

Node side only (the runner and its cleanup, :mod:`backend.pulls.job`); imports nothing
the console needs.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import os
import posixpath
import stat as stat_mod
from pathlib import Path

from backend.agent.context import JobContext
from backend.errors import JobError
from backend.pulls.objects import PulledObject
from backend.units import bytes_text


def outside_dest(dest: Path, objects: list[PulledObject]) -> list[tuple[str, str]]:
    """(rel, why) for each object whose path in ``dest`` resolves outside it (symlinks followed)
    or where something not a regular file is in the way; checked on the node just before s5cmd."""
    root = os.path.realpath(dest)
    inside: dict[str, bool] = {}
    out = []

    def within(p: str) -> bool:
        return p == root or p.startswith(root.rstrip("/") + "/")

    for o in objects:
        parent = posixpath.dirname(o.rel)
        ok = inside.get(parent)
        if ok is None:
            ok = inside[parent] = within(os.path.realpath(os.path.join(root, parent)))
        if not ok:
            out.append(
                (
                    o.rel,
                    f"its folder resolves to {os.path.realpath(os.path.join(root, parent))}, "
                    f"outside {root} (a symlink in DEST)",
                )
            )
            continue
        path = os.path.join(root, o.rel)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            out.append((o.rel, f"cannot be checked: {exc.strerror}"))
            continue
        if stat_mod.S_ISLNK(st.st_mode):
            target = os.path.realpath(path)
            if not within(target) or os.path.isdir(target):
                out.append((o.rel, f"is a symlink to {target}"))
        elif not stat_mod.S_ISREG(st.st_mode):
            out.append((o.rel, "is in DEST already and is not a regular file"))
    return out


# -- s5cmd's temporary files ----------------------------------------------------------------------
#
# s5cmd (command/cp.go, doDownload) writes each object to ``os.CreateTemp(dir(dst), base(dst))``
# and renames it over ``dst`` when complete. Go's CreateTemp names the file
# prefix + decimal uint32 (no leading zeros) + suffix, where prefix/suffix are the pattern split
# at its last "*" (the whole name when it has none). So ``part-1`` has temporaries such as
# ``part-12582912``; ``part-10`` matches that scheme too, which is why a name alone never proves a
# file is ours: the runner records every look-alike present before s5cmd starts and removes only
# look-alikes that were not there then.

SNAPSHOT_FILE = "dest-before.json"
_UINT32_MAX = 2**32 - 1


def _go_random(s: str) -> bool:
    """``s`` is a number Go's CreateTemp would put in a name: decimal uint32, no leading zero."""
    return s.isascii() and s.isdigit() and (s == "0" or s[0] != "0") and len(s) <= 10 and int(s) <= _UINT32_MAX


def is_s5cmd_temp_name(name: str, target: str) -> bool:
    """Whether ``name`` fits s5cmd's temporary-file scheme for the destination file ``target``."""
    pos = target.rfind("*")
    prefix, suffix = (target[:pos], target[pos + 1 :]) if pos >= 0 else (target, "")
    if len(name) <= len(prefix) + len(suffix) or not name.startswith(prefix) or not name.endswith(suffix):
        return False
    return _go_random(name[len(prefix) : len(name) - len(suffix)])


def _temp_candidates(dest: Path, objects: list[PulledObject]) -> list[tuple[str, int, int]]:
    """(rel, inode, uid) of every regular file beside an expected object that fits s5cmd's temp scheme."""
    by_dir: dict[str, set[str]] = collections.defaultdict(set)
    for o in objects:
        parent, _, name = o.rel.rpartition("/")
        by_dir[parent].add(name)
    out = []
    root = os.path.realpath(dest)
    for d, names in by_dir.items():
        starred = [n for n in names if "*" in n]
        folder = os.path.realpath(os.path.join(root, d))
        if folder != root and not folder.startswith(root.rstrip("/") + "/"):
            continue  # a folder that leads out of DEST (a symlink) is never searched, let alone cleaned
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for e in entries:
            n = e.name
            if n in names:
                continue
            k = len(n)
            hit = False
            while k > 0 and n[k - 1].isdigit():  # the common case: the name, then digits
                k -= 1
                if n[:k] in names and is_s5cmd_temp_name(n, n[:k]):
                    hit = True
                    break
            hit = hit or any(is_s5cmd_temp_name(n, t) for t in starred)
            if not hit:
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat_mod.S_ISREG(st.st_mode):
                out.append((f"{d}/{n}" if d else n, st.st_ino, st.st_uid))
    return out


class TempTracker:
    """Tells s5cmd's temporaries of this job from look-alikes that were in DEST before it started."""

    def __init__(self, dest: Path, objects: list[PulledObject], before: set[tuple[str, int]] | None) -> None:
        self.dest = dest
        self.objects = objects
        #: None: nothing recorded, so nothing can be proven ours (s5cmd never started).
        self.before = before

    @classmethod
    def snapshot(cls, dest: Path, objects: list[PulledObject], job_dir: Path | None) -> TempTracker:
        """Record the look-alikes present now (in the job directory, for a later cleanup)."""
        before = {(rel, ino) for rel, ino, _uid in _temp_candidates(dest, objects)}
        if job_dir is not None:
            write_job_file(job_dir / SNAPSHOT_FILE, json.dumps(sorted(before)))
        return cls(dest, objects, before)

    @classmethod
    def load(cls, dest: Path, objects: list[PulledObject], job_dir: Path | None) -> TempTracker:
        before = None
        if job_dir is not None:
            try:
                before = {(str(r), int(i)) for r, i in json.loads((job_dir / SNAPSHOT_FILE).read_text())}
            except (OSError, ValueError, TypeError):
                before = None
        return cls(dest, objects, before)

    def ours(self) -> list[Path]:
        """The job's own in-flight temporaries (none when nothing was recorded before s5cmd ran)."""
        if self.before is None:
            return []
        uid = os.getuid()
        return [
            self.dest / rel
            for rel, ino, owner in _temp_candidates(self.dest, self.objects)
            if (rel, ino) not in self.before and owner == uid
        ]

    def remove(self) -> int:
        n = 0
        for p in self.ours():
            with contextlib.suppress(OSError):
                p.unlink()
                n += 1
        return n


def in_flight_bytes(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            continue
        # s5cmd writes parts at their offsets, so st_size runs ahead of what has arrived.
        total += min(st.st_size, st.st_blocks * 512)
    return total


# -- the job directory and free space ----------------------------------------------------------


def write_job_file(path: Path, text: str) -> None:
    """Write a file of the job directory by rename; a full disk is one line naming it."""
    try:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise JobError(f"no space left to write {path} (the job directory)") from None
        raise JobError(f"cannot write {path}: {exc.strerror}") from None


def check_space(dest: Path, expected: list[PulledObject], total: int, ctx: JobContext) -> None:
    """Refuse a pull that does not fit: what is still needed at ``dest`` against what is free there."""
    if ctx.params.get("skip_space_check"):
        return
    present = 0
    for o in expected:
        try:
            present += (dest / o.rel).stat().st_size
        except OSError:
            pass
    st = os.statvfs(dest)
    free = st.f_bavail * st.f_frsize
    need = total - present
    if need > free:
        raise JobError(
            f"destination {dest} has {bytes_text(free)} free but the pull needs {bytes_text(need)}; "
            "free space or choose another --dest"
        )


def nospace_error(dest: Path, objects: list[PulledObject]) -> JobError:
    """One line naming the destination, what is still needed and what is free."""
    present = 0
    for o in objects:
        with contextlib.suppress(OSError):
            if (dest / o.rel).stat().st_size == o.size:
                present += o.size
    try:
        st = os.statvfs(dest)
        free = bytes_text(st.f_bavail * st.f_frsize)
    except OSError:
        free = "unknown"
    need = sum(o.size for o in objects) - present
    return JobError(
        f"no space left on the device of {dest}: the pull still needs {bytes_text(need)} and {free} is "
        "free; free space or choose another DEST"
    )


def is_nospace(text: str) -> bool:
    return "no space left on device" in text.lower()
