"""``loadmaster pull``: copy s3:// objects into a directory on nodes with s5cmd, as durable jobs.

Console side (:func:`plan_pull`, :func:`launch_pull`): list the source for object count and bytes,
probe each node's free space, NIC line rate and s5cmd, price the egress, then launch one job per
node. Node side (:func:`run_pull_job`): run ``s5cmd --json ... cp`` with credentials from a 0600
shared-credentials file (never argv), report bytes done from completed objects plus the growing
temporary files s5cmd writes beside each destination, treat any ERROR line as failure even when
s5cmd exits 0, and verify every expected object's size before reporting success.
"""

from __future__ import annotations

import collections
import contextlib
import fnmatch
import json
import logging
import os
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from backend.agent.context import JobContext
from backend.credentials import Credentials
from backend.errors import ConfigError, JobError, LoadmasterError, PolicyError, StoreError

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


def _temp_files(dest: Path, expected: list[tuple[str, int]]) -> list[Path]:
    """s5cmd's in-flight temporary files: ``<name><digits>`` beside each expected destination."""
    by_dir: dict[Path, set[str]] = collections.defaultdict(set)
    for rel, _size in expected:
        p = dest / rel
        by_dir[p.parent].add(p.name)
    out: list[Path] = []
    for d, names in by_dir.items():
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            n = e.name
            if n in names:
                continue
            k = len(n)
            while k > 0 and n[k - 1].isdigit():
                k -= 1
                if n[:k] in names and k < len(n):
                    out.append(Path(e.path))
                    break
    return out


def _remove_temp_files(dest: Path, expected: list[tuple[str, int]]) -> int:
    n = 0
    for p in _temp_files(dest, expected):
        try:
            p.unlink()
            n += 1
        except OSError:
            pass
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


def _list_on_node(ctx: JobContext, src: SourcePattern, env: dict[str, str]) -> list[tuple[str, int]]:
    cmd = [*_s5cmd_base(ctx.params), "ls", src.url]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    errors = [e for e in map(_error_text, (res.stdout + "\n" + res.stderr).splitlines()) if e]
    if res.returncode != 0 or errors:
        raise JobError(f"listing {src.url} failed: {errors[0] if errors else res.stderr.strip()}")
    out = []
    for line in res.stdout.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d.get("type") == "file" and d.get("key"):
            key = d["key"][5 + len(src.bucket) + 1:]
            out.append((src.rel(key), int(d.get("size", 0))))
    return out


def run_pull_job(ctx: JobContext) -> dict[str, Any]:
    """Run s5cmd cp for the pull in ``ctx.params``, report progress, verify sizes; the result details."""
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
        expected = [(str(r), int(s)) for r, s in p["expected"]] if p.get("expected") is not None else None
        if expected is None:
            ctx.log(f"listing {src.url} on the node")
            expected = _list_on_node(ctx, src, env)
            if ctx.job_dir is not None:
                (ctx.job_dir / EXPECTED_FILE).write_text(json.dumps(expected))
        if not expected:
            raise JobError(f"no objects match {src.url}")
        total = sum(s for _, s in expected)
        _check_space(dest, expected, total, ctx)
        return _copy(ctx, src, dest, expected, total, env)
    finally:
        if creds_path is not None:
            creds_path.unlink(missing_ok=True)
        if ctx.job_dir is None:
            try:
                workdir.rmdir()
            except OSError:
                pass


def _check_space(dest: Path, expected: list[tuple[str, int]], total: int, ctx: JobContext) -> None:
    if ctx.params.get("skip_space_check"):
        return
    present = 0
    for rel, _ in expected:
        try:
            present += (dest / rel).stat().st_size
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


def _copy(ctx: JobContext, src: SourcePattern, dest: Path, expected: list[tuple[str, int]], total: int,
          env: dict[str, str]) -> dict[str, Any]:
    p = ctx.params
    cmd = [*_s5cmd_base(p), "cp", "--concurrency", str(int(p["concurrency"])),
           "--part-size", str(int(p["part_size_mib"])), src.url, str(dest) + "/"]
    ctx.log("running: " + shlex.join(cmd))  # no secrets: credentials travel in a file named by env
    if ctx.cancelled:
        raise JobError("cancelled before the copy started")
    started = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=env, text=True, preexec_fn=_die_with_parent)  # noqa: PLW1509
    done = {"bytes": 0, "items": 0}
    errors: list[str] = []
    lock = threading.Lock()

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

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for r in [*readers, threading.Thread(target=reap, daemon=True)]:
        r.start()
    window: collections.deque[tuple[float, int]] = collections.deque()
    n_items = len(expected)
    terminated = False

    def report(final: bool = False) -> None:
        with lock:
            b, i = done["bytes"], done["items"]
        now = time.time()
        b = min(total, b + (0 if final else _in_flight_bytes(_temp_files(dest, expected))))
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
        _remove_temp_files(dest, expected)
        raise JobError("cancelled")
    if proc.returncode != 0 or errors:
        _remove_temp_files(dest, expected)
        more = f" (+{len(errors) - 1} more errors)" if len(errors) > 1 else ""
        first = errors[0] if errors else "no error output"
        for e in errors[:20]:
            ctx.log(f"s5cmd: {e}")
        raise JobError(f"s5cmd exited {proc.returncode}: {first}{more}")
    bad = []
    for rel, size in expected:
        try:
            got = (dest / rel).stat().st_size
        except OSError:
            bad.append(f"{rel} missing")
            continue
        if got != size:
            bad.append(f"{rel} is {got} bytes, expected {size}")
    _remove_temp_files(dest, expected)
    if bad:
        raise JobError(f"verification failed: {len(bad)} of {n_items} objects wrong: {'; '.join(bad[:3])}")
    report(final=True)
    ctx.log(f"verified {n_items} objects, {total} bytes in {elapsed:.1f}s")
    return {"objects": n_items, "bytes": total, "seconds": round(elapsed, 3), "dest": str(dest),
            "gbps": round(total * 8 / 1e9 / max(elapsed, 1e-6), 3)}


