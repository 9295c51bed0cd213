"""SVG snapshots of every console screen at 80x24 (the smallest supported size) and 120x40, in the
states an operator decides in: a starved node, a state database that is down, 256 nodes (the
heatmap), a launch with a failed node, a 16-node pull's estimate, a 64-step run's checkpoints and
retention plan; the audit log, the error log and help. Dark theme at both sizes; the light theme
at 80x24 for the everyday screens.

Deterministic by construction (see tests/tui/snapshot_services.py): synthetic samples fed at fixed
hub times, a frozen clock, a fixed config, a state database and preferences of the test's own,
no node or remote store contacted; the 64-step run is real DCP checkpoints in a fixed local
folder with fixed ages. Regenerate the baselines after an intended change with
``pytest tests/tui/test_snapshots.py --snapshot-update`` and read each one before committing
(a snapshot of a broken screen is a defect, not a baseline).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backend.errors import StoreError
from backend.services import Services
from tests.tui.snapshot_services import (
    FROZEN_NOW,
    SNAPSHOT_RUNS,
    frozen_clock,
    launch_records,
    pull_preview,
    record_audit_trail,
    record_egress_month,
    services_with_jobs,
    snapshot_run,
    snapshot_services,
)
from tui.app import LoadmasterApp

SIZES = {"80x24": (80, 24), "120x40": (120, 40)}
DARK, LIGHT = "loadmaster-dark", "loadmaster-light"

Step = Callable[[Any], Awaitable[None]]


async def settle(pilot: Any) -> None:
    """Let mount-time workers finish and the screen repaint (a finished worker may start the
    next: a listing starts the plan), then let the messages they posted be handled."""
    for _ in range(8):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        if not any(w.is_running for w in pilot.app.workers):
            break


async def open_node_detail(pilot: Any) -> None:
    await settle(pilot)
    await pilot.press("down", "enter")  # the starved node, second row
    await settle(pilot)


async def open_help(pilot: Any) -> None:
    await settle(pilot)
    await pilot.press("question_mark")
    await settle(pilot)


async def database_down(pilot: Any) -> None:
    await settle(pilot)
    pilot.app.screen._state_checked("state database oncall@db.internal:5432/loadmaster is unreachable")
    await settle(pilot)


async def pull_16_nodes(pilot: Any) -> None:
    """The pull form with a 16-node estimate: node 3's scratch too small, node 7 not answering."""
    from tui.screens.transfers import PullPlanned

    await settle(pilot)
    await pilot.press("n")
    preview = pull_preview(pilot.app.services, nodes=16, failed=(7,), full=(3,))
    pilot.app.screen.post_message(PullPlanned(preview, "", preview.startable))
    await settle(pilot)


def list_run(box: str, *, milestone_every: str = "") -> Step:
    """Type the 64-step run into the screen's run folder, list it (and plan it)."""

    async def before(pilot: Any) -> None:
        from textual.widgets import Input

        await settle(pilot)
        screen = pilot.app.screen
        screen.query_one(box, Input).value = str(snapshot_run())
        if milestone_every:
            screen.query_one("#milestone-every", Input).value = milestone_every
        screen.action_reload()
        await settle(pilot)
        screen.main_table().focus()
        await settle(pilot)

    return before


async def open_audit(pilot: Any) -> None:
    await settle(pilot)
    await pilot.press("L")
    await settle(pilot)


async def open_errors(pilot: Any) -> None:
    import dataclasses
    from datetime import datetime

    await settle(pilot)
    app = pilot.app
    app.report_error(
        "Listing s3://ml-checkpoints/llama-70b",
        StoreError("s3://ml-checkpoints/llama-70b: access denied (check the store's profile 'ckpt')"),
    )
    app.errors[-1] = dataclasses.replace(app.errors[-1], when=datetime.fromtimestamp(FROZEN_NOW))
    await settle(pilot)
    app.clear_notifications()  # the toast would cover the detail
    await pilot.pause()
    await pilot.press("e")
    await settle(pilot)


def _plain(state_dir: Path) -> Services:
    return snapshot_services(state_dir=state_dir)


