"""``[[nodes]] hostfile``: a DeepSpeed/MPI hostfile (``worker-1 slots=8`` per line, ``#`` comments),
the file the training launcher already reads, so the console sees the same fleet as the job."""

from __future__ import annotations

import os
from pathlib import Path

from backend.errors import ConfigError


def read_hostfile(path: Path, *, file: str | None = None, key: str = "hostfile") -> list[tuple[str, int | None]]:
    """Parse a DeepSpeed/MPI hostfile: ``worker-1 slots=8`` per line, ``#`` comments.

    Options other than ``slots`` are the launcher's and are skipped; a line that is not
    ``host key=value ...`` is refused with its number, since a guessed fleet is a wrong one.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read hostfile {str(path)!r}: {exc.strerror}", file=file, key=key) from None
    except UnicodeDecodeError:
        raise ConfigError(f"cannot read hostfile {str(path)!r}: not UTF-8 text", file=file, key=key) from None
    out: list[tuple[str, int | None]] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        host, slots = parts[0], None
        for opt in parts[1:]:
            k, sep, v = opt.partition("=")
            if not sep or not v:
                raise ConfigError(f"{path}:{lineno}: expected 'host slots=N', got {raw.strip()!r}", file=file, key=key)
            if k == "slots":
                if not (v.isascii() and v.isdigit()):  # '²'.isdigit(), but int('²') fails
                    raise ConfigError(f"{path}:{lineno}: slots must be a whole number, got {v!r}", file=file, key=key)
                slots = int(v)
        out.append((host, slots))
    if not out:
        raise ConfigError(f"hostfile {str(path)!r} lists no hosts", file=file, key=key)
    return out


class HostfileInventory:
    """The table source for ``hostfile``: its hosts in file order, each with its slots. A relative
    path is read from the config file's folder, ``~`` is the user's home."""

    key = "hostfile"
    what = "a DeepSpeed/MPI hostfile"

    def hosts(self, value: str, *, base: Path, file: str | None, key: str) -> list[tuple[str, int | None]]:
        path = Path(os.path.expanduser(value))
        return read_hostfile(path if path.is_absolute() else base / path, file=file, key=key)
