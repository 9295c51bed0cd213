"""``loadmaster nodes``: the inventory as resolved through hostlists, hostfiles and ~/.ssh/config."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import pytest

from tui.cli import main


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        "Host bastion\n  HostName 203.0.113.5\n  User jump\n"
        "Host gpu-a gpu-b\n  Port 2201\n"
        "Host gpu-b\n  HostName 10.1.0.2\n"
        "Host gpu-*\n  User ubuntu\n  IdentityFile ~/.ssh/id_train\n  ProxyJump bastion\n"
        "Host *\n  User fallback\n"
    )
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "hostfile").write_text("worker-1 slots=8\nworker-2 slots=8\n")
    cfg = tmp_path / "loadmaster.toml"
    cfg.write_text(
        '[[nodes]]\nssh_config = "gpu-*"\n'
        '[[nodes]]\nhostfile = "hostfile"\nuser = "root"\nport = 2222\nidentity = ["/keys/ops"]\n'
        'jump = "ops@gate:22"\nsite = "aws:us-east-1"\ntags = ["a100"]\n'
        '[[nodes]]\nname = "here"\ntransport = "local"\nscratch = "/tmp"\n'
    )
    return cfg


def test_nodes_json_resolves_ssh_config(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(fleet), "nodes", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert list(rows) == ["gpu-a", "gpu-b", "worker-1", "worker-2", "here"]
    home = Path.home()
    a, b = rows["gpu-a"], rows["gpu-b"]
    # First match wins per option, as in OpenSSH: Port from "gpu-a gpu-b", User from "gpu-*".
    assert (a["hostname"], a["user"], a["port"]) == ("gpu-a", "ubuntu", 2201)
    assert a["identity"] == [str(home / ".ssh" / "id_train")]
    assert a["proxy_jump"] == "bastion"
    assert (b["hostname"], b["port"]) == ("10.1.0.2", 2201)
    assert a["known_hosts"] == str(home / ".ssh" / "known_hosts")
    # loadmaster's own fields override ~/.ssh/config.
    w = rows["worker-1"]
    assert (w["hostname"], w["user"], w["port"], w["identity"], w["proxy_jump"]) == (
        "worker-1",
        "root",
        2222,
        ["/keys/ops"],
        "ops@gate:22",
    )
    assert (w["slots"], w["site"], w["tags"]) == (8, "aws:us-east-1", ["a100"])
    assert rows["here"]["transport"] == "local" and rows["here"]["user"] == getpass.getuser()


def test_nodes_table(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(fleet), "nodes", "--nodes", "gpu-*,worker-1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["NAME", "HOST", "USER", "PORT", "IDENTITY", "JUMP", "SITE", "TAGS"]
    assert out[2].split()[:6] == ["gpu-b", "10.1.0.2", "ubuntu", "2201", f"{Path.home()}/.ssh/id_train", "bastion"]
    assert out[3].split() == [
        "worker-1",
        "worker-1",
        "root",
        "2222",
        "/keys/ops",
        "ops@gate:22",
        "aws:us-east-1",
        "a100",
    ]
    assert out[-1] == f"3 node(s) from {fleet}"


def test_nodes_without_ssh_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = tmp_path / "c.toml"
    cfg.write_text('[[nodes]]\nname = "gpu-[1-2]"\n')
    assert main(["--config", str(cfg), "nodes", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["hostname"], r["port"], r["identity"], r["ssh_config"]) for r in rows] == [
        ("gpu-1", "gpu-1", 22, [], None),
        ("gpu-2", "gpu-2", 22, [], None),
    ]


def test_unknown_node_pattern_is_one_line(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(fleet), "nodes", "--nodes", "tpu-*"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"loadmaster: error: {fleet}: no node matches 'tpu-*'"]


def test_broken_ssh_config_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host gpu-1\n  Port twenty-two\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = tmp_path / "c.toml"
    cfg.write_text('[[nodes]]\nname = "gpu-1"\n')
    assert main(["--config", str(cfg), "nodes"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "cannot parse OpenSSH config" in err[0] and "Invalid Port integer value: twenty-two" in err[0]
    assert str(tmp_path / ".ssh" / "config") in err[0]


def test_doctor_with_lab_through_subprocess(lab, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys

    exe = Path(sys.executable).parent / "loadmaster"
    env = {**os.environ, **lab.env()}
    res = subprocess.run(
        [str(exe), "doctor", "--json", "--nodes", "node-0[3-4]"], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 1, res.stderr
    data = json.loads(res.stdout)
    assert [(d["name"], d["ready"]) for d in data] == [("node-03", False), ("node-04", True)]
