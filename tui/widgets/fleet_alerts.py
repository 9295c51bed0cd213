"""The alert list: "GPU starved" events, active first, then recently cleared ones."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from rich.text import Text

from backend.ops.types import Alert
from tui.widgets.fleet_format import alert_cells
from tui.widgets.table_fit import FitColumn, FittedTable

# The decisive columns first: they give way from the last, so Node and Hint stay on screen at 80
# columns, and a column the width cannot hold whole is not shown (the Since and Status columns at
# 80); the GPUs (``0-7``) take what is left, cut with "…" when even that is short.
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
#: The narrowest a column may get (cells cut with "…" below their natural width).
LEAST = {"gpus": 7}


def _silence(row: tuple[str, ...], silenced: bool) -> tuple[str, ...]:
    return (*row[:-1], "silenced") if silenced and row[-1] == "active" else row


class AlertList(FittedTable):
    """Alerts as a table; rewritten only where an alert's visible text changed."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        columns = [FitColumn(key, label, width, LEAST.get(key)) for key, label, width in COLUMNS]
        super().__init__(columns, name=name, id=id, classes=classes, cursor_type="row")
        self._shown_rows: list[tuple[str, ...]] = []
        self._alert_style: str | None = None

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
        self.set_rows([(str(i), [self._cell(row, v) for v in row]) for i, row in enumerate(rows)])
        self._shown_rows = rows
        return True

    def _cell(self, row: tuple[str, ...], value: str) -> str | Text:
        if row[-1] == "active" and self._alert_style:
            return Text(value, style=self._alert_style)
        return value
