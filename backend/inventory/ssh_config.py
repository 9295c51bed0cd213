"""``[[nodes]] ssh_config``: the concrete ``Host`` aliases of ``~/.ssh/config`` that match a glob,
for a fleet the operator already reaches with plain ``ssh gpu-07``."""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

from backend.errors import ConfigError


def ssh_config_hosts(pattern: str, path: Path | None = None) -> list[str]:
    """Concrete ``Host`` aliases in an OpenSSH client config that match glob ``pattern``."""
    path = path or Path(os.path.expanduser("~/.ssh/config"))
    if not path.exists():
        return []
    hosts: list[str] = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        m = re.match(r"(?i)host\s*(?:=\s*|\s)(.*)$", line)
        if not m:
            continue
        for alias in m.group(1).split():
            if any(c in alias for c in "*?!") or alias in hosts:
                continue
            if fnmatch.fnmatchcase(alias, pattern):
                hosts.append(alias)
    return hosts


class SshConfigInventory:
    """The table source for ``ssh_config``: the matching aliases in the file's order, no slots
    (ssh itself resolves each alias's address, user and port). No match is an error: an empty
    fleet from a typo would look like a healthy, idle one."""

    key = "ssh_config"
    what = "a Host pattern"

    def hosts(self, value: str, *, base: Path, file: str | None, key: str) -> list[tuple[str, int | None]]:
        try:
            found = ssh_config_hosts(value)
        except OSError as exc:
            raise ConfigError(f"cannot read ~/.ssh/config: {exc.strerror}", file=file, key=key) from None
        except UnicodeDecodeError:
            raise ConfigError("cannot read ~/.ssh/config: not UTF-8 text", file=file, key=key) from None
        if not found:
            raise ConfigError(f"no Host in ~/.ssh/config matches {value!r}", file=file, key=key)
        return [(h, None) for h in found]
