"""Object stores: S3-compatible through aiobotocore, or a local POSIX directory, behind one API.

A store is rooted at a URL (``s3://bucket/prefix`` or a directory); keys passed to and returned
from its methods are relative to that root. Listing is paginated (1000 keys a page). Errors that
an operator can fix (missing bucket, rejected credentials, unreachable endpoint) become
:class:`StoreError` with a message naming the store, bucket or profile to fix.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import hashlib
import os
import stat
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from backend.config import Config, StoreProfile
from backend.credentials import Credentials
from backend.errors import StoreError
from backend.storage import localfs
from backend.storage.keys import check_key, check_sub
from backend.textfmt import safe_text

DELETE_BATCH = 1000  # S3 DeleteObjects takes at most 1000 keys per request


@dataclass(frozen=True)
class ObjectInfo:
    """One object (or file) under a store root."""

    key: str
    size: int
    mtime: float
    etag: str | None = None


@dataclass(frozen=True)
class DeleteResult:
    """What a batch delete did: keys deleted, and per-key errors the store reported.

    A key is in ``deleted`` only when the store confirmed its bytes are gone. On a versioned
    bucket a delete only stacks a delete marker on the key: it no longer lists, but its bytes
    stay (and are billed) as a noncurrent version; such keys are in ``hidden``, not ``deleted``.
    """

    deleted: tuple[str, ...] = ()
    errors: dict[str, str] = field(default_factory=dict)
    hidden: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors


def parse_s3_url(url: str) -> tuple[str, str]:
    """Split ``s3://bucket/prefix`` into (bucket, prefix-without-leading-slash)."""
    if not url.startswith("s3://"):
        raise StoreError(f"not an s3:// URL: {url!r}")
    rest = url[5:]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise StoreError(f"no bucket in {url!r} (expected s3://bucket/prefix)")
    return bucket, prefix.strip("/")


