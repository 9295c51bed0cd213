"""``loadmaster doctor`` and ``nodes`` on a node that answers like an attacker: its nvidia-smi and
s5cmd print escape codes (a clipboard write, a cleared screen, a window title), C1 controls, bidi
overrides and carriage returns. None of it reaches the terminal or ``--json``; what the node said
is still shown, cleaned."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from backend.config import Node
from backend.doctor import check_node
from backend.nodes.transport import LocalTransport
from tui.cli import main

FORBIDDEN = ("\x1b", "\x07", "\x9b", "\x9d", "\u202e", "\r")
EVIL = r"\033]52;c;cm0gLXJmIH4=\007\033[2J\033]0;root@prod\007\302\2332J\342\200\256"


def _tool(bin_dir: Path, name: str, says: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\nprintf '{says}\\n'\n")
    path.chmod(0o755)


@pytest.fixture
def hostile_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH whose nvidia-smi and s5cmd print escape codes around what they say."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "nvidia-smi", f"0, NVIDIA H100{EVIL} 80GB, 550.54{EVIL}, 81559")
    _tool(bin_dir, "s5cmd", f"v2.2.2{EVIL}\\r\\nFAKE ready")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir


def _clean(text: str) -> None:
    for bad in FORBIDDEN:
        assert bad not in text, f"{bad!r} reached the output: {text!r}"


async def test_a_report_from_a_hostile_node_holds_no_escape_code(tmp_path: Path, hostile_path: Path) -> None:
    r = await check_node(LocalTransport(Node(name="evil", host="localhost", transport="local", scratch=str(tmp_path))))
    _clean(json.dumps(r.as_dict(), ensure_ascii=False))
    assert r.gpu_count == 1 and r.gpu_models == ("NVIDIA H100 80GB",)
    assert r.driver == "550.54" and r.s5cmd is not None and r.s5cmd.startswith("v2.2.2")


@pytest.mark.parametrize("json_out", [False, True])
def test_doctor_prints_none_of_a_node_s_escape_codes(
    tmp_path: Path, hostile_path: Path, capsys: pytest.CaptureFixture[str], json_out: bool
) -> None:
    cfg = tmp_path / "lm.toml"
    cfg.write_text(
        f'[[nodes]]\nname = "evil"\nhost = "localhost"\ntransport = "local"\nscratch = "{tmp_path}"\n\n'
        f'[state]\ndir = "{tmp_path / "state"}"\n'
    )
    main(["--config", str(cfg), "doctor", *(["--json"] if json_out else [])])
    out, err = capsys.readouterr()
    _clean(out + err)
    assert "NVIDIA H100 80GB" in out
    assert not any(line.startswith("FAKE") for line in out.splitlines()), "a line break forged a line"


def test_nodes_cleans_an_inventory_from_outside(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "lm.toml"
    cfg.write_text(
        '[[nodes]]\nname = "gpu-01"\nhost = "10.0.0.1"\nsite = "rack\\u001b]52;c;eA==\\u0007-7"\n\n'
        f'[state]\ndir = "{tmp_path / "state"}"\n'
    )
    assert main(["--config", str(cfg), "nodes"]) == 0
    out = capsys.readouterr().out
    _clean(out)
    assert "rack-7" in out
