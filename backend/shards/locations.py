"""Where a conversion reads and writes: a local directory or an ``s3://bucket/prefix``.

A location as typed (a path, a URL or a configured store's name) resolves to a URL and its store
profile (:func:`resolve_location`, for the CLI and the console); a URL opens as an
:class:`~backend.storage.ObjectStore` (:func:`open_store`).
"""

from __future__ import annotations

import os
from pathlib import Path

from backend.config import Config, StoreProfile
from backend.shards.plan import ShardError
from backend.storage import Credentials, LocalStore, ObjectStore, S3Store


def normalize_location(url: str) -> str:
    """``url`` in a form two spellings of the same place share (no trailing slash, absolute path)."""
    return url.rstrip("/") if url.startswith("s3://") else os.path.abspath(os.path.expanduser(url))


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


def open_store(url: str, profile: StoreProfile | None, credentials: Credentials | None = None) -> ObjectStore:
    """An ObjectStore for ``url`` (``s3://`` with the profile's endpoint/credentials, or a dir)."""
    if url.startswith("s3://"):
        return S3Store(url, profile, credentials=credentials)
    if "://" in url:
        raise ShardError(f"unsupported location {url!r}: use a local directory or s3://bucket/prefix")
    return LocalStore(Path(os.path.expanduser(url)).resolve())
