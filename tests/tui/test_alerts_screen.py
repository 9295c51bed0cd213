"""The Alerts screen (key 7) against the real Alertmanager (tests/am_fixtures.py): the site's alerts
mapped to this inventory's nodes and jobs, a silence made in the console (in ``amtool silence
query`` with the operator as author, in the audit log), read-only refusal, Alertmanager stopped
("alerting degraded", no traceback), the Fleet marks of alerted nodes, and enter going back to
what one of loadmaster's own alerts is about. The nodes are per-test names (the session's
Alertmanager keeps every test's alerts), fed synthetic samples, never contacted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Checkbox, DataTable, Input, Static

from backend.alerts.alertmanager import ActiveAlert, AlertmanagerClient, AmAlert, Matcher, Silence
from backend.alerts.settings import AlertSettings
from backend.config import Config, Node, StateSettings
from backend.errors import ReadOnlyRefused
from backend.ops import Operations
from backend.ops.alerts import SilenceRequest, SiteAlert
from backend.services import Services
from backend.state import actor
from backend.telemetry.hub import TelemetryHub
from backend.telemetry.settings import TelemetrySettings
from backend.telemetry.synthetic import SyntheticNode, SyntheticPool
from tests.am_fixtures import AlertmanagerLab, unique
from tests.helpers import wait_until
from tests.tui.snapshot_services import FROZEN_NOW, frozen_clock, snapshot_services
from tui.app import LoadmasterApp
from tui.screens.alerts import AlertsScreen, SilenceModal
from tui.screens.node_detail import NodeDetailScreen
from tui.widgets.confirm import ConfirmModal
from tui.widgets.fleet_heatmap import ATTENTION, FleetHeatmap
from tui.widgets.fleet_table import FleetTable
from tui.widgets.table_fit import cut_end

pytestmark = [pytest.mark.timeout(120)]

SIZE = (120, 40)


@pytest.fixture(autouse=True)
def _dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("LOADMASTER_DATA_DIR", str(tmp_path / "data"))


def lab_services(tmp_path: Path, url: str, *, readonly: bool = False) -> Services:
    """Three per-test nodes (fed 5 s of training samples: up), [alerts] pointing at ``url``."""
    nodes = tuple(Node(name=unique(f"gpu{i}"), host="127.0.0.1", port=1, site="lab:am") for i in range(3))
    config = Config(
        nodes=nodes,
        stores={},
        state=StateSettings(dir=str(tmp_path / "state")),
        sections={"alerts": AlertSettings(alertmanager_url=url, timeout=3.0)},
        source="test",
    )
    services = Services(config=config, readonly=readonly)
    hub = TelemetryHub(SyntheticPool(nodes), TelemetrySettings(), feed_only=True)  # type: ignore[arg-type]
    gens = [SyntheticNode(n.name, seed=i) for i, n in enumerate(nodes)]
    for t in range(6):
        for g in gens:
            hub.ingest(g.name, g.block(float(t)), float(t))
        hub.tick(float(t))
    services.__dict__["telemetry"] = hub
    return services


def names(services: Services) -> list[str]:
    return [n.name for n in services.config.nodes]


async def apost(url: str, *alerts: AmAlert) -> None:
    async with AlertmanagerClient(url, timeout=5) as client:
        await client.post_alerts(list(alerts))


def alert(name: str, node: str, summary: str = "", **labels: str) -> AmAlert:
    ref = labels.pop("ref", "")
    annotations = {"summary": summary or f"{name} on {node}"}
    if ref:
        annotations["loadmaster_ref"] = ref
    return AmAlert({"alertname": name, "node": node, "severity": "warning", **labels}, annotations)


def table(app: LoadmasterApp) -> DataTable[Any]:
    return app.screen.query_one("#alerts-table", DataTable)


def row_keys(t: DataTable[Any]) -> list[str]:
    return [str(k.value) for k in t.rows]


def screen(app: LoadmasterApp) -> AlertsScreen:
    s = app.screen
    assert isinstance(s, AlertsScreen)
    return s


async def wait_for_alert(pilot: Any, app: LoadmasterApp, name: str) -> SiteAlert:
    """Read again until the alert called ``name`` is on screen; it, selected."""

    def shown() -> SiteAlert | None:
        s = app.screen
        if not isinstance(s, AlertsScreen):
            return None
        return next((a for a in s.alerts if a.name == name and a.alert.fingerprint in row_keys(table(app))), None)

    for _ in range(100):
        got = shown()
        if got is not None:
            t = table(app)
            t.move_cursor(row=row_keys(t).index(got.alert.fingerprint))
            t.focus()
            await pilot.pause()
            return got
        screen(app).action_reload()
        await pilot.pause(0.1)
    raise AssertionError(f"{name} never listed: {screen(app).status_text}")


def status(app: LoadmasterApp) -> str:
    return str(app.screen.query_one("#alerts-status", Static).render())


def notes(app: LoadmasterApp) -> list[str]:
    return [n.message for n in app._notifications]


async def test_alerts_listed_mapped_to_nodes_and_the_fleet_marks_them(am_lab: AlertmanagerLab, tmp_path: Path) -> None:
    services = lab_services(tmp_path, am_lab.url)
    n0, n1, n2 = names(services)
    name = unique("LmTestScreen")
    job = unique("pull")
    await apost(am_lab.url, alert(name, n0, "rx at 3% of line rate", job_id=job, severity="critical"))
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="alerts")
    async with app.run_test(size=SIZE) as pilot:
        got = await wait_for_alert(pilot, app, name)
        assert got.node == n0 and got.job_id == job and got.severity == "critical"
        row = [str(c) for c in table(app).get_row(got.alert.fingerprint)]
        assert row[:5] == ["critical", name, n0, job, "rx at 3% of line rate"]
        assert row[6] == ""  # not silenced
        assert "alert(s) from " + am_lab.url in status(app) and "degraded" not in status(app)
        # The read hands the app the alerted nodes; the Fleet table and heatmap mark them.
        assert app.site_alerts.get(n0) == [name] and n1 not in app.site_alerts
        await pilot.press("1")
        await pilot.pause()
        fleet = app.screen.query_one(FleetTable)
        fleet.flush_all()
        # The whole mark where the column has room, else cut with '…' (never cut bare).
        assert str(fleet.get_cell(n0, "alerts")) == cut_end(f"!1 {name}", dict(fleet._layout)["alerts"])
        assert str(fleet.get_cell(n1, "alerts")) == ""
        await pilot.press("v")
        await pilot.pause()
        lines = app.screen.query_one(FleetHeatmap).grid.node_lines()
        assert lines[0] == (ATTENTION, (n0,)), lines
        grid = app.screen.query_one(FleetHeatmap).grid
        assert grid.group_lines()[0] == "needs attention · 1 node: 1 site alert"
        assert grid.cursor is not None and grid.cursor[0] == n0  # the most urgent node, top left
        assert grid.cursor_status().endswith(f" · site alert: {name}")
        assert app.errors == []


async def test_a_silence_made_in_the_console_is_amtools_with_the_operator_and_audited(
    am_lab: AlertmanagerLab, tmp_path: Path
) -> None:
    services = lab_services(tmp_path, am_lab.url)
    n0, _n1, _n2 = names(services)
    name = unique("LmTestSilence")
    job = unique("pull")
    await apost(am_lab.url, alert(name, n0, job_id=job))
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="alerts")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for_alert(pilot, app, name)
        await pilot.press("s")
        await wait_until(pilot, lambda: isinstance(app.screen, SilenceModal))
        modal = app.screen
        assert modal.query_one("#silence-matchers", Input).value == f"alertname={name}, node={n0}, job_id={job}"
        assert modal.query_one("#silence-duration", Input).value == "2h"
        # No comment, then a duration that is not one: one line in the dialog, nothing made.
        await pilot.press("enter")
        await pilot.pause()
        error = modal.query_one("#silence-error", Static)
        assert "say why" in str(error.render())
        modal.query_one("#silence-duration", Input).value = "two hours"
        modal.query_one("#silence-comment", Input).value = "draining n0 for a reboot"
        await pilot.press("enter")
        await pilot.pause()
        assert "expected a duration" in str(error.render()) and "\n" not in str(error.render())
        assert isinstance(app.screen, SilenceModal)
        modal.query_one("#silence-duration", Input).value = "90m"
        modal.query_one("#silence-any", Checkbox).value = True  # not a loadmaster condition: asked
        await pilot.press("enter")
        await wait_until(pilot, lambda: not isinstance(app.screen, SilenceModal), delay=0.05)
        [made] = [s for s in am_lab.amtool_json("silence", "query") if s["comment"] == "draining n0 for a reboot"]
        assert made["createdBy"] == actor()
        assert {(m["name"], m["value"]) for m in made["matchers"]} == {
            ("alertname", name),
            ("node", n0),
            ("job_id", job),
        }
        ends = datetime.fromisoformat(made["endsAt"].replace("Z", "+00:00"))
        assert timedelta(minutes=85) < ends - datetime.now(UTC) <= timedelta(minutes=90)
        assert any(made["id"] in m for m in notes(app))
        [entry] = services.db.audit_entries(action="alerts.silence")
        assert entry.actor == actor() and entry.outcome == "ok" and entry.reason == "draining n0 for a reboot"
        assert entry.detail["silence_id"] == made["id"]
        # The alert reads as silenced, by that silence; x (on the alert) expires it after a yes.
        for _ in range(100):
            if any(a.name == name and made["id"] in a.alert.silenced_by for a in screen(app).alerts):
                break
            screen(app).action_reload()
            await pilot.pause(0.1)
        got = await wait_for_alert(pilot, app, name)
        assert got.alert.silenced_by == (made["id"],)
        assert str(table(app).get_row(got.alert.fingerprint)[6]) == made["id"][:8]
        await pilot.press("x")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal))
        await pilot.press("y")
        await wait_until(pilot, lambda: any("expired" in m for m in notes(app)), delay=0.05)
        [after] = [s for s in am_lab.amtool_json("silence", "query", "--expired") if s["id"] == made["id"]]
        assert after["status"]["state"] == "expired"
        assert [e.target for e in services.db.audit_entries(action="alerts.unsilence")] == [made["id"]]
        assert app.errors == []


async def test_read_only_refuses_a_silence_and_makes_nothing(am_lab: AlertmanagerLab, tmp_path: Path) -> None:
    services = lab_services(tmp_path, am_lab.url, readonly=True)
    n0, _n1, _n2 = names(services)
    name = unique("LmTestReadonly")
    await apost(am_lab.url, alert(name, n0))
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="alerts")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for_alert(pilot, app, name)
        await pilot.press("s")
        await pilot.pause()
        assert not isinstance(app.screen, SilenceModal)
        assert "Read-only mode: cannot create a silence" in notes(app)
        # The operation refuses it too, whoever asks, before Alertmanager is asked.
        req = SilenceRequest((("alertname", name),), 3600.0, "should not exist")
        with pytest.raises(ReadOnlyRefused, match=r"^read-only mode: cannot create a silence \(drop --readonly\)$"):
            await Operations(services).alerts.silence(req)
        assert services.db.audit_entries(action="alerts.silence") == []
    assert not [s for s in am_lab.amtool_json("silence", "query") if s["comment"] == "should not exist"]


async def test_alertmanager_stopped_reads_alerting_degraded(am_lab: AlertmanagerLab, tmp_path: Path) -> None:
    services = lab_services(tmp_path, am_lab.url)
    n0, _n1, _n2 = names(services)
    name = unique("LmTestDown")
    await apost(am_lab.url, alert(name, n0))
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="alerts")
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for_alert(pilot, app, name)
            am_lab.server.stop()
            await pilot.press("r")
            await wait_until(pilot, lambda: "alerting degraded" in status(app), delay=0.05)
            line = status(app)
            assert line.startswith("alerting degraded: Alertmanager " + am_lab.url) and "\n" not in line
            assert app.screen.query_one("#alerts-status").has_class("-degraded")
            # The last read stays on screen, and so do the Fleet's marks.
            assert any(a.name == name for a in screen(app).alerts) and n0 in app.site_alerts
            assert app.errors == []  # no worker failed: no traceback anywhere
    finally:
        am_lab.server.start()


async def test_enter_goes_back_to_the_job_or_the_node(am_lab: AlertmanagerLab, tmp_path: Path) -> None:
    services = lab_services(tmp_path, am_lab.url)
    _n0, _n1, n2 = names(services)
    job = unique("pull")
    by_job, by_node = unique("LmTestJobRef"), unique("LmTestNodeRef")
    await apost(
        am_lab.url,
        alert(by_job, n2, "no bytes for 5m", job_id=job, ref=f"job:{job}"),
        alert(by_node, n2, "unreachable", ref=f"node:{n2}"),
    )
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="alerts")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for_alert(pilot, app, by_job)
        assert str(table(app).get_row(screen(app).selected_alert().alert.fingerprint)[1]) == f"{by_job} ↩"  # type: ignore[union-attr]
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.current_mode == "transfers")
        assert app.screen.filter_text == job  # type: ignore[attr-defined]
        assert app.screen.query_one("#screen-filter", Input).value == job
        await pilot.press("7")
        await pilot.pause()
        await wait_for_alert(pilot, app, by_node)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, NodeDetailScreen))
        assert app.screen.node_name == n2  # type: ignore[attr-defined]


async def test_unconfigured_says_what_to_set(tmp_path: Path) -> None:
    services = snapshot_services()
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="alerts")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: "alertmanager_url" in status(app), delay=0.05)
        assert status(app).startswith("[alerts] alertmanager_url is not set")
        assert table(app).row_count == 0 and app.errors == []
        # Fleet still says none is set: an Alertmanager nobody asked is not "0 firing".
        await pilot.press("1")
        conditions = app.screen.query_one("#fleet-conditions", Static)
        await wait_until(pilot, lambda: "Alertmanager" in str(conditions.render()), delay=0.05)
        assert "Alertmanager: not set" in str(conditions.render()), str(conditions.render())


# -- the snapshot ---------------------------------------------------------------------------------


def _fixed_alerts() -> tuple[list[SiteAlert], list[Silence]]:
    """Deterministic alerts about the snapshot fleet (tests/tui/snapshot_services.py)."""
    at = datetime.fromtimestamp(FROZEN_NOW, UTC)
    sid = "5b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"

    def one(
        labels: dict[str, str], summary: str, mins: int, silenced: tuple[str, ...] = (), ref: str = ""
    ) -> ActiveAlert:
        return ActiveAlert(
            labels=labels,
            annotations={"summary": summary, **({"loadmaster_ref": ref} if ref else {})},
            starts_at=at - timedelta(minutes=mins),
            ends_at=at + timedelta(minutes=15),
            updated_at=at,
            fingerprint=f"{mins:016x}",
            state="suppressed" if silenced else "active",
            silenced_by=silenced,
            inhibited_by=(),
            receivers=("oncall",),
        )

    alerts = [
        SiteAlert(
            one(
                {"alertname": "GPUStarved", "node": "gpu-a02", "severity": "critical"},
                "gpu-a02: 8 GPUs at 11% for 8m, NIC rx 3% of line rate (data loader starved)",
                8,
                ref="node:gpu-a02",
            ),
            "gpu-a02",
            None,
            "node:gpu-a02",
        ),
        SiteAlert(
            one(
                {"alertname": "TransferStalled", "node": "gpu-a01", "job_id": "pull-7f3a", "severity": "warning"},
                "pull pull-7f3a on gpu-a01: no new bytes for 5m (412 GiB of 1.2 TiB)",
                6,
                ref="job:pull-7f3a",
            ),
            "gpu-a01",
            "pull-7f3a",
            "job:pull-7f3a",
        ),
        SiteAlert(
            one(
                {"alertname": "NodeFilesystemAlmostFull", "instance": "10.0.1.21:9100", "severity": "warning"},
                "/mnt/local-nvme on 10.0.1.21 is 91% full",
                47,
                silenced=(sid,),
            ),
            "gpu-b01",
            None,
            None,
        ),
    ]
    silences = [
        Silence(
            id=sid,
            matchers=(Matcher("alertname", "NodeFilesystemAlmostFull"), Matcher("instance", "10.0.1.21:9100")),
            starts_at=at - timedelta(minutes=30),
            ends_at=at + timedelta(hours=2),
            updated_at=at,
            created_by="oncall@bastion",
            comment="scratch cleanup running (OPS-4411)",
            state="active",
        )
    ]
    return alerts, silences


@pytest.fixture
def _frozen(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with frozen_clock(monkeypatch):
        yield


def test_alerts_screen_snapshot(snap_compare: Any, _frozen: None) -> None:
    services = snapshot_services()
    services.config = replace(services.config, sections={})
    alerts, silences = _fixed_alerts()

    async def before(pilot: Any) -> None:
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        s = pilot.app.screen
        s.show_alerts(
            alerts,
            silences,
            "3 alert(s) from http://alertmanager.example:9093: 2 firing, 1 silenced · 1 active silence(s) · "
            "enter opens, s silences",
        )
        await pilot.pause()

    app = LoadmasterApp(services, theme="loadmaster-dark", mode="alerts")
    assert snap_compare(app, terminal_size=SIZE, run_before=before)
