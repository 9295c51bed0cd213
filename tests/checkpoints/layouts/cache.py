"""Layout templates written once and shared: by every process of a test session (the xdist
workers, which otherwise each ran DeepSpeed, the Trainer and FSDP2 again) and by later sessions on
the same machine while the libraries and the builders are unchanged.

A template is a folder under ``<root>/<key>/`` where ``key`` digests the versions of the libraries
that write checkpoints (torch, transformers, accelerate, deepspeed, lightning, safetensors, numpy,
Python) and the source of the builders themselves; a new version or an edited builder is a new
key, so nothing stale is ever reused. ``root`` is ``$LOADMASTER_LAYOUT_CACHE``, else
``~/.cache/loadmaster/test-layouts``. One process writes a template under an exclusive lock; the
others wait for it and read it. A template is complete only with its ``.done`` marker (a build
killed half-way is removed and written again). Templates are read only: builders copy them. Keys
unused for a week are removed when a new key is first used.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from importlib import metadata
from pathlib import Path

#: The libraries whose own save functions write the templates.
LIBRARIES = ("torch", "transformers", "accelerate", "deepspeed", "lightning", "safetensors", "numpy")
_HERE = Path(__file__).resolve().parent
#: The code that decides what a template holds.
_SOURCES = (*sorted(_HERE.glob("*.py")), _HERE.parent / "conftest.py")


@cache
def cache_key() -> str:
    """The digest of the library versions and the builders' source."""
    h = hashlib.sha256(sys.version.encode())
    for lib in LIBRARIES:
        try:
            version = metadata.version(lib)
        except metadata.PackageNotFoundError:
            version = "-"
        h.update(f"\0{lib}={version}".encode())
    for src in _SOURCES:
        if src.name.startswith("test_"):
            continue
        h.update(b"\0" + src.name.encode() + b"\0" + src.read_bytes())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    """Where this machine's templates for the current key live."""
    base = os.environ.get("LOADMASTER_LAYOUT_CACHE") or str(Path.home() / ".cache" / "loadmaster" / "test-layouts")
    root = Path(base) / cache_key()
    if not root.exists():
        root.mkdir(parents=True, exist_ok=True)
        _prune(root.parent, keep=root)
    return root


#: A key's templates unused this long are removed (a machine that changed libraries or builders).
PRUNE_AFTER_S = 7 * 86400


def _prune(base: Path, keep: Path) -> None:
    """Remove other keys' folders not used for :data:`PRUNE_AFTER_S` (bounded disk)."""
    now = time.time()
    for old in base.iterdir():
        if old != keep and old.is_dir() and now - old.stat().st_mtime > PRUNE_AFTER_S:
            shutil.rmtree(old, ignore_errors=True)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def template(name: str, key: object, write: Callable[[Path], None]) -> Path:
    """The folder ``write(folder)`` fills for (``name``, ``key``), written at most once per key."""
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    path = cache_root() / f"{name}-{digest}"
    if (path / ".done").exists():
        path.parent.touch()  # in use: not pruned
        return path
    with _locked(path.with_name(path.name + ".lock")):
        if not (path / ".done").exists():  # another process may have written it meanwhile
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
            write(path)
            (path / ".done").touch()
    return path
