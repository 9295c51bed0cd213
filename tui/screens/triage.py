"""The Triage screen: a job's (or some nodes') suspects, ranked, with the evidence behind each and
the commands to exclude, drain and resume, shown and never run (``loadmaster triage``'s answer).

Opened with the job, the nodes or the run it is about (from a node, a job or an alert); ``r``
reads every node again. Nothing here changes anything.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from backend.errors import LoadmasterError

if TYPE_CHECKING:
    from backend.services import Services
    from backend.triage.analyze import TriageReport


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%m-%d %H:%M:%SZ") if t is not None else "?"


class TriageScreen(Screen[None]):
    """Suspects ranked, the highlighted one's evidence, the commands (shown, not run)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Back"),
        Binding("r", "reload", "Read again"),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | escape | Back to the screen you came from. |
    | r | Read every node again. |
    """

    def __init__(
        self,
        services: Services,
        *,
        job: str | None = None,
        nodes: str | None = None,
        run: str | None = None,
    ) -> None:
        super().__init__()
        self.services = services
        self.job, self.nodes, self.run = job, nodes, run
        self.report: TriageReport | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("reading the nodes...", id="triage-status", markup=False)
        yield DataTable(cursor_type="row", zebra_stripes=True, id="triage-table")
        yield Static("", id="triage-evidence", markup=False)
        yield Static("", id="triage-commands", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"Triage: job {self.job}" if self.job else f"Triage: {self.nodes}"
        self.query_one(DataTable).add_columns("#", "node", "GPUs", "evidence", "since")
        self.action_reload()

    @work(exclusive=True, group="triage", exit_on_error=False)
    async def _read(self) -> None:
        try:
            report = await self.services.ops.triage.run(
                job=self.job, nodes=[self.nodes] if self.nodes is not None else None, run=self.run
            )
        except LoadmasterError as exc:
            self.query_one("#triage-status", Static).update(f"cannot triage: {exc}")
            return
        self._loaded(report)

    def _loaded(self, report: TriageReport) -> None:
        from backend.textfmt import safe_text

        self.report = report
        table = self.query_one(DataTable)
        table.clear()
        for rank, s in enumerate(report.suspects, 1):
            kinds = ", ".join(dict.fromkeys(e.kind for e in s.evidence))
            gpus = ",".join(map(str, s.gpus)) or "-"
            table.add_row(str(rank), s.node, gpus, kinds, _when(s.since), key=s.node)
        down = sum(1 for n in report.nodes if not n.reachable)
        status = f"{len(report.nodes)} node(s) read, {down} not answering: "
        status += f"{len(report.suspects)} suspect(s)" if report.suspects else "no suspects"
        if report.notes:
            status += f" · {len(report.notes)} note(s): {safe_text(report.notes[0], 100)}"
        self.query_one("#triage-status", Static).update(status)
        lines = ["commands (shown, not run):", *(f"  {c}" for c in report.commands)] if report.commands else []
        if report.checkpoint is not None:
            from backend.triage.restart import restart_lines

            lines.extend(restart_lines(report.checkpoint))
        self.query_one("#triage-commands", Static).update("\n".join(lines))
        self._show(0)
        if report.suspects:
            table.focus()

    def _show(self, index: int) -> None:
        from backend.textfmt import safe_text

        text = ""
        if self.report is not None and 0 <= index < len(self.report.suspects):
            s = self.report.suspects[index]
            text = "\n".join(f"{e.kind}: {safe_text(e.detail, 160)} (since {_when(e.since)})" for e in s.evidence)
        self.query_one("#triage-evidence", Static).update(text)

    @on(DataTable.RowHighlighted)
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show(event.cursor_row)

    def action_reload(self) -> None:
        self.query_one("#triage-status", Static).update("reading the nodes...")
        self._read()

    def action_close(self) -> None:
        self.dismiss(None)
