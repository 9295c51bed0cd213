"""The stand-in nvidia-smi prints NVIDIA's documented formats and exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from backend.lab import fake_nvidia_smi
from backend.lab.fake_nvidia_smi import write_scenario
from backend.telemetry.model import NO_GPU
from backend.telemetry.parse import parse_gpu_csv
from backend.telemetry.sampler import GPU_FIELDS

SCRIPT = Path(fake_nvidia_smi.__file__)
QUERY = [f"--query-gpu={GPU_FIELDS}", "--format=csv,noheader,nounits"]


def smi(scenario: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--scenario", str(scenario), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_query_training(tmp_path):
    sc = write_scenario(tmp_path / "s.json", gpus=8, pattern="training", fixed_t=10.0)
    res = smi(sc, *QUERY)
    assert res.returncode == 0
    lines = res.stdout.splitlines()
    assert len(lines) == 8
    assert lines[0].startswith("0, GPU-") and ", NVIDIA H100 80GB HBM3, " in lines[0]
    gpus, status = parse_gpu_csv(res.stdout, "0")
    assert status == "ok" and all(g.util_pct is not None and g.util_pct >= 90 for g in gpus)
    assert all(g.mem_used_mib and g.mem_used_mib > 60000 for g in gpus)


def test_starved_and_not_supported_power(tmp_path):
    sc = write_scenario(tmp_path / "s.json", gpus=2, pattern="starved", power="not_supported", fixed_t=3.0)
    res = smi(sc, *QUERY)
    assert "[Not Supported]" in res.stdout
    gpus, _ = parse_gpu_csv(res.stdout, "0")
    assert all(g.power_w is None and 10 <= (g.util_pct or 0) <= 30 for g in gpus)


def test_gpu_lost_after_t(tmp_path):
    sc = write_scenario(tmp_path / "s.json", gpus=4, lost_gpu=2, lost_after=5.0, fixed_t=1.0)
    assert not any(g.lost for g in parse_gpu_csv(smi(sc, *QUERY).stdout)[0])
    sc = write_scenario(tmp_path / "s.json", gpus=4, lost_gpu=2, lost_after=5.0, fixed_t=6.0)
    res = smi(sc, *QUERY)
    assert "GPU is lost" in res.stdout and res.returncode != 0
    gpus, status = parse_gpu_csv(res.stdout, str(res.returncode))
    assert status == "ok" and [g.lost for g in gpus] == [False, False, True, False]


def test_no_devices_exits_6(tmp_path):
    sc = write_scenario(tmp_path / "s.json", gpus=0)
    res = smi(sc, *QUERY)
    assert res.returncode == 6 and res.stdout.strip() == "No devices were found"
    assert parse_gpu_csv(res.stdout, "6") == ((), NO_GPU)


def test_header_with_units_list_and_summary(tmp_path):
    sc = write_scenario(tmp_path / "s.json", gpus=2, driver="550.54.15", fixed_t=0.0)
    res = smi(sc, "--query-gpu=index,memory.used,power.draw", "--format=csv")
    assert res.stdout.splitlines()[0] == "index, memory.used [MiB], power.draw [W]"
    assert res.stdout.splitlines()[1].endswith(" W") and " MiB, " in res.stdout
    listing = smi(sc, "-L").stdout.splitlines()
    assert listing[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    summary = smi(sc).stdout
    assert "Driver Version: 550.54.15" in summary and "NVIDIA-SMI" in summary


def test_loop_ms_repeats(tmp_path):
    sc = write_scenario(tmp_path / "s.json", gpus=1)
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--scenario", str(sc), *QUERY, "-lms", "50"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        first, second = proc.stdout.readline(), proc.stdout.readline()
        assert first.startswith("0, GPU-") and second.startswith("0, GPU-")
    finally:
        proc.kill()
        proc.wait()


def test_unknown_scenario_field_rejected(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="gpu_count"):
        write_scenario(tmp_path / "s.json", gpu_count=3)
