"""Inventory and config validation: hostlists, hostfiles, ~/.ssh/config Host patterns, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.config import load_config_file
from backend.errors import ConfigError
from tui.cli import main


def write(tmp_path: Path, text: str, name: str = "loadmaster.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private $HOME so ~/.ssh/config is the test's own."""
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(h))
    return h


def test_single_nodes_and_hostlist_ranges(tmp_path: Path) -> None:
    cfg = load_config_file(
        write(
            tmp_path,
            """
[defaults]
user = "ops"
port = 2200
scratch = "/nvme"
[[nodes]]
name = "head"
host = "10.0.0.1"
[[nodes]]
name = "gpu-[01-16]"
host = "{name}.cluster.internal"
tags = ["a100"]
[[nodes]]
name = "h100-[1-4,7]"
user = "root"
port = 22
""",
        )
    )
    names = [n.name for n in cfg.nodes]
    assert names[0] == "head"
    assert names[1:17] == [f"gpu-{i:02d}" for i in range(1, 17)]
    assert names[17:] == ["h100-1", "h100-2", "h100-3", "h100-4", "h100-7"]
    head, gpu5, h7 = cfg.node("head"), cfg.node("gpu-05"), cfg.node("h100-7")
    assert (head.host, head.user, head.port, head.scratch) == ("10.0.0.1", "ops", 2200, "/nvme")
    assert gpu5.host == "gpu-05.cluster.internal"
    assert gpu5.tags == ("a100",)
    assert (h7.host, h7.user, h7.port) == ("h100-7", "root", 22)
    assert [n.name for n in cfg.select("gpu-[01-03],h100-7")] == ["gpu-01", "gpu-02", "gpu-03", "h100-7"]
    assert len(cfg.select("gpu-*")) == 16


def test_deepspeed_hostfile_relative_to_config(tmp_path: Path) -> None:
    (tmp_path / "hostfile").write_text(
        "# DeepSpeed hostfile\nworker-1 slots=8\n\nworker-2 slots=4  # spare\nworker-3\n"
    )
    cfg = load_config_file(write(tmp_path, '[[nodes]]\nhostfile = "hostfile"\nuser = "train"\n'))
    assert [(n.name, n.slots, n.user) for n in cfg.nodes] == [
        ("worker-1", 8, "train"),
        ("worker-2", 4, "train"),
        ("worker-3", None, "train"),
    ]


def test_ssh_config_host_patterns(tmp_path: Path, home: Path) -> None:
    (home / ".ssh" / "config").write_text(
        "Host bastion\n  HostName 203.0.113.5\n"
        "Host gpu-a gpu-b\n  User ubuntu\n"
        "Host gpu-c\n  HostName 10.1.0.3\n"
        "Host gpu-*\n  ProxyJump bastion\n"
    )
    cfg = load_config_file(write(tmp_path, '[[nodes]]\nssh_config = "gpu-*"\n'))
    # Wildcard Host lines are patterns, not nodes; concrete aliases become nodes in file order.
    assert [n.name for n in cfg.nodes] == ["gpu-a", "gpu-b", "gpu-c"]
    assert all(n.host == n.name for n in cfg.nodes)


def test_local_node_and_embedded_default_shape(tmp_path: Path) -> None:
    cfg = load_config_file(write(tmp_path, '[[nodes]]\nname = "me"\ntransport = "local"\nscratch = "/tmp"\n'))
    me = cfg.node("me")
    assert (me.transport, me.host) == ("local", "localhost")
    with pytest.raises(ConfigError, match="no node named 'nope'"):
        cfg.node("nope")


BAD_CONFIGS = [
    ("unknown key", '[[nodes]]\nname = "a"\nhostnam = "x"\n', "nodes[0].hostnam", "unknown key"),
    ("bad type", '[[nodes]]\nname = "a"\nport = "22"\n', "nodes[0].port", "expected an integer"),
    (
        "bad type in defaults",
        '[defaults]\nconnect_timeout = "soon"\n[[nodes]]\nname = "a"\n',
        "defaults.connect_timeout",
        "expected a number",
    ),
    ("unparseable range", '[[nodes]]\nname = "gpu-[01-"\n', "nodes[0].name", "cannot expand hostlist"),
    (
        "duplicate node",
        '[[nodes]]\nname = "gpu-[1-3]"\n[[nodes]]\nname = "gpu-2"\n',
        "nodes[1]",
        "duplicate node name 'gpu-2'",
    ),
    ("missing hostfile", '[[nodes]]\nhostfile = "nope.txt"\n', "nodes[0].hostfile", "cannot read hostfile"),
    ("bad TOML", "[[nodes]\nname = 'a'\n", None, "not valid TOML"),
    ("two sources", '[[nodes]]\nname = "a"\nhostfile = "h"\n', "nodes[0]", "exactly one of"),
    ("no nodes", 'nodes = []\n[ui]\ntheme = "loadmaster-dark"\n', "nodes", "no nodes"),
    ("unknown section", '[nodez]\n[[nodes]]\nname = "a"\n', "nodez", "unknown section"),
    ("bad transport", '[[nodes]]\nname = "a"\ntransport = "telnet"\n', "nodes[0].transport", "ssh"),
    ("no ssh_config match", '[[nodes]]\nssh_config = "tpu-*"\n', "nodes[0].ssh_config", "no Host"),
]


@pytest.mark.parametrize(("label", "text", "key", "expected"), BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_invalid_config_is_one_clear_line(
    label: str,
    text: str,
    key: str | None,
    expected: str,
    tmp_path: Path,
    home: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write(tmp_path, text)
    rc = main(["--config", str(path), "nodes"])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    assert str(path) in lines[0]
    if key:
        assert f": {key}:" in lines[0]
    assert expected in lines[0]


def test_missing_config_file_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere.toml"
    assert main(["--config", str(missing), "nodes"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"loadmaster: error: {missing}: config file not found"


def test_bad_hostfile_line_names_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "hosts").write_text("worker-1 slots=eight\n")
    path = write(tmp_path, '[[nodes]]\nhostfile = "hosts"\n')
    assert main(["--config", str(path), "nodes"]) == 2
    err = capsys.readouterr().err.strip()
    assert "hosts:1: slots must be a whole number, got 'eight'" in err
    assert "nodes[0].hostfile" in err


def test_a_config_of_sections_only_keeps_the_default_fleet(tmp_path: Path, home: Path) -> None:
    """One setting changed without writing the whole fleet: the embedded default for the rest."""
    from backend.config import default_config, load_config_file
    from backend.telemetry.settings import TelemetrySettings

    path = write(tmp_path, '[telemetry]\ninterval = "2s"\n')
    cfg = load_config_file(path)
    default = default_config()
    assert cfg.nodes == default.nodes and cfg.stores == default.stores
    assert cfg.section(TelemetrySettings).interval == 2.0
    assert cfg.source == str(path)


def test_every_config_problem_is_listed_on_one_line(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        '[nodez]\n[[nodes]]\nname = "a"\nport = "22"\n[[nodes]]\nname = "b"\nhostnam = "x"\n'
        '[stores.x]\nurl = "s3:///nobucket"\n[ui]\ntheme = 3\n'
    )
    path = write(tmp_path, text)
    assert main(["--config", str(path), "nodes"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    line = err[0]
    assert str(path) in line and "5 problems: " in line
    for key in ("nodez: unknown section", "nodes[0].port:", "nodes[1].hostnam:", "stores.x.url:", "ui.theme:"):
        assert key in line, (key, line)