def _egress(state_dir: Path) -> Services:
    services = snapshot_services(state_dir=state_dir)
    record_egress_month(services)
    return services


def _audit(state_dir: Path) -> Services:
    services = snapshot_services(state_dir=state_dir)
    record_audit_trail(services)
    return services


def _failed_launch(state_dir: Path) -> Services:
    return services_with_jobs(launch_records(nodes=4, failed=3), state_dir=state_dir)


def _jobs_db_down(state_dir: Path) -> Services:
    return services_with_jobs(launch_records(nodes=16, failed=0, recorded=False), state_dir=state_dir)


def _pull_form(state_dir: Path) -> Services:
    services = services_with_jobs((), state_dir=state_dir)
    record_egress_month(services)
    return services


def _fleet_256(state_dir: Path) -> Services:
    """Fresh services over a copy of the 256-node hub (fed once per process: ~1 s of CPU)."""
    fed = _fed_fleet_256()
    services = Services(fed.services.config)
    services.__dict__["telemetry"] = copy.deepcopy(fed.hub)  # the composition root's cached service
    return services


@functools.cache
def _fed_fleet_256() -> Any:
    from tests.tui.test_fleet_heatmap import Fleet

    fleet = Fleet.synthetic(256, starved=(9,), sites=4)
    fleet.feed(3)
    fleet.xid["gpu-022"] = (3, 48)
    fleet.feed(6, skip=("gpu-041",))
    return fleet  # never fed again: its hub's clock (fleet.t) stays where the copies read it


@dataclass(frozen=True)
class Case:
    """One screen in one state."""

    name: str
    mode: str
    before: Step
    services: Callable[[Path], Services] = _plain
    light: bool = False  # also in the light theme at 80x24


CASES = (
    Case("fleet_starved", "fleet", settle, light=True),
    Case("fleet_database_down", "fleet", database_down),
    Case("fleet_256_nodes", "fleet", settle, _fleet_256),
    Case("node_detail", "fleet", open_node_detail, light=True),
    Case("transfers_failed_node", "transfers", settle, _failed_launch, light=True),
    Case("transfers_database_down", "transfers", settle, _jobs_db_down),
    Case("transfers_pull_16_nodes", "transfers", pull_16_nodes, _pull_form),
    Case("checkpoints_64_steps", "checkpoints", list_run("#ckpt-url"), light=True),
    Case("retention_64_steps", "retention", list_run("#retention-url", milestone_every="8000"), light=True),
    Case("egress", "egress", settle, _egress, light=True),
    Case("shards", "shards", settle, light=True),
    Case("alerts", "alerts", settle),
    Case("audit", "fleet", open_audit, _audit),
    Case("errors", "fleet", open_errors),
    Case("help", "fleet", open_help, light=True),
)


def _params() -> list[Any]:
    out = []
    for case in CASES:
        for size in SIZES:
            out.append(pytest.param(case, size, DARK, id=f"{case.name}-{size}"))
        if case.light:
            out.append(pytest.param(case, "80x24", LIGHT, id=f"{case.name}-80x24-light"))
    return out


@pytest.fixture(autouse=True)
def _frozen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "config"))  # nothing remembered
    with frozen_clock(monkeypatch):
        yield


def steady(before: Step) -> Step:
    """``before``, then every text field's cursor held still: a blinking cursor is drawn or not
    depending on the moment the picture is taken."""

    async def run(pilot: Any) -> None:
        from textual.widgets import Input

        await before(pilot)
        for field in pilot.app.screen.query(Input):
            field.cursor_blink = False
        await pilot.pause()

    return run


@pytest.mark.parametrize(("case", "size", "theme"), _params())
def test_screen(snap_compare: Any, case: Case, size: str, theme: str) -> None:
    import shutil

    # The audit screen names the state file: a fixed path, emptied first (one per snapshot).
    state = SNAPSHOT_RUNS / "state" / f"{case.name}-{size}-{theme}"
    shutil.rmtree(state, ignore_errors=True)
    app = LoadmasterApp(case.services(state), theme=theme, mode=case.mode)
    assert snap_compare(app, terminal_size=SIZES[size], run_before=steady(case.before))
