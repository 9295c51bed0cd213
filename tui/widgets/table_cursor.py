"""The row under a table's cursor, by key: filtered or re-sorted tables shift row indexes."""

from __future__ import annotations

from typing import Any

from textual.widgets import DataTable


def cursor_row_key(table: DataTable[Any]) -> str | None:
    """The key of the row under the cursor, or None for an empty table."""
    if table.row_count == 0:
        return None
    try:
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
    except Exception:  # noqa: BLE001 - the table shrank under the cursor
        return None
    return None if key is None else str(key)
