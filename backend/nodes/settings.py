"""The ``[ssh]`` config section: how long the command line keeps node connections between commands."""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.schema import parse_duration

#: ``LOADMASTER_SSH_PERSIST`` overrides ``[ssh] persist`` (a duration; 0 turns the keeper off).
PERSIST_ENV = "LOADMASTER_SSH_PERSIST"


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
