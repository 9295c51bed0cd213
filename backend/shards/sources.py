"""Reading the source: listing it, and member data handed to the writer thread in tar order.

The tar stream is cut into chunks of whole members (never across shards). A local chunk is
filled -- headers, file data read straight into place, padding -- into one of a few reused
buffers, then written with one write() and hashed with one update() in the hash thread: no
per-file bytes objects, no per-file writes or hash calls, and no fresh memory to fault in.
Objects under ``s3://`` are fetched with bounded concurrent GETs on the event loop instead.
Every local file is opened refusing one that resolves outside the source, and read checking
that it still has the size it was listed with.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import errno
import functools
import os
import queue
import resource
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from backend.shards import tarfmt
from backend.shards.plan import STATE_DIR, PlannedShard, ShardError, SourceFile, inside, scan_local
from backend.storage import LocalStore, ObjectStore, S3Store

#: Per-thread resource usage (Linux): voluntary context switches tell reads that sleep.
_RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)
#: Members filled into one buffer: small enough to stay in cache between filling and hashing.
CHUNK_BYTES = 1 << 20
Piece = bytes | bytearray | memoryview
#: What a filled chunk hands the writer: the pieces to write in order, and what to call once
#: they are written and hashed (gives a reused buffer back), if anything.
Filled = tuple[list[Piece], Callable[[], None] | None]
_ZEROS = bytes(CHUNK_BYTES)


async def scan(store: ObjectStore) -> tuple[list[SourceFile], list[tuple[str, str]]]:
    """The source's files (paginated on S3), and the local ones it cannot read (with why).

    In no particular order: :func:`~backend.shards.plan.group_samples` gives the same answer for
    any order, and S3 lists in key order anyway.
    """
    if isinstance(store, LocalStore):
        return await asyncio.to_thread(scan_local, str(store.root), ordered=False)
    assert isinstance(store, S3Store)
    files: list[SourceFile] = []
    async for page in store.iter_pages(""):  # ListObjectsV2, 1000 keys a page
        for obj in page.get("Contents", []):
            rel = store._rel(obj["Key"])
            if rel.startswith(STATE_DIR + "/") or rel.endswith("/"):
                continue
            files.append(SourceFile(rel, int(obj["Size"])))
    return files, []


class Chunk(NamedTuple):
    """Consecutive members of one shard: (header, relative path, size) each."""

    members: list[tuple[bytes, str, int]]
    nbytes: int  # headers + data + padding
    samples: int  # samples whose last member is in this chunk (for progress)
    big: bool = False  # one member larger than a buffer: the writer streams it


def _chunks(shard: PlannedShard, cap: int, max_files: int, stream_big: bool) -> Iterator[Chunk]:
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
                yield Chunk(members, used, samples)
                members, used, samples = [], 0, 0
            if stream_big and nb > cap:
                yield Chunk([(head, rel, size)], nb, 0, True)
                continue
            members.append((head, rel, size))
            used += nb
        samples += 1
    if members or samples:
        yield Chunk(members, used, samples)


def _unreadable(path: str, exc: OSError) -> ShardError:
    return ShardError(f"cannot read source file {path}: {exc.strerror or exc}")


_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_NONBLOCK", 0)


def _open_source(path: str, root_real: str, flags: int = _OPEN_FLAGS, what: str = "file") -> int:
    """Open a source file (or, with ``what="folder"``, a folder) for reading, refusing one that
    resolves outside the source.

    The check is made on the open descriptor (``/proc/self/fd``), so a file swapped for a
    symbolic link after the listing cannot smuggle another file in; O_NONBLOCK keeps a FIFO
    swapped in from blocking the conversion (its read fails instead).
    """
    fd = os.open(path, flags)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = os.path.realpath(path)  # no /proc: the path as it resolves now
    if not inside(real, root_real):
        os.close(fd)
        raise ShardError(
            f"source {what} {path} resolves to {real}, outside the source "
            f"{root_real}: refused (a symbolic link out of SRC is never followed)"
        )
    return fd


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class _Folders:
    """Open descriptors of the source folders one chunk reads from, each checked once.

    A source file is opened by its name relative to its folder's descriptor, without following a
    link (``O_NOFOLLOW``), as GNU tar opens what it packs: one short lookup per file, not a walk of
    the whole path plus a ``/proc/self/fd`` readlink. The folder itself is checked the way a file
    is (:func:`_open_source`: where its open descriptor leads must lie inside the source), so a
    folder swapped for a link out of the source after the listing is refused. A file that is a
    link fails with ``ELOOP`` and takes the checked path of :func:`_open_source`: a link to a file
    inside the source is data, one leading out is refused. Held for one chunk (a few dozen files)
    and then closed, so nothing is evicted while another reader thread uses it.
    """

    def __init__(self, base: str, root_real: str) -> None:
        self.base = base
        self.root_real = root_real
        self.fds: dict[str, int] = {}

    def open(self, rel: str) -> int:
        slash = rel.rfind("/")
        folder, name = (rel[:slash], rel[slash + 1 :]) if slash >= 0 else ("", rel)
        if not _NOFOLLOW or not name or name in (".", ".."):
            return _open_source(self.base + rel, self.root_real)
        dfd = self.fds.get(folder)
        if dfd is None:
            dfd = self.fds[folder] = self._open_folder(folder)
        try:
            return os.open(name, _OPEN_FLAGS | _NOFOLLOW, dir_fd=dfd)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
        return _open_source(self.base + rel, self.root_real)  # a link: followed only inside the source

    def _open_folder(self, folder: str) -> int:
        return _open_source(self.base + folder, self.root_real, _DIR_FLAGS, "folder")

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _changed(path: str, size: int, got: int) -> ShardError:
    return ShardError(
        f"source file {path} changed during the conversion (listed {size} bytes, "
        f"read {got}); run again once the source is stable"
    )


def _read_source(
    path: str, size: int, opener: Callable[[str], int], rel: str, read: Callable[..., int], *args: Any
) -> None:
    """Open ``path`` (listed at ``size`` bytes) with ``opener(rel)``, let ``read(fd, *args)`` read
    it all, check the count.

    ``read`` returns how many bytes it got, one more than it was asked for when the file grew.
    """
    try:
        fd = opener(rel)
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


class Source:
    """Member data for the writer thread: chunks filled ahead of it, handed over in order."""

    cap = CHUNK_BYTES
    max_files = 1 << 30
    stream_big = False
    ahead = 2

    def submit(self, chunk: Chunk) -> concurrent.futures.Future[Filled]:
        raise NotImplementedError

    def stream(self, rel: str, size: int) -> Iterator[Filled]:
        """One big file's data in buffer-sized pieces (only when ``stream_big``)."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop reading ahead (the conversion is over or failed)."""


