"""Pack many small files into WebDataset tar shards: locally, from/to ``s3://``, or as a node job.

The pipeline: list the source (paginated on S3), group files into samples, plan the shards
(:mod:`backend.shards.plan`), then one writer thread builds each shard with precomputed ustar
headers and large sequential writes while reads run ahead of it (a thread pool for local files,
bounded concurrent GETs for S3). Each finished shard is renamed into place (local) or streamed up
as a multipart upload while the next is written (S3, at most ``pending_uploads`` shards spooled),
then recorded in a journal with its sha256, so an interrupted conversion resumes from the last
completed shard. ``manifest.json`` is written last.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import errno
import functools
import hashlib
import json
import os
import queue
import resource
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from backend.config import Config, StoreProfile
from backend.errors import LoadmasterError
from backend.nodes.untrusted import loads_bounded
from backend.shards import tarfmt
from backend.shards.manifest import (
    JOURNAL_MAX_BYTES,
    MANIFEST_NAME,
    Manifest,
    RequestArithmetic,
    ShardEntry,
    get_price,
    request_arithmetic,
)
from backend.shards.plan import (
    STATE_DIR,
    InputProblems,
    PlannedShard,
    ShardError,
    ShardPlan,
    SourceFile,
    group_samples,
    inside,
    pattern_regex,
    plan_shards,
    scan_local,
)
from backend.shards.settings import ShardSettings
from backend.storage import Credentials, LocalStore, ObjectStore, S3Store, multipart
from backend.storage.multipart import MIN_PART_SIZE, UploadSettings

IncompletePolicy = Literal["error", "skip", "keep"]
PLAN_KEY = f"{STATE_DIR}/plan.json"
JOURNAL_PREFIX = f"{STATE_DIR}/journal"
PROGRESS_EVERY = 0.25
PART_CONCURRENCY = 4  # parts of one shard uploaded at once
#: Per-thread resource usage (Linux): voluntary context switches tell reads that sleep.
_RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)
_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)


class ShardCancelled(ShardError):
    """The conversion was cancelled; completed shards stay and ``--resume`` continues."""


@dataclass(frozen=True)
class ShardRequest:
    """Everything one conversion needs; JSON-able (it travels to a node as job params)."""

    src: str
    dest: str
    shard_size: int = ShardSettings.shard_size
    pattern: str = ShardSettings.pattern
    seed: int | None = None
    workers: int = ShardSettings.workers
    overwrite: bool = False
    resume: bool = False
    incomplete: IncompletePolicy = "error"
    fetch_concurrency: int = ShardSettings.fetch_concurrency
    upload_part_size: int = ShardSettings.upload_part_size
    pending_uploads: int = ShardSettings.pending_uploads
    spool_dir: str | None = None
    partner_share: float = ShardSettings.partner_share

    @classmethod
    def from_settings(cls, settings: ShardSettings, src: str, dest: str, **overrides: Any) -> ShardRequest:
        """A request with the ``[shards]`` defaults, ``overrides`` (None values ignored) on top."""
        base: dict[str, Any] = {
            "shard_size": settings.shard_size, "pattern": settings.pattern, "workers": settings.workers,
            "fetch_concurrency": settings.fetch_concurrency, "upload_part_size": settings.upload_part_size,
            "pending_uploads": settings.pending_uploads, "spool_dir": settings.spool_dir,
            "partner_share": settings.partner_share,
        }
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(src=src, dest=dest, **base)  # type: ignore[arg-type]

    def as_params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> ShardRequest:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in params.items() if k in names})

    def validate(self) -> None:
        """Refuse nonsensical settings with a message naming the option."""
        if self.incomplete not in ("error", "skip", "keep"):
            raise ShardError(f"--incomplete must be error, skip or keep, not {self.incomplete!r}")
        if self.workers < 0:
            raise ShardError("--workers must be 0 (read in the writer thread) or more")
        if self.overwrite and self.resume:
            raise ShardError("choose one of --overwrite and --resume")
        if self.shard_size <= 0:
            raise ShardError("--shard-size must be positive (e.g. 512MB)")
        if _norm(self.src) == _norm(self.dest):
            raise ShardError("source and destination are the same place; write shards elsewhere")


def _norm(url: str) -> str:
    return url.rstrip("/") if url.startswith("s3://") else os.path.abspath(os.path.expanduser(url))


@dataclass(frozen=True)
class ShardProgress:
    """A progress snapshot of a running conversion."""

    samples_done: int
    samples_total: int
    bytes_done: int
    bytes_total: int
    shards_done: int
    shards_total: int
    elapsed: float
    samples_per_s: float
    mb_per_s: float
    phase: str = "writing"
    final: bool = False


@dataclass(frozen=True)
class ShardPreview:
    """What a conversion would do, computed from the listing alone (no data read)."""

    src: str
    dest: str
    files: int
    samples: int
    source_bytes: int
    shards: int
    largest_shard: int
    requests: RequestArithmetic
    warnings: tuple[str, ...]
    errors: tuple[str, ...]
    problems: InputProblems = field(default_factory=InputProblems)
    #: The plan behind the preview (handed to :func:`convert` so the source is listed once).
    plan: ShardPlan | None = field(default=None, repr=False, compare=False)
    request: ShardRequest | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return not self.errors

    def as_dict(self) -> dict[str, Any]:
        return {
            "src": self.src, "dest": self.dest, "files": self.files, "samples": self.samples,
            "source_bytes": self.source_bytes, "shards": self.shards, "largest_shard": self.largest_shard,
            "requests": self.requests.as_dict(), "warnings": list(self.warnings),
            "errors": list(self.errors), "problems": self.problems.as_dict(),
        }


@dataclass(frozen=True)
class ConvertResult:
    """A finished conversion: its manifest and what this run did."""

    manifest: Manifest
    dest: str
    written: tuple[str, ...]
    resumed: tuple[str, ...]
    elapsed: float
    warnings: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "dest": self.dest, "manifest": f"{self.dest.rstrip('/')}/{MANIFEST_NAME}",
            "shards": len(m.shards), "samples": m.samples, "files": m.files, "bytes": m.bytes,
            "written": len(self.written), "resumed": len(self.resumed), "elapsed_s": round(self.elapsed, 3),
            "requests": m.requests.as_dict(), "warnings": list(self.warnings),
        }


# -- stores ----------------------------------------------------------------------------------


def open_store(url: str, profile: StoreProfile | None, credentials: Credentials | None = None) -> ObjectStore:
    """An ObjectStore for ``url`` (``s3://`` with the profile's endpoint/credentials, or a dir)."""
    if url.startswith("s3://"):
        return S3Store(url, profile, credentials=credentials)
    if "://" in url:
        raise ShardError(f"unsupported location {url!r}: use a local directory or s3://bucket/prefix")
    return LocalStore(Path(os.path.expanduser(url)).resolve())


async def _scan(store: ObjectStore) -> tuple[list[SourceFile], list[tuple[str, str]]]:
    if isinstance(store, LocalStore):
        return await asyncio.to_thread(scan_local, str(store.root))
    assert isinstance(store, S3Store)
    files: list[SourceFile] = []
    async for page in store.iter_pages(""):  # ListObjectsV2, 1000 keys a page
        for obj in page.get("Contents", []):
            rel = store._rel(obj["Key"])
            if rel.startswith(STATE_DIR + "/") or rel.endswith("/"):
                continue
            files.append(SourceFile(rel, int(obj["Size"])))
    files.sort(key=lambda f: f.rel)
    return files, []


# -- planning --------------------------------------------------------------------------------


def _dest_inside_src(req: ShardRequest) -> str | None:
    """The destination's path relative to the source when it lies inside it, else None."""
    src, dest = _norm(req.src), _norm(req.dest)
    if dest.startswith(src.rstrip("/") + "/"):
        return dest[len(src.rstrip("/")) + 1:]
    return None


async def _plan(req: ShardRequest, src: ObjectStore) -> tuple[ShardPlan | None, InputProblems, list[str], list[str]]:
    """The plan, the input problems, errors (refusals) and warnings."""
    files, unreadable = await _scan(src)
    inner = _dest_inside_src(req)
    if inner:  # shards written inside the source must never be read back as source files
        files = [f for f in files if not f.rel.startswith(inner + "/")]
        unreadable = [u for u in unreadable if not u[0].startswith(inner + "/") and u[0] != inner]
    samples, problems = group_samples(files, partner_share=req.partner_share)
    problems = dataclasses.replace(problems, unreadable=tuple(unreadable))
    errors: list[str] = []
    warnings: list[str] = []
    if not files and not unreadable:
        errors.append(f"source {req.src} is empty: no files to shard")
    lines = problems.describe()
    hard = [ln for ln in lines if "unreadable" in ln or "collision" in ln]
    soft = [ln for ln in lines if ln not in hard]
    errors += hard
    if soft:
        if req.incomplete == "error":
            errors += [*soft, "pass --incomplete skip to leave such files out, or --incomplete keep "
                              "to shard incomplete samples as they are (unkeyed files are always left out)"]
        else:
            warnings += soft
            warnings.append(f"--incomplete {req.incomplete}: "
                            + ("incomplete samples and unkeyed files left out" if req.incomplete == "skip"
                               else "incomplete samples kept; unkeyed files left out"))
    if req.incomplete == "skip" and problems.incomplete:
        bad = {k for k, _m in problems.incomplete}
        samples = [s for s in samples if s.key not in bad]
    if not errors and not samples:
        errors.append(f"source {req.src} has no samples left to shard")
    plan = None
    if samples:
        plan = plan_shards(samples, shard_size=req.shard_size, pattern=req.pattern, seed=req.seed)
        warnings = list(plan.warnings) + warnings
    return plan, problems, errors, warnings


async def preview(
    req: ShardRequest, *, config: Config | None = None, src_profile: StoreProfile | None = None,
    dest_profile: StoreProfile | None = None,
) -> ShardPreview:
    """Sample count, shard count and GET reduction of a conversion, from the listing alone."""
    req.validate()
    src = open_store(req.src, src_profile)
    dest = open_store(req.dest, dest_profile)
    try:
        plan, problems, errors, warnings = await _plan(req, src)
        # The destination too: a busy or unreachable one is refused before anything runs.
        refusal = _busy_refusal(req, *await _existing(dest, req.pattern))
        if refusal:
            errors.append(refusal)
    finally:
        await src.close()
        await dest.close()
    price, source = get_price(config, dest_profile, src_profile)
    files = plan.files if plan else 0
    shards = len(plan.shards) if plan else 0
    return ShardPreview(
        src=req.src, dest=req.dest, files=files, samples=plan.samples if plan else 0,
        source_bytes=plan.source_bytes if plan else 0, shards=shards,
        largest_shard=max((s.nbytes for s in plan.shards), default=0) if plan else 0,
        requests=request_arithmetic(files, shards, price, source), warnings=tuple(warnings),
        errors=tuple(errors), problems=problems, plan=plan, request=req,
    )


# -- reading ---------------------------------------------------------------------------------
#
# The tar stream is cut into chunks of whole members (never across shards). A local chunk is
# filled -- headers, file data read straight into place, padding -- into one of a few reused
# buffers, then written with one write() and hashed with one update() in the hash thread: no
# per-file bytes objects, no per-file writes or hash calls, and no fresh memory to fault in.

#: Members filled into one buffer: small enough to stay in cache between filling and hashing.
CHUNK_BYTES = 1 << 20
Piece = bytes | bytearray | memoryview
#: What a filled chunk hands the writer: the pieces to write in order, and what to call once
#: they are written and hashed (gives a reused buffer back), if anything.
Filled = tuple[list[Piece], Callable[[], None] | None]
_ZEROS = bytes(CHUNK_BYTES)


class _Chunk(NamedTuple):
    """Consecutive members of one shard: (header, relative path, size) each."""

    members: list[tuple[bytes, str, int]]
    nbytes: int  # headers + data + padding
    samples: int  # samples whose last member is in this chunk (for progress)
    big: bool = False  # one member larger than a buffer: the writer streams it


def _chunks(shard: PlannedShard, cap: int, max_files: int, stream_big: bool) -> Iterator[_Chunk]:
    """The shard's members cut into chunks of at most ``cap`` bytes and ``max_files`` files."""
    header = tarfmt.header
    members: list[tuple[bytes, str, int]] = []
    used = samples = 0
    for sample in shard.samples:
        key = sample.key
        for ext, rel, size in sample.files:
            head = header(f"{key}.{ext}", size)
            nb = len(head) + size + (-size % tarfmt.BLOCK)
            if members and (used + nb > cap or len(members) >= max_files):
                yield _Chunk(members, used, samples)
                members, used, samples = [], 0, 0
            if stream_big and nb > cap:
                yield _Chunk([(head, rel, size)], nb, 0, True)
                continue
            members.append((head, rel, size))
            used += nb
        samples += 1
    if members or samples:
        yield _Chunk(members, used, samples)


def _unreadable(path: str, exc: OSError) -> ShardError:
    return ShardError(f"cannot read source file {path}: {exc.strerror or exc}")


def _write_error(path: str, exc: OSError) -> ShardError:
    """A failed write (a full disk, a quota) as one line naming the file and what to do."""
    hint = ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = ": free space there, then rerun with --resume (completed shards are kept)"
    return ShardError(f"cannot write {exc.filename or path}: {exc.strerror or exc}{hint}")


_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_NONBLOCK", 0)


def _open_source(path: str, root_real: str) -> int:
    """Open a source file for reading, refusing one that resolves outside the source.

    The check is made on the open descriptor (``/proc/self/fd``), so a file swapped for a
    symbolic link after the listing cannot smuggle another file in; O_NONBLOCK keeps a FIFO
    swapped in from blocking the conversion (its read fails instead).
    """
    fd = os.open(path, _OPEN_FLAGS)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = os.path.realpath(path)  # no /proc: the path as it resolves now
    if not inside(real, root_real):
        os.close(fd)
        raise ShardError(f"source file {path} resolves to {real}, outside the source "
                         f"{root_real}: refused (a symbolic link out of SRC is never followed)")
    return fd


def _changed(path: str, size: int, got: int) -> ShardError:
    return ShardError(f"source file {path} changed during the conversion (listed {size} bytes, "
                      f"read {got}); run again once the source is stable")


def _read_source(path: str, size: int, root_real: str, read: Callable[..., int], *args: Any) -> None:
    """Open ``path`` (listed at ``size`` bytes, under ``root_real``), let ``read(fd, *args)`` read
    it all, check the count.

    ``read`` returns how many bytes it got, one more than it was asked for when the file grew.
    """
    try:
        fd = _open_source(path, root_real)
        try:
            got = read(fd, *args)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _unreadable(path, exc) from None
    if got != size:
        raise _changed(path, size, got)


def _readv_exact(fd: int, view: memoryview, spare: bytearray) -> int:
    """Fill ``view`` from ``fd``; returns the bytes read (``len(view) + 1`` if there was more)."""
    # One byte more than listed lands in ``spare``: on a regular file a short read means EOF, so
    # one readv() both fetches a small file and proves it did not grow.
    got = os.readv(fd, [view, spare])
    size = len(view)
    while 0 < got < size:  # reads cap at ~2 GiB, some filesystems return less: gather the rest
        more = os.readv(fd, [view[got:], spare])
        if not more:
            break
        got += more
    return got


class _Buffers:
    """A fixed set of reused chunk buffers: bounds memory and is faulted in once."""

    def __init__(self, count: int, size: int) -> None:
        self.free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(count):
            self.free.put(bytearray(size))

    def get(self) -> bytearray:
        return self.free.get()

    def put(self, buf: bytearray) -> None:
        self.free.put(buf)


class _Source:
    """Member data for the writer thread: chunks filled ahead of it, handed over in order."""

    cap = CHUNK_BYTES
    max_files = 1 << 30
    stream_big = False
    ahead = 2

    def submit(self, chunk: _Chunk) -> concurrent.futures.Future[Filled]:
        raise NotImplementedError

    def stream(self, rel: str, size: int) -> Iterator[Filled]:
        """One big file's data in buffer-sized pieces (only when ``stream_big``)."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop reading ahead (the conversion is over or failed)."""


class _LocalSource(_Source):
    """Local files read into reused buffers: by the writer thread, or by ``workers`` threads once
    reads turn out to wait for the device or the network.

    Reader threads pay off only while reads block (a network filesystem, a cold disk): on files
    the page cache already holds, a read is a memory copy and threads only fight over the GIL
    (on 2 cores that cost a third more CPU than the whole read). So the writer thread reads
    while its reads do not sleep, and hands reading to the pool for good once they do. With
    ``workers`` 0 it always reads itself (and hashes too: see ``_write_shards``).
    """

    stream_big = True
    #: Chunks read by the writer thread in a row that must sleep (block on I/O) before the
    #: reader threads start; a chunk sleeps when its reads switch out on at least a quarter of
    #: its files and twice (a page-cache hit never does; a wait for the GIL now and then may).
    BLOCKED_CHUNKS = 3

    def __init__(self, root: str, workers: int) -> None:
        self.base = root.rstrip("/") + "/"  # plain concatenation: os.path.join costs per file
        self.root_real = os.path.realpath(root)
        self.workers = workers
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.ahead = 1
        self.blocked = 0
        # Every chunk in flight holds a buffer; the rest are being written and hashed. Pages of
        # buffers never used are never touched.
        self.buffers = _Buffers(max(2, 2 * workers) + 3, self.cap)

    def start_pool(self) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="shard-read")
        self.ahead = max(2, 2 * self.workers)

    def fill(self, chunk: _Chunk, buf: bytearray) -> Filled:
        mv = memoryview(buf)
        spare = bytearray(1)
        base = self.base
        pos = 0
        for head, rel, size in chunk.members:
            end = pos + len(head)
            mv[pos:end] = head
            _read_source(base + rel, size, self.root_real, _readv_exact, mv[end:end + size], spare)
            pos = end + size
            pad = -size % tarfmt.BLOCK
            if pad:  # the buffer is reused: padding is written, not assumed
                mv[pos:pos + pad] = _ZEROS[:pad]
                pos += pad
        return [mv[:pos]], functools.partial(self.buffers.put, buf)

    def submit(self, chunk: _Chunk) -> concurrent.futures.Future[Filled]:
        buf = self.buffers.get()
        if self.pool is not None:
            return self.pool.submit(self.fill, chunk, buf)
        fut: concurrent.futures.Future[Filled] = concurrent.futures.Future()
        if not self.workers or _RUSAGE_THREAD is None:
            fut.set_result(self.fill(chunk, buf))
            return fut
        before = resource.getrusage(_RUSAGE_THREAD).ru_nvcsw
        fut.set_result(self.fill(chunk, buf))  # in the writer thread: see the class docstring
        sleeps = resource.getrusage(_RUSAGE_THREAD).ru_nvcsw - before
        self.blocked = self.blocked + 1 if sleeps >= max(2, len(chunk.members) // 4) else 0
        if self.blocked >= self.BLOCKED_CHUNKS:
            self.start_pool()
        return fut

    def stream(self, rel: str, size: int) -> Iterator[Filled]:
        path = self.base + rel
        try:
            fd = _open_source(path, self.root_real)
        except OSError as exc:
            raise _unreadable(path, exc) from None
        got = 0
        try:
            while got < size:
                buf = self.buffers.get()
                mv = memoryview(buf)[:min(len(buf), size - got)]
                try:
                    n = os.readv(fd, [mv])
                except OSError as exc:
                    raise _unreadable(path, exc) from None
                if not n:
                    self.buffers.put(buf)
                    break
                got += n
                yield [mv[:n]], functools.partial(self.buffers.put, buf)
            if got == size:
                try:
                    got += len(os.read(fd, 1))  # proves the file did not grow
                except OSError as exc:
                    raise _unreadable(path, exc) from None
        finally:
            os.close(fd)
        if got != size:
            raise _changed(path, size, got)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


class _S3Source(_Source):
    """Objects under an ``s3://`` prefix: bounded concurrent GETs on the event loop."""

    cap = 8 << 20
    max_files = 64

    def __init__(self, store: S3Store, loop: asyncio.AbstractEventLoop, concurrency: int) -> None:
        self.store = store
        self.loop = loop
        self.sem = asyncio.Semaphore(max(1, concurrency))
        # Chunks in flight while the writer waits on one: enough to keep every GET slot busy.
        self.ahead = max(2, 2 * -(-max(1, concurrency) // self.max_files)) + 1

    async def _fetch(self, rel: str, size: int) -> bytes:
        async with self.sem:
            data = await self.store.get_bytes(rel)
        if len(data) != size:
            raise ShardError(f"{self.store.url}/{rel} changed during the conversion (listed {size} "
                             f"bytes, got {len(data)})")
        return data

    async def _fill(self, chunk: _Chunk) -> Filled:
        datas = await asyncio.gather(*(self._fetch(rel, size) for _h, rel, size in chunk.members))
        pieces: list[Piece] = []
        for (head, _rel, size), data in zip(chunk.members, datas, strict=True):
            pieces += (head, data)
            if size % tarfmt.BLOCK:
                pieces.append(_ZEROS[:-size % tarfmt.BLOCK])
        return pieces, None

    def submit(self, chunk: _Chunk) -> concurrent.futures.Future[Filled]:
        return asyncio.run_coroutine_threadsafe(self._fill(chunk), self.loop)


def _ordered(source: _Source, todo: Sequence[PlannedShard]) -> Iterator[tuple[PlannedShard, _Chunk, Any]]:
    """(shard, chunk, future of its filling or None for a streamed one) in order, ``ahead`` submitted."""
    chunks = ((shard, c) for shard in todo for c in _chunks(shard, source.cap, source.max_files, source.stream_big))
    pending: collections.deque[tuple[PlannedShard, _Chunk, Any]] = collections.deque()

    def push(item: tuple[PlannedShard, _Chunk] | None) -> bool:
        if item is None:
            return False
        shard, chunk = item
        pending.append((shard, chunk, None if chunk.big else source.submit(chunk)))
        return True

    try:
        while True:
            while len(pending) < source.ahead and push(next(chunks, None)):
                pass  # ``ahead`` may grow on the way (reader threads started)
            if not pending:
                return
            yield pending.popleft()
    finally:
        for _s, _c, fut in pending:
            if fut is not None:
                fut.cancel()


# -- writing ---------------------------------------------------------------------------------


class _Progress:
    def __init__(self, plan: ShardPlan, done: Sequence[PlannedShard],
                 callback: Callable[[ShardProgress], None] | None) -> None:
        self.callback = callback
        self.samples_total = plan.samples
        self.bytes_total = plan.total_bytes
        self.shards_total = len(plan.shards)
        self.samples_done = sum(len(s.samples) for s in done)
        self.bytes_done = sum(s.nbytes for s in done)
        self.shards_done = len(done)
        self._base_samples, self._base_bytes = self.samples_done, self.bytes_done
        self.started = time.monotonic()
        self._last = 0.0

    def snapshot(self, *, final: bool = False, phase: str = "writing") -> ShardProgress:
        el = max(time.monotonic() - self.started, 1e-9)
        return ShardProgress(
            self.samples_done, self.samples_total, self.bytes_done, self.bytes_total, self.shards_done,
            self.shards_total, el, (self.samples_done - self._base_samples) / el,
            (self.bytes_done - self._base_bytes) / el / 1e6, phase, final,
        )

    def tick(self, *, force: bool = False, final: bool = False) -> None:
        if self.callback is None:
            return
        now = time.monotonic()
        if force or final or now - self._last >= PROGRESS_EVERY:
            self._last = now
            self.callback(self.snapshot(final=final, phase="done" if final else "writing"))


class _Sink:
    """Where finished shards go; ``commit`` is called from the writer thread."""

    def __init__(self, store: ObjectStore, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self.loop = loop

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def journal(self, entry: ShardEntry) -> None:
        self._run(self.store.put_bytes(f"{JOURNAL_PREFIX}/{entry.name}.json",
                                       json.dumps(entry.as_dict()).encode()))

    def temp_path(self, name: str) -> str:
        raise NotImplementedError

    def commit(self, entry: ShardEntry, path: str) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Wait for work still in flight."""

    def abandon(self, path: str | None) -> None:
        if path:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


class _LocalSink(_Sink):
    def __init__(self, store: LocalStore, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(store, loop)
        self.root = store.root
        self.root.mkdir(parents=True, exist_ok=True)

    def temp_path(self, name: str) -> str:
        return str(self.root / f".{name}.partial")

    def commit(self, entry: ShardEntry, path: str) -> None:
        os.replace(path, self.root / entry.name)
        self.journal(entry)

    def journal(self, entry: ShardEntry) -> None:
        # Synchronous: a journal line must not outlive its shard's rename by a scheduling gap.
        d = self.root / JOURNAL_PREFIX
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{entry.name}.json.tmp"
        tmp.write_text(json.dumps(entry.as_dict()))
        os.replace(tmp, d / f"{entry.name}.json")


class _S3Sink(_Sink):
    """Streams each finished shard up with the verified multipart uploader while the next is written."""

    def __init__(self, store: S3Store, loop: asyncio.AbstractEventLoop, req: ShardRequest) -> None:
        super().__init__(store, loop)
        self.s3 = store
        # PART_CONCURRENCY also bounds the parts of one shard held in memory
        self.settings = UploadSettings(part_size=max(int(req.upload_part_size), MIN_PART_SIZE),
                                       concurrency=PART_CONCURRENCY, always_multipart=True)
        self.max_pending = max(1, int(req.pending_uploads))
        base = req.spool_dir or None
        if base:
            Path(base).mkdir(parents=True, exist_ok=True)
        self.spool = tempfile.mkdtemp(prefix="lm-shard-spool-", dir=base)
        self.pending: collections.deque[concurrent.futures.Future[None]] = collections.deque()
        self.client: Any = None
        self.uploads: multipart.MultipartJournal | None = None  # this conversion's multipart upload ids
        self._stack = contextlib.AsyncExitStack()
        self._running: set[asyncio.Task[Any]] = set()

    async def open(self) -> None:
        """Create the upload client (on the event loop the uploads run on) and hold this
        destination's multipart journal: every upload id this conversion starts is recorded, and
        only those are ever aborted (another conversion's parts under the same prefix are not)."""
        journal = multipart.MultipartJournal.for_destination(self.s3.url)
        self.uploads = self._stack.enter_context(journal.locked(self.s3.url, tidy=True))
        self.client = await self._stack.enter_async_context(multipart.upload_client(self.s3, self.settings))

    def temp_path(self, name: str) -> str:
        return os.path.join(self.spool, name)

    async def _upload(self, entry: ShardEntry, path: str) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._running.add(task)  # so aclose() can wait for a cancelled upload's abort
        try:
            await multipart.upload_file(self.s3, path, entry.name, settings=self.settings, client=self.client,
                                        journal=self.uploads)
        except LoadmasterError as exc:
            raise ShardError(f"uploading {entry.name} to {self.s3.url} failed: {exc}") from None
        finally:
            self._running.discard(task)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        await self.s3.put_bytes(f"{JOURNAL_PREFIX}/{entry.name}.json", json.dumps(entry.as_dict()).encode())

    async def abort_stale(self, pattern: str) -> int:
        """Abort the multipart uploads an earlier, killed run of this conversion recorded (they
        cost storage); uploads anyone else started are left alone."""
        if self.uploads is None:
            return 0
        return len(await multipart.abort_recorded(self.s3, self.uploads))

    def commit(self, entry: ShardEntry, path: str) -> None:
        self.pending.append(asyncio.run_coroutine_threadsafe(self._upload(entry, path), self.loop))
        # Bounded local disk: at most max_pending finished shards wait while the next is written.
        while len(self.pending) >= self.max_pending + 1 or (self.pending and self.pending[0].done()):
            self.pending.popleft().result()

    def finish(self) -> None:
        while self.pending:
            self.pending.popleft().result()

    async def aclose(self) -> None:
        """Cancel uploads still in flight (each aborts its multipart upload), then drop the spool."""
        for fut in self.pending:
            fut.cancel()
        running = list(self._running)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await self._stack.aclose()
        shutil.rmtree(self.spool, ignore_errors=True)


class _Output:
    """Writes the shard stream and hashes it (sha256) in its own thread, overlapping the reads.

    Each piece is written, then hashed while still in cache; a buffer goes back to its reader
    only after both. A write error is kept and raised to the writer thread by the next ``feed``
    or by ``finish``. ``threaded=False`` does both in the calling thread.
    """

    def __init__(self, *, threaded: bool = True) -> None:
        # Bounded: with reused buffers this rarely fills; with S3 data it bounds memory.
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=16)
        self.digest = hashlib.sha256()
        self.error: OSError | None = None
        self.thread: threading.Thread | None = None
        if threaded:
            self.thread = threading.Thread(target=self._run, name="shard-output", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if isinstance(item, concurrent.futures.Future):
                if self.error is not None:
                    item.set_exception(self.error)
                else:
                    item.set_result(self.digest.hexdigest())
                self.digest, self.error = hashlib.sha256(), None
                continue
            self._put(*item)

    def _put(self, fd: int, offset: int | None, pieces: list[Piece], release: Callable[[], None] | None) -> None:
        try:
            if self.error is None:  # after a failed write only buffers are given back
                if offset is not None:
                    _pwrite_all(fd, pieces, offset)
                update = self.digest.update
                for piece in pieces:
                    update(piece)  # releases the GIL for pieces over 2 KB
        except OSError as exc:
            self.error = exc
        finally:
            if release is not None:
                release()

    def check(self) -> None:
        """Raise the error of a failed write, if any."""
        if self.error is not None:
            raise self.error

    def backlog(self) -> int:
        """Pieces waiting for the output thread."""
        return self.queue.qsize() if self.thread is not None else 0

    def feed(self, fd: int, offset: int | None, pieces: list[Piece],
             release: Callable[[], None] | None = None) -> None:
        """Write ``pieces`` to ``fd`` at ``offset`` (None: already written) and hash them, then
        call ``release``."""
        self.check()
        if self.thread is None:
            self._put(fd, offset, pieces, release)
            self.check()
        else:
            self.queue.put((fd, offset, pieces, release))

    def finish(self) -> str:
        """The hex digest of everything fed since the last finish, once it is all written."""
        if self.thread is None:
            error, hexdigest = self.error, self.digest.hexdigest()
            self.digest, self.error = hashlib.sha256(), None
            if error is not None:
                raise error
            return hexdigest
        fut: concurrent.futures.Future[str] = concurrent.futures.Future()
        self.queue.put(fut)
        return fut.result()

    def close(self) -> None:
        """Wait until everything fed is written (or dropped after an error), then stop."""
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join()
            self.thread = None


def _pwrite_all(fd: int, pieces: list[Piece], offset: int) -> None:
    """Write every piece at ``offset`` on with as few syscalls as possible (no joining copy)."""
    for i in range(0, len(pieces), _IOV_MAX):
        group = pieces[i:i + _IOV_MAX]
        want = sum(len(p) for p in group)
        n = os.pwritev(fd, group, offset)
        if n < want:  # a short write: finish this group piece by piece
            skip, pos = n, offset + n
            for piece in group:
                if skip >= len(piece):
                    skip -= len(piece)
                    continue
                view = memoryview(piece)[skip:]
                skip = 0
                while view:
                    done = os.pwrite(fd, view, pos)
                    pos += done
                    view = view[done:]
        offset += want


class _TarOut:
    """One shard file being written: pieces go to the output thread, which writes and hashes them.

    Each piece is written at its own offset, so when the output thread falls behind (hashing is
    its larger half) the writer thread writes a piece itself and leaves it only the hashing: the
    work balances itself over two cores.
    """

    def __init__(self, shard: PlannedShard, path: str, output: _Output) -> None:
        self.shard = shard
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.output = output
        self.written = 0
        self.files = 0

    def emit(self, pieces: list[Piece], release: Callable[[], None] | None = None) -> None:
        offset = self.written
        self.written += sum(len(p) for p in pieces)
        self.output.check()  # nothing more is written after a failed write
        if self.output.backlog() >= 2:
            _pwrite_all(self.fd, pieces, offset)
            self.output.feed(self.fd, None, pieces, release)
        else:
            self.output.feed(self.fd, offset, pieces, release)

    def finish(self) -> str:
        self.emit([bytes(tarfmt.archive_end(self.written))])
        return self.output.finish()

    def close(self) -> None:
        if self.fd >= 0:  # once: a second close could hit a descriptor another thread reopened
            fd, self.fd = self.fd, -1
            os.close(fd)


def _check_cancel(cancelled: Callable[[], bool], written: int) -> None:
    if cancelled():
        raise ShardCancelled(f"conversion cancelled after {written} new shard(s); completed shards "
                             "are kept: rerun with --resume to continue")


def _write_shards(
    todo: Sequence[PlannedShard], source: _Source, sink: _Sink, progress: _Progress,
    cancelled: Callable[[], bool] | None, *, threaded_output: bool = True,
) -> list[ShardEntry]:
    """Write every shard in ``todo`` (runs in a thread); returns their journal entries."""
    entries: list[ShardEntry] = []
    last_check = time.monotonic()
    out: _TarOut | None = None
    output = _Output(threaded=threaded_output)
    bytes_before = progress.bytes_done

    def finish() -> None:
        nonlocal out
        assert out is not None
        try:
            sha = out.finish()
        finally:
            out.close()
        shard = out.shard
        if out.written != shard.nbytes:
            raise ShardError(f"internal error: {shard.name} is {out.written} bytes, planned {shard.nbytes}")
        entry = ShardEntry(shard.name, out.written, len(shard.samples), out.files, sha)
        sink.commit(entry, out.path)
        out = None  # committed: no longer ours to remove on failure
        entries.append(entry)
        progress.shards_done += 1
        progress.bytes_done = bytes_before + shard.nbytes  # members plus the end-of-archive
        progress.tick(force=True)

    try:
        for shard, chunk, fut in _ordered(source, todo):
            if out is None or out.shard is not shard:
                if out is not None:
                    finish()
                if cancelled is not None:
                    _check_cancel(cancelled, len(entries))  # at every shard boundary, and every 0.2 s
                bytes_before = progress.bytes_done
                out = _TarOut(shard, sink.temp_path(shard.name), output)
            if fut is None:  # one member too big for a buffer: header, streamed data, padding
                head, rel, size = chunk.members[0]
                out.emit([head])
                for piece in source.stream(rel, size):
                    out.emit(*piece)
                if size % tarfmt.BLOCK:
                    out.emit([bytes(-size % tarfmt.BLOCK)])
            else:
                out.emit(*fut.result())
            out.files += len(chunk.members)
            progress.samples_done += chunk.samples
            progress.bytes_done = bytes_before + out.written
            progress.tick()
            now = time.monotonic()
            if cancelled is not None and now - last_check >= 0.2:
                last_check = now
                _check_cancel(cancelled, len(entries))
        if out is not None:
            finish()
        sink.finish()
    except BaseException as exc:
        path = out.path if out is not None else ""
        if out is not None:
            output.close()  # nothing may still be writing to the file as it is closed and removed
            out.close()
            sink.abandon(out.path)
        if isinstance(exc, OSError):  # reads raise ShardError: this is a write (ENOSPC, EIO)
            raise _write_error(path, exc) from None
        raise
    finally:
        source.close()
        output.close()
    return entries


# -- the conversion --------------------------------------------------------------------------


async def _existing(dest: ObjectStore, pattern: str) -> tuple[list[str], bool, bool]:
    """Shard-like names already in the destination root, and whether a manifest/journal exist."""
    rx = pattern_regex(pattern)
    names: list[str] = []
    manifest = journal = False
    for obj in await dest.list(""):
        if obj.key == MANIFEST_NAME:
            manifest = True
        elif obj.key.startswith(STATE_DIR + "/"):
            journal = True
        elif "/" not in obj.key and rx.match(obj.key):
            names.append(obj.key)
    return sorted(names), manifest, journal


def _busy_refusal(req: ShardRequest, existing: list[str], has_manifest: bool, has_journal: bool) -> str:
    """Why a destination that already holds shards is refused ('' when it is not)."""
    if not (existing or has_manifest or has_journal) or req.overwrite or req.resume:
        return ""
    what = (f"{len(existing)} shard(s) (e.g. {', '.join(existing[:3])})" if existing
            else "a manifest or conversion journal")
    return (f"destination {req.dest} already has {what}; pass --resume to continue an interrupted "
            "conversion or --overwrite to replace them")


async def _read_journal(dest: ObjectStore) -> tuple[dict[str, ShardEntry], str | None]:
    entries: dict[str, ShardEntry] = {}
    plan_hash = None
    for obj in await dest.list(STATE_DIR):
        if obj.size > JOURNAL_MAX_BYTES:
            continue  # not an entry loadmaster wrote: that shard is redone, the file is not read
        raw = await dest.get_bytes(obj.key)
        try:
            doc = loads_bounded(raw, what=obj.key, max_bytes=JOURNAL_MAX_BYTES)
            if not isinstance(doc, dict):
                continue
            if obj.key == PLAN_KEY:
                plan_hash = doc.get("plan_hash")
            elif obj.key.startswith(JOURNAL_PREFIX + "/") and obj.key.endswith(".json"):
                e = ShardEntry.from_dict(doc)
                entries[e.name] = e
        except (ValueError, KeyError, TypeError, OverflowError):
            continue  # a torn journal line only means that shard is redone
    return entries, plan_hash


async def convert(
    req: ShardRequest,
    *,
    config: Config | None = None,
    src_profile: StoreProfile | None = None,
    dest_profile: StoreProfile | None = None,
    on_progress: Callable[[ShardProgress], None] | None = None,
    on_log: Callable[[str], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    prepared: ShardPreview | None = None,
    credentials: Credentials | None = None,
) -> ConvertResult:
    """Convert ``req.src`` into shards at ``req.dest``; resumable, deterministic, verified by size.

    ``prepared`` is a :func:`preview` of the same request just shown to the operator: its plan is
    used as is, so what runs is exactly what was previewed and the source is listed once.
    ``credentials`` (a node job's secrets) are used for ``s3://`` locations instead of the chain.
    """
    req.validate()
    started = time.monotonic()
    log = on_log or (lambda _m: None)
    src = open_store(req.src, src_profile, credentials)
    dest = open_store(req.dest, dest_profile, credentials)
    sink: _Sink | None = None
    try:
        plan: ShardPlan | None
        if prepared is not None and prepared.request == req and prepared.plan is not None:
            plan, problems = prepared.plan, prepared.problems
            errors, warnings = list(prepared.errors), list(prepared.warnings)
        else:
            plan, problems, errors, warnings = await _plan(req, src)
        if errors:
            raise ShardError(f"cannot shard {req.src}: " + "; ".join(errors))
        assert plan is not None
        for w in warnings:
            log(f"warning: {w}")
        existing, has_manifest, has_journal = await _existing(dest, req.pattern)
        done: dict[str, ShardEntry] = {}
        if existing or has_manifest or has_journal:
            if req.overwrite:
                old = [*existing, *([MANIFEST_NAME] if has_manifest else []),
                       *[o.key for o in await dest.list(STATE_DIR)]]
                res = await dest.delete_many(old)
                if not res.ok:
                    k, why = next(iter(res.errors.items()))
                    raise ShardError(f"cannot remove old shard {k} in {req.dest}: {why}")
                log(f"--overwrite: removed {len(existing)} existing shard(s) from {req.dest}")
            elif req.resume:
                journal, old_hash = await _read_journal(dest)
                if old_hash is not None and old_hash != plan.plan_hash:
                    raise ShardError(f"{req.dest} holds shards of a different conversion (the source, "
                                     "shard size, pattern or seed changed); use --overwrite to replace them")
                if old_hash is None and existing:
                    raise ShardError(f"{req.dest} has shards but no loadmaster journal to resume from; "
                                     "use --overwrite to replace them")
                sizes = {o.key: o.size for o in await dest.list("") if "/" not in o.key}
                planned = {s.name: s for s in plan.shards}
                for name, e in journal.items():
                    s = planned.get(name)
                    if s is not None and sizes.get(name) == e.bytes == s.nbytes:
                        done[name] = e
                log(f"--resume: {len(done)} of {len(plan.shards)} shard(s) already complete")
            else:
                raise ShardError(_busy_refusal(req, existing, has_manifest, has_journal))
        await dest.put_bytes(PLAN_KEY, json.dumps({"plan_hash": plan.plan_hash, "shards": len(plan.shards),
                                                   "samples": plan.samples}).encode())
        todo = [s for s in plan.shards if s.name not in done]
        progress = _Progress(plan, [s for s in plan.shards if s.name in done], on_progress)
        progress.tick(force=True)
        loop = asyncio.get_running_loop()
        if isinstance(dest, S3Store):
            sink = _S3Sink(dest, loop, req)
            await sink.open()
            if req.resume or req.overwrite:
                stale = await sink.abort_stale(req.pattern)
                if stale:
                    log(f"aborted {stale} unfinished multipart upload(s) of an interrupted run")
        else:
            assert isinstance(dest, LocalStore)
            sink = _LocalSink(dest, loop)
        # Written and hashed in their own thread (--workers 0: in the writer thread, with the reads).
        source: _Source = (_LocalSource(str(src.root), req.workers) if isinstance(src, LocalStore)
                           else _S3Source(src, loop, req.fetch_concurrency))  # type: ignore[arg-type]
        new_entries = await asyncio.to_thread(_write_shards, todo, source, sink, progress, cancelled,
                                              threaded_output=req.workers > 0)
        by_name = {**done, **{e.name: e for e in new_entries}}
        entries = tuple(by_name[s.name] for s in plan.shards)
        # Verify what landed: every shard present with the size the journal recorded.
        sizes = {o.key: o.size for o in await dest.list("") if "/" not in o.key}
        bad = [e.name for e in entries if sizes.get(e.name) != e.bytes]
        if bad:
            raise ShardError(f"after writing, {len(bad)} shard(s) in {req.dest} are missing or the wrong "
                             f"size (e.g. {', '.join(bad[:3])}); rerun with --resume")
        price, price_source = get_price(config, dest_profile, src_profile)
        manifest = Manifest(
            source=req.src, pattern=req.pattern, shard_size=req.shard_size, seed=req.seed,
            plan_hash=plan.plan_hash, shards=entries,
            requests=request_arithmetic(plan.files, len(entries), price, price_source),
            problems=problems.as_dict(), incomplete_policy=req.incomplete,
        )
        await dest.put_bytes(MANIFEST_NAME, manifest.to_json().encode())
        progress.tick(final=True)
        return ConvertResult(manifest, req.dest, tuple(e.name for e in new_entries), tuple(sorted(done)),
                             time.monotonic() - started, tuple(warnings))
    except OSError as exc:  # the destination's own files (plan, journal, manifest): a full disk
        raise _write_error(req.dest, exc) from None
    finally:
        if isinstance(sink, _S3Sink):
            await sink.aclose()
        await src.close()
        await dest.close()


def convert_sync(req: ShardRequest, **kwargs: Any) -> ConvertResult:
    """:func:`convert` for synchronous callers (benchmarks, job runners)."""
    return asyncio.run(convert(req, **kwargs))


# -- front-end helpers (CLI and console) ------------------------------------------------------


def resolve_location(config: Config, text: str) -> tuple[str, StoreProfile | None]:
    """A source/destination as typed -> (URL or dir, store profile); a store name stands for its URL."""
    text = text.strip()
    if not text:
        raise ShardError("a source and a destination are required (a directory or s3://bucket/prefix)")
    if text in config.stores:
        p = config.stores[text]
        return p.url, p
    if text.startswith("s3://"):
        return text.rstrip("/"), config.store_for_url(text)
    if "://" in text:
        raise ShardError(f"unsupported location {text!r}: use a local directory or s3://bucket/prefix")
    return text, None


async def job_secrets(*locations: tuple[str, StoreProfile | None]) -> dict[str, str]:
    """Credentials a node needs for the first ``s3://`` location, as env vars for the job's 0600 file."""
    for url, prof in locations:
        if url.startswith("s3://"):
            return (await S3Store(url, prof).credentials()).as_env()
    return {}


async def launch_on_node(
    services: Any, node: str, req: ShardRequest, src_profile: StoreProfile | None,
    dest_profile: StoreProfile | None,
) -> Any:
    """Start the conversion as a durable ``shard`` job on ``node`` (audited); returns its JobRecord."""
    node_cfg = services.config.node(node)
    req.validate()
    if req.spool_dir is None and req.dest.startswith("s3://"):
        # Spool shards awaiting upload on the node's scratch disk, not its (often small) /tmp.
        req = dataclasses.replace(req, spool_dir=f"{node_cfg.scratch.rstrip('/')}/.loadmaster-shard-spool")
    # The destination's credentials first: it is the side written.
    secrets = await job_secrets((req.dest, dest_profile), (req.src, src_profile))
    rec = await services.jobs.launch(node, "shard", job_params(req, src_profile, dest_profile),
                                     secrets=secrets, label=f"shard {req.src} -> {req.dest}")
    services.db.record_audit("shard.launch", req.dest, "started",
                             detail={"src": req.src, "node": node, "job": rec.id,
                                     "overwrite": req.overwrite, "resume": req.resume})
    return rec


# -- durable job -----------------------------------------------------------------------------


def job_params(req: ShardRequest, src_profile: StoreProfile | None, dest_profile: StoreProfile | None) -> dict[str, Any]:
    """Params of a ``shard`` job: the request plus the store settings (never credentials)."""
    params = req.as_params()
    params["src_profile"] = dataclasses.asdict(src_profile) if src_profile else None
    params["dest_profile"] = dataclasses.asdict(dest_profile) if dest_profile else None
    return params


def _profile(d: dict[str, Any] | None, has_env_creds: bool) -> StoreProfile | None:
    if not d:
        return None
    p = StoreProfile(**d)
    # Credentials delivered as job secrets (env) must win over a profile the node may not have.
    return dataclasses.replace(p, profile=None) if has_env_creds else p


def run_shard_job(ctx: Any) -> dict[str, Any]:
    """Job runner for kind ``shard``: convert, verify every shard landed, return the totals."""
    # The job's secrets go to the stores directly: never into os.environ (children would inherit them).
    creds = Credentials.from_env(ctx.secret_env())
    has_creds = creds is not None
    req = ShardRequest.from_params(ctx.params)

    def report(p: ShardProgress) -> None:
        ctx.progress(bytes_done=p.bytes_done, bytes_total=p.bytes_total, items_done=p.samples_done,
                     items_total=p.samples_total, shards_done=p.shards_done, shards_total=p.shards_total,
                     samples_per_s=round(p.samples_per_s, 1), mb_per_s=round(p.mb_per_s, 2),
                     phase=p.phase, final=p.final)

    result = convert_sync(
        req, src_profile=_profile(ctx.params.get("src_profile"), has_creds),
        dest_profile=_profile(ctx.params.get("dest_profile"), has_creds),
        on_progress=report, on_log=ctx.log, cancelled=lambda: bool(ctx.cancelled), credentials=creds,
    )
    ctx.log(result.manifest.summary())
    return result.as_dict()


def cleanup(ctx: Any) -> None:
    """After a cancel or a lost run: remove half-written local shards (completed ones stay)."""
    dest = str(ctx.params.get("dest", ""))
    ctx.log("completed shards are kept: continue with 'loadmaster shard SRC DEST --resume'")
    if not dest or dest.startswith("s3://") or not os.path.isdir(dest):
        return
    for name in os.listdir(dest):
        if name.startswith(".") and name.endswith(".partial"):
            try:
                os.unlink(os.path.join(dest, name))
            except OSError:
                pass

