"""Strict host-key checking for asyncssh, the way OpenSSH's StrictHostKeyChecking does it.

asyncssh only rejects a key it cannot match; it has no notion of "unknown" versus "changed" and
no trust-on-first-use. :class:`VerifyingClient` is consulted by asyncssh for every offered key
that is not already trusted by the node's known_hosts file: it records both fingerprints so the
refusal can name them, and appends an UNKNOWN key only when the operator enabled
``trust_on_first_use`` for that node. A CHANGED key is always refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from backend.config import Node
from backend.errors import HostKeyRefused

DEFAULT_SSH_PORT = 22


def known_hosts_path(node: Node) -> Path:
    """The known_hosts file checked for ``node``: its own setting or ``~/.ssh/known_hosts``."""
    return Path(os.path.expanduser(node.known_hosts or "~/.ssh/known_hosts"))


def load_known_hosts(path: Path) -> asyncssh.SSHKnownHosts:
    """The parsed known_hosts file; an empty set when the file does not exist yet."""
    if not path.exists():
        return asyncssh.SSHKnownHosts()
    return asyncssh.read_known_hosts(str(path))


def fingerprint(key: asyncssh.SSHKey) -> str:
    """``SHA256:...`` fingerprint as OpenSSH prints it."""
    return key.get_fingerprint("sha256")


def host_pattern(host: str, port: int | None) -> str:
    """The known_hosts host field OpenSSH writes: ``host`` or ``[host]:port``."""
    if port in (None, DEFAULT_SSH_PORT):
        return host
    return f"[{host}]:{port}"


def expected_keys(path: Path, host: str, addr: str, port: int | None) -> list[asyncssh.SSHKey]:
    """Keys known_hosts holds for this host (by name, address and port)."""
    p = None if port in (None, DEFAULT_SSH_PORT) else port
    # A line can match by name and by address: list each key once.
    keys: list[asyncssh.SSHKey] = []
    for k in load_known_hosts(path).match(host, addr, p)[0]:
        if k not in keys:
            keys.append(k)
    return keys


def append_known_host(path: Path, host: str, port: int | None, key: asyncssh.SSHKey) -> None:
    """Append ``key`` for ``host`` to known_hosts (creating it 0600 in a 0700 directory)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    alg, blob = key.export_public_key("openssh").decode().split()[:2]
    line = f"{host_pattern(host, port)} {alg} {blob}\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        prefix = b""
        if os.fstat(fd).st_size:
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    prefix = b"\n"
        os.write(fd, prefix + line.encode())
    finally:
        os.close(fd)


@dataclass
class Refusal:
    """Why a host key was refused: what was offered and what known_hosts expected."""

    host: str
    port: int | None
    offered: str
    expected: list[str]
    known_hosts: Path

    def error(self, node: str) -> HostKeyRefused:
        where = host_pattern(self.host, self.port)
        if self.expected:
            message = (
                f"host key for {where} CHANGED: offered {self.offered}, expected "
                f"{', '.join(self.expected)} from {self.known_hosts}; if the node was reinstalled, "
                f"remove the old line with: ssh-keygen -f {self.known_hosts} -R '{where}'"
            )
            expected = ", ".join(self.expected)
        else:
            message = (
                f"host key for {where} is unknown: offered {self.offered}, not in known_hosts "
                f"{self.known_hosts}; verify it and add it (ssh-keyscan), or set "
                f"trust_on_first_use = true for this node"
            )
            expected = f"not in known_hosts {self.known_hosts}"
        return HostKeyRefused(node, message, offered=self.offered, expected=expected)


class VerifyingClient(asyncssh.SSHClient):
    """asyncssh client callbacks for one connection: strict host keys, TOFU, loss tracking."""

    def __init__(self, node_name: str, known_hosts: Path, trust_on_first_use: bool) -> None:
        self.node_name = node_name
        self.known_hosts = known_hosts
        self.trust_on_first_use = trust_on_first_use
        self.refusal: Refusal | None = None
        self.added: str | None = None
        self.lost: Exception | None = None
        self.closed = False
        self.on_lost: Callable[[Exception | None], None] | None = None

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        # asyncssh calls this only for a key known_hosts does not already trust.
        p = None if port == DEFAULT_SSH_PORT else port
        expected = [fingerprint(k) for k in expected_keys(self.known_hosts, host, addr, p)]
        if not expected and self.trust_on_first_use:
            append_known_host(self.known_hosts, host, p, key)
            self.added = fingerprint(key)
            return True
        self.refusal = Refusal(host, p, fingerprint(key), expected, self.known_hosts)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost = exc
        if self.on_lost is not None:
            self.on_lost(exc)
