"""Pilot test of the pruning flow: list, live recompute, pin, milestone, typed confirmation, apply."""

from __future__ import annotations

from pathlib import Path

import pytest
from retention_helpers import DcpRun  # type: ignore[import-not-found]
from textual.widgets import DataTable, Input, Static

from tests.helpers import Recorder
from tests.helpers import settle_workers as settle_once
from tui.app import LoadmasterApp
from tui.screens.retention import (
    ActionProgressed,
    CatalogLoaded,
    PlanApplied,
    PlanComputed,
    RetentionScreen,
)
from tui.widgets.confirm import ConfirmTyped


async def settle_workers(pilot) -> None:  # type: ignore[no-untyped-def]
    """Settle until no worker runs: a listing starts the plan's worker when it arrives."""
    for _ in range(10):
        await settle_once(pilot)
        if not any(w.is_running for w in pilot.app.workers):
            return


async def test_pruning_flow_with_typed_confirmation(tmp_path: Path, local_services, dcp_run: DcpRun) -> None:  # type: ignore[no-untyped-def]
    root = dcp_run.copy_to(tmp_path / "run1")
    app = LoadmasterApp(local_services, mode="retention")
    rec = Recorder()
    async with app.run_test(size=(160, 50), message_hook=rec) as pilot:
        screen = app.screen
        assert isinstance(screen, RetentionScreen)
        await pilot.press("o")  # o edits the run folder, as on Checkpoints
        url_box = screen.query_one("#retention-url", Input)
        assert url_box.has_focus
        url_box.value = str(root)
        await pilot.press("enter")
        await settle_workers(pilot)
        assert rec.of(CatalogLoaded)
        assert screen.query_one("#retention-steps", DataTable).has_focus
        plan = screen.plan
        assert plan is not None
        acts = {a.step: a.action for a in plan.actions}
        assert acts[11000] == acts[12000] == "keep-full" and acts[13000] == "skip" and acts[1000] == "delete"
        table = screen.query_one("#retention-steps", DataTable)
        assert table.row_count == len(plan.actions) == 14
        summary = str(screen.query_one("#retention-summary", Static).render())
        assert "saves" in summary and "%" in summary

        # the policy changes live: keep 3 full
        n_plans = len(rec.of(PlanComputed))
        screen.query_one("#keep-full", Input).value = "3"
        await settle_workers(pilot)  # the plan is asked for again from the operation layer
        assert len(rec.of(PlanComputed)) > n_plans
        assert {a.step: a.action for a in screen.plan.actions}[10000] == "keep-full"

        # pin step 2000 and mark step 4000 a milestone from the table
        table.focus()
        table.move_cursor(row=table.get_row_index("step-2000"))  # rows: kept first, then deletes
        await pilot.press("p")
        await settle_workers(pilot)
        table.move_cursor(row=table.get_row_index("step-4000"))
        await pilot.press("m")
        await settle_workers(pilot)
        acts = {a.step: a for a in screen.plan.actions}
        assert acts[2000].action == "keep-full" and acts[2000].pinned == "pinned in the console"
        assert acts[4000].action == "strip-to-weights"
        # the milestone is recorded (and audited) like a pin: the next plan, CLI or console, honours it
        from backend.retention import MilestoneStore

        assert MilestoneStore(local_services.db).milestones(str(root)) == (4000,)
        (mark,) = local_services.db.audit_entries(action="retention.milestone")
        assert mark.target == f"{root}#4000"
        # kept full steps show the deep resumable check
        assert acts[12000].resumable == "verified"

        # a dry run re-checks and changes nothing
        table.focus()
        await pilot.press("d")
        await settle_workers(pilot)
        (dry,) = rec.of(PlanApplied)
        assert dry.report.dry_run and dry.report.count("would-do") == len(screen.plan.destructive_actions)
        assert "Nothing was changed" in str(screen.query_one("#retention-status", Static).render())
        assert (root / "step-1000" / ".metadata").exists()

        # apply: a typed confirmation first; a wrong phrase does nothing
        await pilot.press("a")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, ConfirmTyped) and modal.phrase == "run1"
        await pilot.press(*"run2", "enter")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmTyped)
        assert (root / "step-1000" / ".metadata").exists()
        modal.query_one("#phrase", Input).value = ""
        await pilot.press(*"run1", "enter")
        await settle_workers(pilot)
        await settle_workers(pilot)
        assert app.screen is screen
        (applied,) = [m for m in rec.of(PlanApplied) if not m.report.dry_run]
        report = applied.report
        assert report.ok, report.as_dict()
        assert {m.outcome.outcome for m in rec.of(ActionProgressed)} >= {"running", "done", "kept"}
        assert report.audit_id and "Audit record #" in str(screen.query_one("#retention-status", Static).render())
        (entry,) = local_services.db.audit_entries(action="retention.apply")
        assert entry.plan_hash == report.plan_hash and entry.id == report.audit_id
    assert not (root / "step-1000").exists()
    assert (root / "step-2000" / ".metadata").exists()  # pinned
    assert (root / "step-10000" / ".metadata").exists()  # latest 3
    assert sorted(p.name for p in (root / "step-4000").iterdir()) == [
        "model-00001-of-00001.safetensors",
        "model.safetensors.index.json",
    ]
    assert not (root / "step-13000" / ".metadata").exists() and (root / "step-13000").exists()


