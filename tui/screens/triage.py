"""The Triage screen: a job's (or some nodes') suspects, ranked, with the evidence behind each,
the commands to exclude, drain and resume (shown and never run), the restart point and the run's
goodput (``loadmaster triage``'s answer).

Opened from a node (Fleet, node detail), an alert or a Slurm job with what it is about
(``LoadmasterApp.open_triage``); opened with nothing, it asks for a job ID or a node list. ``r``
reads every node again; ``S`` stages the restart (``loadmaster restage``) after a confirmation.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static

from backend.errors import LoadmasterError
from tui.screens.base import console_ops
from tui.widgets.plain import PlainStatic, PlainTable

if TYPE_CHECKING:
    from backend.ops.triage import TriageReport
    from backend.services import Services

#: A Slurm job ID (or an array task) as typed in the ask box; anything else is a node list.
_JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%m-%d %H:%M:%SZ") if t is not None else "?"


class TriageScreen(Screen[None]):
    """Suspects ranked, the commands (shown, not run), the highlighted one's evidence, goodput."""

    SCREEN_TITLE: ClassVar[str] = "Triage"
    DEFAULT_CSS = """
    TriageScreen #triage-body { height: 1fr; }
    TriageScreen #triage-table { height: auto; max-height: 7; }
    TriageScreen Static { height: auto; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Back"),
        Binding("r", "reload", "Read again"),
        Binding("S", "restage", "Restage"),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | escape | Back to the screen you came from. |
    | r | Read every node again. |
    | S | Stage the restart: pull the newest proven step once, relay it to the nodes that pass (asks first; needs a run). |
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
        yield Input(placeholder="Slurm job ID or nodes (node-[01-04]), enter to triage", id="triage-ask")
        with VerticalScroll(id="triage-body"):
            yield PlainStatic("reading the nodes...", id="triage-status")
            yield PlainTable(cursor_type="row", zebra_stripes=True, id="triage-table")
            yield PlainStatic("", id="triage-commands")
            yield PlainStatic("", id="triage-evidence")
            yield PlainStatic("", id="triage-restart")
            yield PlainStatic("", id="triage-goodput")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("#", "node", "GPUs", "evidence", "since")
        ask = self.query_one("#triage-ask", Input)
        if self.job is None and self.nodes is None:
            self.title = "Triage"
            ask.focus()
            self.query_one("#triage-status", Static).update("name a Slurm job or nodes above")
            return
        # Hidden, and never holding the focus (it would swallow the screen's keys).
        ask.display = False
        self.query_one("#triage-body", VerticalScroll).focus()
        self.action_reload()

    @on(Input.Submitted, "#triage-ask")
    def _asked(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip()
        if not text:
            return
        self.job, self.nodes = (text, None) if _JOB_ID.match(text) else (None, text)
        event.input.display = False
        self.query_one("#triage-body", VerticalScroll).focus()
        self.action_reload()

    @work(exclusive=True, group="triage", exit_on_error=False)
    async def _read(self) -> None:
        try:
            report = await console_ops(self).triage.run(
                job=self.job, nodes=[self.nodes] if self.nodes is not None else None, run=self.run
            )
        except LoadmasterError as exc:
            self.query_one("#triage-status", Static).update(f"cannot triage: {exc}")
            return
        self._loaded(report)

    def _loaded(self, report: TriageReport) -> None:
        from backend.textfmt import gpu_ranges, safe_text

        self.report = report
        table = self.query_one(DataTable)
        table.clear()
        for rank, s in enumerate(report.suspects, 1):
            kinds = ", ".join(dict.fromkeys(e.kind for e in s.evidence))
            gpus = gpu_ranges(s.gpus) or "-"
            table.add_row(str(rank), s.node, gpus, kinds, _when(s.since), key=s.node)
        down = sum(1 for n in report.nodes if not n.reachable)
        status = f"{len(report.nodes)} node(s) read, {down} not answering: "
        status += f"{len(report.suspects)} suspect(s)" if report.suspects else "no suspects"
        if report.notes:
            status += f" · {len(report.notes)} note(s): {safe_text(report.notes[0], 100)}"
        self.query_one("#triage-status", Static).update(status)
        table.display = bool(report.suspects)
        lines = ["commands (shown, not run):", *(f"  {c}" for c in report.commands)] if report.commands else []
        self.query_one("#triage-commands", Static).update("\n".join(lines))
        restart: list[str] = []
        if report.checkpoint is not None:
            from backend.ops.triage import restart_lines

            restart = restart_lines(report.checkpoint)
        self.query_one("#triage-restart", Static).update("\n".join(restart))
        good: list[str] = []
        if report.goodput is not None:
            from backend.ops.triage import goodput_lines

            good = goodput_lines(report.goodput)
        self.query_one("#triage-goodput", Static).update("\n".join(good))
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
        if self.job is None and self.nodes is None:
            return
        from backend.textfmt import safe_text

        # the job or nodes may come from an alert's labels: one printable line in the header
        self.title = safe_text(f"Triage: job {self.job}" if self.job else f"Triage: {self.nodes}", 200)
        self.query_one("#triage-status", Static).update("reading the nodes...")
        self._read()

    # -- stage the restart ---------------------------------------------------------------------

    def resuming_nodes(self) -> list[str]:
        """The nodes read that answered and are not suspects: the ones that will resume."""
        if self.report is None:
            return []
        accused = {s.node for s in self.report.suspects}
        return [n.node for n in self.report.nodes if n.node not in accused and n.reachable and n.read]

    def action_restage(self) -> None:
        if self.run is None:
            self.notify("no run to restage: open triage with a run (--run URL)", severity="warning")
            return
        nodes = self.resuming_nodes()
        if not nodes:
            self.notify("no node passes: nothing to restage to", severity="warning")
            return
        if self.services.readonly:
            self.notify("read-only mode: cannot restage a run (drop --readonly)", severity="error")
            return
        self._restage(",".join(nodes))

    @work(exclusive=True, group="triage-restage", exit_on_error=False)
    async def _restage(self, nodes: str) -> None:
        from backend.textfmt import safe_text
        from tui.widgets.confirm import ConfirmModal

        out = self.query_one("#triage-restart", Static)
        assert self.run is not None
        try:
            plan = await console_ops(self).triage.restage_plan(self.run, nodes)
        except LoadmasterError as exc:
            out.update(f"cannot restage: {safe_text(str(exc), 200)}")
            return
        body = "\n".join(safe_text(ln, 200) for ln in plan.lines())
        if not plan.startable:
            why = plan.refused or "; ".join(plan.preview.blockers if plan.preview else ())
            out.update(f"{body}\nnot restaged: {safe_text(why, 200)}")
            return
        if not await self.app.push_screen_wait(ConfirmModal(title="Stage the restart?", body=body)):
            return
        out.update(f"{body}\npulling...")
        try:
            result = await console_ops(self).triage.restage(plan)
        except LoadmasterError as exc:
            out.update(f"{body}\nnot restaged: {safe_text(str(exc), 200)}")
            return
        out.update("\n".join(safe_text(ln, 200) for ln in result.lines()))

    def action_close(self) -> None:
        self.dismiss(None)
