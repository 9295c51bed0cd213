"""Free TCP ports on the lab's loopback addresses (every lab part picks its own)."""

from __future__ import annotations

import socket

from backend.errors import LoadmasterError


def free_port(ip: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``ip`` right now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def port_free(ip: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``ip`` now."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
        except OSError:
            return False
    return True


def common_free_port(ips: list[str], what: str = "a lab part") -> int:
    """A port free on every one of ``ips`` (sshd nodes, node_exporters: one port across the lab)."""
    for _ in range(100):
        port = free_port(ips[0])
        if all(port_free(ip, port) for ip in ips):
            return port
    raise LoadmasterError(f"no port free on every lab address for {what}")
