"""``loadmaster alerts`` against the real Alertmanager (tests/am_fixtures.py): the list (mapped to
this inventory's nodes, table and --json), ``silence`` (the id printed, in ``amtool silence query``
with the operator as author, audited), ``silences``, ``unsilence``, and one-line errors (exit 2)
for a bad duration, read-only mode, an unset URL and an Alertmanager that is down."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from backend.alerts.alertmanager import AlertmanagerClient, AmAlert
from backend.config import load_config
from backend.services import Services
from backend.state import actor
from tests.am_fixtures import AlertmanagerLab, unique
from tui.cli import main

pytestmark = [pytest.mark.timeout(120)]


def write_config(tmp_path: Path, url: str | None, node: str) -> Path:
    cfg = tmp_path / "lm.toml"
    alerts = f'[alerts]\nalertmanager_url = "{url}"\ntimeout = "3s"\n' if url else ""
    cfg.write_text(
        f'[[nodes]]\nname = "{node}"\nhost = "127.0.0.1"\nport = 1\n\n[state]\ndir = "{tmp_path / "state"}"\n\n{alerts}'
    )
    return cfg


def post(url: str, *alerts: AmAlert) -> None:
    async def go() -> None:
        async with AlertmanagerClient(url, timeout=5) as client:
            await client.post_alerts(list(alerts))

    asyncio.run(go())


@pytest.fixture
def node() -> str:
    return unique("node")


def one_line_error(err: str, needle: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loadmaster: error: ") and needle in lines[0], err
    assert "Traceback" not in err


def test_list_silence_silences_unsilence(
    am_lab: AlertmanagerLab, tmp_path: Path, node: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path, am_lab.url, node)
    name, job = unique("LmTestCli"), unique("pull")
    post(
        am_lab.url,
        AmAlert(
            {"alertname": name, "node": node, "job_id": job, "severity": "critical"},
            {"summary": f"{node} starved", "loadmaster_ref": f"job:{job}"},
        ),
    )

    assert main(["--config", str(cfg), "alerts"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["SEVERITY", "ALERTNAME", "NODE", "JOB", "SINCE", "SILENCED", "BY", "SUMMARY"]
    [row] = [line for line in out if name in line]
    assert row.split()[:4] == ["critical", name, node, job] and row.endswith(f"{node} starved")
    assert out[-1].endswith("silenced") and "alert(s)" in out[-1]

    assert main(["--config", str(cfg), "alerts", "--json"]) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    [doc] = [d for d in docs if d["alertname"] == name]
    assert doc["node"] == node and doc["job_id"] == job and doc["ref"] == f"job:{job}"
    assert doc["silenced_by"] == [] and doc["state"] == "active"

    argv = ["--config", str(cfg), "alerts", "silence", "--match", f"node={node}", "--match", f"alertname={name}"]
    # Not one of loadmaster's conditions: refused unless the operator says --any-alert.
    assert main([*argv, "--for", "2h", "--comment", "reboot for the driver update"]) == 2
    one_line_error(capsys.readouterr().err, "this silence could match alerts loadmaster did not raise")
    assert not [s for s in am_lab.amtool_json("silence", "query") if any(m["value"] == node for m in s["matchers"])]
    assert main([*argv, "--any-alert", "--for", "2h", "--comment", "reboot for the driver update"]) == 0
    sid = capsys.readouterr().out.strip()
    [made] = [s for s in am_lab.amtool_json("silence", "query") if s["id"] == sid]
    assert made["createdBy"] == actor() and made["comment"] == "reboot for the driver update"
    assert {(m["name"], m["value"], m["isRegex"]) for m in made["matchers"]} == {
        ("node", node, False),
        ("alertname", name, False),
    }
    services = Services(config=load_config(str(cfg)))
    try:
        [entry] = services.db.audit_entries(action="alerts.silence")
        assert entry.actor == actor() and entry.detail["silence_id"] == sid
        assert entry.detail["scope"] == "any-alert"
    finally:
        services.db.close()

    assert main(["--config", str(cfg), "alerts", "silences"]) == 0
    listed = capsys.readouterr().out
    [line] = [ln for ln in listed.splitlines() if ln.startswith(sid)]
    assert line.split()[1] == "active" and actor() in line and "reboot for the driver update" in line
    assert main(["--config", str(cfg), "alerts", "silences", "--json"]) == 0
    [doc] = [d for d in map(json.loads, capsys.readouterr().out.splitlines()) if d["id"] == sid]
    assert doc["matchers"] == [f'node="{node}"', f'alertname="{name}"']

    # The alert now reads as silenced by it.
    assert main(["--config", str(cfg), "alerts", "--json"]) == 0
    [doc] = [d for d in map(json.loads, capsys.readouterr().out.splitlines()) if d["alertname"] == name]
    assert doc["silenced_by"] == [sid]

    assert main(["--config", str(cfg), "alerts", "unsilence", sid, "--reason", "done"]) == 0
    assert capsys.readouterr().out.strip() == f"silence {sid} expired"
    [after] = [s for s in am_lab.amtool_json("silence", "query", "--expired") if s["id"] == sid]
    assert after["status"]["state"] == "expired"
    assert main(["--config", str(cfg), "alerts", "silences"]) == 0
    assert sid not in capsys.readouterr().out  # expired ones only with --all
    assert main(["--config", str(cfg), "alerts", "silences", "--all"]) == 0
    assert sid in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--for", "two hours", "--comment", "x"], "--for: expected a duration like '90s', '2h' or '7d'"),
        (["--for", "30d", "--comment", "x"], "a silence lasts more than 0 and at most 7 days"),
        (["--for", "2h", "--comment", "  "], "say why"),
    ],
)
def test_bad_silence_is_one_line_and_makes_nothing(
    am_lab: AlertmanagerLab,
    tmp_path: Path,
    node: str,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    needle: str,
) -> None:
    cfg = write_config(tmp_path, am_lab.url, node)
    assert main(["--config", str(cfg), "alerts", "silence", "--match", f"node={node}", *extra]) == 2
    one_line_error(capsys.readouterr().err, needle)
    assert not [s for s in am_lab.amtool_json("silence", "query") if any(m["value"] == node for m in s["matchers"])]


def test_readonly_unset_and_down_are_one_line(
    am_lab: AlertmanagerLab, tmp_path: Path, node: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path, am_lab.url, node)
    silence = ["alerts", "silence", "--match", f"node={node}", "--for", "1h", "--comment", "no"]
    assert main(["--config", str(cfg), "--readonly", *silence]) == 2
    one_line_error(capsys.readouterr().err, "read-only mode: cannot create a silence (drop --readonly)")
    assert not [s for s in am_lab.amtool_json("silence", "query") if any(m["value"] == node for m in s["matchers"])]

    (tmp_path / "unset").mkdir()
    unset = write_config(tmp_path / "unset", None, node)
    assert main(["--config", str(unset), "alerts"]) == 2
    one_line_error(capsys.readouterr().err, "[alerts] alertmanager_url is not set")

    assert main(["--config", str(cfg), "alerts", "unsilence", "not-an-id"]) == 2
    one_line_error(capsys.readouterr().err, "'not-an-id' is not a silence id")

    am_lab.server.stop()
    try:
        assert main(["--config", str(cfg), "alerts"]) == 2
        one_line_error(capsys.readouterr().err, f"Alertmanager {am_lab.url}")
    finally:
        am_lab.server.start()


@pytest.mark.parametrize(
    "matchers",
    [
        ["node={node}"],  # every alert on the node, the site's and other teams' too
        ["alertname=~GPU.*,node={node}"],  # a regex can match the site's GPUHot
        ["alertname=NodeDown,node={node}"],  # not a loadmaster condition
    ],
)
def test_a_silence_beyond_loadmaster_s_own_alerts_needs_any_alert(
    am_lab: AlertmanagerLab, tmp_path: Path, node: str, capsys: pytest.CaptureFixture[str], matchers: list[str]
) -> None:
    cfg = write_config(tmp_path, am_lab.url, node)
    match = [m.format(node=node) for m in matchers]
    argv = ["--config", str(cfg), "alerts", "silence", "--match", *match, "--for", "2h", "--comment", "maint"]
    assert main(argv) == 2
    one_line_error(capsys.readouterr().err, "add alertname=<one of GPUStarved, GPUXid,")
    assert not [s for s in am_lab.amtool_json("silence", "query") if any(m["value"] == node for m in s["matchers"])]


def test_a_silence_of_one_loadmaster_condition_is_made_and_audited_as_such(
    am_lab: AlertmanagerLab, tmp_path: Path, node: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path, am_lab.url, node)
    argv = ["--config", str(cfg), "alerts", "silence", "--match", f"alertname=GPUStarved,node={node}"]
    assert main([*argv, "--for", "2h", "--comment", "dataloader fix rolling out"]) == 0
    sid = capsys.readouterr().out.strip()
    [made] = [s for s in am_lab.amtool_json("silence", "query") if s["id"] == sid]
    assert {(m["name"], m["value"]) for m in made["matchers"]} == {("alertname", "GPUStarved"), ("node", node)}
    services = Services(config=load_config(str(cfg)))
    try:
        [entry] = services.db.audit_entries(action="alerts.silence")
        assert entry.detail["scope"] == "loadmaster"
    finally:
        services.db.close()
