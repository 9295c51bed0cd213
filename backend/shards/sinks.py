"""Writing shards: each one's tar stream to a file, written and hashed, then committed to a sink.

:class:`TarOut` is one shard file being written; :class:`Output` writes its pieces and hashes them
(BLAKE3, :data:`~backend.shards.manifest.HASH`) in a thread of its own. A finished shard goes to a :class:`Sink`: renamed into place and
journalled (a local directory, :class:`LocalSink`), or streamed up as a verified multipart upload
while the next is written, at most ``pending_uploads`` shards spooled (``s3://``, :class:`S3Sink`).
A shard's journal entry (``JOURNAL_PREFIX/<name>.json``, with its digest) is written once the
shard is in place, so an interrupted conversion resumes from the last completed shard.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import json
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from backend.errors import LoadmasterError
from backend.shards import tarfmt
from backend.shards.manifest import HASH, ShardEntry, new_hasher
from backend.shards.model import ShardRequest
from backend.shards.plan import STATE_DIR, PlannedShard, ShardError
from backend.shards.sources import Piece
from backend.storage import LocalStore, ObjectStore, S3Store, multipart
from backend.storage.multipart import MIN_PART_SIZE, UploadSettings

JOURNAL_PREFIX = f"{STATE_DIR}/journal"
PART_CONCURRENCY = 4  # parts of one shard uploaded at once
_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)


class Sink:
    """Where finished shards go; ``commit`` is called from the writer thread."""

    def __init__(self, store: ObjectStore, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self.loop = loop

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def journal(self, entry: ShardEntry) -> None:
        self._run(self.store.put_bytes(f"{JOURNAL_PREFIX}/{entry.name}.json", json.dumps(entry.as_dict()).encode()))

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


class LocalSink(Sink):
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


class S3Sink(Sink):
    """Streams each finished shard up with the verified multipart uploader while the next is written."""

    def __init__(self, store: S3Store, loop: asyncio.AbstractEventLoop, req: ShardRequest) -> None:
        super().__init__(store, loop)
        self.s3 = store
        # PART_CONCURRENCY also bounds the parts of one shard held in memory
        self.settings = UploadSettings(
            part_size=max(int(req.upload_part_size), MIN_PART_SIZE), concurrency=PART_CONCURRENCY, always_multipart=True
        )
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
            await multipart.upload_file(
                self.s3, path, entry.name, settings=self.settings, client=self.client, journal=self.uploads
            )
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


class Output:
    """Writes the shard stream and hashes it (:data:`HASH`) in its own thread, overlapping the reads.

    Each piece is written, then hashed while still in cache; a buffer goes back to its reader
    only after both. A write error is kept and raised to the writer thread by the next ``feed``
    or by ``finish``. ``threaded=False`` does both in the calling thread.
    """

    def __init__(self, *, threaded: bool = True) -> None:
        # Bounded: with reused buffers this rarely fills; with S3 data it bounds memory.
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=16)
        #: The hash every digest this output returns is made with (the manifest records it).
        self.algorithm = HASH
        self.digest = new_hasher(self.algorithm)
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
                self.digest, self.error = new_hasher(self.algorithm), None
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

    def feed(self, fd: int, offset: int | None, pieces: list[Piece], release: Callable[[], None] | None = None) -> None:
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
            self.digest, self.error = new_hasher(self.algorithm), None
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
        group = pieces[i : i + _IOV_MAX]
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


class TarOut:
    """One shard file being written: pieces go to the output thread, which writes and hashes them.

    Each piece is written at its own offset, so when the output thread falls behind (hashing is
    its larger half) the writer thread writes a piece itself and leaves it only the hashing: the
    work balances itself over two cores.
    """

    def __init__(self, shard: PlannedShard, path: str, output: Output) -> None:
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
