"""Pilot tests of the Checkpoints screen against a real local run folder."""

from __future__ import annotations

import shutil
from pathlib import Path

from textual.widgets import DataTable, Input, Static

from backend.config import default_config
from backend.services import Services
from tests.helpers import wait_until
from tui.app import LoadmasterApp
from tui.screens.checkpoints import CheckpointsScreen
from tui.widgets.confirm import ConfirmModal, ConfirmTyped

SIZE = (140, 40)


def make_run(tmp_path: Path, src: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(src, run / "step-10")
    shutil.copytree(src, run / "step-9")
    (run / "step-9" / ".metadata").unlink()
    return run


async def test_list_inspect_strip_and_upload(tmp_path: Path, tiny_full_dcp: tuple[Path, dict]) -> None:
    from tests.helpers import Recorder
    from tui.screens.checkpoints import ActionProgressed

    run = make_run(tmp_path, tiny_full_dcp[0])
    services = Services(config=default_config())
    app = LoadmasterApp(services, mode="checkpoints")
    rec = Recorder()
    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, CheckpointsScreen)
        footprint = str(screen.query_one("#ckpt-footprint", Static).render())
        assert "980.0 GB (912.7 GiB)" in footprint and "assumed" in footprint  # no run listed yet
        screen.query_one("#ckpt-url", Input).value = str(run)
        screen.action_reload()
        table = screen.query_one("#ckpt-steps", DataTable)
        await wait_until(pilot, lambda: table.row_count == 2)
        assert [str(table.get_row_at(i)[1]) for i in range(2)] == ["incomplete", "full"]
        assert "by kind" in str(screen.query_one("#ckpt-summary", Static).render())
        # the footprint is the run's own model now (read from its tensors), not the 70B default
        footprint = str(screen.query_one("#ckpt-footprint", Static).render())
        assert "from step-10's tensors" in footprint and "980.0 GB" not in footprint, footprint

        # inspect the full step with enter (the detail key of every table): the DCP key list
        table.focus()
        table.move_cursor(row=1)
        await pilot.press("enter")
        tensors = screen.query_one("#ckpt-tensors", DataTable)
        await wait_until(pilot, lambda: tensors.row_count > 0)
        names = {str(tensors.get_row_at(i)[0]) for i in range(tensors.row_count)}
        assert "model.norm.weight" in names and any(n.startswith("optim.state") for n in names)
        await pilot.press("escape")  # escape closes the key list
        await pilot.pause()
        assert not tensors.display and table.has_focus

        # / filters the steps; the actions act on the row under the cursor, not on a row index
        await pilot.press("slash", *"full", "enter")
        await pilot.pause()
        assert table.row_count == 1 and screen.selected().kind == "full"
        await pilot.press("escape")
        await pilot.pause()
        assert table.row_count == 2

        # the in-flight step cannot be stripped
        table.move_cursor(row=0)
        screen.action_strip_step()
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmModal)

        # strip the full one after confirming
        table.move_cursor(row=1)
        screen.action_strip_step()
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal))
        await pilot.press("y")
        await wait_until(
            pilot,
            lambda: (
                (run / "step-10" / "model.safetensors.index.json").exists()
                and table.row_count == 2
                and str(table.get_row_at(1)[6]) == "yes"
            ),
        )
        assert "verified" in str(screen.query_one("#ckpt-status", Static).render())

        # upload a local step folder into the run
        local = tmp_path / "nvme" / "step-20"
        shutil.copytree(tiny_full_dcp[0], local)
        screen.query_one("#ckpt-local", Input).value = str(local)
        screen.action_upload_step()
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal))
        await pilot.press("y")
        await wait_until(pilot, lambda: table.row_count == 3)
        assert str(table.get_row_at(2)[0]) == "20" and str(table.get_row_at(2)[1]) == "full"
        # both ran with a progress bar (bytes done of total), hidden again when they ended
        moves = rec.of(ActionProgressed)
        assert moves and all(0 <= m.done <= m.total for m in moves) and any(m.done == m.total > 0 for m in moves)
        assert not screen.query_one("#ckpt-progress").display
        assert [e.action for e in services.db.audit_entries()][:2] in (
            ["ckpt.strip", "ckpt.upload"],
            ["ckpt.upload", "ckpt.strip"],
        )

        # uploading onto an existing complete step asks for the step's name typed, never a y
        before = (run / "step-20" / ".metadata").read_bytes()
        (local / "extra.txt").write_text("a newer file")
        screen.action_upload_step()
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmTyped))
        assert "already holds" in app.screen.question  # type: ignore[attr-defined]
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.screen is screen)
        assert not (run / "step-20" / "extra.txt").exists() and (run / "step-20" / ".metadata").read_bytes() == before
        screen.action_upload_step()
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmTyped))
        await pilot.press(*"step-20", "enter")
        await wait_until(pilot, lambda: (run / "step-20" / "extra.txt").exists())
        await wait_until(
            pilot,
            lambda: (
                services.db.audit_entries()[0].action == "ckpt.upload"
                and services.db.audit_entries()[0].detail.get("overwrite") is True
            ),
        )
    await services.aclose()


async def test_readonly_refuses_strip(tmp_path: Path, tiny_full_dcp: tuple[Path, dict]) -> None:
    run = make_run(tmp_path, tiny_full_dcp[0])
    services = Services(config=default_config(), readonly=True)
    app = LoadmasterApp(services, mode="checkpoints")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, CheckpointsScreen)
        screen.query_one("#ckpt-url", Input).value = str(run)
        screen.action_reload()
        table = screen.query_one("#ckpt-steps", DataTable)
        await wait_until(pilot, lambda: table.row_count == 2)
        table.move_cursor(row=1)
        screen.action_strip_step()
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmModal)
        assert not (run / "step-10" / "model.safetensors.index.json").exists()
    await services.aclose()


async def test_backlog_alert_shown(tmp_path: Path, tiny_full_dcp: tuple[Path, dict]) -> None:
    import json
    import time

    run = make_run(tmp_path, tiny_full_dcp[0])
    services = Services(config=default_config())
    jobs = services.jobs  # creates the jobs table
    now = time.time()
    for i, step in enumerate((100, 200)):
        jobs.db.execute(
            "INSERT INTO jobs (id, node, kind, label, params, state, created, launched_by, launched_from, job_dir,"
            " updated) VALUES (?, 'local', 'upload', '', ?, 'running', ?, 'me', 'here', '/x', ?)",
            (f"j{i}", json.dumps({"dest": f"s3://b/run1/step-{step}", "step": step}), now - 100 + i, now),
        )
    app = LoadmasterApp(services, mode="checkpoints")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, CheckpointsScreen)
        screen.query_one("#ckpt-url", Input).value = str(run)
        screen.action_reload()
        backlog = screen.query_one("#ckpt-backlog", Static)
        await wait_until(pilot, lambda: backlog.display)
        text = str(backlog.render())
        assert "ALERT" in text and "s3://b/run1" in text and "step 100" in text
    await services.aclose()
