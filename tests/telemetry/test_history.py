"""The bounded ring buffers and their summaries."""

from __future__ import annotations

import math

import pytest

from backend.telemetry.history import NODE_METRICS, NodeHistory, Ring, bytes_per_node
from backend.telemetry.settings import TelemetrySettings


def test_ring_keeps_newest_and_stays_bounded():
    r = Ring(4)
    for v in range(10):
        r.append(float(v))
    assert len(r) == 4
    assert r.values() == [6.0, 7.0, 8.0, 9.0]
    assert r.tail(2) == [8.0, 9.0]
    assert r.nbytes == 16


def test_summary_ignores_missing():
    r = Ring(5)
    for v in (1.0, None, 3.0, 5.0):
        r.append(v)
    s = r.summary()
    assert (s.min, s.mean, s.max, s.count) == (1.0, 3.0, 5.0, 3)
    assert math.isnan(r.values()[1])
    assert Ring(3).summary().count == 0


def test_node_history_aligns_late_gpus():
    h = NodeHistory(10)
    h.append(1.0, {"util_mean": 50.0}, [(0, 50.0)])
    h.append(2.0, {"util_mean": 60.0}, [(0, 40.0), (1, 80.0)])
    assert h.series("util_mean") == [50.0, 60.0]
    gpu1 = h.series("gpu1")
    assert math.isnan(gpu1[0]) and gpu1[1] == 80.0
    assert h.times() == [1.0, 2.0]
    with pytest.raises(KeyError):
        h.series("nope")


def test_default_history_is_fifteen_minutes_and_memory_is_fixed():
    s = TelemetrySettings()
    assert s.history_capacity == 900
    h = NodeHistory(s.history_capacity)
    gpus = [(i, 90.0) for i in range(8)]
    for t in range(2000):  # more than capacity: memory must not grow
        h.append(float(t), dict.fromkeys(NODE_METRICS, 1.0), gpus)
    assert len(h) == 900
    assert h.nbytes == bytes_per_node(900, 8) == 900 * (8 + 4 * (len(NODE_METRICS) + 8))
