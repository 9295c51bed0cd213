"""``loadmaster shard verify DEST``: read the shards back with webdataset, check against the manifest.

Each shard is hashed with the algorithm its manifest entry names (``blake3``, or ``sha256`` in
manifests written before it; digest and size against the manifest) and read with
``webdataset.WebDataset(url, shardshuffle=False)`` to count its samples. Shards in ``s3://`` are
downloaded one at a time to a temporary file (hashed while streaming) and removed after the check.
Shards present in the destination but absent from the manifest are reported too.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backend.config import StoreProfile
from backend.shards.locations import open_store
from backend.shards.manifest import MANIFEST_NAME, Manifest, ShardEntry, new_hasher
from backend.shards.plan import ShardError, pattern_regex
from backend.storage import LocalStore, ObjectStore, S3Store

CHUNK = 8 << 20


@dataclass(frozen=True)
class ShardCheck:
    """The verdict on one shard."""

    name: str
    ok: bool
    samples: int | None = None
    bytes: int | None = None
    digest: str | None = None
    #: The algorithm of ``digest``: the one the manifest names for this shard.
    hash: str | None = None
    problems: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "samples": self.samples,
            "bytes": self.bytes,
            "hash": self.hash,
            "digest": self.digest,
            "problems": list(self.problems),
        }


@dataclass(frozen=True)
class VerifyReport:
    """Every shard's verdict plus shards the manifest does not know."""

    dest: str
    checks: tuple[ShardCheck, ...]
    extra: tuple[str, ...] = ()
    samples: int = 0
    expected_samples: int = 0
    problems: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks) and not self.extra and not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "dest": self.dest,
            "ok": self.ok,
            "samples": self.samples,
            "expected_samples": self.expected_samples,
            "extra": list(self.extra),
            "problems": list(self.problems),
            "shards": [c.as_dict() for c in self.checks],
        }

    def summary(self) -> str:
        """One line saying whether the shards match the manifest."""
        bad = [c for c in self.checks if not c.ok]
        if self.ok:
            return (
                f"OK: {len(self.checks)} shard(s), {self.samples:,} samples match the manifest "
                f"(sizes, digests, sample counts)"
            )
        parts = [f"{len(bad)} of {len(self.checks)} shard(s) do not match the manifest"]
        if self.extra:
            parts.append(f"{len(self.extra)} shard(s) not in the manifest (e.g. {', '.join(self.extra[:3])})")
        parts += list(self.problems)
        return "FAILED: " + "; ".join(parts)


def count_samples(path: str) -> int:
    """Samples in one tar shard, as ``webdataset.WebDataset`` reads them."""
    import webdataset as wds

    return sum(1 for _ in wds.WebDataset(path, shardshuffle=False, empty_check=False))


def _check_file(path: str, entry: ShardEntry) -> ShardCheck:
    digest = new_hasher(entry.hash)
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return _verdict(path, entry, size, digest.hexdigest())


def _verdict(path: str, entry: ShardEntry, size: int, digest: str) -> ShardCheck:
    problems = []
    if size != entry.bytes:
        problems.append(f"size {size} bytes, manifest says {entry.bytes}")
    if digest != entry.digest:
        problems.append(f"{entry.hash} {digest[:12]}..., manifest says {entry.digest[:12]}...")
    try:
        n = count_samples(path)
    except Exception as exc:  # noqa: BLE001 - a corrupt tar is a verdict, not a crash
        problems.append(f"webdataset cannot read it: {exc}")
        n = None
    if n is not None and n != entry.samples:
        problems.append(f"{n} samples, manifest says {entry.samples}")
    return ShardCheck(entry.name, not problems, n, size, digest, entry.hash, tuple(problems))


async def _download(store: S3Store, entry: ShardEntry, path: str) -> tuple[int, str]:
    client = await store.client()
    key = entry.name
    digest = new_hasher(entry.hash)
    size = 0
    try:
        resp = await client.get_object(Bucket=store.bucket, Key=store._key(key))
        with open(path, "wb") as f:  # noqa: ASYNC230 - small sequential writes of one shard
            async with resp["Body"] as body:
                while chunk := await body.read(CHUNK):
                    digest.update(chunk)
                    f.write(chunk)
                    size += len(chunk)
    except Exception as exc:  # noqa: BLE001
        raise store.error(exc) from None
    return size, digest.hexdigest()


async def read_manifest(store: ObjectStore, dest: str) -> Manifest:
    """The manifest at ``dest``; ShardError when missing or malformed."""
    if await store.stat(MANIFEST_NAME) is None:
        raise ShardError(
            f"no {MANIFEST_NAME} in {dest}: not a finished loadmaster conversion "
            "(resume it with 'loadmaster shard SRC DEST --resume')"
        )
    try:
        return Manifest.from_json(
            (await store.get_bytes(MANIFEST_NAME)).decode("utf-8"), where=f"{dest}/{MANIFEST_NAME}"
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise ShardError(str(exc)) from None


async def verify(
    dest: str,
    *,
    profile: StoreProfile | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> VerifyReport:
    """Check every shard at ``dest`` against its manifest (size, digest, webdataset sample count)."""
    store = open_store(dest, profile)
    try:
        manifest = await read_manifest(store, dest)
        listing = {o.key: o.size for o in await store.list("") if "/" not in o.key}
        rx = pattern_regex(manifest.pattern)
        known = {s.name for s in manifest.shards}
        extra = tuple(sorted(k for k in listing if rx.match(k) and k not in known))
        checks: list[ShardCheck] = []
        for i, entry in enumerate(manifest.shards):
            if entry.name not in listing:
                checks.append(ShardCheck(entry.name, False, problems=("missing from the destination",)))
            elif isinstance(store, LocalStore):
                checks.append(await asyncio.to_thread(_check_file, str(store.local_path(entry.name)), entry))
            else:
                assert isinstance(store, S3Store)
                fd, tmp = tempfile.mkstemp(prefix="lm-verify-", suffix=".tar")
                os.close(fd)
                try:
                    size, digest = await _download(store, entry, tmp)
                    checks.append(await asyncio.to_thread(_verdict, tmp, entry, size, digest))
                finally:
                    os.unlink(tmp)
            if on_progress is not None:
                on_progress(i + 1, len(manifest.shards))
        total = sum(c.samples or 0 for c in checks)
        problems: tuple[str, ...] = ()
        if total != manifest.samples and all(c.samples is not None for c in checks):
            problems = (f"{total} samples read, manifest totals {manifest.samples}",)
        return VerifyReport(dest, tuple(checks), extra, total, manifest.samples, problems)
    finally:
        await store.close()
