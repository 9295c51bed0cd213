"""``loadmaster pull``: copy s3:// objects into a directory on nodes with s5cmd, as durable jobs.

Console side (:func:`plan_pull`, :func:`launch_pull`): list the source for object count, bytes and
ETags (refusing any key that would land outside DEST), probe each node's free space, NIC line
rate and s5cmd, price the egress, then launch one job per node. Node side (:func:`run_pull_job`):
check every key again and every destination path against symlinks out of DEST, then feed
``s5cmd run`` one exact ``cp`` per object (never a wildcard s5cmd would expand from its own
listing), with credentials from a 0600 shared-credentials file (never argv); report bytes done
from completed objects plus the job's own temporary files; treat any ERROR line as failure even
when s5cmd exits 0; verify every object's size, its size and ETag in a fresh listing, and its
bytes against a plain-MD5 ETag before reporting success. Cleanup removes only s5cmd temporaries
the job created (look-alikes present before it started are recorded and left alone).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import errno
import fnmatch
import hashlib
import json
import logging
import os
import posixpath
import re
import shlex
import shutil
import signal
import stat as stat_mod
import subprocess
import tempfile
import threading
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, NamedTuple

from backend.agent.context import JobContext
from backend.credentials import Credentials
from backend.errors import (
    ConfigError,
    JobError,
    LoadmasterError,
    NodeUnreachable,
    PolicyError,
    StoreError,
)

# The node-side runner imports this module on every job start: what only the console needs
# (asyncio, the S3 client) is imported where it is used.
if TYPE_CHECKING:
    from backend.config import Config, StoreProfile
    from backend.jobs.manager import JobManager, JobRecord

WILDCARDS = "*?["
CREDS_PROFILE = "loadmaster"
CREDS_FILE = "aws-credentials"
EXPECTED_FILE = "expected.json"

log = logging.getLogger(__name__)

#: Presets offered by the console and ``--preset``: (numworkers, concurrency, part size MiB).
PRESETS: dict[str, tuple[int, int, int]] = {
    "tuned": (256, 32, 64),       # the brief's tuned command: many objects, big parts
    "large-objects": (64, 64, 128),  # few multi-GB objects: parallelism inside each object
    "small-objects": (512, 4, 8),  # millions of small shards: parallelism across objects
    "gentle": (32, 8, 64),        # share the NIC with a running training job
}


# -- source patterns --------------------------------------------------------------------------


@dataclass(frozen=True)
class SourcePattern:
    """An ``s3://`` source as s5cmd takes it: bucket, listing prefix and key pattern."""

    url: str          # what s5cmd is given (a bare prefix ending in / gets a "*")
    bucket: str
    base: str         # key prefix up to the last "/" before the first wildcard (destination root)
    pattern: str | None  # fnmatch pattern over full keys; None for a single object

    def rel(self, key: str) -> str:
        """Where ``key`` lands under the destination directory (as s5cmd places it)."""
        if self.pattern is None:
            return PurePosixPath(key).name
        return key[len(self.base):]

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
    key = src[5 + len(bucket):].lstrip("/")
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
        bad = [(o.rel, "is also a folder of other keys (a file and a folder cannot share a path)")
               for o in objects if any(p in seen for p in _parents(o.rel))]
        if not bad and dup:
            bad = [(next(r for r in seen if sum(o.rel == r for o in objects) > 1), "is listed twice")]
    if bad:
        rel, why = bad[0]
        more = f" (and {len(bad) - 1} more such keys)" if len(bad) > 1 else ""
        raise StoreError(f"refusing to pull {src.url}: key {src.key_of(rel)!r} {why}; it would be written "
                         f"outside DEST or over another object{more}. Rename or remove it, or narrow the source")


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


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
            out.append((o.rel, f"its folder resolves to {os.path.realpath(os.path.join(root, parent))}, "
                               f"outside {root} (a symlink in DEST)"))
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


def parse_expected(raw: list[Any]) -> list[PulledObject]:
    """The spec's expected objects ([rel, size] or [rel, size, etag] each)."""
    out = []
    for item in raw:
        if not isinstance(item, list | tuple) or len(item) not in (2, 3):
            raise JobError(f"malformed expected object in the job spec: {str(item)[:80]!r}")
        etag = item[2] if len(item) == 3 and item[2] else None
        out.append(PulledObject(str(item[0]), int(item[1]), None if etag is None else str(etag)))
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
    return (s.isascii() and s.isdigit() and (s == "0" or s[0] != "0") and len(s) <= 10
            and int(s) <= _UINT32_MAX)