def join_key(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def egress_profile(config: Config, store: str | None, src: str) -> StoreProfile:
    """The store profile a transfer from ``src`` is priced by: the named store, else the bare
    bucket (:func:`bucket_profile`). Pulls, shard conversions, uploads and strips price their
    reads with it."""
    if store and store in config.stores:
        return config.stores[store]
    return bucket_profile(src)


def bucket_profile(src: str) -> StoreProfile:
    """The bare bucket of an ``s3://`` URL that no configured store names: quoted as unpriced
    (``[egress] unpriced_action`` decides)."""
    bucket = f"s3://{parse_s3_url(src)[0]}"
    return StoreProfile(url=bucket, name=bucket)


class ObjectStore(ABC):
    """Async access to the objects under one root URL."""

    url: str

    @abstractmethod
    async def list(self, sub: str = "") -> list[ObjectInfo]:
        """Every object under ``sub`` (recursive), keys relative to the store root, sorted."""

    @abstractmethod
    async def list_dirs(self, sub: str = "") -> builtins.list[str]:  # `list` is a method here
        """Immediate child 'directories' of ``sub`` (common prefixes), without trailing slash."""

    @abstractmethod
    async def stat(self, key: str) -> ObjectInfo | None:
        """The object at ``key``, or None when absent."""

    @abstractmethod
    async def get_bytes(self, key: str) -> bytes:
        """The whole object (small objects only: manifests, indexes, markers)."""

    @abstractmethod
    async def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``key`` from offset ``start``."""

    @abstractmethod
    async def put_bytes(self, key: str, data: bytes) -> None:
        """Write a small object."""

    @abstractmethod
    async def delete_many(self, keys: Iterable[str]) -> DeleteResult:
        """Delete keys in batches; per-key failures are returned, never ignored."""

    async def versioning(self) -> str:
        """Whether a delete here frees the bytes: "" when it does (a local folder, a bucket that
        never kept versions); else why not, for the operator: the bucket's versioning status
        (``Enabled``, ``Suspended``: a delete hides the key behind a delete marker and its bytes
        stay stored as a noncurrent version), or "unknown (...)" when the store would not say."""
        return ""

    async def close(self) -> None:  # noqa: B027 - optional hook, a no-op for local stores
        """Release clients."""

    async def __aenter__(self) -> ObjectStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class LocalStore(ObjectStore):
    """A directory tree used as an object store (keys are relative POSIX paths).

    Deletes and writes never follow a symbolic link (see :mod:`backend.storage.localfs`): a key
    whose folders hold a link is refused, a key that is a link removes the link itself. Reads go
    through links that stay inside the root (an operator's own layout) and refuse those leading out.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.url = str(self.root)

    def _check(self, key: str) -> builtins.list[str]:
        return check_key(key, self.url).split("/")

    def _path(self, key: str) -> Path:
        # "" is the root (a strip's output folder); a read, so a name with a control character is read
        check_key(key, self.url, allow_empty=True, acting=False)
        p = (self.root / key).resolve()
        if p != self.root.resolve() and self.root.resolve() not in p.parents:
            raise StoreError(f"{self.url}: refused key {key!r}: it leads out of the store root (a symbolic link)")
        return p

    def _folder(self, sub: str) -> Path | None:
        """The folder ``sub`` to list (None when absent); a link among its folders is refused."""
        sub = check_sub(sub, self.url)
        parts = sub.split("/") if sub else []
        try:
            with localfs.walk(self.root, parts) as fds:
                if fds is None:
                    return None
        except StoreError as exc:
            if not self._link_among(parts):
                # A file where a folder would be (a flat step `model_5.pt` listed as a prefix):
                # nothing is under it, as an S3 listing of `model_5.pt/` finds nothing.
                return None
            raise StoreError(f"{self.url}: cannot list {sub!r}: {exc}") from None
        return self.root / sub if sub else self.root

    def _link_among(self, parts: builtins.list[str]) -> bool:
        """Whether a component of ``parts`` under the root is a symbolic link (on a refused walk)."""
        path = self.root
        for name in parts:
            path = path / name
            try:
                if stat.S_ISLNK(os.lstat(path).st_mode):
                    return True
            except OSError:
                return False
        return False

    async def list(self, sub: str = "") -> list[ObjectInfo]:
        def walk() -> list[ObjectInfo]:
            base = self._folder(sub)
            if base is None:
                return []
            out = []
            for dirpath, _dirs, files in os.walk(base):  # never descends into a linked folder
                for f in files:
                    p = Path(dirpath) / f
                    try:
                        st = p.stat()
                    except FileNotFoundError:
                        continue
                    out.append(ObjectInfo(str(p.relative_to(self.root)), st.st_size, st.st_mtime))
            return sorted(out, key=lambda o: o.key)

        return await asyncio.to_thread(walk)

    async def list_dirs(self, sub: str = "") -> builtins.list[str]:  # `list` is a method here
        base = self._folder(sub)
        if base is None or not base.is_dir():
            return []
        # a link to a folder is not a folder of the store: listing or deleting through it is refused
        return sorted(str(p.relative_to(self.root)) for p in base.iterdir() if p.is_dir() and not p.is_symlink())

    async def stat(self, key: str) -> ObjectInfo | None:
        p = self._path(key)
        try:
            st = p.stat()
        except FileNotFoundError:
            return None
        return ObjectInfo(key, st.st_size, st.st_mtime) if p.is_file() else None

    async def get_bytes(self, key: str) -> bytes:
        try:
            return await asyncio.to_thread(self._path(key).read_bytes)
        except FileNotFoundError:
            raise StoreError(f"{self.url}: no object {key!r}") from None

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        def read() -> bytes:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read(length)

        return await asyncio.to_thread(read)

    def _write(self, key: str, fill: Callable[[int], None], *, mode: int = 0o600) -> None:
        self._check(key)
        try:
            localfs.write(self.root, key, fill, mode=mode)
        except localfs.Refused as exc:
            raise StoreError(f"{self.url}: refused to write {key!r}: {exc}") from None

    @contextlib.contextmanager
    def writing(self, key: str, *, mode: int = 0o644) -> Iterator[BinaryIO]:
        """A file that becomes ``key`` when the block ends cleanly (see :func:`localfs.writing`):
        for a writer that streams a large object (a strip's shard) rather than holding it."""
        self._check(key)
        try:
            with localfs.writing(self.root, key, mode=mode) as f:
                yield f
        except localfs.Refused as exc:
            raise StoreError(f"{self.url}: refused to write {key!r}: {exc}") from None

    async def put_bytes(self, key: str, data: bytes) -> None:
        def fill(fd: int) -> None:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]

        await asyncio.to_thread(self._write, key, fill)

    async def delete_many(self, keys: Iterable[str]) -> DeleteResult:
        keys = builtins.list(keys)
        refused = refused_keys(keys, self.url)
        if refused:
            return DeleteResult((), refused)

        # on the event loop, as it always was: a retention apply's audit records of concurrent
        # actions keep one order from run to run (a thread here would interleave them by timing)
        deleted, errors = [], {}
        for key in keys:
            try:
                why = localfs.delete(self.root, key)
            except StoreError as exc:
                why = str(exc)
            except OSError as exc:
                why = exc.strerror or str(exc)
            if why is None:
                deleted.append(key)
            else:
                errors[key] = why
        return DeleteResult(tuple(deleted), errors)

    def local_path(self, key: str) -> Path:
        return self._path(key)

    async def copy_in(self, src: Path, key: str) -> None:
        def fill(fd: int) -> None:
            with open(src, "rb") as f:
                while chunk := f.read(1 << 20):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]

        await asyncio.to_thread(self._write, key, fill, mode=0o666)


