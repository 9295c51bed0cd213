"""Small reusable widgets for loadmaster screens (styles in ``themes/app.tcss``)."""

from tui.widgets.confirm import ConfirmModal, ConfirmTyped
from tui.widgets.gauge import Gauge
from tui.widgets.mode_bar import ModeBar
from tui.widgets.summary import Summary

__all__ = ["ConfirmModal", "ConfirmTyped", "Gauge", "ModeBar", "Summary"]
