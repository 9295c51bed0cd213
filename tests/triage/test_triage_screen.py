"""The Triage screen in the real app: a machine-local node whose stand-in nvidia-smi (on PATH)
has a pending row remap on GPU 2; the screen ranks it with its evidence and shows the commands."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from backend.config import parse_config
from backend.services import Services
from lab import fake_nvidia_smi
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


def _services(tmp_path: Path, **sections: object) -> Services:
    raw: dict[str, object] = {
        "nodes": [{"name": "here", "transport": "local"}],
        "state": {"dir": str(tmp_path / "state")},
        **sections,
    }
    return Services(parse_config(raw, file="t.toml", base=tmp_path))


async def test_key_T_on_a_node_opens_triage_with_suspects_and_commands_on_screen(
    tmp_path: Path, sick_gpu: Path
) -> None:
    """At 80x24, then with the terminal resized to 120x40: all of it on the first screen."""
    from tests.tui.test_terminal_sizes import screen_text
    from tui.screens.node_detail import NodeDetailScreen

    services = _services(tmp_path)
    app = LoadmasterApp(services)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.push_screen(NodeDetailScreen(services, "here"))
        await pilot.pause()
        assert app.triage_target() == {"nodes": "here"}
        await pilot.press("T")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TriageScreen) and screen.nodes == "here" and screen.job is None
        table = screen.query_one(DataTable)
        await wait_until(pilot, lambda: table.row_count == 1, rounds=600, delay=0.05)
        for size in ((80, 24), (120, 40)):
            if size != (80, 24):
                await pilot.resize_terminal(*size)
            await pilot.pause()
            text = screen_text(app.export_screenshot())
            # The suspect, the exact commands and the way out are all on the first screen.
            assert "here" in text and "remap-pending" in text, (size, text)
            assert "--exclude=here" in text and "loadmaster drain here --reason" in text, (size, text)
            assert "goodput: not computed" in text and "missing: checkpoints: no run given" in text, (size, text)
            commands = screen.query_one("#triage-commands", Static)
            assert commands.region.bottom <= size[1] - 1, (size, commands.region, text)
            assert "Back" in text.rstrip().splitlines()[-1], (size, text)
        # T does nothing on the Triage screen itself (not offered there).
        assert app.triage_target() is None
    services.db.close()


async def test_opened_with_nothing_it_asks_for_a_job_or_nodes(tmp_path: Path, sick_gpu: Path) -> None:
    from textual.widgets import Input

    services = _services(tmp_path)
    app = LoadmasterApp(services)
    async with app.run_test(size=(80, 24)) as pilot:
        app.open_triage()
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TriageScreen)
        ask = screen.query_one("#triage-ask", Input)
        assert ask.has_focus
        await pilot.press(*"here", "enter")
        table = screen.query_one(DataTable)
        await wait_until(pilot, lambda: table.row_count == 1, rounds=600, delay=0.05)
        assert screen.nodes == "here" and not ask.display
        # Without a run, S says what is missing and stages nothing.
        await pilot.press("S")
        await pilot.pause()
        assert any("no run to restage" in n.message for n in app._notifications)
    services.db.close()


async def test_key_T_on_an_alert_triages_its_node_or_its_slurm_job(tmp_path: Path, sick_gpu: Path, am_lab) -> None:  # type: ignore[no-untyped-def]
    from tests.am_fixtures import unique
    from tests.tui.test_alerts_screen import alert, apost, wait_for_alert

    services = _services(tmp_path, alerts={"alertmanager_url": am_lab.url, "timeout": "3s"})
    name, job_name = unique("LmTriageNode"), unique("LmTriageJob")
    await apost(am_lab.url, alert(name, "here"), alert(job_name, "here", slurm_job_id="4242"))
    app = LoadmasterApp(services, mode="alerts")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_alert(pilot, app, job_name)
        assert app.triage_target() == {"job": "4242"}
        await wait_for_alert(pilot, app, name)
        assert app.triage_target() == {"nodes": "here"}
        await pilot.press("T")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TriageScreen) and screen.nodes == "here"
        table = screen.query_one(DataTable)
        await wait_until(pilot, lambda: table.row_count == 1, rounds=600, delay=0.05)
        assert [str(c) for c in table.get_row_at(0)][:3] == ["1", "here", "2"]
    services.db.close()


async def test_key_T_on_fleet_triages_the_selected_node(tmp_path: Path, sick_gpu: Path) -> None:
    """From Fleet (the console's first screen) T triages the node under the cursor."""
    from tui.screens.fleet import FleetScreen

    services = _services(tmp_path)
    app = LoadmasterApp(services)
    async with app.run_test(size=(80, 24)) as pilot:
        fleet = app.screen
        assert isinstance(fleet, FleetScreen)
        await wait_until(pilot, lambda: fleet.selected_node() == "here", rounds=600, delay=0.05)
        assert app.triage_target() == {"nodes": "here"}
        await pilot.press("T")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TriageScreen) and screen.nodes == "here"
    services.db.close()
