"""The "GPU starved" detector: GPUs hold a job's memory but stay mostly idle for a window.

Pure state machine per node, fed one sample at a time with the hub's clock, so tests and the
benchmark drive it with synthetic time. The hint tells the operator where the bottleneck is:
NIC near line rate -> "input-bound" (the pipe is full); NIC far below line rate while starved ->
"request-bound" (many small GETs; the brief's fix is WebDataset shards).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from backend.telemetry.model import Alert, GpuSample
from backend.telemetry.settings import TelemetrySettings


@dataclass
class _Point:
    t: float
    util: float
    mem: float
    rx_gbps: float | None
    rx_pct: float | None


class StarvationDetector:
    """Raises an Alert for one node after ``starved_window`` seconds of starvation; clears it
    as soon as utilisation recovers or the job's memory is released."""

    def __init__(self, node: str, settings: TelemetrySettings, to_wall: Callable[[float], float] | None = None) -> None:
        self.node = node
        self.s = settings
        self._to_wall = to_wall
        self._points: deque[_Point] = deque()
        self._since: float | None = None  # when the job-holding, low-util run started
        self._gpus: tuple[int, ...] = ()
        self.alert: Alert | None = None

    def update(
        self, t: float, gpus: tuple[GpuSample, ...], rx_gbps: float | None, rx_pct: float | None
    ) -> tuple[Alert | None, Alert | None]:
        """Feed one sample; returns (active alert or None, alert that just cleared or None)."""
        busy = [
            g
            for g in gpus
            if not g.lost
            and g.mem_used_mib is not None
            and g.mem_used_mib > self.s.starved_memory_mib
            and g.util_pct is not None
        ]
        if not busy:
            return None, self._clear(t)
        util = sum(g.util_pct or 0.0 for g in busy) / len(busy)
        mem = sum(g.mem_used_mib or 0.0 for g in busy)
        self._gpus = tuple(sorted(g.index for g in busy))
        self._points.append(_Point(t, util, mem, rx_gbps, rx_pct))
        while self._points and self._points[0].t < t - self.s.starved_window:
            self._points.popleft()
        if self._since is None:
            self._since = t
        mean_util = sum(p.util for p in self._points) / len(self._points)
        held = t - self._since
        if mean_util >= self.s.starved_util_pct:
            cleared = self._clear(t)
            # Keep the job-holding run going: only the utilisation recovered.
            self._since = t
            self._points.clear()
            self._points.append(_Point(t, util, mem, rx_gbps, rx_pct))
            return None, cleared
        if held < self.s.starved_window:
            return None, None
        rx_vals = [p.rx_gbps for p in self._points if p.rx_gbps is not None]
        pct_vals = [p.rx_pct for p in self._points if p.rx_pct is not None]
        rx = sum(rx_vals) / len(rx_vals) if rx_vals else None
        pct = sum(pct_vals) / len(pct_vals) if pct_vals else None
        if pct is None:
            hint = "line rate unknown"
        elif pct >= self.s.input_bound_pct:
            hint = "input-bound"
        else:
            hint = "request-bound"
        if self.alert is None:
            started = t - held
            self.alert = Alert(
                node=self.node,
                gpus=self._gpus,
                started=started,
                duration=held,
                mean_util_pct=mean_util,
                mem_used_mib=mem,
                rx_gbps=rx,
                rx_pct=pct,
                hint=hint,
                started_wall=self._to_wall(started) if self._to_wall else None,
            )
        else:
            self.alert = replace(
                self.alert,
                gpus=self._gpus,
                duration=t - self.alert.started,
                mean_util_pct=mean_util,
                mem_used_mib=mem,
                rx_gbps=rx,
                rx_pct=pct,
                hint=hint,
            )
        return self.alert, None

    def reset(self, t: float) -> Alert | None:
        """The node stopped answering: forget the run; returns the alert that cleared, if any."""
        return self._clear(t)

    def _clear(self, t: float) -> Alert | None:
        self._points.clear()
        self._since = None
        if self.alert is None:
            return None
        done = replace(self.alert, active=False, ended=t, duration=t - self.alert.started)
        self.alert = None
        return done
