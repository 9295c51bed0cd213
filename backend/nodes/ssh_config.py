"""The OpenSSH client config (``~/.ssh/config``) as loadmaster reads it: which files apply, every
file they ``Include``, and a node's effective settings (loadmaster's fields over the config's).

The parse itself is asyncssh's own, imported only when a node's settings are worked out: the
connection keeper's clients list the config files (to key their keeper) without the SSH stack.
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from backend.config import Node
from backend.errors import ConfigError

if TYPE_CHECKING:
    import asyncssh.config

#: OpenSSH's limit on nested Include directives.
_INCLUDE_DEPTH = 16


def ssh_config_paths(explicit: str | Path | None = None) -> list[str]:
    """The OpenSSH client config files that apply: ``explicit`` or ``~/.ssh/config`` if readable."""
    if explicit is not None:
        return [str(explicit)] if str(explicit) else []
    default = Path(os.path.expanduser("~/.ssh/config"))
    return [str(default)] if os.access(default, os.R_OK) else []


def ssh_config_files(paths: list[str]) -> list[Path]:
    """The OpenSSH client config files ``paths`` name, with every file they ``Include`` (globs
    relative to ~/.ssh, as ssh_config(5) says), in reading order: an edit to any of them matters."""
    out: list[Path] = []
    seen: set[Path] = set()

    def visit(path: Path, depth: int) -> None:
        if path in seen or depth > _INCLUDE_DEPTH:
            return
        seen.add(path)
        out.append(path)
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return
        for line in text.splitlines():
            words = line.strip().replace("=", " ", 1).split()
            if len(words) < 2 or words[0].lower() != "include":
                continue
            for pattern in words[1:]:
                pat = Path(os.path.expanduser(pattern))
                if not pat.is_absolute():
                    pat = Path(os.path.expanduser("~/.ssh")) / pat
                try:
                    matches = sorted(Path(pat.anchor).glob(str(pat.relative_to(pat.anchor))))
                except (OSError, ValueError):
                    continue  # not a pattern ssh could read either
                for match in matches:
                    if match.is_file():
                        visit(match, depth + 1)

    for p in paths:
        visit(Path(p), 0)
    return out


def load_ssh_config(node: Node, paths: list[str]) -> asyncssh.config.SSHConfig:
    """asyncssh's own parse of the OpenSSH client config for this node's host."""
    from backend.nodes.libsearch import quick_library_search

    with quick_library_search():  # asyncssh probes for liboqs at import time
        import asyncssh
        import asyncssh.config
    try:
        return asyncssh.config.SSHClientConfig.load(
            None,
            paths,
            False,
            False,
            False,
            getpass.getuser(),
            node.user if node.user else (),
            node.host,
            node.port if node.port else (),
        )
    except (OSError, asyncssh.Error, ValueError) as exc:
        raise ConfigError(f"cannot parse OpenSSH config: {exc}", file=", ".join(paths) or None) from None


def config_value(paths: list[str], node: Node, option: str) -> Any:
    """One option of the config for ``node`` (None with no config file)."""
    if not paths:
        return None
    return load_ssh_config(node, paths).get(option)


class ConnectionSettings(TypedDict):
    """How loadmaster reaches a node (``loadmaster nodes``, ``--json`` prints it as it is)."""

    name: str
    transport: str
    hostname: str
    user: str
    #: The node's, else ``~/.ssh/config``'s, else 22; None for a local node.
    port: int | None
    identity: list[str]
    proxy_jump: str | None
    known_hosts: str | None
    trust_on_first_use: bool
    scratch: str
    site: str | None
    tags: list[str]
    slots: int | None
    #: The ssh_config file read (SSH nodes only).
    ssh_config: NotRequired[str | None]


def effective_settings(node: Node, ssh_config: str | Path | None = None) -> ConnectionSettings:
    """How loadmaster will reach ``node``: loadmaster's fields over ``~/.ssh/config``'s."""
    if node.transport == "local":
        return {
            "name": node.name,
            "transport": "local",
            "hostname": node.host,
            "user": getpass.getuser(),
            "port": None,
            "identity": [],
            "proxy_jump": None,
            "known_hosts": None,
            "trust_on_first_use": False,
            "scratch": node.scratch,
            "site": node.site,
            "tags": list(node.tags),
            "slots": node.slots,
        }
    from backend.nodes.hostkeys import known_hosts_path  # the SSH stack, only for SSH nodes

    paths = ssh_config_paths(ssh_config)
    cfg = load_ssh_config(node, paths)
    from_config: list[str] = cfg.get("IdentityFile") or []  # type: ignore[assignment]
    identity = list(node.identity) or [str(p) for p in from_config]
    return {
        "name": node.name,
        "transport": "ssh",
        "hostname": str(cfg.get("Hostname", node.host)),
        "user": node.user or _set(cfg.get("User")) or getpass.getuser(),
        "port": node.port or _port(cfg.get("Port")) or 22,
        "identity": [os.path.expanduser(p) for p in identity],
        "proxy_jump": node.jump or _set(cfg.get("ProxyJump")) or None,
        "known_hosts": str(known_hosts_path(node)),
        "trust_on_first_use": node.trust_on_first_use,
        "scratch": node.scratch,
        "site": node.site,
        "tags": list(node.tags),
        "slots": node.slots,
        "ssh_config": paths[0] if paths else None,
    }


def _set(value: object) -> str:
    """An ssh_config option's text as the table shows it; "" where the file does not set it."""
    return "" if value is None else str(value)


def _port(value: object) -> int | None:
    """ssh_config's Port (asyncssh parses it to an int); None where the file does not set it."""
    return value if isinstance(value, int) else None


def parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """``user@host:port`` (user and port optional) -> (user, host, port)."""
    user, _, rest = spec.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = int(tail[1:]) if tail.startswith(":") else None
    elif rest.count(":") == 1:
        host, p = rest.split(":")
        port = int(p)
    return (user or None), host, port