def cleanup(ctx: JobContext) -> None:
    """Remove s5cmd's partial temporary files; complete, verified-size objects are kept."""
    dest = _dest(ctx.params)
    expected = ctx.params.get("expected")
    if expected is None and ctx.job_dir is not None and (ctx.job_dir / EXPECTED_FILE).exists():
        expected = json.loads((ctx.job_dir / EXPECTED_FILE).read_text())
    if ctx.job_dir is not None:
        (ctx.job_dir / CREDS_FILE).unlink(missing_ok=True)
    if expected:
        n = _remove_temp_files(dest, [(str(r), int(s)) for r, s in expected])
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
    objects: tuple[tuple[str, int], ...]
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
                           s5cmd: str) -> tuple[list[tuple[str, int]], Credentials] | None:
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
    if proc.returncode != 0 or any(map(_error_text, err.decode(errors="replace").splitlines())):
        return None
    objects = []
    prefix = f"s3://{src.bucket}/"
    for line in out.decode(errors="replace").splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            return None
        if d.get("error"):
            return None
        k = d.get("key") or ""
        if d.get("type") != "file" or not k.startswith(prefix):
            continue
        key = k[len(prefix):]
        if src.matches(key):  # a bare key is listed as a prefix by s5cmd: keep only the object
            objects.append((src.rel(key), int(d.get("size", 0))))
    return (sorted(objects), creds) if objects else None


async def list_source(src: SourcePattern, profile: StoreProfile | None, *,
                      credentials: bool = False) -> tuple[list[tuple[str, int]], Credentials | None]:
    """Every object the source matches, as (destination-relative path, size), and optionally
    the credentials the same client used (for the jobs' secrets files)."""
    if credentials and src.pattern is not None and (s5cmd := _console_s5cmd()) is not None:
        # s5cmd (Go) lists in a fraction of the time it takes to import and set up the Python S3
        # client, and runs beside the node connections on another core.
        fast = await _list_with_s5cmd(src, profile, s5cmd)
        if fast is not None:
            log.debug("listed with %s", s5cmd)
            return fast
    from backend.storage import S3Store

    store = S3Store(f"s3://{src.bucket}", profile)
    try:
        sub = src.base.rstrip("/") if src.pattern is not None else src.base
        if src.pattern is None:
            info = await store.stat(src.base)
            if info is None:
                raise StoreError(f"{src.url}: no such object (for everything under a prefix end it with '/')")
            objects = [(src.rel(src.base), info.size)]
        else:
            objs = await store.list(sub)
            objects = [(src.rel(o.key), o.size) for o in objs if src.matches(o.key)]
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
        est = await probe_node(t, node_dest(dest, n.scratch), [], settings.s5cmd)
        log.debug("plan: %s connected and probed", t.name)
        return est

    # Connecting to and probing the nodes overlaps the listing. A node whose destination does not
    # exist yet has nothing present, so that first probe is its whole answer; the others (and any
    # node that failed) are probed again below with the object names, to count what is there.
    log.debug("plan: listing + connecting")

    # The egress quote needs only the listing's total, so it is priced while the nodes answer.
    async def list_and_price() -> tuple[list[tuple[str, int]], Credentials | None, Any, str | None]:
        objects, creds = await list_source(pattern, profile, credentials=True)
        if not objects:
            return objects, creds, None, None
        decision, note = egress_check(services, profile, [config.node(n) for n in nodes],
                                      sum(s for _, s in objects), len(objects), allow_over_budget, src)
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
    total = sum(s for _, s in objects)
    rels = [r for r, _ in objects] if len(objects) <= settings.max_spec_objects else []

    async def probe(t: Any) -> NodeEstimate:
        n = config.node(t.name)
        return await probe_node(t, node_dest(dest, n.scratch), rels, settings.s5cmd)

    again = [n for n in nodes if isinstance(first[n], BaseException) or first[n].error
             or (first[n].dest_exists and rels)]
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
            "part_size_mib": plan.part_size_mib, "s5cmd": settings.s5cmd, "bytes_total": plan.total_bytes,
            "objects_total": len(plan.objects), "expected": expected,
        }
        out.append(await manager.launch(est.node, "pull", params, secrets=secrets,
                                        label=label or f"pull {plan.src} -> {est.dest}"))
    return out


def pull_time_estimate(total: int, gbps: float | None) -> float | None:
    """Seconds to move ``total`` bytes at ``gbps`` (line rate)."""
    return None if not gbps else total * 8 / (gbps * 1e9)


__all__ = [
    "PRESETS", "NodeEstimate", "PullPlan", "SourcePattern", "cleanup", "launch_pull", "list_source",
    "parse_source", "plan_pull", "run_pull_job",
]
