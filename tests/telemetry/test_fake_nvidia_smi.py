"""The stand-in nvidia-smi prints NVIDIA's documented formats and exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from backend.telemetry.model import NO_GPU
from backend.telemetry.parse import parse_gpu_csv
from backend.telemetry.sampler import GPU_FIELDS
from lab import fake_nvidia_smi
from lab.fake_nvidia_smi import write_scenario

SCRIPT = Path(fake_nvidia_smi.__file__)
QUERY = [f"--query-gpu={GPU_FIELDS}", "--format=csv,noheader,nounits"]


def smi(scenario: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run the stand-in the way a lab node does: its ``nvidia-smi`` wrapper."""
    wrapper = scenario.with_name("nvidia-smi")
    if not wrapper.exists():
        wrapper.write_text(fake_nvidia_smi.stand_in_script(scenario))
        wrapper.chmod(0o755)
    return subprocess.run([str(wrapper), *args], capture_output=True, text=True, timeout=timeout)


def test_run_as_a_script_it_answers_the_same(tmp_path):
    sc = write_scenario(tmp_path / "s.json", gpus=2, pattern="training", fixed_t=10.0)
    direct = subprocess.run(
        [sys.executable, str(SCRIPT), "--scenario", str(sc), *QUERY], capture_output=True, text=True, timeout=30
    )
    assert direct.returncode == 0 and direct.stdout == smi(sc, *QUERY).stdout


def test_a_changed_scenario_is_read_again(tmp_path):
    # The stand-in keeps a scenario's parsed form beside it; a rewrite (the lab's, a new file) and
    # an edit in place (a person's) must both be what the next call answers.
    sc = write_scenario(tmp_path / "s.json", gpus=2, pattern="training", fixed_t=10.0)
    assert len(smi(sc, *QUERY).stdout.splitlines()) == 2
    assert len(smi(sc, *QUERY).stdout.splitlines()) == 2  # from the kept form
    write_scenario(sc, gpus=3, pattern="training", fixed_t=10.0)
    assert len(smi(sc, *QUERY).stdout.splitlines()) == 3
    with open(sc, "r+") as f:  # same inode, new size and mtime
        text = f.read().replace('"gpus": 3', '"gpus": 1')
        f.seek(0)
        f.write(text)
        f.truncate()
    assert len(smi(sc, *QUERY).stdout.splitlines()) == 1
    cache = next(tmp_path.glob("s.json.*.marshal"))
    cache.write_bytes(b"not marshal")  # a damaged cache is parsed past, not trusted
    assert len(smi(sc, *QUERY).stdout.splitlines()) == 1


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


HEALTH = (
    "index,uuid,pci.bus_id,clocks.sm,clocks.max.sm,clocks_event_reasons.active,ecc.errors.uncorrected.volatile.total"
)
REMAP = "gpu_uuid,remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure"


def test_health_faults_remapped_rows_and_compute_apps(tmp_path):
    """Faults per GPU in the health fields; --query-remapped-rows and --query-compute-apps in the
    real CSV shape; a vanished GPU is not enumerated and the indices close up."""
    sc = write_scenario(
        tmp_path / "s.json", gpus=4, fixed_t=2.0,
        faults={"1": {"clock_reasons": 0x48, "sm_clock_pct": 95, "ecc_uncorrected": 3}, "2": {"remap_pending": True}, "3": {"vanish": True}},
        apps=[{"gpu": 2, "pid": 4242, "name": "python", "used_mib": 2048}],
    )  # fmt: skip
    lines = smi(sc, f"--query-gpu={HEALTH}", "--format=csv").stdout.splitlines()
    assert lines[0] == (
        "index, uuid, pci.bus_id, clocks.sm [MHz], clocks.max.sm [MHz], clocks_event_reasons.active, "
        "ecc.errors.uncorrected.volatile.total"
    )
    assert len(lines) == 4 and lines[2].endswith(", 1881 MHz, 1980 MHz, 0x0000000000000048, 3")
    assert lines[1].endswith(", 1980 MHz, 1980 MHz, 0x0000000000000000, 0")
    remap = smi(sc, f"--query-remapped-rows={REMAP}", "--format=csv,noheader").stdout.splitlines()
    assert [r.split(", ")[1:] for r in remap] == [
        ["0", "0", "No", "No"],
        ["0", "0", "No", "No"],
        ["0", "1", "Yes", "No"],
    ]
    apps = smi(sc, "--query-compute-apps=pid,gpu_uuid,process_name,used_memory", "--format=csv").stdout.splitlines()
    assert apps == [
        "pid, gpu_uuid, process_name, used_memory [MiB]",
        "4242, GPU-5f1c2a3b-0000-4000-8000-000000000002, python, 2048 MiB",
    ]
    assert (
        smi(sc, "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader").stdout
        == "4242, GPU-5f1c2a3b-0000-4000-8000-000000000002\n"
    )


def test_unknown_fault_field_rejected(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="unknown fault field"):
        write_scenario(tmp_path / "s.json", faults={"1": {"on_fire": True}})


def test_sh_stand_in_prints_the_health_fields_byte_for_byte(tmp_path):
    """The fleet-scale sh stand-in answers the health and remapped-rows queries as the Python one."""
    from bench import nvidia_smi_sh

    for pattern in ("training", "idle"):
        sh = nvidia_smi_sh.write(tmp_path / "smi", fixed_t=3.0, pattern=pattern, gpus=3)
        sc = write_scenario(tmp_path / "s.json", fixed_t=3.0, pattern=pattern, gpus=3)
        for q in (f"--query-gpu={HEALTH}", f"--query-remapped-rows={REMAP}"):
            for fmt in ("--format=csv,noheader,nounits", "--format=csv"):
                got = subprocess.run([str(sh), q, fmt], capture_output=True, text=True, timeout=30).stdout
                assert got == smi(sc, q, fmt).stdout, (pattern, q, fmt)
