"""What a table shows at the screen's edge: its header as on screen, and whether a column runs past
the edge (a DataTable wider than its widget scrolls sideways, and the edge cuts a header to ``ET``)."""

from __future__ import annotations

import re
from typing import Any

from tests.firsthour.screen_text import screen_lines


def table_lines(app: Any, table: Any) -> list[str]:
    """The table's lines as the screen shows them (its header first), within its region."""
    region = table.region
    return [line[region.x : region.right] for line in screen_lines(app)[region.y : region.bottom]]


def header_on_screen(app: Any, table: Any) -> list[str]:
    """The table's header labels as the screen shows them."""
    line = table_lines(app, table)[0]
    return [h.removesuffix(" ▲").removesuffix(" ▼") for h in re.split(r"\s{2,}", line.strip()) if h]


def cut_at_edge(app: Any, table: Any) -> list[str]:
    """The columns the table's right edge cuts (shown in part: their header or cells read as
    whole when they are not), and a header shown in part."""
    labels = [str(c.label).removesuffix(" ▲").removesuffix(" ▼") for c in table.ordered_columns]
    problems = [f"header {h!r} is not whole" for h in header_on_screen(app, table) if h not in labels]
    room = table.scrollable_content_region.width
    start = 0
    for column, label in zip(table.ordered_columns, labels, strict=True):
        end = start + column.get_render_width(table)
        if start < room < end:
            problems.append(f"{label!r} cut at {room - start} of {end - start} cells")
        start = end
    return problems
