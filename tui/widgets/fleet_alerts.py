"""The alert list: "GPU starved" events, active first, then recently cleared ones."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from rich.text import Text
from textual.coordinate import Coordinate
from textual.widgets import DataTable

from backend.ops.types import Alert
from tui.widgets.fleet_format import alert_cells

# The decisive columns first, so Node and Hint stay on screen at 80 columns.
COLUMNS = (
    ("node", "Node", 12),
    ("hint", "Hint", 17),
    ("for", "For", 6),
    ("util", "Util", 5),
    ("nic", "NIC rx Gbps (%)", 15),
    ("gpus", "GPUs", 15),
    ("since", "Since", 8),
    ("status", "Status", 8),
)


def _silence(row: tuple[str, ...], silenced: bool) -> tuple[str, ...]:
    return (*row[:-1], "silenced") if silenced and row[-1] == "active" else row


class AlertList(DataTable[Any]):
    """Alerts as a table; rebuilt only when an alert's visible text changed."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes, cursor_type="row")
        self._shown_rows: list[tuple[str, ...]] = []
        self._alert_style: str | None = None

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            self.add_column(label, key=key, width=width)

    def set_style(self, style: str | None) -> None:
        self._alert_style = style
        self._shown_rows = []

    def show(self, alerts: Sequence[Alert], *, silenced: Collection[str] = ()) -> bool:
        """Apply the alert list; returns whether anything changed.

        ``silenced``: nodes whose GPUStarved page Alertmanager holds back (their status says so).
        """
        rows = [_silence(alert_cells(a), a.node in silenced) for a in alerts]
        if rows == self._shown_rows:
            return False
        if len(rows) == len(self._shown_rows):
            for r, (old, new) in enumerate(zip(self._shown_rows, rows, strict=True)):
                for c, (a, b) in enumerate(zip(old, new, strict=True)):
                    if a != b:
                        self.update_cell_at(Coordinate(r, c), self._cell(new, b))
        else:
            self.clear()
            for row in rows:
                self.add_row(*(self._cell(row, v) for v in row))
        self._shown_rows = rows
        return True

    def _cell(self, row: tuple[str, ...], value: str) -> Any:
        if row[-1] == "active" and self._alert_style:
            return Text(value, style=self._alert_style)
        return value
