"""The Shards screen's conversions: a table of those started here, and the selected one in full.

A :class:`Conversion` is a snapshot of one conversion (in-process or a node job);
:func:`from_job_record` folds a ``shard`` job's record into one. :class:`ShardRuns` renders them:
one table row each, and under the table the selected one's progress bar, counters, paths and
manifest summary.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from backend.ops.shards import ShardProgress
from backend.units import bytes_text
from tui.widgets.plain import PlainStatic
from tui.widgets.summary import Summary
from tui.widgets.table_fit import CellFor, FitColumn, FittedTable
from tui.widgets.transfers_format import short

if TYPE_CHECKING:
    from backend.ops.types import JobRecord

#: The conversions table's columns, the decisive ones first (key, header): on a narrow terminal
#: the columns that give way (the last first; one that does not fit whole is not shown) are the
#: rates, never the state.
RUN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("state", "State"),
    ("shards", "Shards"),
    ("route", "Source -> destination"),
    ("where", "Where"),
    ("rate", "smp/s"),
    ("mbps", "MB/s"),
)
#: Source -> destination is cut to this width (each path in the middle), down to ROUTE_LEAST where
#: the rates would not fit beside it; the full paths are shown under the table for the selected
#: conversion.
ROUTE_WIDTH = 36
ROUTE_LEAST = 16
#: Fixed widths: State fits its longest word ("succeeded", "cancelled") from the start.
COLUMN_WIDTHS = {"route": ROUTE_WIDTH, "state": 9}
FIT_COLUMNS = tuple(
    FitColumn(key, label, COLUMN_WIDTHS.get(key), ROUTE_LEAST if key == "route" else None) for key, label in RUN_COLUMNS
)


def route_text(conv: Conversion, width: int) -> str:
    """``source -> destination`` in ``width`` cells, both paths keeping their ends."""
    half = max(3, (width - 4) // 2)
    return f"{short(conv.src, half)} -> {short(conv.dest, half)}"


@dataclass(frozen=True)
class Conversion:
    """One conversion started from this console (a snapshot the table renders)."""

    key: str
    src: str
    dest: str
    where: str
    state: str = "running"  # running | succeeded | failed | cancelled
    progress: ShardProgress | None = None
    fraction: float | None = None
    detail: str = ""
    summary: str = ""
    job_id: str | None = None
    started: float = field(default_factory=time.time)


def from_job_record(conv: Conversion, rec: JobRecord) -> Conversion:
    """``conv`` (a node job's conversion) with the progress of ``rec``, and its outcome once it ended."""
    prog = rec.progress
    if prog is not None:
        ex = prog.extra
        conv = replace(
            conv,
            fraction=prog.fraction,
            progress=ShardProgress(
                prog.items_done,
                prog.items_total or 0,
                prog.bytes_done,
                prog.bytes_total or 0,
                int(ex.get("shards_done", 0)),
                int(ex.get("shards_total", 0)),
                0.0,
                float(ex.get("samples_per_s", 0.0)),
                float(ex.get("mb_per_s", 0.0)),
            ),
        )
    if not rec.terminal:
        return conv
    res = rec.result or {}
    summary = ""
    if rec.state == "succeeded" and res:
        r = res.get("requests", {})
        summary = (
            f"{res.get('shards', 0):,} shards, {res.get('samples', 0):,} samples, "
            f"{bytes_text(res.get('bytes', 0))}\nGETs per epoch {r.get('gets_before', 0):,} -> "
            f"{r.get('gets_after', 0):,} ({r.get('reduction', 0):,.0f}x fewer)"
        )
    return replace(conv, state=rec.state, detail=rec.error or f"job {rec.id}", summary=summary)


def progress_fields(p: ShardProgress) -> list[tuple[str, str]]:
    """A conversion's counters as (label, value): samples, shards and bytes done of all."""
    return [
        ("samples", f"{p.samples_done:,}/{p.samples_total:,}"),
        ("shards", f"{p.shards_done}/{p.shards_total}"),
        ("bytes", f"{bytes_text(p.bytes_done)}/{bytes_text(p.bytes_total)}"),
    ]


class ShardRuns(Vertical):
    """The conversions table (rows keyed by conversion key) and the selected conversion under it."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        #: The conversions in the table, in order.
        self._rows: dict[str, Conversion] = {}

    def compose(self) -> ComposeResult:
        yield PlainStatic("Conversions", id="shards-runs-title")
        yield FittedTable(FIT_COLUMNS, id="shards-table", cursor_type="row", zebra_stripes=True)
        yield ProgressBar(id="shards-progress", total=1.0, show_eta=False)
        yield Summary(id="shards-run-summary")
        yield PlainStatic("", id="shards-manifest")

    def on_mount(self) -> None:
        # No bar until a conversion is shown: an empty screen's "0%" would read as a stalled run.
        self.query_one("#shards-progress", ProgressBar).display = False

    @property
    def table(self) -> FittedTable:
        return self.query_one("#shards-table", FittedTable)

    def show_row(self, conv: Conversion, *, visible: bool) -> None:
        """Add, update or (when ``visible`` is false) remove ``conv``'s row."""
        if visible:
            self._rows[conv.key] = conv
        elif self._rows.pop(conv.key, None) is None:
            return
        self._show()

    def show_rows(self, convs: Iterable[Conversion]) -> None:
        """Exactly ``convs`` in the table, in order."""
        self._rows = {conv.key: conv for conv in convs}
        with self.app.batch_update():
            self._show()

    def _show(self) -> None:
        self.table.set_rows([(key, self._cells(conv)) for key, conv in self._rows.items()])

    @staticmethod
    def _cells(conv: Conversion) -> list[CellFor]:
        p = conv.progress
        cells: dict[str, CellFor] = {
            "state": conv.state,
            "shards": f"{p.shards_done}/{p.shards_total}" if p else "",
            "route": lambda width: route_text(conv, width),
            "where": conv.where,
            "rate": f"{p.samples_per_s:,.0f}" if p else "",
            "mbps": f"{p.mb_per_s:,.1f}" if p else "",
        }
        return [cells[k] for k, _ in RUN_COLUMNS]

    def show_selected(self, conv: Conversion) -> None:
        """``conv`` under the table: progress bar, counters, paths, detail and manifest summary."""
        bar = self.query_one("#shards-progress", ProgressBar)
        bar.display = True
        bar.update(total=1.0, progress=conv.fraction or (1.0 if conv.state == "succeeded" else 0.0))
        p = conv.progress
        items: list[tuple[str, object]] = [("state", conv.state)]
        if p is not None:
            items += [*progress_fields(p), ("samples/s", f"{p.samples_per_s:,.0f}"), ("MB/s", f"{p.mb_per_s:,.1f}")]
        self.query_one("#shards-run-summary", Summary).set_items(items)
        box = self.query_one("#shards-manifest", Static)
        box.update("\n".join(x for x in (f"{conv.src} -> {conv.dest}", conv.detail, conv.summary) if x))
        box.set_class(conv.state == "failed", "-failed")
        box.set_class(conv.state == "succeeded", "-succeeded")
