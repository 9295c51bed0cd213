"""Verified S3 multipart upload of one local file, shared by checkpoint uploads and shard streaming.

Each file goes up as an S3 multipart upload with equal parts (the last one shorter), several
parts in flight, each part read from disk with ``os.preadv`` (never the whole file), sent with a
Content-MD5 and retried on failure or on an ETag that does not match what we sent. After
completion the object is HEADed: its size and its composite ETag (MD5 of the part MD5s, "-N")
must match what we computed from the bytes on disk. Any failure or cancel aborts the multipart
upload, so no orphaned parts are left. Every upload id is recorded in a
:class:`MultipartJournal` as soon as S3 hands it out, so what a killed process left behind is
aborted later by id (:func:`abort_recorded`): never a multipart upload someone else started.

Cost per byte (the uploader shares a node's CPUs with training and the store's own gateway):
each part is read into a buffer reused from part to part (no fresh pages for the kernel to
zero), hashed once (MD5, in the same worker-thread call as the read, the GIL released), and sent
from that buffer in 1 MiB slices (no 32 MiB copy into asyncio's transport buffer). botocore's own
per-part CRC32 is off by default: the Content-MD5 the server checks already covers each part
(``UploadSettings.sdk_checksum`` turns it back on where the store profile allows it).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.backoff import Backoff
from backend.errors import LoadmasterError, StoreError
from backend.storage import LocalStore, ObjectStore, S3Store, join_key

MiB = 1024 * 1024
DEFAULT_PART_SIZE = 32 * MiB
DEFAULT_CONCURRENCY = 8
DEFAULT_RETRIES = 4
#: Seconds a failed part waits before its next attempt: doubling from the first, up to the max.
PART_RETRY_FIRST = 0.2
PART_RETRY_MAX = 8.0
MIN_PART_SIZE = 5 * MiB  # S3's minimum for every part but the last
MAX_PARTS = 10_000
#: A part's body goes to the socket in slices this size (asyncio copies whatever the socket does
#: not take at once into its own buffer: a slice, never a whole part).
SEND_SLICE = 1 * MiB

#: Test hook: (key, part_number, attempt, data) -> data actually sent (fault injection only).
PartFault = Callable[[str, int, int, bytes], bytes]


class UploadError(StoreError):
    """An upload failed (after retries) or its verification did not match."""


class UploadCancelled(LoadmasterError):
    """The upload was cancelled; its multipart uploads were aborted."""


@dataclass(frozen=True)
class UploadSettings:
    """Part size, parts in flight, retries per part, files in flight."""

    part_size: int = DEFAULT_PART_SIZE
    concurrency: int = DEFAULT_CONCURRENCY
    retries: int = DEFAULT_RETRIES
    files_in_flight: int = 4
    #: SigV4 signs the SHA-256 of every body over plain http (both sides hash every byte). Each
    #: part already carries a Content-MD5 the server checks, plus our ETag checks, which is
    #: botocore's own policy over https; True restores payload signing.
    sign_payload: bool = False
    #: A file that fits in one part still goes up as a (one-part) multipart upload, so every
    #: object has the same "-N" ETag form (shards); False sends it as a single PUT.
    always_multipart: bool = False
    #: Also let botocore add its own CRC32 of every part (``x-amz-checksum-crc32``) when the
    #: store profile's ``checksum`` is "when_supported". Off by default: each part's Content-MD5
    #: is already checked by the server and the composite ETag after completion, so the CRC32
    #: would hash every byte a second time on both sides. "when_required" profiles (R2) never
    #: get it either way.
    sdk_checksum: bool = False

    def check(self) -> UploadSettings:
        if self.part_size < MIN_PART_SIZE:
            raise UploadError(f"part size {self.part_size} is below S3's 5 MiB minimum")
        if self.concurrency < 1 or self.retries < 0 or self.files_in_flight < 1:
            raise UploadError("concurrency and files_in_flight must be >= 1, retries >= 0")
        return self


class MultipartJournal:
    """The multipart uploads one upload started (bucket, key, upload id), kept in a JSON-lines file
    when given a path, so that a later run or a lost job's cleanup aborts exactly those.

    While an upload runs it holds an exclusive lock on its journal (:meth:`locked`): a second
    upload to the same destination on this machine is refused instead of aborting the first
    one's parts, and entries found under the lock are those of a run that is gone.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._open: dict[str, tuple[str, str]] = {}
        self._lock_fd: int | None = None
        self._load()

    @classmethod
    def for_destination(cls, url: str) -> MultipartJournal:
        """The journal of uploads to ``url`` made in-process on this machine (CLI, console, training
        scripts): under the data dir, keyed by the destination."""
        from backend.config import data_dir

        d = data_dir() / "uploads"
        d.mkdir(parents=True, exist_ok=True)
        return cls(d / f"{hashlib.sha256(url.encode()).hexdigest()[:24]}.jsonl")

    def _load(self) -> None:
        self._open.clear()
        if self.path is None or not self.path.exists():
            return
        for line in self.path.read_text().splitlines():
            try:
                d = json.loads(line)
                if d["op"] == "start":
                    self._open[str(d["upload_id"])] = (str(d["bucket"]), str(d["key"]))
                elif d["op"] == "end":
                    self._open.pop(str(d["upload_id"]), None)
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line (killed mid-write): the id before it is still read

    @contextlib.contextmanager
    def locked(self, dest: str, *, tidy: bool = False) -> Iterator[MultipartJournal]:
        """Hold the journal for one upload to ``dest`` (re-read under the lock); with ``tidy``, a
        journal left with nothing open is removed afterwards."""
        if self.path is None:
            yield self
            return
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UploadError(
                f"another upload to {dest} is running on this machine (its journal {self.path} "
                "is locked); wait for it or cancel it"
            ) from None
        self._lock_fd = fd
        try:
            self._load()
            yield self
        finally:
            if tidy and not self._open:
                with contextlib.suppress(OSError):
                    self.path.unlink()
            self._lock_fd = None
            os.close(fd)

    def _append(self, record: dict[str, str]) -> None:
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def started(self, bucket: str, key: str, upload_id: str) -> None:
        """Record an upload id the moment S3 returns it (before any part is sent)."""
        self._append({"op": "start", "bucket": bucket, "key": key, "upload_id": upload_id})
        self._open[upload_id] = (bucket, key)

    def ended(self, upload_id: str) -> None:
        """The upload was completed or aborted: nothing of it is left to clean up."""
        if self._open.pop(upload_id, None) is not None:
            self._append({"op": "end", "upload_id": upload_id})

    def open_uploads(self) -> list[tuple[str, str, str]]:
        """(bucket, key, upload id) started and not yet completed or aborted."""
        return [(b, k, uid) for uid, (b, k) in self._open.items()]


