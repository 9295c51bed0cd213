"""One-shot looks tell the truth: with Alertmanager, `top --once` names the alerts firing there;
without, it says that windowed conditions need --count N or a running watch."""

from __future__ import annotations

from pathlib import Path

from backend.config import Config, Node, StateSettings
from backend.services import Services
from backend.telemetry.settings import TelemetrySettings
from tests.am_fixtures import AlertmanagerLab, unique
from tests.tui.test_alerts_screen import alert, apost, lab_services
from tui.cli.top import oneshot_lines


async def test_without_alertmanager_a_one_shot_says_what_it_cannot_see(tmp_path: Path) -> None:
    nodes = (Node(name="gpu-01", host="127.0.0.1", port=1),)
    services = Services(config=Config(nodes=nodes, stores={}, state=StateSettings(dir=str(tmp_path / "s"))))
    (line,) = await oneshot_lines(services, TelemetrySettings())
    assert "windowed conditions" in line and "--count 62" in line and "loadmaster watch" in line


async def test_with_alertmanager_a_one_shot_names_what_is_firing(am_lab: AlertmanagerLab, tmp_path: Path) -> None:
    services = lab_services(tmp_path, am_lab.url)
    node = services.config.nodes[1].name
    name = unique("GPUStarved")
    await apost(am_lab.url, alert(name, node, "util 12% for 60s"))
    lines = await oneshot_lines(services, TelemetrySettings())
    assert lines[0].startswith("Alertmanager: ") and "firing" in lines[0]
    assert f"  {name} {node}" in lines
