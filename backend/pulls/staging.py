"""Staging mode of a pull's copy: one wildcard ``s5cmd cp`` into a private folder inside DEST,
and only the planned objects, each proven, renamed into place.

Why: fed one exact ``cp`` per object through ``s5cmd run``, s5cmd spends ~2 ms of CPU and the
store ~0.7 ms per command (a stat of each source, connections opened and dropped); measured on
2,000 objects of 1 MiB, that shape is ~1.5x a wildcard ``cp`` of the same prefix, while the
wildcard copy into a staging folder plus the renames costs what the bare ``cp`` costs
(BENCHMARKS.md, #33). The wildcard lets s5cmd copy what *it* lists, so nothing it writes is
trusted:

- **Where s5cmd may write.** s5cmd joins each key to the destination folder with Go's
  ``filepath.Join``, which resolves ``..``: measured with v2.3.0, a key ``data/../../x`` copied
  from ``s3://b/data/*`` into ``DEST/.staging/`` is written at ``DEST/../x``. The copy is given
  ``--exclude`` patterns (:data:`EXCLUDES`) for every key whose place is not
  ``staging/<key less the prefix>`` as written (``..`` anywhere, empty and ``.`` segments,
  a leading or trailing ``/``), and each object s5cmd reports is classified by its source key
  (:func:`classify`): a report whose file is anywhere but that exact path stops the job.
- **What reaches DEST.** Only a planned key whose report names exactly its staging path, with
  the planned size, is proven (:class:`backend.pulls.verify.PullVerifier`, from the staging
  path) and then renamed into DEST (:meth:`Staging.place`, with the same symlink and
  outside-DEST rules as the per-object copy, :func:`backend.pulls.destination.outside_dest`).
- **The quote.** Keys added to the prefix after the plan are copied by s5cmd all the same: their
  bytes are counted (``unplanned_bytes`` in progress and result, which the ledger adds), their
  files deleted from staging at once, and past :func:`unplanned_cap` s5cmd is killed and the
  job fails naming the first such key. Under the cap the job succeeds and says what it moved.
- **Afterwards.** The staging folder is removed on every outcome, and by the job's cleanup
  (cancel, a lost runner) when it is the folder this job created (its inode, recorded in the
  job directory).

Used only where the plan's listing is exactly what the wildcard copies (:func:`refusal`).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import posixpath
import re
import shutil
import stat as stat_mod
import threading
from dataclasses import dataclass
from pathlib import Path

from backend.pulls.destination import outside_dest, write_job_file
from backend.pulls.objects import PulledObject, SourcePattern, rel_problem
from backend.pulls.params import PullParams

STAGING_PREFIX = ".loadmaster-staging-"
#: In the job directory: the staging folder this job created (path, device, inode).
STAGING_FILE = "staging.json"
#: From this many objects up the staging mode is used. The per-object shape costs ~2.7 ms of CPU
#: a command (s5cmd's and the store's), nothing next to 16 large objects and ~5 s at 2,000.
MIN_OBJECTS = 64
#: Unplanned bytes allowed before the copy is stopped: 1% of the planned bytes, at most 64 MiB.
UNPLANNED_CAP_FRACTION = 0.01
UNPLANNED_CAP_MAX = 64 << 20
#: Folders of DEST kept open at once for the renames into them (the least recently used closed).
OPEN_FOLDERS = 64
#: s5cmd ``--exclude`` patterns (wildcards over the key less the source's prefix, anchored, ``*``
#: across ``/`` and newlines): every key Go's ``filepath.Join`` would not place at
#: ``staging/<rel>`` as written. ``*..*`` also covers ``..`` segments (and names such as ``a..b``,
#: which is why a plan with one is copied per object).
EXCLUDES = ("*..*", "*//*", "/*", "*/", "./*", "*/./*", "*/.", ".")
_EXCLUDE_RES = [re.compile("(?s)^" + ".*".join(map(re.escape, p.split("*"))) + "$") for p in EXCLUDES]


def excluded(rel: str) -> bool:
    """Whether s5cmd's ``--exclude`` patterns (:data:`EXCLUDES`) skip the key that lands at ``rel``."""
    return any(r.match(rel) for r in _EXCLUDE_RES)


