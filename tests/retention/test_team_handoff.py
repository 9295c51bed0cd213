"""The 2 a.m. / 9 a.m. handoff on one shared PostgreSQL state database, end to end.

Alice (her HOME, her config) launches a detached pull from the command line at 2 a.m., pins and
marks steps of a real DCP run and applies a retention plan, then closes her laptop. Bob opens the
console at 9 a.m. with his own HOME and config naming the same database: his Transfers screen
shows her job (and his console settles its egress reservation when it sees it end), his Egress
screen shows her spend, his audit log shows her actions under her name, and his own retention plan
keeps what she pinned and marked.
"""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path

import pytest
from retention_helpers import DcpRun  # type: ignore[import-not-found]
from textual.widgets import DataTable

from backend.config import load_config_file
from backend.services import Services
from lab import Lab
from tests.helpers import Recorder, wait_until, write_lab_config
from tests.jobs.conftest import SourceData
from tui.app import LoadmasterApp
from tui.cli import main as cli_main
from tui.screens.egress import EgressScreen
from tui.screens.transfers import JobsRefreshed
from tui.widgets.transfers_table import TransfersTable

pytestmark = pytest.mark.timeout(300)
until = functools.partial(wait_until, rounds=3000, delay=0.02)
#: A visible bill for a small pull: $100/GB, no free tier.
PRICES = "\n[prices.providers.aws]\ninternet_tiers = [{usd_per_gb = 100.0}]\n"


def _operator(lab: Lab, tmp_path: Path, name: str, url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Become ``name``: own HOME, config and data dir; the one shared database."""
    home = tmp_path / name
    home.mkdir(exist_ok=True)
    for var, value in (
        ("HOME", str(home)),
        ("USER", name),
        ("LOGNAME", name),
        ("LOADMASTER_DATA_DIR", str(home / "data")),
        ("LOADMASTER_CONFIG_DIR", str(home / "config")),
    ):
        monkeypatch.setenv(var, value)
    return write_lab_config(lab, home / "loadmaster.toml", home / "state", PRICES, state_url=url)


async def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """One ``loadmaster`` command, run as from a shell (its own event loop, off this test's)."""
    rc = await asyncio.to_thread(cli_main, list(argv))
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


async def test_the_night_operator_hands_over_to_the_day_operator(
    lab: Lab,
    source: SourceData,
    dcp_run: DcpRun,
    pg_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = str(dcp_run.copy_to(tmp_path / "run1"))

    # -- 2 a.m., alice ---------------------------------------------------------------------------
    alice = str(_operator(lab, tmp_path, "alice", pg_url, monkeypatch))
    out = await _cli(
        capsys,
        *("--config", alice, "pull", source.url, "pulls/handoff", "--node", "node-01", "--yes", "--detach", "--json"),
    )
    job = json.loads(out)["jobs"][0]["id"]
    await _cli(capsys, "--config", alice, "retention", "pin", run, "3000:eval baseline")
    await _cli(capsys, "--config", alice, "retention", "milestone", run, "4000")
    plan = tmp_path / "plan.json"
    await _cli(capsys, "--config", alice, "retention", "plan", run, "--keep-full", "2", "--out", str(plan))
    await _cli(capsys, "--config", alice, "retention", "apply", str(plan), "--yes")
    assert not (Path(run) / "step-1000").exists()  # her plan really ran

    # -- 9 a.m., bob -----------------------------------------------------------------------------
    bob = _operator(lab, tmp_path, "bob", pg_url, monkeypatch)
    services = Services(load_config_file(bob))
    rec = Recorder()
    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=(200, 50), message_hook=rec) as pilot:
        table = app.screen.query_one(TransfersTable)
        await until(
            pilot,
            lambda: any(r.id == job and r.state == "succeeded" for m in rec.of(JobsRefreshed) for r in m.records),
        )
        await until(pilot, lambda: job in [str(k.value) for k in table.rows])
        mine = services.jobs.get(job)
        assert mine.launched_by.startswith("alice@")
        # His console saw her job end and settled her reservation to the bytes really pulled.
        entry = services.egress.ledger.for_job(job)
        assert entry is not None and entry.state == "settled" and entry.bytes == source.total
        assert entry.who.startswith("alice@")
        usd = source.total / 1e9 * 100

        await pilot.press("5")
        await until(pilot, lambda: bool(rec.of(EgressScreen.ReportLoaded)))
        await pilot.pause()
        routes = app.screen.query_one("#egress-routes", DataTable)
        row = {str(c.label): str(v) for c, v in zip(routes.ordered_columns, routes.get_row_at(0), strict=True)}
        assert row["USD"] == f"${usd:,.2f}", row

        await pilot.press("L")
        await pilot.pause()
        audit = app.screen.query_one("#audit-table", DataTable)
        await until(pilot, lambda: audit.row_count > 0)
        seen = {
            (str(audit.get_row_at(i)[1]).split("@")[0], str(audit.get_row_at(i)[2])) for i in range(audit.row_count)
        }
        for action in ("pull.launch", "retention.pin", "retention.milestone", "retention.apply"):
            assert ("alice", action) in seen, seen
    await services.aclose()

    # Bob's own plan, stricter than hers (keep one full): her pin and her milestone still hold.
    out = await _cli(capsys, "--config", str(bob), "retention", "plan", run, "--keep-full", "1", "--json")
    acts = {a["step"]: a for a in json.loads(out)["actions"]}
    assert acts[3000]["action"] == "keep-full" and "eval baseline" in json.dumps(acts[3000])
    assert acts[4000]["action"] != "delete"
    out = await _cli(capsys, "--config", str(bob), "audit", "--json")
    assert {e["actor"].split("@")[0] for e in json.loads(out)} == {"alice"}  # bob changed nothing
    out = await _cli(capsys, "--config", str(bob), "audit", "--actor", "alice", "--action", "retention.pin")
    assert "alice@" in out and "retention.pin" in out and "#3000" in out
