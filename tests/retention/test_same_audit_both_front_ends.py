"""One table, two front ends: each operation done from the CLI and from the console (Pilot) on
identical copies of a real DCP run (and of a small image dataset, for the shard conversion) leaves
the same audit record.

The operation layer (backend.ops) writes every record, so the front ends cannot drift apart:
the same action, target, outcome, reason and detail, whichever one the operator used. Only
what differs by nature is normalised: the two copies' paths, timings and plan hashes.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from retention_helpers import DcpRun  # type: ignore[import-not-found]
from textual.widgets import DataTable, Input

from backend.config import load_config
from backend.services import Services
from tests.helpers import settle_workers, wait_until
from tests.shards.conftest import make_dataset
from tui import cli
from tui.app import LoadmasterApp
from tui.screens.checkpoints import CheckpointsScreen
from tui.screens.retention import RetentionScreen
from tui.screens.shards import ShardsScreen
from tui.widgets.confirm import ConfirmModal, ConfirmTyped

#: Measured, not compared: they differ between any two runs.
VOLATILE = {"seconds", "elapsed_s", "gbps", "ts", "started", "finished", "rate_bps", "journal"}


def _normal(value: Any, roots: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _normal(v, roots) for k, v in sorted(value.items()) if k not in VOLATILE}
    if isinstance(value, list):
        return [_normal(v, roots) for v in value]
    if isinstance(value, str):
        for real, name in roots.items():
            value = value.replace(real, name)
    return value


def _records(services: Services, roots: dict[str, str]) -> list[dict[str, Any]]:
    """The audit log, oldest first, without ids, times, the actor and plan hashes (asserted present)."""
    out = []
    for e in reversed(services.db.audit_entries()):
        if e.action == "retention.apply":
            assert e.plan_hash
        out.append(
            _normal(
                {"action": e.action, "target": e.target, "outcome": e.outcome, "reason": e.reason, "detail": e.detail},
                roots,
            )
        )
    return out


def _cli(config_file: Path, run: Path, nvme: Path) -> None:
    cfg = str(config_file)

    def ok(*argv: str) -> None:
        assert cli.main(["--config", cfg, *argv]) == 0, argv

    ok("retention", "pin", str(run), "2000:pinned in the console")
    ok("retention", "milestone", str(run), "4000")
    ok("retention", "unpin", str(run), "2000")
    ok("retention", "milestone", str(run), "4000", "--remove")
    ok("retention", "plan", str(run), "--out", str(run.parent / "plan.json"))
    ok("retention", "apply", str(run.parent / "plan.json"), "--yes")
    ok("ckpt", "strip", str(run / "step-12000"))
    ok("upload", str(nvme), str(run / "step-20000"))
    ok("shard", str(run.parent / "data"), str(run.parent / "shards"), "--shard-size", "16KB")


async def _console(config_file: Path, run: Path, nvme: Path) -> None:
    services = Services(load_config(str(config_file)))
    app = LoadmasterApp(services, mode="retention")
    async with app.run_test(size=(160, 50)) as pilot:
        screen = app.screen
        assert isinstance(screen, RetentionScreen)
        await pilot.press("o")
        screen.query_one("#retention-url", Input).value = str(run)
        await pilot.press("enter")
        await settle_workers(pilot)
        table = screen.query_one("#retention-steps", DataTable)
        table.focus()
        for path, key in (("step-2000", "p"), ("step-4000", "m"), ("step-2000", "p"), ("step-4000", "m")):
            table.move_cursor(row=table.get_row_index(path))  # pin 2000, mark 4000, then undo both
            await pilot.press(key)
            await settle_workers(pilot)
        await pilot.press("a")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmTyped))
        await pilot.press(*run.name, "enter")
        await settle_workers(pilot)
        await wait_until(pilot, lambda: any(e.action == "retention.apply" for e in services.db.audit_entries()))

        await pilot.press("3")  # Checkpoints
        await wait_until(pilot, lambda: isinstance(app.screen, CheckpointsScreen))
        ck = app.screen
        assert isinstance(ck, CheckpointsScreen)
        ck.query_one("#ckpt-url", Input).value = str(run)
        ck.action_reload()
        steps = ck.query_one("#ckpt-steps", DataTable)
        await wait_until(pilot, lambda: steps.row_count > 0)
        steps.move_cursor(row=[str(k.value) for k in steps.rows].index("step-12000"))
        ck.action_strip_step()
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal))
        await pilot.press("y")
        await wait_until(pilot, lambda: any(e.action == "ckpt.strip" for e in services.db.audit_entries()))
        ck.query_one("#ckpt-local", Input).value = str(nvme)
        ck.action_upload_step()
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal))
        await pilot.press("y")
        await wait_until(pilot, lambda: any(e.action == "ckpt.upload" for e in services.db.audit_entries()))

        await pilot.press("6")  # Shards
        await wait_until(pilot, lambda: isinstance(app.screen, ShardsScreen))
        sh = app.screen
        assert isinstance(sh, ShardsScreen)
        for key, value in (("src", run.parent / "data"), ("dest", run.parent / "shards"), ("shard-size", "16KB")):
            sh.query_one(f"#shards-{key}", Input).value = str(value)
        await wait_until(pilot, lambda: sh.preview is not None and sh.preview.dest == str(run.parent / "shards"))
        await pilot.click("#shards-start")
        await wait_until(
            pilot,
            lambda: any(e.action == "shard.convert" for e in services.db.audit_entries()),
            rounds=2000,
            delay=0.01,
        )
    await services.aclose()


def _copies(tmp_path: Path, dcp_run: DcpRun, side: str) -> tuple[Path, Path]:
    run = dcp_run.copy_to(tmp_path / side / "run1")
    nvme = tmp_path / side / "nvme" / "step-20000"
    shutil.copytree(dcp_run.root / "step-1000", nvme)
    make_dataset(tmp_path / side / "data", n=30)
    return run, nvme


async def test_cli_and_console_leave_the_same_audit_records(tmp_path: Path, dcp_run: DcpRun) -> None:
    runs = {side: _copies(tmp_path, dcp_run, side) for side in ("cli", "console")}
    cli_cfg, console_cfg = (tmp_path / "cli.toml", tmp_path / "console.toml")
    for side, cfg in (("cli", cli_cfg), ("console", console_cfg)):
        cfg.write_text(
            f'[[nodes]]\nname = "here"\ntransport = "local"\n\n[state]\ndir = "{tmp_path / side / "state"}"\n'
        )

    await asyncio.to_thread(_cli, cli_cfg, *runs["cli"])  # the CLI runs its own event loop
    await _console(console_cfg, *runs["console"])

    def records(side: str) -> list[dict[str, Any]]:
        services = Services(load_config(str(cli_cfg if side == "cli" else console_cfg)))
        try:
            run, nvme = runs[side]
            return _records(services, {str(nvme): "<nvme>", str(run): "<run>", str(run.parent): "<side>"})
        finally:
            services.db.close()

    by_cli, by_console = records("cli"), records("console")
    actions: Callable[[list[dict[str, Any]]], list[str]] = lambda rs: [r["action"] for r in rs]  # noqa: E731
    # every destructive action is announced (retention.intent) before it starts, then the apply record
    intents = actions(by_cli).count("retention.intent")
    assert intents and actions(by_cli).index("retention.intent") < actions(by_cli).index("retention.apply")
    assert [a for a in actions(by_cli) if a not in ("retention.intent", "retention.action")] == [
        "retention.pin",
        "retention.milestone",
        "retention.unpin",
        "retention.unmilestone",
        "retention.apply",
        "ckpt.strip",
        "ckpt.upload",
        "shard.convert",
    ]
    assert actions(by_console) == actions(by_cli)
    for a, b in zip(by_cli, by_console, strict=True):
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True), a["action"]
