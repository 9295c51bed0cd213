"""At 80 columns the plan's reasons fit the table: a cut reason ends with "…" (the screen edge
used to cut "verified resumable" to "verified resumabl"), and enter still shows it whole (#29)."""

from __future__ import annotations

from pathlib import Path

from retention_helpers import DcpRun  # type: ignore[import-not-found]
from rich.text import Text
from textual.widgets import DataTable, Input

from tests.helpers import settle_workers as settle_once
from tui.app import LoadmasterApp
from tui.screens.retention import RetentionScreen, _reason_text


async def _settle(pilot) -> None:  # type: ignore[no-untyped-def]
    for _ in range(10):
        await settle_once(pilot)
        if not any(w.is_running for w in pilot.app.workers):
            return


async def test_reasons_cut_with_an_ellipsis_at_80_columns(tmp_path: Path, local_services, dcp_run: DcpRun) -> None:  # type: ignore[no-untyped-def]
    root = dcp_run.copy_to(tmp_path / "run1")
    app = LoadmasterApp(local_services, mode="retention")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, RetentionScreen)
        screen.query_one("#retention-url", Input).value = str(root)
        await pilot.press("o", "enter")
        await _settle(pilot)
        plan = screen.plan
        assert plan is not None
        table = screen.query_one("#retention-steps", DataTable)
        keys = [c.key.value for c in table.ordered_columns]
        reason_col = keys.index("reason")
        cut = 0
        for a in plan.actions:
            shown = table.get_row(a.path)[reason_col]
            shown = shown.plain if isinstance(shown, Text) else str(shown)
            full = _reason_text(a)
            if shown != full:
                cut += 1
                assert shown.endswith("…") and full.startswith(shown[:-1]), (shown, full)
        assert cut, "no reason needed cutting at 80 columns: the test proves nothing"
        # The table is no wider than the screen: nothing is left for the edge to cut.
        assert table.virtual_size.width <= table.size.width
        # widen: the reasons get their room back
        await pilot.resize_terminal(200, 24)
        await _settle(pilot)
        keys = [c.key.value for c in table.ordered_columns]
        for a in plan.actions:
            shown = table.get_row(a.path)[keys.index("reason")]
            assert (shown.plain if isinstance(shown, Text) else str(shown)) == _reason_text(a)
