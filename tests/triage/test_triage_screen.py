"""The Triage screen in the real app: a machine-local node whose stand-in nvidia-smi (on PATH)
has a pending row remap on GPU 2; the screen ranks it with its evidence and shows the commands."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from backend.config import parse_config
from backend.lab import fake_nvidia_smi
from backend.services import Services
from tests.helpers import wait_until
from tui.app import LoadmasterApp
from tui.screens.triage import TriageScreen

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def sick_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    scenario = fake_nvidia_smi.write_scenario(tmp_path / "sc.json", gpus=4, faults={"2": {"remap_pending": True}})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec {sys.executable} {fake_nvidia_smi.__file__} --scenario {scenario} "$@"\n')
    smi.chmod(0o755)
    (bin_dir / "dmesg").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "dmesg").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    return scenario


async def test_screen_ranks_the_suspect_with_evidence_and_commands(tmp_path: Path, sick_gpu: Path) -> None:
    raw = {"nodes": [{"name": "here", "transport": "local"}], "state": {"dir": str(tmp_path / "state")}}
    services = Services(parse_config(raw, file="t.toml", base=tmp_path))
    app = LoadmasterApp(services)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = TriageScreen(services, nodes="here")
        await app.push_screen(screen)
        table = screen.query_one(DataTable)
        await wait_until(pilot, lambda: table.row_count == 1, rounds=600, delay=0.05)
        assert [str(c) for c in table.get_row_at(0)][:3] == ["1", "here", "2"]
        evidence = str(screen.query_one("#triage-evidence", Static).render())
        assert "remap-pending: GPU 2: row remap pending" in evidence
        commands = str(screen.query_one("#triage-commands", Static).render())
        assert "--exclude=here" in commands and "loadmaster drain here --reason" in commands
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, TriageScreen)
    services.db.close()
