"""The state one relay node shares between its receiver (or s5cmd, on a seed) and its server: what
it holds of each object (:class:`Holdings`), how fast bytes arrive (:class:`RateWindow`), the
errors a node ends with, and the timings both ends of a connection agree on.

See :mod:`backend.pulls.relay.node` for how a node's parts fit together.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

from backend.errors import JobError
from backend.pulls.objects import PulledObject
from backend.pulls.relay.protocol import Message

#: A connected child hears from its upstream at least this often (a ping when there is no data).
PING_S = 1.0
#: Without a frame for this long, the upstream is taken as dead and the child re-attaches (the
#: default of ``[pull] relay_silence``, which the job's spec carries as ``silence_s``).
SILENCE_S = 5.0
CONNECT_S = 2.0
#: The most node names a ping says are done at the upstream (a receiver refuses a longer list).
MAX_DONE_NAMES = 64


def listing_digest(objects: list[PulledObject]) -> str:
    """What every node of one relay must agree on: the objects, their sizes and ETags."""
    return hashlib.sha256(json.dumps([list(o) for o in objects]).encode()).hexdigest()


class Cancelled(JobError):
    """The relay was cancelled (here or by a peer)."""


class FatalUpstream(JobError):
    """The seed above this node failed (its source did) and no other seed is left to try."""


class LocalWriteError(JobError):
    """This node cannot write DEST (a full disk, an I/O error): fatal here, never re-attached."""


class CorruptObject(JobError):
    """An object arrived whole but its bytes do not match the listing's checksum or MD5: fatal here."""


class Holdings:
    """What this node has of each object, shared by its receiver (or s5cmd) and its server."""

    def __init__(self, dest: Path, objects: list[PulledObject]) -> None:
        self.dest = dest
        self.objects = objects
        self.sizes = [o.size for o in objects]
        self.avail = [0] * len(objects)
        self.path: list[Path | None] = [None] * len(objects)
        self.complete = [False] * len(objects)
        #: Set when this node's whole copy is verified: the end message its children get.
        self.end: Message | None = None
        #: Set when this node cannot finish: its children are told and fail or re-attach.
        self.error: str | None = None
        self.fatal = False
        #: How fast this node is fed, and its fastest sibling (bytes/s), as its upstream saw it.
        self.fed_bps = 0.0
        self.sibling_bps = 0.0
        self.cancelled = False
        self.cond = threading.Condition()
        #: (object, offset) -> (length, SHA-256) of each chunk hashed or received here: a chunk is
        #: forwarded with the digest it arrived with (or was first hashed with), not hashed again.
        self.digests: dict[tuple[int, int], tuple[int, bytes]] = {}

    def digest(self, index: int, offset: int, data: bytes | memoryview) -> bytes:
        known = self.digests.get((index, offset))
        if known is not None and known[0] == len(data):
            return known[1]
        d = hashlib.sha256(data).digest()
        self.digests[(index, offset)] = (len(data), d)
        return d

    def publish(self, index: int, avail: int, path: Path, *, complete: bool = False) -> None:
        with self.cond:
            self.avail[index] = avail
            self.path[index] = path
            self.complete[index] = complete or self.complete[index]
            self.cond.notify_all()

    def finish(self, end: Message) -> None:
        with self.cond:
            self.end = end
            self.cond.notify_all()

    def fail(self, error: str, *, fatal: bool = False) -> None:
        """This node cannot finish; ``fatal`` when no node below can finish without it (a seed:
        its source failed), else its children re-attach above it."""
        with self.cond:
            self.error = error
            self.fatal = fatal
            self.cond.notify_all()

    def cancel(self) -> None:
        with self.cond:
            self.cancelled = True
            self.cond.notify_all()

    @property
    def bytes_done(self) -> int:
        return sum(self.avail)

    @property
    def items_done(self) -> int:
        return sum(self.complete)


class RateWindow:
    """Bytes per second over the last few seconds of (time, bytes so far) points."""

    def __init__(self, span_s: float = 3.0) -> None:
        self.span_s = span_s
        self.points: list[tuple[float, int]] = []

    def add(self, nbytes: int) -> None:
        now = time.time()
        self.points = [p for p in self.points if now - p[0] <= self.span_s] + [(now, nbytes)]

    def bps(self) -> float:
        if len(self.points) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self.points[0], self.points[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
