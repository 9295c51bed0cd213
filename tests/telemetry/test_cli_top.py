"""``loadmaster top`` end to end over a local node with the stand-in nvidia-smi."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import fake_nvidia_smi
from lab.fake_nvidia_smi import write_scenario
from tui.cli import main


@pytest.fixture
def config(tmp_path: Path) -> Path:
    sc = write_scenario(tmp_path / "gpu.json", gpus=8, pattern="training")
    smi = tmp_path / "nvidia-smi"
    smi.write_text(fake_nvidia_smi.stand_in_script(sc))
    smi.chmod(0o755)
    (tmp_path / "scratch").mkdir()
    cfg = tmp_path / "lm.toml"
    cfg.write_text(
        "[[nodes]]\n"
        'name = "gpu-local"\nhost = "localhost"\ntransport = "local"\n'
        f'scratch = "{tmp_path / "scratch"}"\nsite = "lab:local"\n\n'
        f'[telemetry]\ninterval = 0.2\nnvidia_smi = "{smi}"\n'
    )
    return cfg


def test_top_once_prints_the_fleet_table(config, capsys):
    assert main(["--config", str(config), "top", "--once"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("nodes 1/1 up · GPUs 8 · util ")
    header, row = out[1].split(), out[2].split()
    assert header[:4] == ["NODE", "STATE", "SSH", "GPUS"]
    assert row[0] == "gpu-local" and row[1] == "up" and row[3] == "8"
    assert row[2] == "local"  # this machine, no SSH: no latency to show (it said 3ms)
    assert int(row[4].rstrip("%")) >= 90


def test_top_json_one_object_per_tick(config, capsys):
    assert main(["--config", str(config), "top", "--json", "--count", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    ticks = [json.loads(line) for line in lines]
    assert [t["seq"] for t in ticks] == sorted(t["seq"] for t in ticks)
    node = ticks[-1]["nodes"][0]
    assert node["name"] == "gpu-local" and node["site"] == "lab:local"
    assert node["gpu_status"] == "ok" and len(node["gpus"]) == 8
    assert node["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert ticks[-1]["summary"]["gpus"] == 8
    assert any(n["kind"] == "loopback" for n in node["nics"])


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--interval", "0.05"], "--interval: interval must be between 0.2 and 60"),
        (["--nodes", "nope-*"], "no node matches 'nope-*'"),
        (["--count", "0"], "--count: must be at least 1"),
    ],
)
def test_top_bad_input_is_one_clear_line(config, capsys, argv, needle):
    assert main(["--config", str(config), "top", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
