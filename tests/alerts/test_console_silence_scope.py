"""The console's silence dialog asks whether a silence may match alerts loadmaster did not raise
(#28), against the real Alertmanager (tests/am_fixtures.py): unticked (the default), a silence
of a site alert is refused in one line in the dialog and nothing is made; ticked, it is made and
audited as ``any-alert``; one of loadmaster's own conditions needs no tick and is audited as
``loadmaster``. The dialog fits at 80x24 and 120x40.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Button, Checkbox, Input, Static

from tests.am_fixtures import AlertmanagerLab, unique
from tests.helpers import wait_until
from tests.tui.test_alerts_screen import _dirs, alert, apost, lab_services, names, wait_for_alert  # noqa: F401
from tui.app import LoadmasterApp
from tui.screens.alerts import SilenceModal

pytestmark = [pytest.mark.timeout(120)]


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
async def test_a_site_alert_is_silenced_only_when_the_operator_ticks_any_alert(
    am_lab: AlertmanagerLab, tmp_path: Path, size: tuple[int, int]
) -> None:
    services = lab_services(tmp_path, am_lab.url)
    n0 = names(services)[0]
    name = unique("SiteDiskFull")
    await apost(am_lab.url, alert(name, n0))
    comment = unique("disk swap")
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="alerts")
    async with app.run_test(size=size) as pilot:
        await wait_for_alert(pilot, app, name)
        await pilot.press("s")
        await wait_until(pilot, lambda: isinstance(app.screen, SilenceModal))
        modal = app.screen
        box = modal.query_one("#silence-any", Checkbox)
        assert box.value is False  # never on unless asked
        for wid in ("#silence-any", "#silence-create", "#silence-comment"):  # all on screen at this size
            r = modal.query_one(wid).region
            assert r.width > 0 and r.height > 0 and r.bottom <= size[1] and r.right <= size[0], (wid, r)
        modal.query_one("#silence-comment", Input).value = comment
        await pilot.press("enter")
        await pilot.pause()
        error = str(modal.query_one("#silence-error", Static).render())
        assert "could match alerts loadmaster did not raise" in error and "'Any alert' box" in error
        assert "\n" not in error and isinstance(app.screen, SilenceModal)
        assert not modal.query_one("#silence-create", Button).disabled
        assert not [s for s in am_lab.amtool_json("silence", "query") if s["comment"] == comment]
        assert services.db.audit_entries(action="alerts.silence") == []
        box.value = True
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, SilenceModal), delay=0.05)
        [made] = [s for s in am_lab.amtool_json("silence", "query") if s["comment"] == comment]
        [entry] = services.db.audit_entries(action="alerts.silence")
        assert entry.detail["scope"] == "any-alert" and entry.detail["silence_id"] == made["id"]
        assert app.errors == []


async def test_one_of_loadmaster_s_own_conditions_needs_no_tick(am_lab: AlertmanagerLab, tmp_path: Path) -> None:
    services = lab_services(tmp_path, am_lab.url)
    n0 = names(services)[0]
    await apost(am_lab.url, alert("GPUStarved", n0))
    comment = unique("dataloader fix")
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="alerts")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_alert(pilot, app, "GPUStarved")
        await pilot.press("s")
        await wait_until(pilot, lambda: isinstance(app.screen, SilenceModal))
        modal = app.screen
        assert modal.query_one("#silence-matchers", Input).value.startswith(f"alertname=GPUStarved, node={n0}")
        modal.query_one("#silence-comment", Input).value = comment
        await pilot.press("enter")
        await wait_until(pilot, lambda: not isinstance(app.screen, SilenceModal), delay=0.05)
        [made] = [s for s in am_lab.amtool_json("silence", "query") if s["comment"] == comment]
        [entry] = services.db.audit_entries(action="alerts.silence")
        assert entry.detail["scope"] == "loadmaster" and entry.detail["silence_id"] == made["id"]