def refused_keys(keys: builtins.list[str], store: str) -> dict[str, str]:
    """Every key of a delete when one of them is not a store key (nothing of it is deleted: a
    listing holding such a key is not what the caller meant), else nothing."""
    bad = {}
    for k in keys:
        try:
            check_key(k, store)
        except StoreError as exc:
            bad[k] = str(exc)
    if not bad:
        return {}
    first = next(iter(bad.values()))
    return {k: bad.get(k, f"not deleted: the same delete named a refused key ({first})") for k in keys}


def md5_instead_of_crc32(params: dict[str, Any], **_: Any) -> None:
    """botocore hook (``before-call.s3``): a request that must carry a checksum (DeleteObjects)
    gets the Content-MD5 every S3 store accepts instead of botocore's default CRC32 header.

    Registered for profiles with ``checksum = "when_required"``: the stores that reject
    ``x-amz-checksum-*`` headers (R2 and older S3-compatible stores), where botocore >= 1.36
    would otherwise send CRC32 on DeleteObjects even under "when_required".
    """
    checksum = params.get("context", {}).get("checksum", {})
    body = params.get("body")
    if checksum.get("request_algorithm") and isinstance(body, bytes | bytearray):
        checksum.pop("request_algorithm", None)
        checksum.pop("request_algorithm_header", None)
        params["headers"]["Content-MD5"] = base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode()


def _client_error(exc: Exception, store: str, bucket: str, profile: str | None, *, covered: bool = True) -> StoreError:
    """Translate botocore errors into messages that name what to fix."""
    from botocore.exceptions import (
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
        ProfileNotFound,
    )

    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        msg = exc.response.get("Error", {}).get("Message", "")
        if code in ("NoSuchBucket",):
            return StoreError(f"{store}: bucket {bucket!r} does not exist (create it or fix the store URL)")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"):
            who = f"profile {profile!r}" if profile else "the default AWS credential chain"
            return StoreError(
                f"{store}: credentials from {who} were rejected ({code}); fix them in "
                "your AWS credentials file or environment"
            )
        if code in ("AccessDenied", "403"):
            return StoreError(f"{store}: access denied to bucket {bucket!r} ({msg or code})")
        return StoreError(f"{store}: {code or 'error'}: {msg}")
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        if not covered:
            return StoreError(
                f"{store}: no configured store covers bucket {bucket!r} and the default AWS "
                "credential chain found no credentials; add a [stores.NAME] for it or set AWS_PROFILE"
            )
        who = f"profile {profile!r}" if profile else "the default AWS credential chain (the store sets no 'profile')"
        return StoreError(
            f"{store}: no credentials found for {who}; set 'profile' on the store, add them to your "
            "AWS credentials file, or set the AWS_* environment variables"
        )
    if isinstance(exc, ProfileNotFound):
        hint = (
            '; the sandbox\'s profile comes with its environment: eval "$(loadmaster lab env)"'
            if profile == "lab"
            else ""
        )
        return StoreError(f"{store}: AWS profile {profile!r} not found in your AWS config/credentials files{hint}")
    if isinstance(exc, EndpointConnectionError):
        return StoreError(f"{store}: cannot reach endpoint: {exc}")
    return StoreError(f"{store}: {type(exc).__name__}: {exc}")