def refusal(src: SourcePattern, expected: list[PulledObject], params: PullParams, plain_hooks: bool) -> str | None:
    """Why this pull is copied one object per command rather than staged; None when staging applies.

    Deny by default: staged only when s5cmd's wildcard copies exactly the plan's keys (a source
    that is a whole prefix, no key the exclusions skip) and it pays (:data:`MIN_OBJECTS`)."""
    mode = params.get("copy_mode")
    if mode == "per-object":
        return "the spec asks for it"
    if not plain_hooks:
        return "a relay seed forwards each object as it lands"
    if params.get("pipeline"):
        return "the spec's pipeline takes large objects a few at a time"
    if src.pattern is None or src.pattern != src.base + "*" or (src.base and not src.base.endswith("/")):
        return "the source is not a whole prefix (s5cmd's wildcard would not select exactly the plan's keys)"
    if len(expected) < MIN_OBJECTS and mode != "staging":
        return f"{len(expected)} objects (staged from {MIN_OBJECTS})"
    for o in expected:
        if excluded(o.rel) or rel_problem(o.rel) is not None:
            return f"key {src.key_of(o.rel)!r} is one the staged copy excludes"
        if o.rel.split("/", 1)[0].startswith(STAGING_PREFIX):
            return f"key {src.key_of(o.rel)!r} would share the staging folder's name"
    return None


def unplanned_cap(params: PullParams, total: int) -> int:
    """Bytes of objects not in the plan a staged copy may move before it is stopped
    (``unplanned_cap_bytes`` in the spec, else 1% of the planned bytes, at most 64 MiB)."""
    if (cap := params.get("unplanned_cap_bytes")) is not None:
        return max(0, cap)
    return min(UNPLANNED_CAP_MAX, int(total * UNPLANNED_CAP_FRACTION))


# -- what a line of s5cmd's output means ---------------------------------------------------------


@dataclass(frozen=True)
class Reported:
    """One object s5cmd reports copied: the planned object's index (None: not in the plan), and
    why its file is not where the staged copy lets s5cmd write (None: it is)."""

    index: int | None
    key: str
    path: str
    escaped: str | None = None


def classify(src: SourcePattern, index_of: dict[str, int], staging: str, source: str, destination: str) -> Reported:
    """Classify s5cmd's report of ``source`` copied to ``destination`` in a copy into ``staging``.

    The planned object is found by the *source key* (never by the destination path: an unplanned
    ``x/../a`` lands where planned ``a`` does), and only when the destination is exactly
    ``staging/<rel>``; a destination outside ``staging`` is an escape."""
    prefix = f"s3://{src.bucket}/"
    key = source[len(prefix) :] if source.startswith(prefix) else source
    inside = posixpath.normpath(destination).startswith(staging.rstrip("/") + "/")
    if not source.startswith(prefix) or not key.startswith(src.base):
        return Reported(None, key, destination, None if inside else "written outside the staging folder")
    rel = key[len(src.base) :]
    exact = rel_problem(rel) is None and destination == f"{staging.rstrip('/')}/{rel}"
    if exact:
        return Reported(index_of.get(rel), key, destination)
    return Reported(None, key, destination, None if inside else "written outside the staging folder")