class LocalSource(Source):
    """Local files read into reused buffers: by the writer thread, or by ``workers`` threads once
    reads turn out to wait for the device or the network.

    Reader threads pay off only while reads block (a network filesystem, a cold disk): on files
    the page cache already holds, a read is a memory copy and threads only fight over the GIL
    (on 2 cores that cost a third more CPU than the whole read). So the writer thread reads
    while its reads do not sleep, and hands reading to the pool for good once they do. With
    ``workers`` 0 it always reads itself (and hashes too: see ``backend.shards.convert._write_shards``).
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

    def fill(self, chunk: Chunk, buf: bytearray) -> Filled:
        mv = memoryview(buf)
        spare = bytearray(1)
        base = self.base
        folders = _Folders(base, self.root_real)
        opener = folders.open
        pos = 0
        try:
            for head, rel, size in chunk.members:
                end = pos + len(head)
                mv[pos:end] = head
                _read_source(base + rel, size, opener, rel, _readv_exact, mv[end : end + size], spare)
                pos = end + size
                pad = -size % tarfmt.BLOCK
                if pad:  # the buffer is reused: padding is written, not assumed
                    mv[pos : pos + pad] = _ZEROS[:pad]
                    pos += pad
        finally:
            folders.close()
        return [mv[:pos]], functools.partial(self.buffers.put, buf)

    def submit(self, chunk: Chunk) -> concurrent.futures.Future[Filled]:
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
                mv = memoryview(buf)[: min(len(buf), size - got)]
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


class S3Source(Source):
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
            raise ShardError(
                f"{self.store.url}/{rel} changed during the conversion (listed {size} bytes, got {len(data)})"
            )
        return data

    async def _fill(self, chunk: Chunk) -> Filled:
        datas = await asyncio.gather(*(self._fetch(rel, size) for _h, rel, size in chunk.members))
        pieces: list[Piece] = []
        for (head, _rel, size), data in zip(chunk.members, datas, strict=True):
            pieces += (head, data)
            if size % tarfmt.BLOCK:
                pieces.append(_ZEROS[: -size % tarfmt.BLOCK])
        return pieces, None

    def submit(self, chunk: Chunk) -> concurrent.futures.Future[Filled]:
        return asyncio.run_coroutine_threadsafe(self._fill(chunk), self.loop)


def ordered(source: Source, todo: Sequence[PlannedShard]) -> Iterator[tuple[PlannedShard, Chunk, Any]]:
    """(shard, chunk, future of its filling or None for a streamed one) in order, ``ahead`` submitted."""
    chunks = ((shard, c) for shard in todo for c in _chunks(shard, source.cap, source.max_files, source.stream_big))
    pending: collections.deque[tuple[PlannedShard, Chunk, Any]] = collections.deque()

    def push(item: tuple[PlannedShard, Chunk] | None) -> bool:
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
