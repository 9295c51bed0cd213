"""``[[nodes]] name``: a node name or a Slurm/ClusterShell hostlist (``gpu-[01-16]``)."""

from __future__ import annotations

from pathlib import Path

import hostlist

from backend.errors import ConfigError


def expand_hostlist(expr: str, *, file: str | None = None, key: str = "name") -> list[str]:
    """Expand ``gpu-[01-16]`` / ``h100-[1-4,7]`` / ``a,b`` the way Slurm and ClusterShell do."""
    try:
        names = hostlist.expand_hostlist(expr)
    except hostlist.BadHostlist as exc:
        raise ConfigError(
            f"cannot expand hostlist {expr!r}: {exc} (expected e.g. 'gpu-[01-16]' or 'h100-[1-4,7]')",
            file=file,
            key=key,
        ) from None
    if not names:
        raise ConfigError(f"hostlist {expr!r} expands to no names", file=file, key=key)
    return names


class HostlistNames:
    """The table source for ``name``: each name of the hostlist, in its order, no slots."""

    key = "name"
    what = "a name or hostlist"

    def hosts(self, value: str, *, base: Path, file: str | None, key: str) -> list[tuple[str, int | None]]:
        return [(n, None) for n in expand_hostlist(value, file=file, key=key)]
