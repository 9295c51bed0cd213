"""Destructive operations on a local store that never follow a symbolic link.

Every delete and write opens the store root and walks the key's folders one at a time, each opened
relative to the one before (``dir_fd``) with ``O_NOFOLLOW``: a folder that is a link is refused,
never followed, and a folder swapped for a link after the walk opened it does not redirect
anything (the walk holds the folder it opened, not its name). The last component is removed or
replaced by name in the folder held (``unlink``/``rename`` never follow a link): a key that is a
link removes the link itself, never what it points at.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from backend.errors import StoreError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(StoreError):
    """A key the walk will not act on (a link or a non-folder among its folders)."""


def open_dir(name: str, dir_fd: int) -> int:
    """Open the folder ``name`` of ``dir_fd`` without following a link (tests wrap this hook to
    swap a folder for a link the moment after the walk opened it)."""
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a special file (fifo, socket or device)"


def _link_note(name: str, dir_fd: int) -> str:
    with contextlib.suppress(OSError):
        return f" (-> {os.readlink(name, dir_fd=dir_fd)})"
    return ""


@contextlib.contextmanager
def walk(root: Path, parts: Sequence[str], *, create: bool = False) -> Iterator[list[int] | None]:
    """The folders of ``parts`` opened from ``root``: ``fds[i]`` holds ``parts[i]`` (``fds[0]`` is
    the root), so ``len(fds) == len(parts) + 1``; None when one of them does not exist (with
    ``create``, missing folders are made). A link or non-folder among them is :class:`Refused`."""
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        except FileNotFoundError:
            if not create:
                yield None
                return
            root.mkdir(parents=True, exist_ok=True)
            fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        for i, name in enumerate(parts):
            where = "/".join(parts[: i + 1])
            failed: OSError | None = None
            try:
                fds.append(open_dir(name, fds[-1]))
                continue
            except FileNotFoundError:
                if not create:
                    yield None
                    return
            except OSError as exc:
                failed = exc
            try:
                st = os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is None and create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, dir_fd=fds[-1])
                try:
                    fds.append(open_dir(name, fds[-1]))
                    continue
                except OSError:
                    st = os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
            if st is None:
                yield None
                return
            if stat.S_ISLNK(st.st_mode):
                raise Refused(
                    f"its folder {where!r} is a symbolic link{_link_note(name, fds[-1])}: refused "
                    "(a delete or write never goes through a link; name the target's own keys)"
                )
            if stat.S_ISDIR(st.st_mode) and failed is not None:
                raise StoreError(f"cannot open its folder {where!r}: {failed.strerror or failed}")
            raise Refused(f"its folder {where!r} is {_kind(st.st_mode)}, not a folder: refused")
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


def delete(root: Path, key: str) -> str | None:
    """Remove the file (or the link itself) at ``key``: None when it is gone (or never was),
    else why not. Folders left empty are removed up to the root."""
    parts = key.split("/")
    with walk(root, parts[:-1]) as fds:
        if fds is None:
            return None  # S3 semantics: deleting a missing key succeeds
        here, name = fds[-1], parts[-1]
        try:
            st = os.stat(name, dir_fd=here, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            return f"it is {_kind(st.st_mode)}, not an object: refused"
        try:
            os.unlink(name, dir_fd=here)  # never follows: a link is removed, not its target
        except FileNotFoundError:
            pass
        _prune(parts, fds)
    return None


def _prune(parts: Sequence[str], fds: Sequence[int]) -> None:
    for i in range(len(parts) - 2, -1, -1):
        try:
            os.rmdir(parts[i], dir_fd=fds[i])  # only an empty folder; a link there fails ENOTDIR
        except OSError:
            return


def write(root: Path, key: str, fill: Callable[[int], None], *, mode: int = 0o600) -> None:
    """Write ``key`` whole: ``fill(fd)`` writes a new file beside it, which then replaces it by
    name. An existing ``key`` that is not a regular file (a link, a folder) is refused."""
    with writing(root, key, mode=mode) as f:
        fill(f.fileno())


#: The suffix of a file being written (see :func:`writing`); readers skip such names.
PART_SUFFIX = ".tmp-lm"


def part_name(name: str) -> bool:
    """Whether ``name`` is one :func:`writing` makes for a file it has not finished."""
    return name.startswith(".") and name.endswith(PART_SUFFIX)


@contextlib.contextmanager
def writing(root: Path, key: str, *, mode: int = 0o600) -> Iterator[BinaryIO]:
    """A new file to write ``key`` through: it replaces ``key`` by name when the block ends
    without an error, and is removed when it raises (the key is then as it was).

    The file is created beside ``key`` (``O_EXCL | O_NOFOLLOW`` in the folder the walk holds, under
    a temporary name of its own), so nothing planted at either name, a link to a file elsewhere
    included, is ever written through. An existing ``key`` that is not a regular file is refused.
    """
    parts = key.split("/")
    with walk(root, parts[:-1], create=True) as fds:
        assert fds is not None
        here, name = fds[-1], parts[-1]
        try:
            st = os.stat(name, dir_fd=here, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise Refused(
                f"it is {_kind(st.st_mode)}{_link_note(name, here) if stat.S_ISLNK(st.st_mode) else ''}, "
                "not a file: refused to overwrite it (remove it or write another key)"
            )
        # a temporary name of its own: two writers of one key (two applies taking a run's lock at
        # once) must each end in a whole file, never in each other's rename
        tmp = f".{name[:64]}.{secrets.token_hex(8)}{PART_SUFFIX}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=here)
        try:
            with os.fdopen(fd, "wb") as f:
                yield f
            os.replace(tmp, name, src_dir_fd=here, dst_dir_fd=here)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=here)
            raise


def remove_parts(root: Path, sub: str) -> int:
    """Remove the unfinished files :func:`writing` left in the folder ``sub`` (a writer that was
    killed): how many. Nothing else is touched, and a link among the folders is never followed."""
    parts = [p for p in sub.split("/") if p]
    removed = 0
    with walk(root, parts) as fds:
        if fds is None:
            return 0
        for name in os.listdir(fds[-1]):
            if part_name(name):
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    os.unlink(name, dir_fd=fds[-1])
                    removed += 1
    return removed


def has_link(root: Path, parts: Sequence[str]) -> bool:
    """Whether an existing folder among ``parts`` is a link (raises nothing for missing ones)."""
    try:
        with walk(root, parts):
            return False
    except Refused:
        return True
