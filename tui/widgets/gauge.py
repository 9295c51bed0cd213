"""A one-line labelled progress/usage bar."""

from __future__ import annotations

from typing import ClassVar, Literal

from rich.text import Text
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from backend.textfmt import safe_text

Level = Literal["ok", "warn", "over"]


class Gauge(Widget):
    """A labelled bar showing ``value`` out of ``total``, coloured by level.

    The level is ``ok`` below ``warn_at`` (a fraction of ``total``), ``warn`` from there, and
    ``over`` from ``over_at``; the widget carries the class ``-ok``, ``-warn`` or ``-over`` so
    stylesheets colour it through ``$gauge-ok``/``$gauge-warn``/``$gauge-over``. Used for GPU
    memory, disk fill, transfer progress and budget burn.

    | Class | Description |
    | :- | :- |
    | `gauge--label` | The label on the left. |
    | `gauge--bar` | The filled part of the bar. |
    | `gauge--empty` | The unfilled part of the bar. |
    | `gauge--text` | The value text on the right. |
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "gauge--label",
        "gauge--bar",
        "gauge--empty",
        "gauge--text",
    }

    BINDINGS: ClassVar[list] = []
    """A gauge is display-only: it has no key bindings."""

    DEFAULT_CSS = """
    Gauge {
        height: 1;
    }
    """

    value: reactive[float] = reactive(0.0)
    """The current amount."""
    total: reactive[float] = reactive(1.0)
    """The amount that means full (100%)."""
    text: reactive[str | None] = reactive(None)
    """Text shown after the bar; a percentage when None."""

    class LevelChanged(Message):
        """Posted when the gauge moves between ok, warn and over."""

        def __init__(self, gauge: Gauge, level: Level) -> None:
            self.gauge = gauge
            self.level: Level = level
            super().__init__()

        @property
        def control(self) -> Gauge:
            """The gauge that changed level (alias of `gauge`)."""
            return self.gauge

    def __init__(
        self,
        label: str = "",
        *,
        value: float = 0.0,
        total: float = 1.0,
        text: str | None = None,
        warn_at: float = 0.8,
        over_at: float = 1.0,
        label_width: int | None = None,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
        disabled: bool = False,
    ) -> None:
        """Create a gauge.

        Args:
            label: What is measured, shown on the left.
            value: The current amount.
            total: The amount that means full.
            text: Text after the bar (default: the percentage).
            warn_at: Fraction of `total` from which the gauge shows `warn`.
            over_at: Fraction of `total` from which the gauge shows `over`.
            label_width: Columns reserved for the label (default: its length), to align a column
                of gauges.
        """
        super().__init__(name=name, id=id, classes=classes, disabled=disabled)
        self.label = label
        self.warn_at = warn_at
        self.over_at = over_at
        self.label_width = label_width
        self._level: Level | None = None
        self.set_reactive(Gauge.value, float(value))
        self.set_reactive(Gauge.total, float(total))
        self.set_reactive(Gauge.text, text)
        self._apply_level(post=False)

    @property
    def fraction(self) -> float:
        """``value / total`` (0 when the total is not positive)."""
        return self.value / self.total if self.total > 0 else 0.0

    @property
    def level(self) -> Level:
        """``ok``, ``warn`` or ``over`` for the current fraction."""
        f = self.fraction
        if f >= self.over_at:
            return "over"
        if f >= self.warn_at:
            return "warn"
        return "ok"

    def update(self, *, value: float | None = None, total: float | None = None, text: str | None = None) -> None:
        """Change any of value, total and text at once (one repaint)."""
        if total is not None:
            self.total = float(total)
        if value is not None:
            self.value = float(value)
        if text is not None:
            self.text = text

    def _apply_level(self, *, post: bool = True) -> None:
        level = self.level
        if level == self._level:
            return
        self._level = level
        self.set_class(level == "ok", "-ok")
        self.set_class(level == "warn", "-warn")
        self.set_class(level == "over", "-over")
        if post:
            self.post_message(self.LevelChanged(self, level))

    def watch_value(self) -> None:
        self._apply_level()

    def watch_total(self) -> None:
        self._apply_level()

    def render(self) -> Text:
        width = self.content_size.width or 40
        label = safe_text(self.label, None)  # a store or site name: one printable line
        if self.label_width is not None:
            label = label[: self.label_width].ljust(self.label_width)
        tail = safe_text(self.text, None) if self.text is not None else f"{self.fraction * 100:5.1f}%"
        head = f"{label} " if label else ""
        bar_width = max(0, width - len(head) - len(tail) - 1)
        filled = round(min(max(self.fraction, 0.0), 1.0) * bar_width)
        out = Text(no_wrap=True, overflow="ellipsis")
        out.append(head, self.get_component_rich_style("gauge--label"))
        out.append("█" * filled, self.get_component_rich_style("gauge--bar"))
        out.append("░" * (bar_width - filled), self.get_component_rich_style("gauge--empty"))
        out.append(" " + tail if bar_width else tail, self.get_component_rich_style("gauge--text"))
        return out
