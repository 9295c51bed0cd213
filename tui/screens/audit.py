"""The ``L`` screen: the audit log every operator's actions are in (the shared state database).

Newest first: when, who (``user@host``), the action, its target and outcome; the highlighted
entry's reason, plan hash and detail below the table. With ``[state] url`` the log is the team's,
so the operator who takes over the rotation reads what the one before did. A state database that
cannot be reached is one line on the screen, and ``r`` tries again.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from backend.errors import LoadmasterError
from tui.screens.base import console_ops
from tui.widgets.plain import PlainStatic, PlainTable
from tui.widgets.transfers_format import short

if TYPE_CHECKING:
    from backend.ops.state import AuditEntry
    from backend.services import Services

#: How many entries the screen reads (``loadmaster audit --limit`` reads more).
AUDIT_ROWS = 500


class AuditScreen(Screen[None]):
    """The audit log, newest first; the highlighted entry's detail below the table."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Back"),
        Binding("r", "reload", "Reload"),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | escape | Back to the screen you came from. |
    | r | Read the log again. |
    """

    def __init__(self, services: Services) -> None:
        super().__init__()
        self.services = services
        self.entries: list[AuditEntry] = []

    def compose(self) -> ComposeResult:
        yield Header()
        yield PlainStatic("reading the audit log...", id="audit-status")
        yield PlainTable(cursor_type="row", zebra_stripes=True, id="audit-table")
        yield PlainStatic("", id="audit-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "Audit log"
        self.query_one(DataTable).add_columns("time", "who", "action", "target", "outcome")
        self.action_reload()

    @work(thread=True, exclusive=True, group="audit")
    def _read(self) -> None:
        try:
            entries = console_ops(self).state.audit_entries(limit=AUDIT_ROWS)
        except LoadmasterError as exc:
            self.app.call_from_thread(self._failed, str(exc))
            return
        self.app.call_from_thread(self._loaded, entries)

    def _failed(self, why: str) -> None:
        self.query_one("#audit-status", Static).update(f"cannot read the audit log: {why}")

    def _loaded(self, entries: list[AuditEntry]) -> None:
        self.entries = entries
        table = self.query_one(DataTable)
        table.clear()
        width = self.size.width or self.app.size.width
        target_width = max(18, width - 62)  # a job id whole, and the outcome, at 80 columns
        for e in entries:
            when = datetime.fromtimestamp(e.ts).strftime("%m-%d %H:%M:%S")
            table.add_row(when, e.actor, e.action, short(e.target, target_width), e.outcome, key=str(e.id))
        head = f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, newest first, from "
        where = short(console_ops(self).state.where(), max(20, width - 2 - len(head)))
        self.query_one("#audit-status", Static).update(head + where)
        self._show(0)
        if entries:
            table.focus()

    def _show(self, index: int) -> None:
        text = ""
        if 0 <= index < len(self.entries):
            e = self.entries[index]
            lines = [f"#{e.id}  {datetime.fromtimestamp(e.ts).isoformat(timespec='seconds')}  {e.actor}"]
            lines.append(f"{e.action} {e.target}: {e.outcome}")
            if e.reason:
                lines.append(f"reason: {e.reason}")
            if e.plan_hash:
                lines.append(f"plan: {e.plan_hash}")
            if e.detail:
                lines.append(json.dumps(e.detail, sort_keys=True, default=str)[:2000])
            text = "\n".join(lines)
        self.query_one("#audit-detail", Static).update(text)

    @on(DataTable.RowHighlighted)
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show(event.cursor_row)

    def action_reload(self) -> None:
        self._read()

    def action_close(self) -> None:
        self.dismiss(None)