def is_s5cmd_temp_name(name: str, target: str) -> bool:
    """Whether ``name`` fits s5cmd's temporary-file scheme for the destination file ``target``."""
    pos = target.rfind("*")
    prefix, suffix = (target[:pos], target[pos + 1:]) if pos >= 0 else (target, "")
    if len(name) <= len(prefix) + len(suffix) or not name.startswith(prefix) or not name.endswith(suffix):
        return False
    return _go_random(name[len(prefix):len(name) - len(suffix)])


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
            _write_job_file(job_dir / SNAPSHOT_FILE, json.dumps(sorted(before)))
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
        return [self.dest / rel for rel, ino, owner in _temp_candidates(self.dest, self.objects)
                if (rel, ino) not in self.before and owner == uid]

    def remove(self) -> int:
        n = 0
        for p in self.ours():
            with contextlib.suppress(OSError):
                p.unlink()
                n += 1
        return n


def _in_flight_bytes(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            continue
        # s5cmd writes parts at their offsets, so st_size runs ahead of what has arrived.
        total += min(st.st_size, st.st_blocks * 512)
    return total


# -- the node-side runner ---------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the s5cmd child: be killed when the runner dies (kill -9 leaves no stray s5cmd)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _dest(params: dict[str, Any]) -> Path:
    return Path(os.path.expanduser(str(params["dest"])))


def _s5cmd_base(params: dict[str, Any]) -> list[str]:
    cmd = [str(params.get("s5cmd") or "s5cmd"), "--json", "--numworkers", str(int(params["numworkers"]))]
    if params.get("endpoint_url"):
        cmd += ["--endpoint-url", str(params["endpoint_url"])]
    return cmd


def _s5cmd_env(ctx: JobContext, workdir: Path) -> tuple[dict[str, str], Path | None]:
    """The environment for s5cmd: a 0600 shared-credentials file, region, no IMDS."""
    env = dict(os.environ)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        env.pop(k, None)
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    region = ctx.params.get("region")
    if region and region != "auto":
        env["AWS_REGION"] = str(region)
    creds = Credentials.from_env(ctx.secret_env())
    creds_path = None
    if creds is not None:
        creds_path = workdir / CREDS_FILE
        fd = os.open(creds_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(creds.shared_credentials_file(CREDS_PROFILE))
        env["AWS_SHARED_CREDENTIALS_FILE"] = str(creds_path)
        env["AWS_PROFILE"] = CREDS_PROFILE
    elif ctx.params.get("profile"):
        env["AWS_PROFILE"] = str(ctx.params["profile"])
    return env, creds_path


def _error_text(line: str) -> str | None:
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


def _parse_s5cmd_listing(src: SourcePattern, stdout: str) -> list[PulledObject]:
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
        key, size = k[len(prefix):], int(d.get("size", 0))
        if d.get("type") == "directory" and (size == 0 or not key.endswith("/")):
            continue
        if src.matches(key) and not is_folder_marker(key, size):  # a bare key is listed as a prefix
            out.append(PulledObject(src.rel(key), size, str(d.get("etag") or "").strip('"') or None))
    return sorted(out)


def _list_on_node(ctx: JobContext, src: SourcePattern, env: dict[str, str]) -> list[PulledObject]:
    cmd = [*_s5cmd_base(ctx.params), "ls", src.url]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, errors="surrogateescape")
    errors = [e for e in map(_error_text, (res.stdout + "\n" + res.stderr).split("\n")) if e]
    if res.returncode != 0 or errors:
        raise JobError(f"listing {src.url} failed: {errors[0] if errors else res.stderr.strip()}")
    return _parse_s5cmd_listing(src, res.stdout)


def _nospace_error(dest: Path, objects: list[PulledObject]) -> JobError:
    """One line naming the destination, what is still needed and what is free."""
    present = 0
    for o in objects:
        with contextlib.suppress(OSError):
            if (dest / o.rel).stat().st_size == o.size:
                present += o.size
    try:
        st = os.statvfs(dest)
        free = _fmt(st.f_bavail * st.f_frsize)
    except OSError:
        free = "unknown"
    need = sum(o.size for o in objects) - present
    return JobError(f"no space left on the device of {dest}: the pull still needs {_fmt(need)} and {free} is "
                    "free; free space or choose another DEST")


def _is_nospace(text: str) -> bool:
    return "no space left on device" in text.lower()


def run_pull_job(ctx: JobContext) -> dict[str, Any]:
    """Run s5cmd for the pull in ``ctx.params``, report progress, verify every object; the result details."""
    p = ctx.params
    src = parse_source(str(p["src"]))
    dest = _dest(p)
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise JobError(f"cannot create destination {dest}: {exc.strerror}") from None
    workdir = ctx.job_dir or Path(tempfile.mkdtemp(prefix="lm-pull-"))
    env, creds_path = _s5cmd_env(ctx, workdir)
    try:
        if p.get("expected") is not None:
            expected = parse_expected(p["expected"])
        else:
            ctx.log(f"listing {src.url} on the node")
            expected = _list_on_node(ctx, src, env)
        # Refused again here, whatever the console checked: the spec or the node's own listing
        # could name a key that would land outside DEST.
        try:
            check_objects(src, expected)
        except StoreError as exc:
            raise JobError(str(exc)) from None
        if p.get("expected") is None and ctx.job_dir is not None:
            _write_job_file(ctx.job_dir / EXPECTED_FILE, json.dumps(expected))
        if not expected:
            raise JobError(f"no objects match {src.url}")
        escaped = outside_dest(dest, expected)
        if escaped:
            rel, why = escaped[0]
            more = f" (and {len(escaped) - 1} more)" if len(escaped) > 1 else ""
            raise JobError(f"refusing to write {dest / rel}: it {why}{more}; nothing was pulled")
        total = sum(o.size for o in expected)
        _check_space(dest, expected, total, ctx)
        return _copy(ctx, src, dest, expected, total, env)
    finally:
        if creds_path is not None:
            creds_path.unlink(missing_ok=True)
        if ctx.job_dir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _write_job_file(path: Path, text: str) -> None:
    """Write a file of the job directory by rename; a full disk is one line naming it."""
    try:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise JobError(f"no space left to write {path} (the job directory)") from None
        raise JobError(f"cannot write {path}: {exc.strerror}") from None


def _check_space(dest: Path, expected: list[PulledObject], total: int, ctx: JobContext) -> None:
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
        raise JobError(f"destination {dest} has {_fmt(free)} free but the pull needs {_fmt(need)}; "
                       "free space or choose another --dest")


def _fmt(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n} B"


def _commands(src: SourcePattern, dest: Path, expected: list[PulledObject], params: dict[str, Any]) -> str:
    """One ``cp`` per object for ``s5cmd run``: the source key exact (--raw: no wildcards), the
    destination a file path the runner checked, never a directory s5cmd fills from its own listing."""
    opts = f"cp --raw --concurrency {int(params['concurrency'])} --part-size {int(params['part_size_mib'])}"
    return "".join(f"{opts} {shlex.quote(f's3://{src.bucket}/{src.key_of(o.rel)}')} {shlex.quote(str(dest / o.rel))}\n"
                   for o in expected)


def _copy(ctx: JobContext, src: SourcePattern, dest: Path, expected: list[PulledObject], total: int,
          env: dict[str, str]) -> dict[str, Any]:
    p = ctx.params
    cmd = [*_s5cmd_base(p), "run"]
    ctx.log(f"running: {shlex.join(cmd)} ({len(expected)} cp commands on stdin)")  # credentials: a file in env
    if ctx.cancelled:
        raise JobError("cancelled before the copy started")
    temps = TempTracker.snapshot(dest, expected, ctx.job_dir)
    started = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE,
                            env=env, text=True, errors="surrogateescape",
                            preexec_fn=_die_with_parent)  # noqa: PLW1509
    done = {"bytes": 0, "items": 0}
    errors: list[str] = []
    lock = threading.Lock()
    script = _commands(src, dest, expected, p)

    def feed() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(OSError):  # s5cmd gone (cancelled): the exit status tells
            proc.stdin.write(script)
        with contextlib.suppress(OSError):
            proc.stdin.close()

    def read_out() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            err = _error_text(line)
            with lock:
                if err:
                    errors.append(err)
                    continue
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                if d.get("success") and d.get("operation") == "cp":
                    done["bytes"] += int((d.get("object") or {}).get("size", 0))
                    done["items"] += 1

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err = _error_text(line)
            if err:
                with lock:
                    errors.append(err)

    exited = threading.Event()

    def reap() -> None:
        # A blocking wait, so the loop below learns of the exit at once (Popen.wait with a timeout
        # polls, with sleeps of up to 50 ms).
        with contextlib.suppress(Exception):
            proc.wait()
        exited.set()

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True),
               threading.Thread(target=feed, daemon=True)]
    for r in [*readers, threading.Thread(target=reap, daemon=True)]:
        r.start()
    window: collections.deque[tuple[float, int]] = collections.deque()
    n_items = len(expected)
    terminated = False

    def report(final: bool = False) -> None:
        with lock:
            b, i = done["bytes"], done["items"]
        now = time.time()
        b = min(total, b + (0 if final else _in_flight_bytes(temps.ours())))
        window.append((now, b))
        while len(window) > 2 and now - window[0][0] > 3.0:
            window.popleft()
        rate = (b - window[0][1]) / (now - window[0][0]) if now > window[0][0] else 0.0
        extra: dict[str, Any] = {"rate_bps": max(0.0, rate)}
        if final:
            extra["final"] = True
            extra["rate_bps"] = b / max(1e-6, now - started)
        ctx.progress(bytes_done=b, bytes_total=total, items_done=i, items_total=n_items, **extra)

    try:
        report()
        while not exited.wait(0.5):
            if ctx.cancelled and not terminated:
                ctx.log("cancel requested: stopping s5cmd")
                proc.terminate()
                terminated = True
            report()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for r in readers:
            r.join(timeout=10)
    elapsed = time.time() - started
    if ctx.cancelled:
        temps.remove()
        raise JobError("cancelled")
    if proc.returncode != 0 or errors:
        temps.remove()
        for e in errors[:20]:
            ctx.log(f"s5cmd: {e}")
        if any(_is_nospace(e) for e in errors):
            raise _nospace_error(dest, expected)
        more = f" (+{len(errors) - 1} more errors)" if len(errors) > 1 else ""
        first = errors[0] if errors else "no error output"
        raise JobError(f"s5cmd exited {proc.returncode}: {first}{more}")
    temps.remove()
    checked = _verify(ctx, src, dest, expected, env)
    report(final=True)
    ctx.log(f"verified {n_items} objects, {total} bytes in {elapsed:.1f}s ({checked} by MD5)")
    return {"objects": n_items, "bytes": total, "seconds": round(elapsed, 3), "dest": str(dest),
            "gbps": round(total * 8 / 1e9 / max(elapsed, 1e-6), 3), "md5_verified": checked}