# -- the staging folder --------------------------------------------------------------------------


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _in_the_way(fd: int, parent: str, name: str, root: str) -> str | None:
    """Why ``name`` in the open folder ``fd`` (at ``parent``) must not be renamed over: a symlink
    that leads out of DEST or to a folder (:func:`outside_dest`'s rule for the target)."""
    try:
        st = os.lstat(name, dir_fd=fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be checked: {exc.strerror}"
    if stat_mod.S_ISLNK(st.st_mode):
        target = os.path.realpath(os.path.join(parent, name))
        if not _within(target, root) or os.path.isdir(target):
            return f"is a symlink to {target}"
    return None


class Staging:
    """The private folder one staged copy writes into, and what it let into DEST."""

    def __init__(self, dest: Path, path: Path, cap: int) -> None:
        self.dest = dest
        self.root = os.path.realpath(dest)
        self.path = path
        self.cap = cap
        self._lock = threading.Lock()
        #: Folders of DEST open for the renames: path -> (descriptor, (device, inode)).
        self._fds: collections.OrderedDict[str, tuple[int, tuple[int, int]]] = collections.OrderedDict()
        self.placed: set[str] = set()
        self.unplanned_bytes = 0
        self.unplanned_keys: list[str] = []

    @classmethod
    def create(cls, dest: Path, job_id: str, job_dir: Path | None, cap: int) -> Staging:
        """Create ``DEST/.loadmaster-staging-<job>`` (0700; ``mkdir`` never follows a symlink and
        fails on anything already there) and record it in the job directory for the cleanup."""
        name = STAGING_PREFIX + (re.sub(r"[^A-Za-z0-9_.-]", "_", job_id) or "job")
        path = Path(os.path.realpath(dest)) / name
        os.mkdir(path, 0o700)
        st = os.lstat(path)
        if job_dir is not None:
            write_job_file(job_dir / STAGING_FILE, json.dumps({"path": str(path), "dev": st.st_dev, "ino": st.st_ino}))
        return cls(dest, path, cap)

    def url(self) -> str:
        """The destination s5cmd is given (a folder: the trailing slash)."""
        return str(self.path) + "/"

    def place(self, o: PulledObject) -> str | None:
        """Rename the proven ``o`` from staging into DEST; why not, or None when done. The
        folders it needs are created and checked as the per-object copy checks them.

        Each folder is checked once (:func:`outside_dest`, then the descriptor it was opened as),
        kept open, and renamed into through that descriptor while its path still leads to the
        same folder (one ``stat``): a folder swapped for a symlink after its check cannot take
        the rename elsewhere, and a path that now leads elsewhere is checked again. Measured on
        2,000 objects in 4 folders, DEST 5 levels deep: 22 us of CPU per object, against 58 us
        resolving DEST, the folder and the target path anew for each."""
        parent_rel, _, name = o.rel.rpartition("/")
        parent = os.path.join(self.root, parent_rel) if parent_rel else self.root
        try:
            with self._lock:  # a folder's descriptor is used, and closed, only under the lock
                fd = self._folder(parent, o)
                if isinstance(fd, str):
                    return fd
                why = _in_the_way(fd, parent, name, self.root)
                if why:
                    return f"would be written outside DEST: it {why}"
                os.rename(self.path / o.rel, name, dst_dir_fd=fd)
                self.placed.add(o.rel)
        except OSError as exc:
            return f"could not be moved into DEST: {exc.strerror or exc}"
        return None

    def _folder(self, parent: str, o: PulledObject) -> int | str:
        """The open folder ``o`` is renamed into, or why not (the caller holds the lock)."""
        kept = self._fds.get(parent)
        if kept is not None:
            fd, ident = kept
            try:
                st = os.stat(parent)
            except OSError:
                st = None
            if st is not None and (st.st_dev, st.st_ino) == ident:
                self._fds.move_to_end(parent)
                return fd
            del self._fds[parent]  # the path leads elsewhere now: checked again below
            os.close(fd)
        escaped = outside_dest(self.dest, [o])
        if escaped:
            return f"would be written outside DEST: it {escaped[0][1]}"
        os.makedirs(parent, exist_ok=True)
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")  # the folder opened, whatever the path did
        except OSError:
            real = os.path.realpath(parent)
        if not _within(real, self.root):
            os.close(fd)
            return f"its folder resolves to {real}, outside {self.root}"
        st = os.fstat(fd)
        self._fds[parent] = (fd, (st.st_dev, st.st_ino))
        if len(self._fds) > OPEN_FOLDERS:
            os.close(self._fds.popitem(last=False)[1][0])
        return fd

    def close(self) -> None:
        """Close the folders kept open for the renames."""
        with self._lock:
            while self._fds:
                os.close(self._fds.popitem()[1][0])

    def unplanned(self, r: Reported, size: int, *, delete: bool = True) -> bool:
        """Count an object that is not in the plan (or not as planned: another size) and, with
        ``delete``, delete its file from staging; True once the unplanned bytes are over the cap."""
        with self._lock:
            self.unplanned_bytes += size
            self.unplanned_keys.append(r.key)
            over = self.unplanned_bytes > self.cap
        if delete and r.escaped is None and _within(posixpath.normpath(r.path), str(self.path)):
            with contextlib.suppress(OSError):
                if stat_mod.S_ISREG(os.lstat(r.path).st_mode):
                    os.unlink(r.path)
        return over

    def remove(self) -> None:
        """Remove the staging folder and what is left in it (never through a symlink)."""
        self.close()
        _remove_if_ours(self.path, None)


def _remove_if_ours(path: Path, ident: tuple[int, int] | None) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat_mod.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return False
    if ident is not None and (st.st_dev, st.st_ino) != ident:
        return False
    shutil.rmtree(path, ignore_errors=True)  # fd-based on Linux: symlinks inside are unlinked, not followed
    return not path.exists()


def cleanup_staging(job_dir: Path | None) -> str | None:
    """Remove the staging folder this job recorded, if it is still the one it created; a line
    for the log, or None when there was none."""
    if job_dir is None:
        return None
    try:
        rec = json.loads((job_dir / STAGING_FILE).read_text())
        path, ident = Path(str(rec["path"])), (int(rec["dev"]), int(rec["ino"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not path.name.startswith(STAGING_PREFIX):
        return f"not removing {path}: not a staging folder's name"
    if _remove_if_ours(path, ident):
        return f"removed the staging folder {path}"
    return None if not os.path.lexists(path) else f"left {path}: not the folder this job created"
