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
        tmp = f".{name[:64]}.{secrets.token_hex(8)}.tmp-lm"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=here)
        try:
            try:
                fill(fd)
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=here, dst_dir_fd=here)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=here)
            raise


def has_link(root: Path, parts: Sequence[str]) -> bool:
    """Whether an existing folder among ``parts`` is a link (raises nothing for missing ones)."""
    try:
        with walk(root, parts):
            return False
    except Refused:
        return True
