"""A view with a node missing says so: ``jobs`` and ``top`` name the nodes they could not read on
stderr and exit 4, while the rest of the fleet is still shown (real sshd nodes, one stopped)."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.nodes.pool import PARTIAL_EXIT
from lab import Lab
from tests.helpers import write_lab_config
from tui.cli import main


@pytest.fixture
def config(lab: Lab, tmp_path: Path) -> Path:
    return write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state", "\n[telemetry]\ninterval = 1\n")


def _run(capsys: pytest.CaptureFixture[str], config: Path, *argv: str) -> tuple[int, str, str]:
    rc = main(["--config", str(config), *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


@pytest.mark.parametrize("argv", [["jobs"], ["jobs", "--json"]])
def test_jobs_names_the_node_it_could_not_read(config: Path, lab_node_down, capsys, argv) -> None:  # type: ignore[no-untyped-def]
    assert _run(capsys, config, *argv)[0] == 0  # the whole fleet answers: a complete view
    lab_node_down("node-03")
    rc, out, err = _run(capsys, config, *argv)
    assert rc == PARTIAL_EXIT == 4
    [line] = err.strip().splitlines()
    assert line.startswith("loadmaster: could not read 1 of 4 node(s): node-03 (")
    assert "connection refused" in line
    assert out.strip()  # what the other nodes hold is still printed


def test_jobs_local_does_not_contact_nodes_and_is_complete(config: Path, lab_node_down, capsys) -> None:  # type: ignore[no-untyped-def]
    lab_node_down("node-03")
    assert _run(capsys, config, "jobs", "--local")[0] == 0


def test_top_names_the_node_it_could_not_read(config: Path, lab_node_down, capsys) -> None:  # type: ignore[no-untyped-def]
    lab_node_down("node-02")
    rc, out, err = _run(capsys, config, "top", "--once")
    assert rc == 4
    assert "could not read 1 of 4 node(s): node-02 (unreachable: " in err
    states = {ln.split()[0]: ln.split()[1] for ln in out.splitlines() if ln.startswith("node-")}
    assert states == {"node-01": "up", "node-02": "unreachable", "node-03": "up", "node-04": "up"}
