"""The config's own inventory sources (backend/inventory/): each [[nodes]] table goes through one
TableSource, and a file a source cannot read is one line naming it, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.inventory.model import NodeEntry
from backend.inventory.tables import TABLE_SOURCES, TableSource
from tui.cli import main


def test_every_table_source_satisfies_the_protocol_and_names_a_table_key() -> None:
    keys = [s.key for s in TABLE_SOURCES]
    assert all(isinstance(s, TableSource) for s in TABLE_SOURCES)
    assert keys == ["name", "hostfile", "ssh_config"]
    assert all(k in NodeEntry.__dataclass_fields__ for k in keys)


def _load(tmp_path: Path, table: str, capsys: pytest.CaptureFixture[str]) -> str:
    cfg = tmp_path / "lm.toml"
    cfg.write_text(f"[[nodes]]\n{table}\n")
    assert main(["--config", str(cfg), "nodes"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err.removeprefix(f"loadmaster: error: {cfg}: ")


def test_a_hostfile_that_is_not_text_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "hosts").write_bytes(b"\xff\xfe\x00worker-1 slots=8\n")
    err = _load(tmp_path, 'hostfile = "hosts"', capsys)
    assert err == f"nodes[0].hostfile: cannot read hostfile '{tmp_path / 'hosts'}': not UTF-8 text"


def test_an_unreadable_ssh_config_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    (home / ".ssh" / "config").mkdir(parents=True)  # unreadable as a file, even to root
    monkeypatch.setenv("HOME", str(home))
    err = _load(tmp_path, 'ssh_config = "gpu-*"', capsys)
    assert err == "nodes[0].ssh_config: cannot read ~/.ssh/config: Is a directory"
    (home / ".ssh" / "config").rmdir()
    (home / ".ssh" / "config").write_bytes(b"Host gpu-1\n\xff\n")
    err = _load(tmp_path, 'ssh_config = "gpu-*"', capsys)
    assert err == "nodes[0].ssh_config: cannot read ~/.ssh/config: not UTF-8 text"
