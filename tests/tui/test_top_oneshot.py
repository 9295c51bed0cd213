"""One-shot looks tell the truth: with Alertmanager, `top --once` and `watch --once` name the
alerts firing there (loadmaster's own apart from the others); without, they say that windowed
conditions need more looks (--count N, --rounds N) or a running watch."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from backend.alerts.settings import AlertSettings
from backend.config import Config, Node, StateSettings
from backend.services import Services
from backend.telemetry.settings import TelemetrySettings
from tests.am_fixtures import AlertmanagerLab, unique
from tests.tui.test_alerts_screen import alert, apost, lab_services
from tui.cli.top import oneshot_lines
from tui.cli.watch import run_watch

ONCE = argparse.Namespace(once=True, rounds=None, metrics=None, metrics_web_config=None)


def _no_am_services(tmp_path: Path) -> Services:
    nodes = (Node(name="gpu-01", host="127.0.0.1", port=1),)
    return Services(config=Config(nodes=nodes, stores={}, state=StateSettings(dir=str(tmp_path / "s"))))


async def test_without_alertmanager_a_one_shot_says_what_it_cannot_see(tmp_path: Path) -> None:
    services = _no_am_services(tmp_path)
    (line,) = await oneshot_lines(services, TelemetrySettings())
    assert "windowed conditions" in line and "--count 62" in line and "loadmaster watch" in line
    await services.aclose()


async def test_with_alertmanager_a_one_shot_names_what_is_firing(am_lab: AlertmanagerLab, tmp_path: Path) -> None:
    services = lab_services(tmp_path, am_lab.url)
    node, other_node = services.config.nodes[1].name, services.config.nodes[2].name
    site, own = unique("GPUStarved"), unique("TransferStalled")
    await apost(
        am_lab.url, alert(site, node, "util 12% for 60s"), alert(own, other_node, "stalled", ref=f"node:{other_node}")
    )
    lines = await oneshot_lines(services, TelemetrySettings())
    assert lines[0].startswith("Alertmanager: ") and "firing" in lines[0] and "loadmaster's" in lines[0]
    # The site's rule and loadmaster's own condition, named apart.
    assert f"  other      {site} {node}" in lines, lines
    assert f"  loadmaster {own} {other_node}" in lines, lines
    await services.aclose()


async def test_watch_once_names_what_is_firing(
    am_lab: AlertmanagerLab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    services = lab_services(tmp_path, am_lab.url)
    node = services.config.nodes[0].name
    site = unique("GPUStarved")
    await apost(am_lab.url, alert(site, node, "util 9% for 60s"))
    assert await run_watch(ONCE, services) == 0
    out = capsys.readouterr().out
    assert "condition(s) hold in this round" in out
    assert "Alertmanager: " in out and f"  other      {site} {node}" in out, out
    await services.aclose()


async def test_watch_once_without_alertmanager_says_one_round_is_not_all_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    services = _no_am_services(tmp_path)
    assert await run_watch(ONCE, services) == 0
    out = capsys.readouterr().out
    rounds = int(TelemetrySettings().starved_window / AlertSettings().interval) + 2
    assert "windowed conditions" in out and f"--rounds {rounds}" in out and "loadmaster watch" in out, out
    await services.aclose()