@dataclass(frozen=True)
class UploadedObject:
    """One verified object: key, size, ETag and number of parts (0 = single PUT)."""

    key: str
    size: int
    etag: str
    parts: int


def _part_count(size: int, part_size: int) -> int:
    return max(1, -(-size // part_size))


def effective_part_size(size: int, part_size: int) -> int:
    """The part size for a file: the configured one, grown if the file would need > 10000 parts."""
    while _part_count(size, part_size) > MAX_PARTS:
        part_size *= 2
    return part_size


def _read_part(path: Path, offset: int, view: memoryview) -> bytes:
    """Fill ``view`` from ``path`` at ``offset`` and return its MD5 (one worker-thread call)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        got = 0
        while got < len(view):
            n = os.preadv(fd, [view[got:]], offset + got)
            if n == 0:
                break
            got += n
    finally:
        os.close(fd)
    if got != len(view):
        raise UploadError(
            f"{path}: short read ({got} of {len(view)} bytes at {offset}); was the file modified during the upload?"
        )
    return hashlib.md5(view, usedforsecurity=False).digest()


#: Part buffers, reused from part to part: one free list per parts semaphore (so at most its
#: ``concurrency`` buffers exist), gone with the semaphore at the end of the upload.
_BUFFERS: weakref.WeakKeyDictionary[asyncio.Semaphore, list[bytearray]] = weakref.WeakKeyDictionary()


def _take_buffer(sem: asyncio.Semaphore, length: int) -> bytearray:
    free = _BUFFERS.setdefault(sem, [])
    while free:
        buf = free.pop()
        if len(buf) >= length:
            return buf
    return bytearray(length)


class PartBody:
    """A part's bytes as a request body: botocore sees a seekable file of known length, aiohttp
    writes it in :data:`SEND_SLICE` slices straight from the part buffer (see :class:`_PartPayload`).

    ``read`` (a copy) only serves botocore when it hashes the body itself (payload signing, its
    CRC32); the fast path never calls it.
    """

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self._pos = 0

    def __len__(self) -> int:
        return len(self.view)

    def read(self, n: int = -1) -> bytes:
        end = len(self.view) if n is None or n < 0 else min(len(self.view), self._pos + n)
        out = bytes(self.view[self._pos : end])
        self._pos = end
        return out

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: len(self.view)}[whence]
        self._pos = max(0, min(len(self.view), base + pos))
        return self._pos

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True


_payload_registered = False


def _register_part_payload() -> None:
    """Teach aiohttp to send a :class:`PartBody` (imported lazily: aiohttp is heavy)."""
    global _payload_registered
    if _payload_registered:
        return
    from aiohttp import payload

    class _PartPayload(payload.Payload):
        _value: PartBody

        def __init__(self, value: PartBody, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("content_type", "application/octet-stream")
            super().__init__(value, *args, **kwargs)
            self._size = len(value)

        def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
            return bytes(self._value.view).decode(encoding, errors)

        async def write(self, writer: Any) -> None:
            await self.write_with_length(writer, None)

        async def write_with_length(self, writer: Any, content_length: int | None) -> None:
            view = self._value.view
            end = len(view) if content_length is None else min(len(view), content_length)
            for i in range(0, end, SEND_SLICE):
                await writer.write(view[i : min(end, i + SEND_SLICE)])  # drains between slices

    payload.register_payload(_PartPayload, PartBody)
    _payload_registered = True


class ProgressCounter:
    """Bytes and files done of a total, reported to ``on_progress(done, total, files_done, files)``."""

    def __init__(self, total: int, on_progress: Callable[..., object] | None, files: int = 0) -> None:
        self.done = 0
        self.total = total
        self.files_done = 0
        self.files = files
        self.on_progress = on_progress

    def add(self, n: int) -> None:
        self.done += n
        self._emit()

    def file_done(self) -> None:
        self.files_done += 1
        self._emit()

    def _emit(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.done, self.total, self.files_done, self.files)


async def upload_file(
    store: ObjectStore,
    path: str | Path,
    key: str,
    *,
    settings: UploadSettings | None = None,
    parts_sem: asyncio.Semaphore | None = None,
    counter: ProgressCounter | None = None,
    cancelled: Callable[[], bool] | None = None,
    fault: PartFault | None = None,
    client: Any = None,
    journal: MultipartJournal | None = None,
) -> UploadedObject:
    """Upload one local file to ``key`` and verify its size and checksum after completion
    (a multipart upload's id goes into ``journal`` before any part is sent)."""
    settings = (settings or UploadSettings()).check()
    path = Path(path)
    size = path.stat().st_size
    if isinstance(store, LocalStore):
        await store.copy_in(path, key)
        if counter:
            counter.add(size)
        st = await store.stat(key)
        if st is None or st.size != size:
            raise UploadError(f"{store.url}/{key}: copy has the wrong size")
        return UploadedObject(key, size, "", 0)
    if not isinstance(store, S3Store):
        raise UploadError(f"cannot upload to {store.url}: unsupported store type")
    if client is None:
        async with upload_client(store, settings) as own:
            return await upload_file(
                store,
                path,
                key,
                settings=settings,
                parts_sem=parts_sem,
                counter=counter,
                cancelled=cancelled,
                fault=fault,
                client=own,
                journal=journal,
            )
    _register_part_payload()
    full_key = join_key(store.prefix, key)
    sem = parts_sem or asyncio.Semaphore(settings.concurrency)
    part_size = effective_part_size(size, settings.part_size)
    n_parts = _part_count(size, part_size)

    async def send(part_no: int, send_fn: Callable[[Any, str], Any]) -> tuple[str, bytes]:
        """Read part ``part_no`` and send it, retrying; returns (etag, md5 digest). Holds ``sem``."""
        offset = (part_no - 1) * part_size
        length = min(part_size, size - offset)
        buf = _take_buffer(sem, length)
        view = memoryview(buf)[:length]
        last: Exception | None = None
        backoff = Backoff(PART_RETRY_FIRST, PART_RETRY_MAX)
        try:
            for attempt in range(settings.retries + 1):
                if cancelled is not None and cancelled():
                    raise UploadCancelled(f"upload of {path} cancelled")
                # re-read on every attempt: what goes up is what is on disk now
                digest = await asyncio.to_thread(_read_part, path, offset, view)
                body: Any = PartBody(view) if fault is None else fault(key, part_no, attempt, bytes(view))
                try:
                    resp = await send_fn(body, base64.b64encode(digest).decode())
                    etag = resp.get("ETag", "").strip('"')
                    if etag and etag != digest.hex():
                        raise UploadError(f"part {part_no} of {key}: server ETag {etag} != MD5 {digest.hex()} we sent")
                    if counter:
                        counter.add(length)
                    # the request is complete (response read): nothing can still be sending from
                    # the buffer, so the next part may reuse it (the view is released below, before
                    # any other part can run). On any other exit it is dropped.
                    _BUFFERS.setdefault(sem, []).append(buf)
                    return etag or digest.hex(), digest
                except (UploadCancelled, asyncio.CancelledError):
                    raise
                except Exception as exc:  # noqa: BLE001 - every transport/server error is retried
                    last = exc
                    del body
                    if attempt < settings.retries:  # after the last attempt there is none to wait for
                        await backoff.sleep()
        finally:
            view.release()
        raise UploadError(
            f"{store.url}/{key}: part {part_no} failed after {settings.retries + 1} attempts: "
            f"{store.error(last) if last and not isinstance(last, UploadError) else last}"
        )

    if n_parts == 1 and not settings.always_multipart:

        async def put(body: Any, md5: str) -> Any:
            return await client.put_object(Bucket=store.bucket, Key=full_key, Body=body, ContentMD5=md5)

        async with sem:
            etag, digest = await send(1, put)
        expected = digest.hex()
        parts = 0
    else:
        # A cancel that lands while the create is in flight must not orphan the upload the store
        # has already made: the create finishes (shielded), its id is aborted, then we stop.
        create = asyncio.ensure_future(client.create_multipart_upload(Bucket=store.bucket, Key=full_key))
        try:
            created = await asyncio.shield(create)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                made = await create
                await _abort(client, store.bucket, full_key, made["UploadId"])
            raise
        except Exception as exc:  # noqa: BLE001
            raise store.error(exc) from None
        upload_id = created["UploadId"]
        try:
            if journal is not None:
                journal.started(store.bucket, full_key, upload_id)

            async def one(part_no: int) -> tuple[int, str, bytes]:
                async def up(body: Any, md5: str) -> Any:
                    return await client.upload_part(
                        Bucket=store.bucket,
                        Key=full_key,
                        UploadId=upload_id,
                        PartNumber=part_no,
                        Body=body,
                        ContentMD5=md5,
                    )

                async with sem:
                    etag, digest = await send(part_no, up)
                return part_no, etag, digest

            tasks = [asyncio.ensure_future(one(i)) for i in range(1, n_parts + 1)]
            try:
                results = await asyncio.gather(*tasks)
            except BaseException:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
            results.sort()
            await client.complete_multipart_upload(
                Bucket=store.bucket,
                Key=full_key,
                UploadId=upload_id,
                MultipartUpload={"Parts": [{"PartNumber": n, "ETag": f'"{e}"'} for n, e, _ in results]},
            )
            if journal is not None:
                journal.ended(upload_id)
        except BaseException as exc:
            # shielded so a cancelled task still cleans up its parts
            if await asyncio.shield(_abort(client, store.bucket, full_key, upload_id)) and journal is not None:
                journal.ended(upload_id)
            if not isinstance(exc, Exception) or isinstance(exc, LoadmasterError):
                raise  # cancellation, KeyboardInterrupt, or our own error
            raise store.error(exc) from None
        expected = hashlib.md5(b"".join(d for _, _, d in results), usedforsecurity=False).hexdigest() + f"-{n_parts}"
        parts = n_parts
    head = await store.stat(key)
    if head is None or head.size != size:
        raise UploadError(
            f"{store.url}/{key}: verification failed: stored size "
            f"{None if head is None else head.size} != {size} bytes on disk"
        )
    if head.etag and head.etag != expected:
        raise UploadError(
            f"{store.url}/{key}: verification failed: stored ETag {head.etag} != {expected} "
            "computed from the file on disk"
        )
    return UploadedObject(key, size, expected, parts)


@contextlib.asynccontextmanager
async def upload_client(store: S3Store, settings: UploadSettings) -> AsyncIterator[Any]:
    """An S3 client for uploads: the store's settings, plus payload signing and botocore's own
    checksum per ``settings`` (parts carry a Content-MD5 either way)."""
    p = store.profile
    s3cfg: dict[str, Any] = {"addressing_style": p.addressing_style if p else "auto"}
    if not settings.sign_payload:
        s3cfg["payload_signing_enabled"] = False
    async with contextlib.AsyncExitStack() as stack:
        try:
            client = await stack.enter_async_context(
                store.botocore_session().create_client(
                    "s3",
                    endpoint_url=p.endpoint_url if p else None,
                    region_name=p.region if p and p.region and p.region != "auto" else "us-east-1",
                    config=store.client_config(
                        s3=s3cfg,
                        max_pool_connections=max(64, settings.concurrency * 2),
                        **({} if settings.sdk_checksum else {"request_checksum_calculation": "when_required"}),
                    ),
                )
            )
        except Exception as exc:  # noqa: BLE001 - profile/credential problems name what to fix
            raise store.error(exc) from None
        yield store.prepare_client(client)


async def _abort(client: Any, bucket: str, key: str, upload_id: str) -> bool:
    """Abort one multipart upload by id; True when it is gone (aborted now or already)."""
    try:
        await client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    except Exception as exc:  # noqa: BLE001 - best effort; the journal keeps the id for the next try
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        return code in ("NoSuchUpload", "404")
    return True


async def list_multipart(store: ObjectStore, prefix: str = "") -> list[tuple[str, str, float]]:
    """In-progress multipart uploads under ``prefix``: (key relative to the store, upload id, started)."""
    if not isinstance(store, S3Store):
        return []
    client = await store.client()
    out = []
    full = join_key(store.prefix, prefix)
    try:
        async for page in client.get_paginator("list_multipart_uploads").paginate(
            Bucket=store.bucket, Prefix=full + "/" if full else ""
        ):
            for u in page.get("Uploads", []):
                out.append((store._rel(u["Key"]), u["UploadId"], u["Initiated"].timestamp()))
    except Exception as exc:  # noqa: BLE001
        raise store.error(exc) from None
    return out


async def abort_recorded(store: ObjectStore, journal: MultipartJournal) -> list[tuple[str, str]]:
    """Abort the multipart uploads ``journal`` recorded and never saw end: (key, upload id) of each
    one gone now. Uploads anyone else started are never touched."""
    if not isinstance(store, S3Store) or not journal.open_uploads():
        return []
    client = await store.client()
    out = []
    for bucket, key, uid in journal.open_uploads():
        if bucket == store.bucket and await _abort(client, bucket, key, uid):
            journal.ended(uid)
            out.append((key, uid))
    return out


async def abort_stale(
    store: ObjectStore, prefix: str, *, before: float | None = None, match: Callable[[str], bool] | None = None
) -> int:
    """Abort EVERY multipart upload under ``prefix`` (started before ``before``, keys ``match`` accepts).

    It cannot tell whose they are: only for a caller that owns the whole prefix. Uploads of
    checkpoints record their ids instead and use :func:`abort_recorded`.
    """
    if not isinstance(store, S3Store):
        return 0
    client = await store.client()
    n = 0
    for key, uid, started in await list_multipart(store, prefix):
        if (before is None or started <= before) and (match is None or match(key)):
            await _abort(client, store.bucket, join_key(store.prefix, key), uid)
            n += 1
    return n
