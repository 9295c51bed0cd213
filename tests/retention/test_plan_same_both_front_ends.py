"""The Retention screen and ``loadmaster retention plan --json`` show one plan: both ask the
operation layer (``ops.retention.plan``), which deep-checks the steps the plan keeps.

The run has 40 real DCP steps and a pin on the oldest: a console that proved only the newest 32
full steps (as it once did) left the pinned step's deep check out of its plan, and the two front
ends disagreed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from many_steps import many_step_run  # type: ignore[import-not-found]
from retention_helpers import DcpRun  # type: ignore[import-not-found]
from textual.widgets import DataTable, Input

from backend.config import load_config
from backend.services import Services
from tests.helpers import settle_workers
from tui import cli
from tui.app import LoadmasterApp
from tui.screens.retention import RetentionScreen

#: Differ between any two plans by nature (when each was made).
VOLATILE = {"created", "hash"}


def _comparable(plan: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in plan.items() if k not in VOLATILE}


async def _console_plan(cfg: Path, run: Path) -> tuple[dict[str, Any], list[str]]:
    """The plan the Retention screen shows for ``run``, and its table's row keys."""
    services = Services(load_config(str(cfg)))
    try:
        app = LoadmasterApp(services, mode="retention")
        async with app.run_test(size=(120, 40)) as pilot:
            screen = app.screen
            assert isinstance(screen, RetentionScreen)
            screen.query_one("#retention-url", Input).value = str(run)
            screen.action_reload()
            for _ in range(10):  # the listing arrives, then the plan's worker runs
                await settle_workers(pilot)
                if screen.plan is not None and not any(w.is_running for w in app.workers):
                    break
            assert screen.plan is not None
            rows = [str(k.value) for k in screen.query_one("#retention-steps", DataTable).rows]
            return json.loads(screen.plan.to_json()), rows
    finally:
        services.db.close()


def test_screen_and_cli_render_the_same_plan(
    tmp_path: Path, dcp_run: DcpRun, capsys: pytest.CaptureFixture[str]
) -> None:
    run = many_step_run(dcp_run, tmp_path / "run1", steps=40)
    cfg = tmp_path / "loadmaster.toml"
    cfg.write_text(
        '[[nodes]]\nname = "here"\ntransport = "local"\n\n[retention]\nkeep_full_latest = 2\nmilestone_every = 5000\n'
        f'\n[state]\ndir = "{tmp_path / "state"}"\n'
    )
    assert cli.main(["--config", str(cfg), "retention", "pin", str(run), "500:first eval"]) == 0
    capsys.readouterr()
    assert cli.main(["--config", str(cfg), "retention", "plan", str(run), "--json"]) == 0
    from_cli = json.loads(capsys.readouterr().out)

    from_screen, shown = asyncio.run(_console_plan(cfg, run))

    assert _comparable(from_screen) == _comparable(from_cli)
    acts = {a["step"]: a for a in from_cli["actions"]}
    assert acts[500]["action"] == "keep-full" and acts[500]["resumable"] == "verified"  # the pin, proven
    assert acts[20000]["action"] == "keep-full" and acts[19500]["action"] == "keep-full"
    assert acts[5000]["action"] == "strip-to-weights" and acts[1000]["action"] == "delete"
    assert sorted(shown) == sorted(a["path"] for a in from_cli["actions"])  # every step is a row
