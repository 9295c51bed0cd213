"""The Transfers screen's jobs table: one row per job, refreshed in place from backend snapshots."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rich.text import Text
from textual.widgets import DataTable

from backend.ops.types import JobRecord
from backend.textfmt import safe_text
from backend.units import bytes_text, duration_text
from tui.widgets.table_cursor import cursor_row_key
from tui.widgets.transfers_format import bar, short

#: Theme variable per job state (cells are coloured by meaning, never by literal colour).
STATE_STYLE = {
    "starting": "job-running",
    "running": "job-running",
    "cancelling": "warning",
    "succeeded": "job-succeeded",
    "failed": "job-failed",
    "lost": "job-failed",
    "cancelled": "job-failed",
}

#: Fixed widths where content would otherwise push the live columns off screen (the detail pane
#: shows the full source and destination).
WIDTHS = {"id": 16, "state": 10, "what": 36, "progress": 31}  # state: "succeeded", "cancelled"
#: The Job column grows to the longest id shown (``<launch>.<n>``), up to this; never cut below it.
ID_MAX = 28

#: Most decisive first: on a narrow terminal the columns that scroll off are the rates and the long
#: path, never the node, the job's id (``<launch>.<n>``: what ``job cancel`` takes, for the job or,
#: its part before the dot, the whole launch; shown whole), state or progress.
COLUMNS = (
    ("node", "Node"),
    ("id", "Job"),
    ("state", "State"),
    ("progress", "Progress"),
    ("kind", "Kind"),
    ("eta", "ETA"),
    ("gbps", "Gbps"),
    ("what", "Source -> Destination"),
)


class TransfersTable(DataTable[Text]):
    """Jobs (node, id, state, progress bar, kind, ETA, Gbps, source -> destination); rows keyed by job id."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        self._id_width = WIDTHS["id"]

    def on_mount(self) -> None:
        self._add_columns(WIDTHS["id"])

    def _add_columns(self, id_width: int) -> None:
        self._id_width = id_width
        for key, label in COLUMNS:
            self.add_column(label, key=key, width=id_width if key == "id" else WIDTHS.get(key))

    def update_records(self, records: Iterable[JobRecord], variables: Mapping[str, str] | None = None) -> None:
        """Show ``records`` (newest first), keeping the cursor on the same job."""
        variables = variables or {}
        recs = list(records)
        selected = self.selected_job_id
        wanted = [r.id for r in recs]
        existing = [str(k.value) for k in self.rows]
        id_width = min(ID_MAX, max([WIDTHS["id"], *(len(i) for i in wanted)]))
        if id_width != self._id_width:
            self.clear(columns=True)
            self._add_columns(id_width)
            existing = []
        if existing != wanted:
            self.clear()
            for r in recs:
                self.add_row(*self._cells(r, variables), key=r.id)
            if selected in wanted:
                self.move_cursor(row=wanted.index(selected))
            return
        for r in recs:
            for (key, _label), cell in zip(COLUMNS, self._cells(r, variables), strict=True):
                self.update_cell(r.id, key, cell)

    @property
    def selected_job_id(self) -> str | None:
        """The job under the cursor, if any."""
        return cursor_row_key(self)

    @staticmethod
    def _cells(r: JobRecord, variables: Mapping[str, str]) -> list[Text]:
        p = r.progress
        what = f"{short(r.source, 16)} -> {short(r.destination, 16)}" if r.source else short(r.label or "-", 36)
        if r.slurm_job:  # the Slurm job the pull is for leads (the detail pane has the paths whole)
            tag = f"slurm {safe_text(r.slurm_job, 24)} "
            side = max(6, (36 - len(tag) - 4) // 2)
            rest = f"{short(r.source, side)} -> {short(r.destination, side)}" if r.source else r.label or "-"
            what = short(tag + rest, 36)
        frac = p.fraction if p else None
        prog = Text(bar(frac, 8))
        if p is not None:
            prog.append(f" {bytes_text(p.bytes_done)}/{bytes_text(p.bytes_total)}")
        live = r.state in ("running", "cancelling")
        gbps = f"{p.gbps:.2f}" if p is not None and p.gbps is not None and live else "-"
        eta = duration_text(p.eta_s) if p is not None and live else "-"
        state = r.state + (" ?" if r.note else "")
        style = variables.get(STATE_STYLE.get(r.state, ""), "")
        return [
            Text(r.node),
            Text(r.id),
            Text(state, style=style),
            prog,
            Text(r.kind),
            Text(eta, justify="right"),
            Text(gbps, justify="right"),
            Text(what, overflow="ellipsis"),
        ]