#: botocore's data loader per data path (see :func:`share_data_loader`).
_DATA_LOADERS: dict[object, Any] = {}


def share_data_loader(session: Any) -> None:
    """Give ``session`` the data loader of earlier sessions with the same data path.

    Each store opens its own botocore session (its profile and credentials are its own), and a
    fresh session reads and parses botocore's JSON models (the S3 service model, endpoints,
    partitions) again before its first client: ~0.1 s a client on a quiet machine, several
    times that on a loaded one, for data that never changes within a process. The loader only
    reads those files and caches what it read, as it does for every client of one session.
    """
    path = session.get_config_variable("data_path")
    key = tuple(path) if isinstance(path, list) else path
    loader = _DATA_LOADERS.get(key)
    if loader is None:
        _DATA_LOADERS[key] = session.get_component("data_loader")
    else:
        session.register_component("data_loader", loader)


class S3Store(ObjectStore):
    """An S3-compatible bucket/prefix through aiobotocore (AWS, R2, SeaweedFS, MinIO, ...)."""

    def __init__(
        self, url: str, profile: StoreProfile | None = None, *, credentials: Credentials | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self.bucket, self.prefix = parse_s3_url(self.url)
        if self.prefix:
            check_key(self.prefix, self.url)
        self.profile = profile
        #: Credentials handed over explicitly (a node job's secrets) instead of the credential chain.
        self._credentials = credentials
        self.label = profile.name if profile and profile.name else self.url
        self._client: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._lock = asyncio.Lock()

    def _key(self, key: str, *, acting: bool = False) -> str:
        return join_key(self.prefix, check_key(key, self.label, acting=acting))

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def botocore_session(self) -> Any:
        from aiobotocore.session import get_session

        session = get_session()
        if self.profile and self.profile.profile:
            session.set_config_variable("profile", self.profile.profile)
        if self._credentials is not None:
            c = self._credentials
            session.set_credentials(c.access_key, c.secret_key, c.token)
        share_data_loader(session)
        return session

    def client_config(self, **overrides: Any) -> Any:
        from botocore.config import Config as BotoConfig

        p = self.profile
        kwargs: dict[str, Any] = {
            "s3": {"addressing_style": p.addressing_style if p else "auto"},
            "retries": {"max_attempts": 5, "mode": "adaptive"},
            "max_pool_connections": 64,
            "request_checksum_calculation": p.checksum if p else "when_supported",
            "response_checksum_validation": p.checksum if p else "when_supported",
        }
        kwargs.update(overrides)
        return BotoConfig(**kwargs)

    def prepare_client(self, client: Any) -> Any:
        """Register what every client of this store needs (the MD5 fallback for stores that
        reject botocore's CRC32 headers); returns ``client``."""
        if self.profile is not None and self.profile.checksum == "when_required":
            client.meta.events.register("before-call.s3", md5_instead_of_crc32)
        return client

    async def client(self) -> Any:
        """The shared aiobotocore client (created on first use)."""
        async with self._lock:
            if self._client is None:
                stack = contextlib.AsyncExitStack()
                try:
                    self._client = await stack.enter_async_context(
                        self.botocore_session().create_client(
                            "s3",
                            endpoint_url=self.profile.endpoint_url if self.profile else None,
                            region_name=(
                                self.profile.region
                                if self.profile and self.profile.region and self.profile.region != "auto"
                                else "us-east-1"
                            ),
                            config=self.client_config(),
                        )
                    )
                    self.prepare_client(self._client)
                except Exception as exc:  # noqa: BLE001
                    await stack.aclose()
                    raise self.error(exc) from None
                self._stack = stack
            return self._client

    def error(self, exc: Exception) -> StoreError:
        return _client_error(
            exc,
            self.label,
            self.bucket,
            self.profile.profile if self.profile else None,
            covered=self.profile is not None,
        )

    async def credentials(self) -> Credentials:
        """Resolve this store's credentials (for handing to s5cmd on a node via a 0600 file)."""
        try:
            creds = await self.botocore_session().get_credentials()
        except Exception as exc:  # noqa: BLE001
            raise self.error(exc) from None
        if creds is None:
            raise self.error(__import__("botocore.exceptions").exceptions.NoCredentialsError())
        frozen = await creds.get_frozen_credentials()
        return Credentials(frozen.access_key, frozen.secret_key, frozen.token)

    async def iter_pages(self, sub: str = "", *, delimiter: str | None = None) -> AsyncIterator[dict[str, Any]]:
        client = await self.client()
        # always a whole folder: "run/step-1/", never "run/step-1" (which lists "run/step-10...")
        prefix = self.folder_prefix(sub)
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        try:
            async for page in client.get_paginator("list_objects_v2").paginate(**kwargs):
                yield page
        except Exception as exc:  # noqa: BLE001
            raise self.error(exc) from None

    def folder_prefix(self, sub: str = "") -> str:
        """The full-key prefix of the folder ``sub``, ending in '/' (``""`` for a bare bucket)."""
        full = join_key(self.prefix, check_sub(sub, self.label))
        return full + "/" if full else ""

    async def list(self, sub: str = "") -> list[ObjectInfo]:
        out = []
        prefix = self.folder_prefix(sub)
        async for page in self.iter_pages(sub):
            for obj in page.get("Contents", []):
                full = str(obj.get("Key", ""))
                if prefix and full == prefix:
                    continue  # a folder marker object ("run/step-1/"), not an object in it
                if not full.startswith(prefix):
                    raise StoreError(
                        f"{self.label}: the listing of {prefix or 'the bucket'!r} returned "
                        f"{full[:120]!r}, a key outside it; refusing the listing"
                    )
                out.append(
                    ObjectInfo(
                        self._rel(obj["Key"]),
                        int(obj["Size"]),
                        obj["LastModified"].timestamp(),
                        obj.get("ETag", "").strip('"'),
                    )
                )
        return sorted(out, key=lambda o: o.key)

    async def list_dirs(self, sub: str = "") -> builtins.list[str]:  # `list` is a method here
        out = []
        async for page in self.iter_pages(sub, delimiter="/"):
            for cp in page.get("CommonPrefixes", []):
                out.append(self._rel(cp["Prefix"]).rstrip("/"))
        return sorted(out)

    async def stat(self, key: str) -> ObjectInfo | None:
        from botocore.exceptions import ClientError

        full = self._key(key)
        client = await self.client()
        try:
            head = await client.head_object(Bucket=self.bucket, Key=full)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise self.error(exc) from None
        except Exception as exc:  # noqa: BLE001
            raise self.error(exc) from None
        return ObjectInfo(
            key, int(head["ContentLength"]), head["LastModified"].timestamp(), head.get("ETag", "").strip('"')
        )

    async def get_bytes(self, key: str) -> bytes:
        full = self._key(key)
        client = await self.client()
        try:
            resp = await client.get_object(Bucket=self.bucket, Key=full)
            async with resp["Body"] as body:
                return await body.read()
        except Exception as exc:  # noqa: BLE001
            raise self.error(exc) from None

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        full = self._key(key)
        client = await self.client()
        try:
            resp = await client.get_object(Bucket=self.bucket, Key=full, Range=f"bytes={start}-{start + length - 1}")
            async with resp["Body"] as body:
                return await body.read()
        except Exception as exc:  # noqa: BLE001
            raise self.error(exc) from None

    async def put_bytes(self, key: str, data: bytes) -> None:
        full = self._key(key, acting=True)
        client = await self.client()
        try:
            await client.put_object(Bucket=self.bucket, Key=full, Body=data)
        except Exception as exc:  # noqa: BLE001
            raise self.error(exc) from None

    async def versioning(self) -> str:
        """GetBucketVersioning's ``Status`` (see :meth:`ObjectStore.versioning`). A bucket that
        never had versioning answers no Status: "". Anything else, an error included, is reported
        as keeping versions (a delete is then never counted as freeing bytes it may not free)."""
        try:
            client = await self.client()
            resp = await client.get_bucket_versioning(Bucket=self.bucket)
        except Exception as exc:  # noqa: BLE001
            return f"unknown ({safe_text(str(self.error(exc)), 160)})"
        status = resp.get("Status")
        if status in (None, ""):
            return ""
        return safe_text(str(status), 40)

    async def delete_many(self, keys: Iterable[str]) -> DeleteResult:
        """Delete exactly ``keys`` (DeleteObjects, 1000 a request, never a prefix). A key counts as
        deleted only when the response names it in ``Deleted``; a key in ``Errors`` or in neither
        is reported with why; a delete marker (a versioned bucket) is ``hidden``, not deleted."""
        keys = list(dict.fromkeys(keys))
        refused = refused_keys(keys, self.label)
        if refused:
            return DeleteResult((), refused)
        client = await self.client()
        deleted: list[str] = []
        hidden: list[str] = []
        errors: dict[str, str] = {}
        for i in range(0, len(keys), DELETE_BATCH):
            batch = keys[i : i + DELETE_BATCH]
            asked = {self._key(k): k for k in batch}
            try:
                resp = await client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": full} for full in asked], "Quiet": False},
                )
            except Exception as exc:  # noqa: BLE001
                err = str(self.error(exc))
                errors.update({k: err for k in batch})
                continue
            done: set[str] = set()
            for e in resp.get("Errors", []) or []:
                k = asked.get(str(e.get("Key")))
                if k is not None:
                    errors[k] = f"{e.get('Code', 'Error')}: {e.get('Message', '')}".rstrip(": ")
            for d in resp.get("Deleted", []) or []:
                k = asked.get(str(d.get("Key")))
                if k is None or k in errors or k in done:
                    continue  # a key not asked for (or also in Errors) is never counted
                done.add(k)
                if d.get("DeleteMarker") and not d.get("VersionId"):
                    hidden.append(k)  # a marker now hides the key; its bytes are still stored
                else:
                    deleted.append(k)
            for k in batch:
                if k not in done and k not in errors:
                    errors[k] = "the store did not confirm this delete (neither Deleted nor Errors named it)"
        return DeleteResult(tuple(deleted), errors, tuple(hidden))

    async def close(self) -> None:
        if self._stack is not None:
            await self._stack.aclose()
            self._stack = None
            self._client = None


class StoreRegistry:
    """Opens stores by configured name or URL (the longest configured prefix supplies settings)."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def profile_for(self, url_or_name: str) -> tuple[str, StoreProfile | None]:
        if url_or_name in self.config.stores:
            p = self.config.stores[url_or_name]
            return p.url, p
        return url_or_name, self.config.store_for_url(url_or_name)

    def open(self, url_or_name: str) -> ObjectStore:
        """An ObjectStore for a configured store name, an ``s3://`` URL, or a local directory."""
        url, profile = self.profile_for(url_or_name)
        if url.startswith("s3://"):
            return S3Store(url, profile)
        if "://" in url:
            raise StoreError(f"unsupported URL {url!r}: use s3://bucket/prefix or a local directory")
        return LocalStore(Path(os.path.expanduser(url)))
