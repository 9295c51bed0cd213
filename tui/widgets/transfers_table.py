"""The Transfers screen's jobs table: one row per job, refreshed in place from backend snapshots."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rich.text import Text

from backend.ops.types import JobRecord
from backend.textfmt import safe_text
from backend.units import bytes_text, duration_text
from tui.widgets.table_cursor import cursor_row_key
from tui.widgets.table_fit import CellFor, FitColumn, FittedTable
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
#: shows the full source and destination; State fits "succeeded", "cancelled"); the others are as
#: wide as their widest cell. Source -> Destination takes what the others leave, down to WHAT_LEAST.
WIDTHS = {"id": 16, "state": 10, "what": 36, "progress": 31}
WHAT_LEAST = 16
#: Progress narrows before the route is dropped: its bar and percentage stay, the byte counts are
#: cut with "…" (the detail pane shows them whole), so long job ids or node names at 120 columns
#: do not cost the route and its Slurm tag.
PROGRESS_LEAST = 18
#: The Job column grows to the longest id shown (``<launch>.<n>``), up to this; never cut below it.
ID_MAX = 28

#: Most decisive first: on a narrow terminal the columns that give way (the last first: a column
#: that does not fit whole is not shown) are the path, the rates and the kind, never the node, the
#: job's id (``<launch>.<n>``: what ``job cancel`` takes, for the job or, its part before the dot,
#: the whole launch; shown whole), state or progress.
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


def fit_spec(id_width: int) -> list[FitColumn]:
    """The columns, the Job column ``id_width`` wide."""
    widths = {**WIDTHS, "id": id_width}
    least = {"id": id_width, "what": WHAT_LEAST, "progress": PROGRESS_LEAST}
    return [FitColumn(key, label, widths.get(key), least.get(key)) for key, label in COLUMNS]


def route_text(r: JobRecord, width: int) -> str:
    """``source -> destination`` in ``width`` cells, each path cut in the middle, after its Slurm
    job when it has one (kept whole: it leads); the label of a job without paths."""
    tag = f"slurm {safe_text(r.slurm_job, 24)} " if r.slurm_job else ""
    room = max(width - len(tag), 1)
    if not r.source:
        return tag + short(r.label or "-", room)
    side = max(3, (room - 4) // 2)
    return f"{tag}{short(r.source, side)} -> {short(r.destination, side)}"


class TransfersTable(FittedTable):
    """Jobs (node, id, state, progress bar, kind, ETA, Gbps, source -> destination); rows keyed by job id."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(fit_spec(WIDTHS["id"]), id=id, classes=classes, cursor_type="row", zebra_stripes=True)

    def update_records(self, records: Iterable[JobRecord], variables: Mapping[str, str] | None = None) -> None:
        """Show ``records`` (newest first), keeping the cursor on the same job."""
        variables = variables or {}
        recs = list(records)
        id_width = min(ID_MAX, max([WIDTHS["id"], *(len(r.id) for r in recs)]))
        self.set_rows([(r.id, self._cells(r, variables)) for r in recs], columns=fit_spec(id_width))

    @property
    def selected_job_id(self) -> str | None:
        """The job under the cursor, if any."""
        return cursor_row_key(self)

    @staticmethod
    def _cells(r: JobRecord, variables: Mapping[str, str]) -> list[CellFor]:
        p = r.progress
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
            lambda width: Text(route_text(r, width)),
        ]