# -- verification -------------------------------------------------------------------------------

_MD5_ETAG = re.compile(r"[0-9a-f]{32}")


def _md5_of(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def _kms_encrypted(ctx: JobContext, src: SourcePattern, rel: str, env: dict[str, str]) -> bool:
    """Whether S3 says the object is SSE-KMS encrypted (its ETag is then not an MD5 of the bytes)."""
    cmd = [*_s5cmd_base(ctx.params), "head", "--raw", f"s3://{src.bucket}/{src.key_of(rel)}"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        for line in res.stdout.split("\n"):
            with contextlib.suppress(ValueError, AttributeError):
                if str(json.loads(line).get("server_side_encryption", "")).startswith("aws:kms"):
                    return True
    return False


def _verify(ctx: JobContext, src: SourcePattern, dest: Path, expected: list[PulledObject],
            env: dict[str, str]) -> int:
    """Every object's size on disk, its size and ETag in a fresh listing against the one the job
    started from, and the bytes against a plain-MD5 ETag; a wrong file is removed. Returns the
    number of objects checked by MD5."""
    bad: dict[str, str] = {}
    for o in expected:
        try:
            got = (dest / o.rel).stat().st_size
        except OSError:
            bad[o.rel] = "missing"
            continue
        if got != o.size:
            bad[o.rel] = f"is {got} bytes, the listing says {o.size}"
    now = {o.rel: o for o in _list_on_node(ctx, src, env)}
    etags: dict[str, str] = {}
    for o in expected:
        cur = now.get(o.rel)
        if o.rel in bad:
            continue
        if cur is None:
            bad[o.rel] = "was deleted from the bucket during the pull"
        elif cur.size != o.size or (o.etag and cur.etag and cur.etag != o.etag):
            bad[o.rel] = (f"changed in the bucket during the pull (ETag {o.etag}, now {cur.etag}; "
                          f"{o.size} bytes, now {cur.size}): the file may mix two versions")
        elif etag := (o.etag or cur.etag or ""):
            etags[o.rel] = etag
    plain = [(rel, e) for rel, e in etags.items() if _MD5_ETAG.fullmatch(e)]
    if plain:
        ctx.log(f"checking the bytes of {len(plain)} single-part objects against their MD5 ETags")
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            digests = dict(zip((r for r, _ in plain), pool.map(lambda r: _md5_of(dest / r), (r for r, _ in plain)),
                               strict=True))
        for rel, e in plain:
            if digests[rel] != e and not _kms_encrypted(ctx, src, rel, env):
                bad[rel] = f"has MD5 {digests[rel]} but the object's ETag is {e}: torn or corrupted in transit"
    if bad:
        for rel in bad:
            with contextlib.suppress(OSError):
                if (dest / rel).is_file() and not (dest / rel).is_symlink():
                    (dest / rel).unlink()
        detail = "; ".join(f"{rel} {why}" for rel, why in list(bad.items())[:3])
        raise JobError(f"verification failed: {len(bad)} of {len(expected)} objects wrong (removed): {detail}")
    return len(plain)


def cleanup(ctx: JobContext) -> None:
    """Remove the job's own s5cmd temporaries; complete objects and every file that was in DEST before stay."""
    dest = _dest(ctx.params)
    raw = ctx.params.get("expected")
    if raw is None and ctx.job_dir is not None and (ctx.job_dir / EXPECTED_FILE).exists():
        raw = json.loads((ctx.job_dir / EXPECTED_FILE).read_text())
    if ctx.job_dir is not None:
        (ctx.job_dir / CREDS_FILE).unlink(missing_ok=True)
    if raw:
        objects = parse_expected(raw)
        # Only names that are plain paths inside DEST are looked at (a forged spec reaches nothing else).
        objects = [o for o in objects if rel_problem(o.rel) is None]
        tracker = TempTracker.load(dest, objects, ctx.job_dir)
        if tracker.before is None:
            ctx.log("no record of DEST before s5cmd started: nothing of it is this job's to remove")
            return
        n = tracker.remove()
        ctx.log(f"removed {n} partial file(s) under {dest}")


# -- the console side -------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeEstimate:
    """One destination node's pre-launch facts."""

    node: str
    dest: str
    free_bytes: int | None = None
    present_bytes: int = 0
    line_rate_gbps: float | None = None
    line_rate_known: bool = False
    s5cmd: bool = False
    error: str | None = None
    #: The destination directory already exists (files in it may count as present).
    dest_exists: bool = False

    def needed(self, total: int) -> int:
        return max(0, total - self.present_bytes)

    def fits(self, total: int) -> bool:
        return self.error is None and self.free_bytes is not None and self.needed(total) <= self.free_bytes

    def eta_s(self, total: int) -> float | None:
        if not self.line_rate_gbps:
            return None
        return self.needed(total) * 8 / (self.line_rate_gbps * 1e9)

    def problem(self, total: int) -> str | None:
        """Why this node cannot take the pull, or None."""
        if self.error:
            return self.error
        if not self.s5cmd:
            return f"{self.node}: s5cmd is not installed on the node (install it or set [jobs] s5cmd)"
        if not self.fits(total):
            return (f"{self.node}: {self.dest} has {_fmt(self.free_bytes or 0)} free but the pull needs "
                    f"{_fmt(self.needed(total))}")
        return None


@dataclass(frozen=True)
class PullPlan:
    """Everything shown before a pull starts: what, where, how big, whether it fits, what it costs."""

    src: str
    dest: str
    store: str | None
    objects: tuple[PulledObject, ...]
    total_bytes: int
    nodes: tuple[NodeEstimate, ...]
    numworkers: int
    concurrency: int
    part_size_mib: int
    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    egress: Any = None   # backend.policy.egress.GuardDecision when the guard is available
    egress_note: str | None = None
    #: The store's resolved credentials for the jobs' secrets files (never shown or serialised).
    credentials: Any = field(default=None, repr=False, compare=False)

    @property
    def problems(self) -> list[str]:
        return [p for n in self.nodes if (p := n.problem(self.total_bytes))]

    @property
    def eta_s(self) -> float | None:
        etas = [e for n in self.nodes if (e := n.eta_s(self.total_bytes)) is not None]
        return max(etas) if etas else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "src": self.src, "dest": self.dest, "store": self.store, "objects": len(self.objects),
            "bytes": self.total_bytes, "numworkers": self.numworkers, "concurrency": self.concurrency,
            "part_size_mib": self.part_size_mib, "eta_s": self.eta_s, "problems": self.problems,
            "nodes": [{"node": n.node, "dest": n.dest, "free_bytes": n.free_bytes, "fits": n.fits(self.total_bytes),
                       "line_rate_gbps": n.line_rate_gbps, "line_rate_known": n.line_rate_known,
                       "eta_s": n.eta_s(self.total_bytes), "error": n.error} for n in self.nodes],
            "egress": self.egress.as_dict() if self.egress is not None and hasattr(self.egress, "as_dict") else None,
            "egress_note": self.egress_note,
        }


def node_dest(dest: str, scratch: str) -> str:
    """DEST as the node sees it: absolute, ``~/...``, or relative to the node's scratch dir."""
    if dest.startswith("/") or dest.startswith("~"):
        return dest.rstrip("/") or "/"
    return f"{scratch.rstrip('/')}/{dest.strip('/')}"


_PROBE = r"""
D="$1"; case "$D" in "~"*) D="$HOME${D#\~}";; esac
d="$D"; while [ ! -d "$d" ]; do d=$(dirname "$d"); done
echo "@@DF $(df -Pk "$d" | tail -n 1 | awk '{print $4}')"
for i in /sys/class/net/*; do [ -e "$i/device" ] && echo "@@SPEED $(cat "$i/speed" 2>/dev/null)"; done
command -v "$2" >/dev/null 2>&1 && echo "@@S5CMD 1"
present=0
[ -d "$D" ] && echo "@@DEST 1"
if [ -d "$D" ]; then
  while IFS= read -r f; do [ -f "$D/$f" ] && present=$((present + $(stat -c %s "$D/$f"))); done
fi
echo "@@PRESENT $present"
"""


async def probe_node(transport: Any, dest: str, rels: list[str], s5cmd: str) -> NodeEstimate:
    """Free space at ``dest``, NIC line rate, s5cmd presence and bytes already there, on one node."""
    res = await transport.run(f"sh -c {shlex.quote(_PROBE)} probe {shlex.quote(dest)} {shlex.quote(s5cmd)}",
                              input="\n".join(rels) + "\n", timeout=120)
    free = None
    speeds: list[int] = []
    s5 = False
    present = 0
    dest_exists = False
    for line in res.stdout.splitlines():
        tag, _, v = line.partition(" ")
        v = v.strip()
        if tag == "@@DF" and v.isdigit():
            free = int(v) * 1024
        elif tag == "@@SPEED" and v.lstrip("-").isdigit() and int(v) > 0:
            speeds.append(int(v))
        elif tag == "@@S5CMD":
            s5 = True
        elif tag == "@@PRESENT" and v.isdigit():
            present = int(v)
        elif tag == "@@DEST":
            dest_exists = True
    err = None if free is not None else f"{transport.name}: cannot read free space at {dest}: {res.stderr.strip()}"
    return NodeEstimate(node=transport.name, dest=dest, free_bytes=free, present_bytes=present,
                        line_rate_gbps=max(speeds) / 1000 if speeds else None, line_rate_known=bool(speeds),
                        s5cmd=s5, error=err, dest_exists=dest_exists)


def resolve_store(config: Config, src: str, store: str | None) -> StoreProfile | None:
    """The store profile that supplies endpoint, region and credentials for ``src``."""
    if store:
        prof = config.store(store)
        if not prof.is_s3:
            raise ConfigError(f"store {store!r} is a local directory; pull needs an s3:// store")
        return prof
    return config.store_for_url(src)


def _console_s5cmd() -> str | None:
    """s5cmd on the console machine: the console's own install first, else PATH."""
    import shutil
    import sys

    own = Path(sys.executable).parent / "s5cmd"
    return str(own) if own.exists() else shutil.which("s5cmd")


def _botocore_credentials(profile: StoreProfile | None) -> Credentials:
    """The store's credentials through botocore's own chain (no aiohttp client: cheap to import)."""
    import botocore.session

    session = botocore.session.Session()
    if profile and profile.profile:
        session.set_config_variable("profile", profile.profile)
    creds = session.get_credentials()
    if creds is None:
        raise StoreError("no credentials")
    frozen = creds.get_frozen_credentials()
    return Credentials(frozen.access_key, frozen.secret_key, frozen.token)


async def _list_with_s5cmd(src: SourcePattern, profile: StoreProfile | None,
                           s5cmd: str) -> tuple[list[PulledObject], Credentials] | None:
    """List with the tool and flags the job copies with, under the credentials it will get.

    None when anything goes wrong (or nothing matches): the caller then lists through the
    S3 client, which either succeeds or says precisely what to fix.
    """
    import asyncio

    from backend.jobs.awscreds import static_credentials

    # Plain keys are read directly (no botocore import in the way of spawning the listing);
    # anything else goes through botocore's own chain.
    creds = static_credentials(profile.profile if profile and profile.profile else None)
    if creds is None:
        try:
            creds = await asyncio.to_thread(_botocore_credentials, profile)
        except Exception:  # noqa: BLE001 - the client path reports credential problems properly
            return None
    log.debug("credentials resolved")
    env = dict(os.environ)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(k, None)
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    if profile and profile.region and profile.region != "auto":
        env["AWS_REGION"] = profile.region
    cmd = [s5cmd, "--json"]
    if profile and profile.endpoint_url:
        cmd += ["--endpoint-url", profile.endpoint_url]
    cmd += ["ls", src.url]
    with tempfile.TemporaryDirectory(prefix="lm-ls-") as d:  # 0700; the file inside is 0600
        path = Path(d) / CREDS_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(creds.shared_credentials_file(CREDS_PROFILE))
        env["AWS_SHARED_CREDENTIALS_FILE"] = str(path)
        env["AWS_PROFILE"] = CREDS_PROFILE
        try:
            proc = await asyncio.create_subprocess_exec(*cmd, env=env, stdin=subprocess.DEVNULL,
                                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                out, err = await asyncio.wait_for(proc.communicate(), 600)
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                raise
        except (OSError, TimeoutError):
            return None
    if proc.returncode != 0 or any(map(_error_text, err.decode(errors="replace").split("\n"))):
        return None
    text = out.decode(errors="surrogateescape")
    for line in text.split("\n"):
        if line.strip():
            try:
                if json.loads(line).get("error"):
                    return None
            except ValueError:
                return None
    objects = _parse_s5cmd_listing(src, text)
    return (objects, creds) if objects else None


async def list_source(src: SourcePattern, profile: StoreProfile | None, *,
                      credentials: bool = False) -> tuple[list[PulledObject], Credentials | None]:
    """Every object the source matches (where it lands under DEST, size, ETag), and optionally
    the credentials the same client used (for the jobs' secrets files). A key that would land
    outside DEST refuses the whole listing."""
    if credentials and src.pattern is not None and (s5cmd := _console_s5cmd()) is not None:
        # s5cmd (Go) lists in a fraction of the time it takes to import and set up the Python S3
        # client, and runs beside the node connections on another core.
        fast = await _list_with_s5cmd(src, profile, s5cmd)
        if fast is not None:
            log.debug("listed with %s", s5cmd)
            check_objects(src, fast[0])
            return fast
    from backend.storage import S3Store

    store = S3Store(f"s3://{src.bucket}", profile)
    try:
        sub = src.base.rstrip("/") if src.pattern is not None else src.base
        if src.pattern is None:
            info = await store.stat(src.base)
            if info is None:
                raise StoreError(f"{src.url}: no such object (for everything under a prefix end it with '/')")
            objects = [PulledObject(src.rel(src.base), info.size, info.etag or None)]
        else:
            objs = await store.list(sub)
            objects = [PulledObject(src.rel(o.key), o.size, o.etag or None) for o in objs
                       if src.matches(o.key) and not is_folder_marker(o.key, o.size)]
        check_objects(src, objects)
        creds = await store.credentials() if credentials else None
        return objects, creds
    finally:
        await store.close()


async def plan_pull(
    services: Any,
    src: str,
    dest: str,
    nodes: list[str],
    *,
    store: str | None = None,
    numworkers: int | None = None,
    concurrency: int | None = None,
    part_size_mib: int | None = None,
    allow_over_budget: str | None = None,
) -> PullPlan:
    """List the source, probe each node and price the egress: the plan shown before launch."""
    import asyncio

    config = services.config
    settings = config.section("jobs")
    pattern = parse_source(src)
    profile = resolve_store(config, src, store)

    async def early(t: Any) -> NodeEstimate:
        n = config.node(t.name)
        est = await probe_node(t, node_dest(dest, n.scratch), [], node_s5cmd(n, settings.s5cmd))
        log.debug("plan: %s connected and probed", t.name)
        return est

    # Connecting to and probing the nodes overlaps the listing. A node whose destination does not
    # exist yet has nothing present, so that first probe is its whole answer; the others (and any
    # node that failed) are probed again below with the object names, to count what is there.
    log.debug("plan: listing + connecting")

    # The egress quote needs only the listing's total, so it is priced while the nodes answer.
    async def list_and_price() -> tuple[list[PulledObject], Credentials | None, Any, str | None]:
        objects, creds = await list_source(pattern, profile, credentials=True)
        if not objects:
            return objects, creds, None, None
        decision, note = egress_check(services, profile, [config.node(n) for n in nodes],
                                      sum(o.size for o in objects), len(objects), allow_over_budget, src)
        log.debug("plan: egress priced")
        _ = services.jobs  # the launch needs the job manager: import and set it up while waiting too
        return objects, creds, decision, note

    # The listing subprocess is spawned first, so it runs while this process imports the SSH
    # stack and connects (both CPU-bound here).
    listing = asyncio.ensure_future(list_and_price())
    await asyncio.sleep(0)
    try:
        fanout = services.pool.fanout(early, nodes, timeout=120)
    except BaseException:
        listing.cancel()
        raise
    # A listing error (no such bucket, bad credentials) is raised at once, as before.
    (objects, creds, decision, note), first = await asyncio.gather(listing, fanout)
    log.debug("plan: listed %d objects, connected", len(objects))
    if not objects:
        raise StoreError(f"no objects match {src}")
    total = sum(o.size for o in objects)
    rels = [o.rel for o in objects] if len(objects) <= settings.max_spec_objects else []

    async def probe(t: Any) -> NodeEstimate:
        n = config.node(t.name)
        return await probe_node(t, node_dest(dest, n.scratch), rels, node_s5cmd(n, settings.s5cmd))

    # A node that could not be reached at all is not probed again: in a one-shot command the
    # second try only meets the connection backoff ("next retry in 0.9s") and says nothing new.
    again = [n for n in nodes if not isinstance(first[n], NodeUnreachable)
             and (isinstance(first[n], BaseException) or first[n].error or (first[n].dest_exists and rels))]
    probes = {**first, **(await services.pool.fanout(probe, again, timeout=120) if again else {})}
    log.debug("plan: probed (%d again)", len(again))
    ests = []
    for name in nodes:
        r = probes[name]
        if isinstance(r, BaseException):
            msg = str(r) if isinstance(r, LoadmasterError) else f"{type(r).__name__}: {r}"
            ests.append(NodeEstimate(node=name, dest=node_dest(dest, config.node(name).scratch),
                                     error=msg if msg.startswith(name) else f"{name}: {msg}"))
        else:
            if not r.line_rate_known:
                r = NodeEstimate(**{**r.__dict__, "line_rate_gbps": settings.nic_gbps})
            ests.append(r)
    return PullPlan(
        src=pattern.url, dest=dest, store=profile.name if profile else None, objects=tuple(objects),
        total_bytes=total, nodes=tuple(ests),
        numworkers=numworkers or settings.numworkers, concurrency=concurrency or settings.concurrency,
        part_size_mib=part_size_mib or settings.part_size_mib,
        endpoint_url=profile.endpoint_url if profile else None, region=profile.region if profile else None,
        profile=profile.profile if profile else None, egress=decision, egress_note=note, credentials=creds,
    )


# ---- EGRESS INTEGRATION POINT ------------------------------------------------------------------
# backend.ledger.EgressGuard(config, db) prices and decides; these functions are the only places
# pulls touch it: a quote + decision before launch, the override audit, the ledger entry on success.


def _guard(config: Any, db: Any) -> Any:
    try:
        from backend.ledger import EgressGuard
    except ImportError:  # the egress feature is optional for pulls
        return None
    return EgressGuard(config, db)


def _profile_for(config: Any, store: str | None, src: str) -> Any:
    from backend.config import StoreProfile

    if store and store in config.stores:
        return config.stores[store]
    # An unconfigured bucket: quoted as unpriced ([egress] unpriced_action decides).
    return StoreProfile(url=f"s3://{parse_source(src).bucket}", name=f"s3://{parse_source(src).bucket}")


def egress_check(services: Any, profile: StoreProfile | None, nodes: list[Any], total: int, objects: int,
                 allow_over_budget: str | None, src: str = "") -> tuple[Any, str | None]:
    """The guard's decision for pulling ``total`` bytes to each node (the strictest node decides)."""
    guard = _guard(services.config, services.db)
    if guard is None:
        return None, "egress guard not available: transfer not priced"
    prof = profile or _profile_for(services.config, None, src)
    order = {"allow": 0, "warn": 1, "confirm": 2, "block": 3}
    worst = None
    # Every node receives the whole pull; nodes at the same site are priced together, in sequence.
    by_site: dict[str | None, int] = {}
    for n in nodes:
        by_site[n.site] = by_site.get(n.site, 0) + 1
    for site, count in by_site.items():
        quote = guard.quote_transfer(prof, site, total * count, objects=objects * count)
        dec = guard.check(quote, allow_over_budget_reason=allow_over_budget)
        if worst is None or order.get(dec.action, 0) > order.get(worst.action, 0):
            worst = dec
    return worst, None


def egress_gate(plan: PullPlan, allow_over_budget: str | None) -> None:
    """Refuse to start when the guard says block, or confirm without an override reason."""
    dec = plan.egress
    if dec is None:
        return
    if dec.action == "block":
        raise PolicyError(f"egress guard blocks this pull: {dec.message}")
    if dec.action == "confirm":
        raise PolicyError(f"egress guard needs confirmation: {dec.message}; "
                          "re-run with --allow-over-budget REASON")


def egress_record_override(services: Any, plan: PullPlan, reason: str) -> None:
    """Audit the operator's reason for starting a pull over budget (when the guard needed one)."""
    guard = _guard(services.config, services.db)
    dec = plan.egress
    if guard is not None and dec is not None and getattr(dec, "override_reason", None):
        guard.record_override(dec, reason)


def egress_record_success(config: Any, db: Any, rec: JobRecord) -> None:
    """Put a succeeded pull's bytes in the egress ledger (called once per job)."""
    guard = _guard(config, db)
    if guard is None:
        return
    node = config.node(rec.node)
    nbytes = int((rec.result or {}).get("bytes", 0))
    guard.record_transfer(_profile_for(config, rec.params.get("store"), str(rec.params.get("src", ""))),
                          node.site, nbytes, job_id=rec.id)


# ---- end of egress integration point -----------------------------------------------------------


async def launch_pull(services: Any, plan: PullPlan, *, label: str = "") -> list[JobRecord]:
    """Start one pull job per node of the plan (credentials via each job's 0600 secrets file)."""
    if plan.problems:
        raise JobError("; ".join(plan.problems))
    creds = plan.credentials
    if creds is None:
        from backend.storage import S3Store

        store = S3Store(f"s3://{parse_source(plan.src).bucket}",
                        services.config.stores.get(plan.store) if plan.store else None)
        try:
            creds = await store.credentials()
        finally:
            await store.close()
    secrets = creds.as_env()
    settings = services.config.section("jobs")
    expected = [list(o) for o in plan.objects] if len(plan.objects) <= settings.max_spec_objects else None
    manager: JobManager = services.jobs
    out = []
    for est in plan.nodes:
        params = {
            "src": plan.src, "dest": est.dest, "store": plan.store, "endpoint_url": plan.endpoint_url,
            "region": plan.region, "numworkers": plan.numworkers, "concurrency": plan.concurrency,
            "part_size_mib": plan.part_size_mib, "s5cmd": node_s5cmd(services.config.node(est.node), settings.s5cmd),
            "bytes_total": plan.total_bytes,
            "objects_total": len(plan.objects), "expected": expected,
        }
        out.append(await manager.launch(est.node, "pull", params, secrets=secrets,
                                        label=label or f"pull {plan.src} -> {est.dest}"))
    return out


def node_s5cmd(node: Any, configured: str) -> str:
    """The s5cmd a node's job runs: as configured, except that this machine (a local node) with
    the default ``s5cmd`` not on PATH runs the one installed beside loadmaster."""
    if getattr(node, "transport", None) == "local" and configured == "s5cmd":
        from backend.config import installed_s5cmd

        return installed_s5cmd()
    return configured


def pull_time_estimate(total: int, gbps: float | None) -> float | None:
    """Seconds to move ``total`` bytes at ``gbps`` (line rate)."""
    return None if not gbps else total * 8 / (gbps * 1e9)


__all__ = [
    "PRESETS", "NodeEstimate", "PullPlan", "SourcePattern", "cleanup", "launch_pull", "list_source",
    "parse_source", "plan_pull", "run_pull_job",
]
