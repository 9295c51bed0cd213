"""The ``[jobs]`` config section: what every job kind uses (polling, lost detection, cancel grace,
egress reservations). A pull's own knobs are ``[pull]`` (:mod:`backend.pulls.settings`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.schema import parse_duration


@dataclass(frozen=True)
class JobSettings:
    """How jobs are watched and stopped."""

    #: Seconds between re-reads of running jobs' directories (CLI --follow, console).
    poll_interval: float = field(default=1.0, metadata={"parse": parse_duration})
    #: A job with no result, a dead pid and a heartbeat older than this is "lost".
    lost_after: float = field(default=15.0, metadata={"parse": parse_duration})
    #: An egress reservation whose job never appeared (the launch died between the two: SIGKILL,
    #: a crash) is released by the next refresh this long after it was made.
    reservation_grace: float = field(default=600.0, metadata={"parse": parse_duration})
    #: After SIGTERM, how long a cancelled job gets before its process group is SIGKILLed.
    cancel_grace: float = field(default=10.0, metadata={"parse": parse_duration})
