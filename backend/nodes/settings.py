"""The ``[ssh]`` config section: how long the command line keeps node connections between commands."""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.nodes.transport import DEFAULT_KEEPALIVE, DEFAULT_KEEPALIVE_COUNT
from backend.schema import parse_duration

#: ``LOADMASTER_SSH_PERSIST`` overrides ``[ssh] persist`` (a duration; 0 turns the keeper off).
PERSIST_ENV = "LOADMASTER_SSH_PERSIST"


def _keepalive(value: str | int | float) -> float:
    seconds = parse_duration(value)
    if not 0.2 <= seconds <= 300:
        raise ValueError(f"expected a duration between 0.2s and 300s, got {value!r}")
    return seconds


def _count(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
        raise ValueError(f"expected a whole number between 1 and 100, got {value!r}")
    return value


def _persist(value: str | int | float) -> float:
    seconds = parse_duration(value)
    if seconds < 0:
        raise ValueError(f"expected a duration >= 0 (0 turns it off), got {value!r}")
    return seconds


@dataclass(frozen=True)
class SshSettings:
    """Connection reuse for ``loadmaster`` commands (the console holds its own connections)."""

    #: After a command ends, its SSH connections (handshake done, command server started) stay
    #: open this long in a per-user connection keeper, so the next command skips the handshake and
    #: the node's login shell, like OpenSSH's ``ControlPersist``. 0 turns the keeper off: every
    #: command connects on its own.
    persist: float = field(default=60.0, metadata={"parse": _persist})
    #: Seconds between SSH keepalives on every connection, and how many may go unanswered: a
    #: node that stops answering (a black-holed link) is unreachable after interval x count.
    keepalive_interval: float = field(default=DEFAULT_KEEPALIVE, metadata={"parse": _keepalive})
    keepalive_count: int = field(default=DEFAULT_KEEPALIVE_COUNT, metadata={"parse": _count})
