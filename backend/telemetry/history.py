"""Bounded per-node history: one fixed-size float32 ring per metric, with min/mean/max.

Memory is fixed at construction: ``capacity`` slots x (8 bytes of timestamp + 4 bytes per
metric). With the defaults (900 s at 1 Hz) and the 7 node metrics plus 8 per-GPU utilisation
series a node costs 900 x (8 + 15 x 4) = 61,200 bytes, so 256 nodes hold about 15.7 MB however
long the console runs.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

#: Node-level series, in the order they are stored.
NODE_METRICS = (
    "util_mean",
    "util_min",
    "mem_used_mib",
    "rx_gbps",
    "tx_gbps",
    "disk_write_mbps",
    "disk_read_mbps",
)
NAN = float("nan")


@dataclass(frozen=True)
class Summary:
    """min/mean/max of a series over the window (None when it holds no values)."""

    min: float | None
    mean: float | None
    max: float | None
    count: int


class Ring:
    """A fixed-capacity ring of float32 values; NaN marks a missing sample."""

    __slots__ = ("_buf", "_cap", "_head", "_len")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._cap = capacity
        self._buf = array("f", [NAN]) * capacity
        self._head = 0  # next write position
        self._len = 0

    def __len__(self) -> int:
        return self._len

    @property
    def capacity(self) -> int:
        """Slots in the ring."""
        return self._cap

    def append(self, value: float | None) -> None:
        """Add a value (None -> NaN), overwriting the oldest when full."""
        self._buf[self._head] = NAN if value is None else value
        self._head = (self._head + 1) % self._cap
        if self._len < self._cap:
            self._len += 1

    def values(self) -> list[float]:
        """Oldest to newest (NaN for missing)."""
        return self.tail(self._len)

    def tail(self, n: int) -> list[float]:
        """The newest ``n`` values, oldest first."""
        n = max(0, min(n, self._len))
        start = (self._head - n) % self._cap
        if start + n <= self._cap:
            return self._buf[start : start + n].tolist()
        return self._buf[start:].tolist() + self._buf[: (start + n) % self._cap].tolist()

    def summary(self, n: int | None = None) -> Summary:
        """min/mean/max over the newest ``n`` values (all when None), ignoring missing ones."""
        vals = [v for v in self.tail(self._len if n is None else n) if not math.isnan(v)]
        if not vals:
            return Summary(None, None, None, 0)
        return Summary(min(vals), sum(vals) / len(vals), max(vals), len(vals))

    @property
    def nbytes(self) -> int:
        """Bytes held by the ring."""
        return self._buf.itemsize * self._cap


class TimeRing(Ring):
    """Timestamps need float64: float32 loses sub-second precision on a monotonic clock."""

    __slots__ = ()

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._buf = array("d", [NAN]) * capacity


class NodeHistory:
    """Every series of one node, sampled together (one slot per ingested sample)."""

    def __init__(self, capacity: int, gpu_count: int = 0) -> None:
        self.capacity = capacity
        self.t = TimeRing(capacity)
        self.metrics: dict[str, Ring] = {m: Ring(capacity) for m in NODE_METRICS}
        self.gpu_util: dict[int, Ring] = {}
        self._gpu_hint = gpu_count

    def append(
        self, t: float, values: dict[str, float | None], gpu_util: Iterable[tuple[int, float | None]] = ()
    ) -> None:
        """Record one sample's node metrics and per-GPU utilisation at time ``t``."""
        self.t.append(t)
        for name, ring in self.metrics.items():
            ring.append(values.get(name))
        seen = set()
        for idx, util in gpu_util:
            gring = self.gpu_util.get(idx)
            if gring is None:
                # A GPU first seen now: pad so every ring stays aligned with the timestamps.
                gring = self.gpu_util[idx] = Ring(self.capacity)
                for _ in range(len(self.t) - 1):
                    gring.append(None)
            gring.append(util)
            seen.add(idx)
        for idx, ring in self.gpu_util.items():
            if idx not in seen:
                ring.append(None)

    def series(self, metric: str, n: int | None = None) -> list[float]:
        """A node metric (see NODE_METRICS) or ``gpu<i>`` util, oldest first."""
        ring = self._ring(metric)
        return ring.values() if n is None else ring.tail(n)

    def summary(self, metric: str, n: int | None = None) -> Summary:
        """min/mean/max of one series over the newest ``n`` samples (all when None)."""
        return self._ring(metric).summary(n)

    def times(self) -> list[float]:
        """Sample times (hub clock), oldest first."""
        return self.t.values()

    def __len__(self) -> int:
        return len(self.t)

    @property
    def nbytes(self) -> int:
        """Bytes held by the rings (fixed once every GPU has been seen)."""
        return (
            self.t.nbytes + sum(r.nbytes for r in self.metrics.values()) + sum(r.nbytes for r in self.gpu_util.values())
        )

    def _ring(self, metric: str) -> Ring:
        if metric in self.metrics:
            return self.metrics[metric]
        if metric.startswith("gpu") and metric[3:].isdigit():
            ring = self.gpu_util.get(int(metric[3:]))
            if ring is not None:
                return ring
        raise KeyError(f"no such series: {metric!r}")


def bytes_per_node(capacity: int, gpus: int) -> int:
    """Ring memory of one node: capacity x (8 B timestamp + 4 B x (node metrics + GPUs))."""
    return capacity * (8 + 4 * (len(NODE_METRICS) + gpus))
