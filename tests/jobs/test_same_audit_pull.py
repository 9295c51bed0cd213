"""A pull over its egress budget, started with a reason from the CLI and from the console (Pilot)
against the real lab, leaves the same audit records: the override, then the launch.

Both go through ``ops.pulls.start``; only job ids and the two destinations differ.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Button, Input

from backend.config import load_config
from lab import Lab
from tests.helpers import Recorder, wait_until, write_lab_config
from tests.jobs.conftest import SourceData
from tui import cli
from tui.app import LoadmasterApp
from tui.screens.transfers import PullLaunched, PullPlanned

pytestmark = pytest.mark.timeout(300)
until = functools.partial(wait_until, rounds=3000, delay=0.02)
#: A budget any real transfer exceeds: every pull needs the operator's reason.
OVER_BUDGET = '\n[egress]\naction = "confirm"\nbudgets = { lab = 0.000001 }\n'
JOB_ID = re.compile(r"\b\d{4}-\d{6}-[0-9a-f]{4}\b")


def _records(config_path: Path, dest: str) -> list[dict[str, Any]]:
    from backend.services import Services

    services = Services(load_config(str(config_path)))
    try:
        out = []
        for e in reversed(services.db.audit_entries()):
            text = JOB_ID.sub("<job>", json.dumps(e.detail, sort_keys=True)).replace(dest, "<dest>")
            out.append(
                {
                    "action": e.action,
                    "target": e.target,
                    "outcome": e.outcome,
                    "reason": e.reason,
                    "detail": json.loads(text),
                }
            )
        return out
    finally:
        services.db.close()


async def test_over_budget_pull_is_audited_the_same_from_cli_and_console(
    lab: Lab,
    source: SourceData,
    tmp_path: Path,
) -> None:
    cli_cfg = write_lab_config(lab, tmp_path / "cli.toml", tmp_path / "cli-state", OVER_BUDGET)
    con_cfg = write_lab_config(lab, tmp_path / "console.toml", tmp_path / "console-state", OVER_BUDGET)

    # Without a reason the guard stops it, from either front end.
    assert (
        await asyncio.to_thread(
            cli.main,
            ["--config", str(cli_cfg), "pull", source.url, "pulls/cli", "--node", "node-01", "--yes", "--detach"],
        )
        == 2
    )
    assert (
        await asyncio.to_thread(
            cli.main,
            [
                "--config",
                str(cli_cfg),
                "pull",
                source.url,
                "pulls/cli",
                "--node",
                "node-01",
                "--yes",
                "--detach",
                "--allow-over-budget",
                "deadline for the eval run",
            ],
        )
        == 0
    )

    from backend.services import Services

    services = Services(load_config(str(con_cfg)))
    app = LoadmasterApp(services, mode="transfers")
    rec = Recorder()
    async with app.run_test(size=(200, 50), message_hook=rec) as pilot:
        await pilot.press("n")
        await pilot.pause()
        screen = app.screen
        for field, value in (("src", source.url), ("dest", "pulls/console"), ("nodes", "node-01")):
            screen.query_one(f"#pull-{field}", Input).value = value
        screen.query_one("#pull-estimate", Button).press()
        await until(pilot, lambda: rec.of(PullPlanned))
        assert not rec.of(PullPlanned)[-1].launchable  # over budget, no reason yet
        screen.query_one("#pull-reason", Input).value = "deadline for the eval run"
        screen.query_one("#pull-estimate", Button).press()
        await until(pilot, lambda: len(rec.of(PullPlanned)) == 2)
        assert rec.of(PullPlanned)[-1].launchable, rec.of(PullPlanned)[-1].text
        screen.query_one("#pull-launch", Button).press()
        await until(pilot, lambda: rec.of(PullLaunched) or app.errors)
        assert not app.errors, [e.detail for e in app.errors]
    await services.aclose()

    by_cli, by_console = _records(cli_cfg, "pulls/cli"), _records(con_cfg, "pulls/console")
    assert [r["action"] for r in by_cli] == ["egress.override", "pull.launch"]
    assert by_cli == by_console
    assert by_cli[0]["reason"] == by_cli[1]["reason"] == "deadline for the eval run"
