"""The table helpers that make a cut show: the end of free text gives way to "…" (#29)."""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import DataTable

from tui.widgets.table_fit import LEAST_ROOM, cut_end, room_for


def test_cut_end_keeps_what_fits_and_marks_a_cut() -> None:
    assert cut_end("neither recent", 20) == "neither recent"
    assert cut_end("latest 2 complete · verified resumable", 20) == "latest 2 complete ·…"
    assert len(cut_end("x" * 50, 7)) == 7
    styled = cut_end(Text("keep-full because", style="bold"), 9)
    assert isinstance(styled, Text) and styled.plain == "keep-ful…" and styled.style == "bold"


class OneTable(App[None]):
    def compose(self) -> ComposeResult:
        yield DataTable()


async def test_room_for_is_what_the_other_columns_leave() -> None:
    app = OneTable()
    async with app.run_test(size=(60, 10)):
        table = app.query_one(DataTable)
        rows = [["10000", "keep-full", "a long reason"], ["4000", "strip-to-weights", "short"]]
        room = room_for(table, ["Step", "Action", "Reason"], rows, 2)
        pad = 2 * table.cell_padding
        # Step (5) and Action (16) padded, the reason's own padding, a scrollbar.
        assert room == 60 - (5 + pad) - (16 + pad) - pad - table.styles.scrollbar_size_vertical
        assert room_for(table, ["Step", "Reason"], [["x" * 70, "r"]], 1) == LEAST_ROOM
