"""SVG snapshots of the shell's own screens, with fixed data (no clock, no hostnames)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from textual.app import ComposeResult
from textual.widgets import Static

from backend.config import default_config
from backend.services import Services
from tui.app import LoadmasterApp
from tui.screens.base import LoadmasterScreen
from tui.screens.errors import ErrorRecord, ErrorsScreen
from tui.widgets import ConfirmTyped

ERRORS = [
    ErrorRecord(
        datetime(2026, 11, 29, 9, 58, 1),
        "_list_pulls (transfers)",
        "bucket 'ckpt' does not exist",
        "bucket 'ckpt' does not exist",
    ),
    ErrorRecord(
        datetime(2026, 11, 29, 10, 0, 0),
        "_sample (telemetry)",
        "NodeUnreachable: gpu-07: connection refused",
        "gpu-07: connection refused (is sshd running on port 22?)",
    ),
]


class Backdrop(LoadmasterScreen):
    """A fixed screen under the dialog, so feature screens' changes don't move this snapshot."""

    SCREEN_TITLE = "Retention"

    def compose_body(self) -> ComposeResult:
        yield Static("Retention\n\nComing: the retention plan.", classes="placeholder screen-body", markup=False)


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LoadmasterApp:
    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("LOADMASTER_DATA_DIR", str(tmp_path / "data"))
    return LoadmasterApp(Services(config=default_config(), readonly=True), theme="loadmaster-contrast", mode="egress")


def test_errors_screen_snapshot(snap_compare: Any, app: LoadmasterApp) -> None:
    async def show(pilot: Any) -> None:
        pilot.app.clear_notifications()
        await pilot.app.push_screen(ErrorsScreen(list(ERRORS)))
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=show)


def test_confirm_typed_snapshot(snap_compare: Any, app: LoadmasterApp) -> None:
    async def show(pilot: Any) -> None:
        pilot.app.clear_notifications()
        await pilot.app.push_screen(Backdrop(pilot.app.services))
        await pilot.app.push_screen(
            ConfirmTyped(
                title="Delete 2 checkpoints from s3://ckpt/run-7",
                phrase="delete 2 checkpoints",
                body="step-1000  980 GB  delete\nstep-2000  980 GB  delete",
            )
        )
        await pilot.press(*"delete 2")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=show)
