"""Free TCP ports on the lab's loopback addresses (every lab part picks its own).

Every pick is below the kernel's ephemeral range. A port in that range can be taken between the
pick and the daemon's bind by any outgoing connection (the suite makes thousands), or held in
TIME_WAIT for a minute after one, and a listener cannot bind it then: slurmd failed "Unable to bind
listen port ... Address already in use" on a port the kernel had just handed out as free."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

from backend.errors import LoadmasterError

#: The lowest port picked: above the well-known and registered ports services commonly take
#: (PostgreSQL's 5432, Prometheus's 9090, node_exporter's 9100, ...).
LOWEST = 10000


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default if unreadable)."""
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return lo, hi


def port_free(ip: str, port: int) -> bool:
    """Whether a listener could bind ``port`` on ``ip`` now (with SO_REUSEADDR, as daemons do)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
        except OSError:
            return False
    return True


def free_port_block(count: int, ip: str = "127.0.0.1", *, twin_offset: int = 0, lowest: int = LOWEST) -> int:
    """A base port such that ``base .. base+count-1`` are free on ``ip``, below the ephemeral range
    (and, with ``twin_offset``, their ``+twin_offset`` twins too: SeaweedFS's grpc ports)."""
    lo, _hi = ephemeral_range()
    top = min(lo, 65536) - twin_offset - count
    if top <= lowest:
        lowest = 1024
    if top <= lowest:
        raise LoadmasterError(f"no room below the ephemeral port range ({lo}) for the lab's ports")
    rng = secrets.SystemRandom()
    for _ in range(200):
        base = rng.randrange(lowest, top)
        ports = range(base, base + count)
        if all(port_free(ip, p) and (not twin_offset or port_free(ip, p + twin_offset)) for p in ports):
            return base
    raise LoadmasterError(f"no free block of {count} ports on {ip} below the ephemeral range ({lo})")


def free_port(ip: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``ip`` right now, below the ephemeral range."""
    return free_port_block(1, ip)


def common_free_port(ips: list[str], what: str = "a lab part") -> int:
    """A port free on every one of ``ips`` (sshd nodes, node_exporters: one port across the lab)."""
    for _ in range(100):
        port = free_port(ips[0])
        if all(port_free(ip, port) for ip in ips):
            return port
    raise LoadmasterError(f"no port free on every lab address for {what}")
