"""The ``[jobs]`` config section: polling, lost detection, cancel grace and pull defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.schema import parse_duration


def _positive_int(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected a whole number >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class JobSettings:
    """How jobs are watched and stopped, and the tuned s5cmd defaults for pulls."""

    #: Seconds between re-reads of running jobs' directories (CLI --follow, console).
    poll_interval: float = field(default=1.0, metadata={"parse": parse_duration})
    #: A job with no result, a dead pid and a heartbeat older than this is "lost".
    lost_after: float = field(default=15.0, metadata={"parse": parse_duration})
    #: After SIGTERM, how long a cancelled job gets before its process group is SIGKILLed.
    cancel_grace: float = field(default=10.0, metadata={"parse": parse_duration})
    #: s5cmd on the nodes (a path where it is not on the login PATH).
    s5cmd: str = "s5cmd"
    #: ``s5cmd --numworkers``: parallel objects (the tuned command uses 256).
    numworkers: int = field(default=256, metadata={"parse": _positive_int})
    #: ``s5cmd cp --concurrency``: parallel parts per object.
    concurrency: int = field(default=32, metadata={"parse": _positive_int})
    #: ``s5cmd cp --part-size`` in MiB.
    part_size_mib: int = field(default=64, metadata={"parse": _positive_int})
    #: NIC line rate assumed when a node does not report one (/sys/class/net/*/speed).
    nic_gbps: float = 100.0
    #: How many objects a pull spec carries for verification (larger pulls list on the node).
    max_spec_objects: int = field(default=20000, metadata={"parse": _positive_int})