async def _list_run(pilot, screen, root: Path) -> None:  # type: ignore[no-untyped-def]
    """Type the run folder into the screen, list it and wait for the plan."""
    screen.query_one("#retention-url", Input).value = str(root)
    screen.action_reload()
    await settle_workers(pilot)


async def test_readonly_console_refuses_to_apply(tmp_path: Path, local_services, dcp_run: DcpRun) -> None:  # type: ignore[no-untyped-def]
    root = dcp_run.copy_to(tmp_path / "run1")
    local_services.readonly = True
    app = LoadmasterApp(local_services, mode="retention")
    async with app.run_test(size=(160, 50)) as pilot:
        screen = app.screen
        await _list_run(pilot, screen, root)
        assert screen.plan is not None and screen.plan.destructive_actions
        screen.action_apply_plan()
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmTyped)
    assert (root / "step-1000" / ".metadata").exists()


# Navigation only (filter, detail, escape): nothing is written to the state database, so one
# backend shows it; the pruning flow above applies and audits on both.
@pytest.mark.parametrize("state_url", ["sqlite"], indirect=True)
async def test_filter_enter_detail_and_escape_steps_back(tmp_path: Path, local_services, dcp_run: DcpRun) -> None:  # type: ignore[no-untyped-def]
    from tui.widgets.detail import DetailModal

    root = dcp_run.copy_to(tmp_path / "run1")
    app = LoadmasterApp(local_services, mode="retention")
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        await _list_run(pilot, screen, root)
        table = screen.query_one("#retention-steps", DataTable)
        assert table.has_focus and table.row_count == 14
        # / filters the steps: only the planned deletes stay, and p/m act on the row shown.
        await pilot.press("slash", *"delete")
        await pilot.pause()
        deletes = [a for a in screen.plan.actions if a.action == "delete"]
        assert table.row_count == len(deletes) and 0 < len(deletes) < 14
        assert "showing" in str(screen.query_one("#retention-summary", Static).render())
        await pilot.press("enter")  # keep the filter, back to the table
        await pilot.pause()
        assert table.has_focus and table.row_count == len(deletes)
        table.move_cursor(row=1)
        await pilot.press("enter")  # enter on a row: its plan in full
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, DetailModal)
        fields = dict(modal.fields)
        assert fields["action"] == "delete" and fields["folder"].endswith(deletes[1].path)
        await pilot.press("escape")  # closes the detail ...
        await pilot.pause()
        assert app.screen is screen and table.row_count == len(deletes)
        await pilot.press("escape")  # ... then clears the filter
        await pilot.pause()
        assert table.row_count == 14 and screen.filter_text == ""
        assert not screen.query_one("#screen-filter", Input).display
