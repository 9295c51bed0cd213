"""Upload a checkpoint step directory to an object store: parallel multipart, verified, ordered.

Each file goes up through :func:`backend.storage.multipart.upload_file` (parallel parts, per-part
Content-MD5, retries, ETag and size verified, aborted on failure or cancel). Commit markers (DCP
``.metadata``, the safetensors index, DeepSpeed ``latest``) go up LAST so a reader never sees a complete-looking partial checkpoint.
A destination that already holds objects is refused unless ``overwrite=True``. Every multipart
upload id is journalled as it is created; a rerun with the same journal, or a lost job's
cleanup, aborts those and only those (other people's uploads under the prefix are counted and
left alone).

The node job that runs an upload on a node is :mod:`backend.checkpoints.upload.job`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.config import StoreProfile
from backend.errors import StoreError
from backend.storage import Credentials, LocalStore, ObjectStore, S3Store, join_key
from backend.storage.multipart import (
    DEFAULT_CONCURRENCY,  # noqa: F401 - re-exported: the operation layer's defaults
    DEFAULT_PART_SIZE,  # noqa: F401 - re-exported: the operation layer's defaults
    MiB,
    MultipartJournal,
    PartFault,
    ProgressCounter,
    UploadCancelled,  # noqa: F401 - re-exported: callers catch it from here
    UploadedObject,
    UploadError,
    UploadSettings,
    abort_recorded,
    list_multipart,
    upload_client,
    upload_file,
)

#: The job directory's record of the multipart uploads an upload job started.
JOURNAL_FILE = "multipart.jsonl"

COMMIT_MARKERS = (".metadata", "model.safetensors.index.json", "latest")


@dataclass(frozen=True)
class UploadResult:
    """A finished, verified directory upload."""

    url: str
    prefix: str
    objects: tuple[UploadedObject, ...]
    bytes: int
    seconds: float
    #: Multipart uploads this upload's journal had left open (a killed earlier run), now aborted.
    aborted_stale: int = 0
    aborted_ids: tuple[str, ...] = ()
    #: Multipart uploads in progress under the destination that this upload did not start: left alone.
    others_in_progress: int = 0
    overwrote: int = 0

    @property
    def gbps(self) -> float:
        return self.bytes * 8 / 1e9 / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {
            "url": self.url,
            "prefix": self.prefix,
            "objects": len(self.objects),
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "gbps": round(self.gbps, 3),
            "aborted_stale": self.aborted_stale,
            "aborted_ids": list(self.aborted_ids),
            "others_in_progress": self.others_in_progress,
            "overwrote": self.overwrote,
        }

    def notes(self) -> list[str]:
        """What the upload did beside uploading, in words (for logs and the CLI)."""
        out = []
        if self.aborted_stale:
            out.append(
                f"aborted {self.aborted_stale} multipart upload(s) an earlier run of this upload left "
                f"open ({', '.join(self.aborted_ids)})"
            )
        if self.others_in_progress:
            out.append(
                f"left {self.others_in_progress} multipart upload(s) under the destination alone: "
                "not started by this upload"
            )
        if self.overwrote:
            out.append(f"overwrote a destination that held {self.overwrote} object(s) (overwrite was given)")
        return out


def local_files(root: Path) -> dict[str, int]:
    """Files under ``root`` (relative path -> size), skipping our own temporary files."""
    if not root.is_dir():
        raise UploadError(f"{root}: not a directory")
    out = {
        str(p.relative_to(root)): p.stat().st_size
        for p in root.rglob("*")
        if p.is_file() and not p.name.endswith(".tmp-lm")
    }
    if not out:
        raise UploadError(f"{root}: no files to upload")
    return out


def upload_order(files: list[str]) -> list[str]:
    """Data files first (largest first, so parts stay busy), commit markers last."""
    return sorted(files, key=lambda f: (f.rsplit("/", 1)[-1] in COMMIT_MARKERS, f))


async def check_destination(store: ObjectStore, prefix: str, *, overwrite: bool) -> int:
    """Refuse a destination that already holds objects unless ``overwrite``; returns their number."""
    found = await store.list(prefix)
    if found and not overwrite:
        example = found[0].key
        raise UploadError(
            f"{url_join(store.url, prefix)} already holds {len(found)} object(s) (e.g. {example}); "
            "refusing to overwrite: pass --overwrite to replace them"
        )
    return len(found)


async def upload_dir(
    store: ObjectStore,
    local_dir: str | Path,
    prefix: str,
    *,
    settings: UploadSettings | None = None,
    progress: Callable[[int, int, int, int], object] | None = None,
    cancelled: Callable[[], bool] | None = None,
    fault: PartFault | None = None,
    overwrite: bool = False,
    journal: MultipartJournal | None = None,
) -> UploadResult:
    """Upload every file of ``local_dir`` under ``prefix``; markers last; every object verified.

    A ``prefix`` that already holds objects is refused (:class:`UploadError` naming it and
    ``--overwrite``) unless ``overwrite=True``. ``journal`` records every multipart upload id as
    it is created (by default this machine's journal for the destination); open ids it holds
    from an earlier, killed run are aborted first, and nothing anyone else started is touched.
    ``progress(bytes_done, bytes_total, files_done, files_total)`` is called as parts complete.
    """
    settings = (settings or UploadSettings()).check()
    root = Path(local_dir)
    sizes = await asyncio.to_thread(local_files, root)
    dest = url_join(store.url, prefix)
    own = journal is None
    if journal is None:
        journal = MultipartJournal.for_destination(dest) if isinstance(store, S3Store) else MultipartJournal()
    with journal.locked(dest, tidy=own):
        return await _upload_locked(
            store, root, prefix, sizes, settings, progress, cancelled, fault, overwrite, journal
        )


async def _upload_locked(
    store: ObjectStore,
    root: Path,
    prefix: str,
    sizes: dict[str, int],
    settings: UploadSettings,
    progress: Callable[[int, int, int, int], object] | None,
    cancelled: Callable[[], bool] | None,
    fault: PartFault | None,
    overwrite: bool,
    journal: MultipartJournal,
) -> UploadResult:
    files = list(sizes)
    t0 = time.monotonic()
    # What an earlier, killed run of this same upload left behind: its own ids, nobody else's.
    aborted = await abort_recorded(store, journal)
    present = await check_destination(store, prefix, overwrite=overwrite)
    counter = ProgressCounter(sum(sizes.values()), progress, len(sizes))
    parts_sem = asyncio.Semaphore(settings.concurrency)
    files_sem = asyncio.Semaphore(settings.files_in_flight)
    ordered = upload_order(files)
    data = sorted((f for f in ordered if f.rsplit("/", 1)[-1] not in COMMIT_MARKERS), key=lambda f: -sizes[f])
    markers = [f for f in ordered if f.rsplit("/", 1)[-1] in COMMIT_MARKERS]

    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(upload_client(store, settings)) if isinstance(store, S3Store) else None

        async def one(f: str) -> UploadedObject:
            async with files_sem:
                obj = await upload_file(
                    store,
                    root / f,
                    join_key(prefix, f),
                    settings=settings,
                    parts_sem=parts_sem,
                    counter=counter,
                    cancelled=cancelled,
                    fault=fault,
                    client=client,
                    journal=journal,
                )
                counter.file_done()
                return obj

        done: list[UploadedObject] = []
        tasks = [asyncio.ensure_future(one(f)) for f in data]
        try:
            done.extend(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        for f in markers:  # only after every data file is complete and verified
            done.append(await one(f))
    others = [uid for _key, uid, _t in await list_multipart(store, prefix)]
    return UploadResult(
        store.url,
        prefix,
        tuple(done),
        counter.total,
        time.monotonic() - t0,
        len(aborted),
        tuple(uid for _k, uid in aborted),
        len(others),
        present,
    )


async def download_file(store: ObjectStore, key: str, dest: Path, *, chunk: int = 64 * MiB) -> None:
    """Download one object to ``dest`` in ranged chunks (bounded memory)."""
    info = await store.stat(key)
    if info is None:
        raise StoreError(f"{store.url}: no object {key!r}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as f:  # noqa: ASYNC230 - sequential writes of bounded chunks
        pos = 0
        while pos < info.size:
            data = await store.get_range(key, pos, min(chunk, info.size - pos))
            if not data:
                raise StoreError(f"{store.url}/{key}: short read at {pos}")
            await asyncio.to_thread(f.write, data)
            pos += len(data)


# -- what a node job re-opens a store from (the upload and strip kinds, save) ----------------------


def url_join(url: str, sub: str) -> str:
    """``url`` + ``/sub`` (keeps a local path's leading slash, unlike join_key)."""
    sub = sub.strip("/")
    return f"{url.rstrip('/')}/{sub}" if sub else url


def store_params(store: ObjectStore) -> dict[str, Any]:
    """JSON parameters that let a node re-open ``store`` (no secrets: those travel separately)."""
    if isinstance(store, S3Store):
        p = store.profile or StoreProfile(url=store.url)
        return {
            "url": store.url,
            "endpoint_url": p.endpoint_url,
            "region": p.region,
            "provider": p.provider,
            "addressing_style": p.addressing_style,
            "checksum": p.checksum,
            "name": p.name,
        }
    return {"url": store.url}


def open_store_params(params: dict[str, Any], env: dict[str, str] | None = None) -> ObjectStore:
    """Re-open a store from :func:`store_params` output and the job's secret env."""
    url = params["url"]
    if not url.startswith("s3://"):
        return LocalStore(Path(os.path.expanduser(url)))
    profile = StoreProfile(
        url=url,
        endpoint_url=params.get("endpoint_url"),
        region=params.get("region"),
        provider=params.get("provider"),
        name=params.get("name") or "",
        addressing_style=params.get("addressing_style") or "auto",
        checksum=params.get("checksum") or "when_supported",
    )
    return S3Store(url, profile, credentials=Credentials.from_env(env or {}))


async def store_secrets(store: ObjectStore) -> dict[str, str]:
    """The env a node job needs to reach ``store`` (delivered via the job's 0600 secrets file)."""
    if not isinstance(store, S3Store):
        return {}
    return (await store.credentials()).as_env()
