"""The Slurm jobs screen (``J`` on Fleet): running and pending jobs, their nodes, GPUs and reasons.

One row per job, and one per array task: ``squeue --json`` collapses an array's pending tasks into
one record (``123_[4-7]``), so the screen lists each task itself (:func:`array_rows`). Running
jobs first, then pending; the highlighted job's nodes with the GPU indices it holds on each, and
why it waits, below the table. ``enter`` filters Fleet to the job's nodes (``job:N``), ``T``
triages it (the app's triage key reads :meth:`SlurmJobsScreen.triage_target`), ``/`` filters the
rows, ``r`` reads Slurm again. Without ``[slurm] enabled`` the screen says how to enable it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static

from backend.errors import LoadmasterError
from backend.ops.types import HOLDING_JOB_STATES, SlurmSettings
from backend.textfmt import safe_text
from backend.units import duration_text
from tui.screens.base import console_ops
from tui.widgets.plain import PlainStatic, PlainTable
from tui.widgets.text_filter import text_matches
from tui.widgets.transfers_format import short

if TYPE_CHECKING:
    from backend.ops.types import SlurmJob
    from backend.services import Services

#: Most tasks one collapsed array record is listed as (the rest is one "... more" row).
MAX_TASKS = 1000


@dataclass(frozen=True)
class JobRow:
    """One line of the screen: a job or one array task."""

    job_id: str
    state: str
    user: str
    name: str
    elapsed_s: float | None
    nodes: tuple[str, ...]
    #: node -> GPU indices held there.
    gpus: tuple[tuple[str, tuple[int, ...]], ...]
    reason: str

    @property
    def gpu_count(self) -> int:
        return sum(len(idx) for _n, idx in self.gpus)

    @property
    def running(self) -> bool:
        """Whether the job holds its nodes now (the one definition: ``SlurmJob.holds_nodes``)."""
        return self.state in HOLDING_JOB_STATES


def task_ids(spec: str, limit: int = MAX_TASKS) -> tuple[list[str], int]:
    """Slurm's array task string (``4-7``, ``1-9:2``, ``1,3,5-7``, ``0-99%4``) -> the task ids (at
    most ``limit``) and how many more there are; ValueError on text that is not one."""
    spec = spec.split("%", 1)[0].strip()
    if not spec:
        raise ValueError("empty array task string")
    out: list[str] = []
    more = 0
    for part in spec.split(","):
        rng, _, step_text = part.partition(":")
        lo_text, dash, hi_text = rng.partition("-")
        for t in (lo_text, hi_text if dash else "0", step_text or "1"):
            if not (t.isascii() and t.isdigit()):
                raise ValueError(f"unreadable array task string {spec[:40]!r}")
        lo = int(lo_text)
        hi = int(hi_text) if dash else lo
        step = int(step_text or "1")
        if step < 1 or hi < lo:
            raise ValueError(f"unreadable array task string {spec[:40]!r}")
        count = (hi - lo) // step + 1
        room = max(0, limit - len(out))
        out.extend(str(i) for i in range(lo, lo + step * min(count, room), step))
        more += max(0, count - room)
    return out, more


def array_rows(job: SlurmJob, now: float) -> list[JobRow]:
    """A job as rows: itself, or each task of a collapsed array record (``123_[4-7]``)."""
    base = JobRow(
        job_id=job.job_id,
        state=job.state,
        user=safe_text(job.user, 64),
        name=safe_text(job.name, 128),
        elapsed_s=job.elapsed(now),
        nodes=job.nodes,
        gpus=job.gpus,
        reason=safe_text(job.reason, 128),
    )
    parent = job.array_job_id
    if parent is None or job.array_task_id is not None or not job.job_id.endswith("]"):
        return [base]
    spec = job.job_id[len(parent) + 2 : -1]
    try:
        ids, more = task_ids(spec)
    except ValueError:
        return [base]
    rows = [JobRow(f"{parent}_{t}", base.state, base.user, base.name, None, (), (), base.reason) for t in ids]
    if more:
        rows.append(JobRow(f"{parent}_[+{more}]", base.state, base.user, base.name, None, (), (), base.reason))
    return rows


#: States of a job that has ended (``squeue --json`` of 22.05 lists them for a while): not shown.
ENDED = frozenset(
    {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
)


def job_rows(jobs: list[SlurmJob], now: float | None = None) -> list[JobRow]:
    """Every job and array task not ended, running first (longest running on top), then pending."""
    t = time.time() if now is None else now
    rows = [r for j in jobs if j.state not in ENDED for r in array_rows(j, t)]

    def key(r: JobRow) -> tuple[int, float, str]:
        return (0 if r.running else 1, -(r.elapsed_s or 0.0), r.job_id)

    return sorted(rows, key=key)


HEADERS = ("job", "state", "user", "name", "elapsed", "nodes", "gpus", "reason")
#: Columns that give way when the table is too wide, in order, and the narrowest each may get
#: (node lists first: the detail line below the table lists them whole).
SHRINK = ((5, 16), (3, 12), (7, 12), (2, 8), (0, 10), (5, 9), (3, 8))


def row_cells(r: JobRow) -> list[str]:
    return [
        r.job_id,
        r.state.lower(),
        r.user,
        r.name or "-",
        duration_text(r.elapsed_s) if r.running else "-",
        nodes_text(r),
        str(r.gpu_count) if r.gpu_count else "-",
        r.reason if not r.running and r.reason else "-",
    ]


def fit_cells(rows: list[list[str]], width: int) -> list[list[str]]:
    """Cut columns (nodes, name, reason, user, job id: :data:`SHRINK`) until the table fits ``width``
    (a DataTable pads each column by one each side)."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(HEADERS)]
    over = sum(w + 2 for w in widths) + 1 - width
    for col, least in SHRINK:
        if over <= 0:
            break
        cut = min(over, max(0, widths[col] - max(least, len(HEADERS[col]))))
        widths[col] -= cut
        over -= cut
    return [[clip(c, w, i in (3, 7)) for i, (c, w) in enumerate(zip(r, widths, strict=True))] for r in rows]


