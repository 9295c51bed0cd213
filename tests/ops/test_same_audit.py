"""One action, two front ends, one audit record: cancel, silence and state repair.

Each is done from the CLI and from the console (Pilot) on identical copies of the same thing, and
the two audit logs are compared field for field (action, target, outcome, reason, detail); only
what differs by nature is normalised (ids the other side could not know, the two copies' paths,
times). The other actions are in tests/retention/test_same_audit_both_front_ends.py (pin,
milestone, retention apply, strip, upload, shard) and tests/jobs/test_same_audit_pull.py (a pull
over its budget: the override, then the launch).

The console has no state repair (it refuses to open a damaged state database and names
``loadmaster state repair``): the CLI's record is compared with the operation's own
(``Operations(services).state.repair()``), which any front end would call. Both state backends:
on PostgreSQL the repair is refused in one line and records nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Checkbox, Input

from backend.config import load_config, load_config_file
from backend.errors import ReadOnlyRefused
from backend.ops import Operations
from backend.services import Services
from backend.state import SQLiteState, StateError
from lab import Lab
from tests.am_fixtures import AlertmanagerLab, unique
from tests.helpers import type_text, wait_until, write_lab_config
from tests.jobs.conftest import SourceData, source  # noqa: F401  (the fixture)
from tests.jobs.test_pull_lab import _launch_stalled
from tests.tui.test_alerts_screen import alert, apost, lab_services, wait_for_alert
from tui import cli
from tui.app import LoadmasterApp
from tui.screens.alerts import SilenceModal
from tui.widgets.confirm import ConfirmTyped
from tui.widgets.transfers_table import TransfersTable

#: Measured, not compared: they differ between any two runs.
VOLATILE = {"seconds", "elapsed_s", "ts", "started", "finished", "starts_at", "ends_at"}


def _normal(value: Any, subs: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _normal(v, subs) for k, v in sorted(value.items()) if k not in VOLATILE}
    if isinstance(value, list):
        return [_normal(v, subs) for v in value]
    if isinstance(value, str):
        for pattern, name in subs.items():
            value = re.sub(pattern, name, value)
    return value


def records(db: Any, subs: dict[str, str], action: str | None = None) -> list[dict[str, Any]]:
    """The audit log (or one action of it), oldest first, normalised."""
    return [
        _normal(
            {"action": e.action, "target": e.target, "outcome": e.outcome, "reason": e.reason, "detail": e.detail},
            subs,
        )
        for e in reversed(db.audit_entries(action=action))
    ]


def same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert a, "nothing was recorded"
    assert [json.dumps(r, sort_keys=True) for r in a] == [json.dumps(r, sort_keys=True) for r in b]


# -- state repair ---------------------------------------------------------------------------------


def _damaged_state(root: Path) -> Path:
    """A config whose local state database holds jobs and audit records, then is cut short."""
    sdir = root / "state"
    sdir.mkdir(parents=True)
    db = SQLiteState(sdir / "state.sqlite3")
    db.executemany(
        "INSERT INTO jobs (id, node, kind, state, created, launched_by, launched_from, updated)"
        " VALUES (?, 'node-01', 'pull', 'succeeded', ?, 'op@host', 'cli', ?)",
        [(f"job-{i:05d}", float(i), float(i)) for i in range(300)],
    )
    for i in range(1500):
        db.record_audit("retention.apply", f"s3://bucket/run/{i}", "ok", detail={"i": i})
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    cfg = root / "lm.toml"
    cfg.write_text(f'[[nodes]]\nname = "here"\ntransport = "local"\n\n[state]\ndir = "{sdir}"\n')
    return cfg


def test_state_repair_is_audited_the_same_from_the_cli_and_the_operation(tmp_path: Path) -> None:
    cfg = {side: _damaged_state(tmp_path / side) for side in ("cli", "ops")}
    state = tmp_path / "cli" / "state" / "state.sqlite3"
    with open(state, "r+b") as f:
        f.truncate(int(state.stat().st_size * 0.6))
    shutil.copyfile(state, tmp_path / "ops" / "state" / "state.sqlite3")  # the same damage

    assert cli.main(["--config", str(cfg["cli"]), "state", "repair"]) == 0
    services = Services(load_config(str(cfg["ops"])))
    done = Operations(services).state.repair()
    services.db.close()
    assert done.report is not None and done.audit_id is not None

    def repaired(side: str) -> list[dict[str, Any]]:
        db = SQLiteState(tmp_path / side / "state" / "state.sqlite3")
        try:
            return records(db, {re.escape(str(tmp_path / side)): "<side>", r"damaged-[0-9-]+": "damaged-<time>"})
        finally:
            db.close()

    by_cli, by_ops = repaired("cli"), repaired("ops")
    [entry] = [r for r in by_cli if r["action"] == "state.repair"]
    assert entry["target"] == "<side>/state/state.sqlite3" and entry["outcome"] in ("ok", "partial")
    assert entry["detail"]["backup"] == "<side>/state/state.sqlite3.damaged-<time>" and entry["detail"]["problems"]
    assert entry["detail"]["kept"]["jobs"] > 0 and not entry["detail"]["forced"]
    same([r for r in by_cli if r["action"] == "state.repair"], [r for r in by_ops if r["action"] == "state.repair"])
    assert by_cli[-1]["action"] == "state.repair"  # recorded after the kept rows, in the fresh file


def test_state_repair_and_migrate_on_both_backends(state_url: str | None, tmp_path: Path) -> None:
    """Read-only refuses both before anything is touched; on PostgreSQL the repair is refused in
    one line (PostgreSQL has its own tools), and neither writes an audit record there."""
    url = f'url = "{state_url}"\n' if state_url else ""
    cfg = tmp_path / "lm.toml"
    cfg.write_text(f'[[nodes]]\nname = "here"\ntransport = "local"\n\n[state]\ndir = "{tmp_path / "s"}"\n{url}')
    services = Services(load_config(str(cfg)), readonly=True)
    ops = Operations(services)
    try:
        for call in (ops.state.repair, lambda: ops.state.migrate("postgresql://u@127.0.0.1:1/x")):
            with pytest.raises(ReadOnlyRefused, match=r"^read-only mode: cannot (repair|migrate) the state database"):
                call()
        services.readonly = False
        if state_url:
            with pytest.raises(StateError, match="state repair is for the local SQLite file"):
                ops.state.repair(force=True)
        else:
            assert ops.state.repair().report is None  # no file yet: nothing to repair
        assert services.db.audit_entries() == []
        assert not (tmp_path / "s" / "state.sqlite3").exists() or state_url is None
    finally:
        services.db.close()


# -- silence --------------------------------------------------------------------------------------


COMMENT = "fan swap, ticket 4411"


def _silence_from_cli(tmp_path: Path, url: str, node: str, name: str) -> Services:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "lm.toml"
    cfg.write_text(
        f'[[nodes]]\nname = "{node}"\nhost = "127.0.0.1"\nport = 1\n\n[state]\n'
        f'dir = "{tmp_path / "state"}"\n\n[alerts]\nalertmanager_url = "{url}"\ntimeout = "3s"\n'
    )
    argv = ["--config", str(cfg), "alerts", "silence", "--any-alert", "--for", "2h", "--comment", COMMENT]
    argv += ["--match", f"alertname={name}", "--match", f"node={node}"]
    assert cli.main(argv) == 0
    return Services(load_config(str(cfg)))


async def _silence_from_console(services: Services, name: str) -> None:
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="alerts")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_alert(pilot, app, name)
        await pilot.press("s")
        await wait_until(pilot, lambda: isinstance(app.screen, SilenceModal))
        app.screen.query_one("#silence-comment", Input).value = COMMENT
        app.screen.query_one("#silence-any", Checkbox).value = True
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, SilenceModal), delay=0.05)
        assert app.errors == []


async def test_a_silence_is_audited_the_same_from_the_cli_and_the_console(
    am_lab: AlertmanagerLab, tmp_path: Path
) -> None:
    """The same kind of alert silenced from each front end, with the same comment, for the
    default two hours, matching the alert's name and node (the console's default matchers), any
    alert allowed."""
    logs: dict[str, list[dict[str, Any]]] = {}
    for side in ("cli", "console"):
        services = lab_services(tmp_path / side, am_lab.url)
        node, name = services.config.nodes[0].name, unique("SiteFanFail")
        await apost(am_lab.url, alert(name, node))
        subs = {re.escape(node): "<node>", re.escape(name): "<alert>", r"[0-9a-f-]{36}": "<silence>"}
        if side == "cli":
            await services.aclose()
            written = await asyncio.to_thread(_silence_from_cli, tmp_path / side, am_lab.url, node, name)
            logs[side] = records(written.db, subs)
            written.db.close()
        else:
            await _silence_from_console(services, name)
            await services.aclose()
            written = Services(config=services.config)  # the console closed its own on exit
            logs[side] = records(written.db, subs)
            written.db.close()
    same(logs["cli"], logs["console"])
    assert [r["action"] for r in logs["cli"]] == ["alerts.silence"]


# -- cancel ---------------------------------------------------------------------------------------

REASON = "cancelled from the console"  # the console's own reason, given to the CLI too
until = functools.partial(wait_until, rounds=3000, delay=0.02)


async def _cancel_from_console(services: Services, rec: Any) -> None:
    app = LoadmasterApp(services, mode="transfers")
    async with app.run_test(size=(200, 50)) as pilot:
        table = app.screen.query_one(TransfersTable)
        await until(pilot, lambda: rec.id in [str(k.value) for k in table.rows])
        table.focus()
        table.move_cursor(row=[str(k.value) for k in table.rows].index(rec.id))
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmTyped))
        await type_text(pilot, "cancel")  # one wait for the screen, not one per key
        await pilot.press("enter")
        await until(pilot, lambda: bool(services.db.audit_entries(action="job.cancel")))


@pytest.mark.timeout(300)
async def test_a_cancel_is_audited_the_same_from_the_cli_and_the_console(
    lab: Lab,
    source: SourceData,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A pull held mid-transfer on node-02 (its store stalled), cancelled from each front end: the
    job (or its launch, as the console picks) is named the same way, with the same outcome and
    detail (killed or not, the group proven ours, the label)."""
    logs: dict[str, list[dict[str, Any]]] = {}
    for side in ("cli", "console"):
        cfg = write_lab_config(lab, tmp_path / f"{side}.toml", tmp_path / f"{side}-state")
        # Whether a SIGTERMed runner is gone within the grace is the machine's load (at 2 s a
        # loaded machine once reached the SIGKILL on one side only): the default grace here, so
        # both sides end on the TERM, as they do in ~0.5 s on a quiet machine. The kill after the
        # grace is tested on its own (test_cancel_escalates_to_sigkill_for_a_frozen_job).
        text = cfg.read_text()
        assert 'cancel_grace = "2s"' in text
        cfg.write_text(text.replace('cancel_grace = "2s"', 'cancel_grace = "10s"', 1))
        services = Services(config=load_config_file(cfg))
        dest = f"pulls/same-cancel-{side}"
        with contextlib.ExitStack() as stack:
            rec, _job_dir, _pgid = await _launch_stalled(services, lab, source, "node-02", dest, stack)
            if side == "cli":
                await services.aclose()
                argv = ["--config", str(cfg), "job", "cancel", rec.launch or rec.id, "--yes", "--reason", REASON]
                assert await asyncio.to_thread(cli.main, argv) == 0
            else:
                await services.pool.close()
                await _cancel_from_console(services, rec)
                await services.aclose()
        written = Services(config=load_config_file(cfg))
        ids = {re.escape(i): "<job>" for i in (rec.id, rec.launch) if i}
        logs[side] = records(written.db, {**ids, re.escape(dest): "<dest>"}, action="job.cancel")
        written.db.close()
    same(logs["cli"], logs["console"])
    [entry] = logs["cli"]
    assert entry["reason"] == REASON and entry["outcome"] == "cancelled"
    assert entry["target"] in ("node-02:<job>", "launch:<job>")
