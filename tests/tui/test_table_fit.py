"""The table helpers that make a cut show: the end of free text gives way to "…" (#29)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import DataTable

from tui.widgets.table_fit import LEAST_ROOM, FitColumn, FittedTable, cut_end, fit_columns, room_for


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


@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=10),
    st.integers(1, 300),
)
def test_fit_columns_shows_whole_columns_in_order(sizes: list[tuple[int, int]], width: int) -> None:
    """The columns shown are the first ones, each between its least and natural width, and
    (beyond the first, always shown) they fit in the width: the edge never cuts one."""
    wanted = [(f"c{i}", natural, least) for i, (natural, least) in enumerate(sizes)]
    layout = fit_columns(wanted, width, padding=1)
    assert [k for k, _w in layout] == [k for k, _n, _l in wanted[: len(layout)]]
    for (_key, w), (_k, natural, least) in zip(layout, wanted, strict=False):
        assert min(least, natural) <= w <= natural
    if len(layout) > 1:
        assert sum(w + 2 for _k, w in layout) <= width
    if len(layout) < len(wanted):  # the next column did not fit even at its least width
        nxt = wanted[len(layout)]
        assert sum(w + 2 for _k, w in layout) + min(nxt[1], nxt[2]) + 2 > width


class Fitted(App[None]):
    def compose(self) -> ComposeResult:
        cols = [FitColumn("a", "Alpha", 10), FitColumn("b", "Beta"), FitColumn("c", "Gamma ray", 30, 12)]
        yield FittedTable(cols)


async def test_a_fitted_table_drops_what_does_not_fit_whole_and_cuts_with_an_ellipsis() -> None:
    app = Fitted()
    async with app.run_test(size=(40, 10)) as pilot:
        table = app.query_one(FittedTable)
        table.set_rows([("r1", ["x" * 12, "beta", lambda w: "y" * 50])])
        await pilot.pause()
        # Alpha (10) + Beta (4) + Gamma's least (12), each padded: 32 of 40; Gamma grows to 20.
        assert table.shown_columns == ("a", "b", "c")
        row = [str(c) for c in table.get_row_at(0)]
        assert row == ["x" * 9 + "…", "beta", "y" * 19 + "…"]
        await pilot.resize_terminal(28, 10)
        await pilot.pause()
        assert table.shown_columns == ("a", "b")  # Gamma does not fit whole: not shown
        assert table.virtual_size.width <= table.size.width