def clip(text: str, width: int, tail: bool) -> str:
    """Text to ``width``: its end cut (names, reasons) or its middle (ids, node lists)."""
    if not tail:
        return short(text, width)
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def nodes_text(row: JobRow) -> str:
    return ",".join(row.nodes) or "-"


def detail_text(row: JobRow) -> str:
    """The highlighted job: its nodes with the GPU indices on each, or why it waits."""
    held = dict(row.gpus)
    where = ", ".join(
        f"{n} GPU {','.join(str(i) for i in held[n])}" if held.get(n) else f"{n} (no GPU index known)"
        for n in row.nodes
    )
    head = f"job {row.job_id} ({row.user}, {row.name or '-'}) {row.state.lower()}"
    if row.running:
        return f"{head} {duration_text(row.elapsed_s)} on {where or 'no node'}\nenter: its nodes in Fleet · T: triage"
    return f"{head}: waits for {row.reason or 'no reason given'}\nT: triage"


class SlurmJobsScreen(Screen[str | None]):
    """Slurm's running and pending jobs; dismissed with a job id to filter Fleet to its nodes."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Back"),
        Binding("enter", "nodes", "Its nodes in Fleet"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("r", "reload", "Reload"),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | enter | Back to Fleet, filtered to the selected job's nodes (job:N). |
    | T | Triage the selected job (suspects, evidence, exact commands). |
    | / | Filter jobs by id, user, name, state, node or reason. |
    | r | Read Slurm again (squeue, at most once per [slurm] interval otherwise). |
    | escape | Leave the filter, or back to Fleet. |
    """

    def __init__(self, services: Services) -> None:
        super().__init__()
        self.services = services
        self.rows: list[JobRow] = []
        #: The rows on screen (after the filter), in table order.
        self.shown: list[JobRow] = []
        self.filter_text = ""

    @property
    def enabled(self) -> bool:
        return bool(self.services.config.section(SlurmSettings).enabled)

    def compose(self) -> ComposeResult:
        yield Header()
        yield PlainStatic("reading Slurm's jobs...", id="slurm-jobs-status")
        box = Input(placeholder="filter: id, user, name, state, node, reason", id="slurm-jobs-filter", compact=True)
        box.display = False
        yield box
        yield PlainTable(cursor_type="row", zebra_stripes=True, id="slurm-jobs-table")
        detail = PlainStatic("", id="slurm-jobs-detail")
        detail.styles.height = 2
        yield detail
        yield Footer()

    def on_mount(self) -> None:
        self.title = "Slurm jobs"
        table = self.query_one(DataTable)
        table.styles.height = "1fr"
        if not self.enabled:
            table.display = False
            self.query_one("#slurm-jobs-status", Static).update(
                "Slurm is not enabled: add [slurm] enabled = true to the config (README, Slurm)"
            )
            return
        self._read(fresh=False)

    # -- reading -----------------------------------------------------------------------------------

    @work(exclusive=True, group="slurm-jobs", exit_on_error=False)
    async def _read(self, fresh: bool) -> None:
        try:
            jobs = await console_ops(self).slurm.jobs(fresh=fresh)
        except LoadmasterError as exc:
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            self.query_one("#slurm-jobs-status", Static).update(f"cannot read Slurm's jobs: {safe_text(first, 200)}")
            return
        self.rows = job_rows(jobs)
        self._show()

    def _show(self) -> None:
        table = self.query_one(DataTable)
        keep = self.selected()
        table.clear(columns=True)
        width = self.size.width or self.app.size.width
        table.add_columns("job", "state", "user", "name", "elapsed", "nodes", "gpus", "reason")
        self.shown = [
            r
            for r in self.rows
            if not self.filter_text
            or text_matches(self.filter_text, r.job_id, r.user, r.name, r.state, r.reason, *r.nodes)
        ]
        for r, cells in zip(self.shown, fit_cells([row_cells(r) for r in self.shown], width), strict=True):
            table.add_row(*cells, key=r.job_id)
        running = sum(1 for r in self.rows if r.running)
        pending = sum(1 for r in self.rows if r.state == "PENDING")
        line = f"{running} running, {pending} pending"
        if self.filter_text:
            line += f" · {len(self.shown)} match {self.filter_text!r}"
        self.query_one("#slurm-jobs-status", Static).update(line + " · enter: its nodes in Fleet · T: triage")
        if keep is not None and keep in [r.job_id for r in self.shown]:
            table.move_cursor(row=[r.job_id for r in self.shown].index(keep))
        self._detail()
        if self.shown and not (isinstance(self.focused, Input) and self.focused.display):
            table.focus()

    def _detail(self) -> None:
        row = self.selected_row()
        self.query_one("#slurm-jobs-detail", Static).update(detail_text(row) if row else "")

    @on(DataTable.RowHighlighted)
    def _highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self._detail()

    @on(DataTable.RowSelected)
    def _selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_nodes()

    # -- selection ---------------------------------------------------------------------------------

    def selected_row(self) -> JobRow | None:
        table = self.query_one(DataTable)
        i = table.cursor_row
        return self.shown[i] if table.row_count and 0 <= i < len(self.shown) else None

    def selected(self) -> str | None:
        row = self.selected_row()
        return row.job_id if row else None

    def triage_target(self) -> dict[str, str] | None:
        """The app's triage key (``T``): the selected job."""
        job = self.selected()
        return {"job": job} if job and "[" not in job else None

    # -- actions -----------------------------------------------------------------------------------

    def action_nodes(self) -> None:
        """Back to Fleet, filtered to the selected job's nodes."""
        row = self.selected_row()
        if row is None:
            return
        if not row.nodes:
            self.notify(f"job {row.job_id} has no nodes yet ({row.state.lower()})", severity="warning", markup=False)
            return
        self.dismiss(row.job_id)

    def action_reload(self) -> None:
        if self.enabled:
            self._read(fresh=True)

    def action_filter(self) -> None:
        box = self.query_one("#slurm-jobs-filter", Input)
        box.display = True
        box.focus()

    @on(Input.Changed, "#slurm-jobs-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        event.stop()
        if event.value.strip() != self.filter_text:
            self.filter_text = event.value.strip()
            self._show()

    @on(Input.Submitted, "#slurm-jobs-filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if not event.value.strip():
            event.input.display = False
        self.query_one(DataTable).focus()

    def action_close(self) -> None:
        box = self.query_one("#slurm-jobs-filter", Input)
        if box.display and (self.focused is box or self.filter_text):
            box.value = ""
            box.display = False
            self.query_one(DataTable).focus()
            return
        self.dismiss(None)
