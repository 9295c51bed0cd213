"""The replay source, added through the TelemetrySource seam alone (no edit to hub.py): a recording
of real Prometheus answers (tests/prom_fixtures.py's Prometheus) played into the hub, and on to the
Fleet rows of both front ends (``top``'s table, the console's FleetTable); a hand-written recording
cycles its frames; a bad recording is one line naming the file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from backend.config import Config, Node
from backend.nodes.pool import NodePool
from backend.services import Services
from backend.telemetry.hub import TelemetryHub
from backend.telemetry.model import FleetSnapshot
from backend.telemetry.prometheus import DCGM_FIELDS, queries
from backend.telemetry.report import fleet_table
from backend.telemetry.settings import TelemetrySettings
from backend.telemetry.sources.replay import FORMAT, ReplaySource, record
from backend.telemetry.synthetic import SyntheticPool
from lab import Lab
from tests.telemetry.test_prometheus_source import node, wait_for
from tui.app import LoadmasterApp
from tui.screens.fleet import FleetScreen
from tui.widgets.fleet_table import FleetTable

pytestmark = pytest.mark.timeout(240)


def replay_settings(path: Path, **kw: Any) -> TelemetrySettings:
    return TelemetrySettings(source="replay", replay_file=str(path), prometheus_interval=1.0, **kw)


@pytest.mark.lab
async def test_a_recording_of_real_prometheus_drives_the_hub_and_the_fleet_rows(
    lab: Lab,
    prom_lab: Any,
    tmp_path: Path,
) -> None:
    live = TelemetrySettings(source="prometheus", prometheus_url=prom_lab.url, prometheus_rate_window=5.0)
    path = tmp_path / "fleet.json"
    # Prometheus scrapes every second; the rate() series need a few scrapes of the exporters.
    for _ in range(60):
        assert await record(live, path) > 0
        doc = json.loads(path.read_text())
        if any(a["data"]["result"] for a in doc["frames"][0]["query"].values()):
            break
        await asyncio.sleep(0.5)
    assert doc["format"] == FORMAT and set(doc["frames"][0]["query"]) == set(queries(live))

    settings = replay_settings(path, prometheus_rate_window=5.0)
    hub = TelemetryHub(NodePool(lab.config.nodes), settings)
    (source,) = hub.sources
    assert isinstance(source, ReplaySource)  # chosen by [telemetry] source, through the seam
    services = Services(Config(nodes=tuple(lab.config.nodes), stores={}))
    services.__dict__["telemetry"] = hub
    app = LoadmasterApp(services)
    try:
        async with app.run_test(size=(220, 40)) as pilot:
            await pilot.pause()
            assert isinstance(app.screen, FleetScreen)
            await hub.start()
            snap = await wait_for(hub, lambda s: node(s, "node-01").state == "up" and node(s, "node-01").samples >= 2)
            n1 = node(snap, "node-01")
            assert n1.source == "prometheus" and len(n1.gpus) == 8 and n1.util_mean is not None and n1.util_mean >= 90
            assert node(snap, "node-03").gpus == () or node(snap, "node-03").state != "up"
            assert source.played >= 2 and snap.source_note is None
            # top's rows and the console's rows show the recording like a live answer.
            row = next(line for line in fleet_table(snap).splitlines() if line.startswith("node-01"))
            assert row.split()[1:2] == ["up"] and " 8 " in row
            await pilot.pause(0.3)
            table = app.screen.query_one(FleetTable)
            assert str(table.get_cell("node-01", "state")) == "up"
            assert str(table.get_cell("node-01", "gpus")).startswith("8")
            assert int(str(table.get_cell("node-01", "util")).split("%")[0]) >= 90
    finally:
        await hub.stop()


def _vector(series: list[tuple[dict[str, str], float]]) -> dict[str, Any]:
    result = [{"metric": labels, "value": [1_700_000_000.0, str(v)]} for labels, v in series]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def _frame(settings: TelemetrySettings, util: float) -> dict[str, Any]:
    exprs = queries(settings)
    answers = {q: _vector([]) for q in exprs}
    gpu = {"Hostname": "gpu-a", "gpu": "0", "job": "dcgm", "instance": "10.0.0.1:9400"}
    answers[exprs[DCGM_FIELDS.index("DCGM_FI_DEV_GPU_UTIL")]] = _vector([(gpu, util)])
    down = {
        "labels": {"job": "dcgm", "instance": "gpu-b:9400"},
        "health": "down",
        "lastError": "connection refused",
    }
    return {"query": answers, "targets": {"status": "success", "data": {"activeTargets": [down]}}}


async def test_a_hand_written_recording_cycles_its_frames(tmp_path: Path) -> None:
    path = tmp_path / "two.json"
    base = TelemetrySettings()
    path.write_text(json.dumps({"format": FORMAT, "frames": [_frame(base, 95.0), _frame(base, 20.0)]}))
    nodes = [Node(name="gpu-a", host="10.0.0.1"), Node(name="gpu-b", host="10.0.0.2"), Node(name="gpu-c", host="x")]
    # A tick every 0.2 s: each frame (one a second) reaches the snapshot at once.
    hub = TelemetryHub(SyntheticPool(nodes), replay_settings(path, interval=0.2))  # type: ignore[arg-type]
    await hub.start()
    try:
        seen: list[float | None] = []

        def third_frame(s: FleetSnapshot) -> bool:
            a = node(s, "gpu-a")
            if a.samples > len(seen):
                seen.append(a.util_mean)
            return len(seen) >= 3

        snap = await wait_for(hub, third_frame)
        assert seen[:3] == [95.0, 20.0, 95.0]  # round and round
        assert node(snap, "gpu-b").state == "stale" and "target down: connection refused" in (
            node(snap, "gpu-b").error or ""
        )
        c = node(snap, "gpu-c")
        assert c.state == "unreachable" and c.error == f"not in the recording {path}"
    finally:
        await hub.stop()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "No such file or directory"),
        ("{not json", "not JSON"),
        ('{"format": "other", "frames": []}', "not a recording"),
        (json.dumps({"format": FORMAT, "frames": []}), '"frames" must be a non-empty list'),
        (json.dumps({"format": FORMAT, "frames": [{"query": {}}]}), "record it again"),
    ],
)
async def test_a_bad_recording_is_one_line_naming_the_file(tmp_path: Path, content: str | None, says: str) -> None:
    path = tmp_path / "rec.json"
    if content is not None:
        path.write_text(content)
    settings = replay_settings(path, interval=0.2)  # the note is in the snapshot from the first tick on
    hub = TelemetryHub(SyntheticPool([Node(name="n", host="h")]), settings)  # type: ignore[arg-type]
    await hub.start()
    try:
        snap = await wait_for(hub, lambda s: bool(s.source_note))
        note = snap.source_note or ""
        assert str(path) in note and says in note and "\n" not in note
        assert node(snap, "n").state == "connecting"  # nothing invented
    finally:
        await hub.stop()


def test_replay_needs_its_file() -> None:
    with pytest.raises(ValueError, match='source = "replay" needs replay_file'):
        TelemetrySettings(source="replay")
