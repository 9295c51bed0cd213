"""A one-line time-series plot on a fixed scale (Textual's Sparkline rescales to min..max, which
makes 94-96% utilisation look like wild swings); missing samples show as gaps."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.widget import Widget

from tui.widgets.fleet_format import SPARK


def bucket_max(values: Sequence[float], width: int) -> list[float]:
    """``values`` squeezed (or left as is) into at most ``width`` points, keeping each bucket's
    maximum; a bucket with only missing samples stays NaN."""
    n = len(values)
    if n <= width:
        return list(values)
    out = []
    for i in range(width):
        chunk = [v for v in values[i * n // width : (i + 1) * n // width] if not math.isnan(v)]
        out.append(max(chunk) if chunk else math.nan)
    return out


class TimeSeriesPlot(Widget):
    """Newest sample on the right; the scale is ``lo``..``hi`` (set by the owner), not the data's.

    | Class | Description |
    | :- | :- |
    | `time-series-plot--bar` | The bars. |
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {"time-series-plot--bar"}

    DEFAULT_CSS = """
    TimeSeriesPlot {
        height: 1;
    }
    """

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._values: list[float] = []
        self._lo = 0.0
        self._hi = 100.0

    def set_series(self, values: Sequence[float], *, lo: float, hi: float) -> None:
        """Show ``values`` (oldest first, NaN = missing) on the scale ``lo``..``hi``."""
        self._values = list(values)
        self._lo, self._hi = lo, max(hi, lo + 1e-9)
        self.refresh()

    def render(self) -> Text:
        width = max(1, self.size.width)
        points = bucket_max(self._values, width)
        span = self._hi - self._lo
        chars = []
        for v in points:
            if math.isnan(v):
                chars.append(" ")
                continue
            i = int((min(max(v, self._lo), self._hi) - self._lo) / span * (len(SPARK) - 1) + 0.5)
            chars.append(SPARK[i])
        style = self.get_component_rich_style("time-series-plot--bar")
        return Text("".join(chars).rjust(width), style=style, no_wrap=True)
