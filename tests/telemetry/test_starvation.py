"""The "GPU starved" detector: memory held, utilisation low, for the window."""

from __future__ import annotations

from backend.telemetry.model import GpuSample
from backend.telemetry.settings import TelemetrySettings
from backend.telemetry.starvation import StarvationDetector

S = TelemetrySettings(starved_window=60, starved_util_pct=50, starved_memory_mib=2048, input_bound_pct=70)


def gpus(util: float, mem: float = 70000, n: int = 8) -> tuple[GpuSample, ...]:
    return tuple(GpuSample(index=i, util_pct=util, mem_used_mib=mem, mem_total_mib=81559) for i in range(n))


def run(det, start, end, util, mem=70000, rx=2.0, pct=2.0):
    alert = cleared = None
    for t in range(start, end + 1):
        alert, c = det.update(float(t), gpus(util, mem), rx, pct)
        cleared = c or cleared
    return alert, cleared


def test_raised_after_window_with_request_bound_hint():
    det = StarvationDetector("n1", S)
    alert, _ = run(det, 0, 59, util=20)
    assert alert is None  # not yet a full window
    alert, _ = run(det, 60, 61, util=20)
    assert alert is not None
    assert alert.gpus == tuple(range(8))
    assert alert.started == 0.0 and alert.duration == 61.0
    assert alert.hint == "request-bound"
    assert alert.active
    assert "WebDataset" in alert.message


def test_input_bound_when_nic_near_line_rate():
    det = StarvationDetector("n1", S)
    alert, _ = run(det, 0, 61, util=25, rx=90.0, pct=90.0)
    assert alert is not None and alert.hint == "input-bound"


def test_unknown_line_rate():
    det = StarvationDetector("n1", S)
    alert, _ = run(det, 0, 61, util=25, rx=1.0, pct=None)
    assert alert is not None and alert.hint == "line rate unknown"


def test_clears_when_utilisation_recovers():
    det = StarvationDetector("n1", S)
    run(det, 0, 70, util=20)
    assert det.alert is not None
    alert, cleared = run(det, 71, 140, util=98)
    assert alert is None and det.alert is None
    assert cleared is not None and not cleared.active and cleared.ended is not None


def test_clears_when_job_memory_released():
    det = StarvationDetector("n1", S)
    run(det, 0, 70, util=20)
    alert, cleared = det.update(71.0, gpus(0, mem=4), 0.0, 0.0)
    assert alert is None and cleared is not None and cleared.duration == 71.0


def test_idle_node_without_job_never_alerts():
    det = StarvationDetector("n1", S)
    alert, _ = run(det, 0, 200, util=0, mem=4)
    assert alert is None


def test_busy_training_never_alerts():
    det = StarvationDetector("n1", S)
    alert, _ = run(det, 0, 200, util=95)
    assert alert is None


def test_lost_gpus_are_ignored():
    det = StarvationDetector("n1", S)
    g = gpus(20) + (GpuSample(index=8, lost=True),)
    for t in range(62):
        alert, _ = det.update(float(t), g, 1.0, 1.0)
    assert alert is not None and 8 not in alert.gpus
