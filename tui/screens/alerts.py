"""Alerts screen: the site's Alertmanager alerts, mapped to nodes and jobs, and its silences.

Every :data:`REFRESH_S` a worker reads ``ops.alerts.site()`` and ``.silences()`` (never on the UI's
loop body: the requests are awaited in a worker, the alert queue is read in a thread). The line at
the top says where the alerts come from, or why alerting is degraded ("alerting degraded: ...":
Alertmanager unreachable, or ``loadmaster watch`` holding changes it could not deliver), or that
``[alerts] alertmanager_url`` is not set. Enter on an alert loadmaster sent itself goes back to
what it is about: its job on the Transfers screen, its node's detail. ``s`` silences the selected
alert (matchers prefilled from its identifying labels, a duration, a required comment, and an
"Any alert" box, off by default: unticked, the silence must name one of loadmaster's own
conditions; the operator is the author, the silence is audited, read-only mode refuses it); ``x`` expires a
silence after a confirmation. Each read also hands the app the nodes with an active, unsilenced
alert (:func:`alerted_nodes`), which the Fleet screen marks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, DataTable, Input, Static

from backend.errors import LoadmasterError
from backend.ops.alerts import AlertingNotConfigured, SilenceRequest, parse_matchers
from backend.ops.types import parse_duration
from backend.units import age_of, age_text
from tui.screens.base import FILTER_BINDING, LoadmasterScreen, PaletteCommand, console_ops
from tui.widgets.confirm import ConfirmModal
from tui.widgets.detail import DetailModal
from tui.widgets.plain import PlainLabel, PlainStatic
from tui.widgets.table_cursor import cursor_row_key
from tui.widgets.table_fit import FitColumn, FittedTable

if TYPE_CHECKING:
    from backend.ops.alerts import Silence, SiteAlert
    from backend.services import Services

#: Seconds between reads of Alertmanager.
REFRESH_S = 15.0
#: The labels that identify an alert for a silence, in the order they are prefilled.
SILENCE_LABELS = ("alertname", "node", "job_id")
#: Severity -> theme variable of its cell.
SEVERITY_STYLE = {"critical": "error", "page": "error", "error": "error", "warning": "warning"}

#: (key, header, width): 116 columns with the cell padding, so all fit at 120; at 80 the most
#: decisive ones (severity, name, node, job) do.
#: The alerts table's columns, the most decisive first: where the screen is narrow, the last ones
#: give way whole (never cut by the edge) and the wide ones narrow to their least, cut with "…".
ALERT_COLUMNS = (
    FitColumn("severity", "Severity", 8),
    FitColumn("alertname", "Alert", None, least=16),
    FitColumn("node", "Node", None, least=12),
    FitColumn("job", "Job", None, least=12),
    FitColumn("summary", "Summary", None, least=12),
    FitColumn("since", "Since", 5),
    FitColumn("silenced", "Silenced by", 11),
)
SILENCE_COLUMNS = (
    FitColumn("matchers", "Matchers", 40, least=24),
    FitColumn("state", "State", 8),
    FitColumn("ends", "Ends in", 8),
    FitColumn("by", "Created by", 20, least=10),
    FitColumn("comment", "Comment", 40, least=12),
    FitColumn("id", "Id", 36),
)


def alerted_nodes(alerts: Sequence[SiteAlert]) -> dict[str, list[str]]:
    """Node -> the alertnames of its active alerts that no silence or inhibition holds back."""
    out: dict[str, list[str]] = {}
    for a in alerts:
        if a.node and a.alert.state == "active" and not a.alert.silenced_by and not a.alert.inhibited_by:
            names = out.setdefault(a.node, [])
            if a.name not in names:
                names.append(a.name)
    return out


def silenced_nodes(alerts: Sequence[SiteAlert]) -> dict[str, list[str]]:
    """Node -> the alertnames of its alerts that a silence holds back (the Fleet says so)."""
    out: dict[str, list[str]] = {}
    for a in alerts:
        if a.node and a.alert.silenced_by:
            names = out.setdefault(a.node, [])
            if a.name not in names:
                names.append(a.name)
    return out


def silence_prefill(a: SiteAlert) -> str:
    """``alertname=..., node=..., job_id=...``: the selected alert's identifying labels."""
    labels = a.alert.labels
    return ", ".join(f"{k}={labels[k]}" for k in SILENCE_LABELS if labels.get(k))


def matcher_text(s: Silence) -> str:
    return ", ".join(m.text() for m in s.matchers)


def alert_cells(a: SiteAlert, styles: dict[str, str]) -> list[Any]:
    """The alert table's cells (node and job: loadmaster's names, else the raw labels)."""
    labels = a.alert.labels
    node = a.node or labels.get("node") or labels.get("instance") or ""
    job = a.job_id or ""
    since = age_of(a.alert.starts_at.timestamp()) if a.alert.starts_at else "?"
    silenced = ",".join(s[:8] for s in a.alert.silenced_by) or ("inhibited" if a.alert.inhibited_by else "")
    style = styles.get(SEVERITY_STYLE.get(a.severity, ""))
    name = a.name + (" ↩" if a.ref else "")  # a link back: enter opens what it is about
    return [
        Text(a.severity or "-", style=style or ""),
        name,
        node,
        job,
        Text(a.summary, overflow="ellipsis", no_wrap=True),
        since,
        silenced,
    ]


class AlertsRead(Message):
    """One read of Alertmanager: the alerts and silences (None: not read) and the status line."""

    def __init__(
        self,
        alerts: list[SiteAlert] | None,
        silences: list[Silence] | None,
        status: str,
        degraded: bool,
        *,
        configured: bool = True,
    ) -> None:
        super().__init__()
        self.alerts = alerts
        self.silences = silences
        self.status = status
        self.degraded = degraded
        #: False: no Alertmanager is set (empty tables, and nothing read to tell Fleet).
        self.configured = configured


class SilenceModal(ModalScreen[str | None]):
    """Make a silence: matchers (``name=value, ...``), a duration (``2h``), a comment (required).

    Submitting runs ``ops.alerts.silence``; an error (a bad field, read-only mode, Alertmanager
    refusing or unreachable) is one line in the dialog, which stays open. Dismisses with the new
    silence's id, or None when cancelled.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", show=True),
        Binding("ctrl+s", "submit", "Create", show=True),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | enter, ctrl+s | Create the silence. |
    | escape | Cancel. |
    """

    def __init__(self, services: Services, *, matchers: str, about: str = "", duration: str = "2h") -> None:
        super().__init__()
        self.services = services
        self.matchers = matchers
        self.about = about
        self.duration = duration

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield PlainLabel("Silence alerts", classes="dialog--title")
            if self.about:
                yield PlainStatic(self.about, classes="dialog--body")
            for key, label, value, hint in (
                ("matchers", "Matchers", self.matchers, "name=value, name=~regex, ..."),
                ("duration", "Duration", self.duration, "e.g. 30m, 2h, 1d (at most 7d)"),
                ("comment", "Comment", "", "why: what the next on-call reads (required)"),
            ):
                with Horizontal(classes="silence-field"):
                    yield PlainLabel(label, classes="silence-label")
                    yield Input(value=value, placeholder=hint, id=f"silence-{key}", compact=True)
            # Unticked, the silence must name one of loadmaster's own conditions (ops.alerts).
            yield Checkbox(
                "Any alert: may also match the site's and other teams' alerts (audited)",
                value=False,
                id="silence-any",
                compact=True,
            )
            yield PlainStatic("", id="silence-error")
            with Horizontal(classes="dialog--buttons"):
                yield Button("Create silence", id="silence-create", variant="primary")
                yield Button("Cancel", id="silence-cancel")

    def on_mount(self) -> None:
        self.query_one("#silence-comment", Input).focus()

    def _value(self, key: str) -> str:
        return self.query_one(f"#silence-{key}", Input).value

    def request(self) -> SilenceRequest:
        """The form as a request; ConfigError naming the field that is wrong."""
        from backend.errors import ConfigError

        matchers, regex = parse_matchers(self._value("matchers"))
        try:
            duration = parse_duration(self._value("duration").strip())
        except ValueError as exc:
            raise ConfigError(str(exc), key="duration") from None
        any_alert = self.query_one("#silence-any", Checkbox).value
        return SilenceRequest(matchers, duration, self._value("comment"), regex, any_alert=any_alert)

    def show_error(self, text: str) -> None:
        box = self.query_one("#silence-error", Static)
        box.update(text)
        box.set_class(bool(text), "-active")

    def action_submit(self) -> None:
        try:
            req = self.request()
        except LoadmasterError as exc:
            self.show_error(str(exc).splitlines()[0])
            return
        self.show_error("")
        self.query_one("#silence-create", Button).disabled = True
        self._create(req)

    @work(exclusive=True, group="silence-create", exit_on_error=False)
    async def _create(self, req: SilenceRequest) -> None:
        try:
            sid = await console_ops(self).alerts.silence(req)
        except LoadmasterError as exc:
            self.show_error(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            self.query_one("#silence-create", Button).disabled = False
            return
        self.dismiss(sid)

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_submit()

    @on(Button.Pressed, "#silence-create")
    def _create_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_submit()

    @on(Button.Pressed, "#silence-cancel")
    def _cancel_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class AlertsScreen(LoadmasterScreen):
    """The site's alerts (severity, name, node, job, summary, since, silenced by) and silences."""

    SCREEN_TITLE: ClassVar[str] = "Alerts"
    AUTO_FOCUS = "#alerts-table"
    FILTER_HINT: ClassVar[str] = "alert name, node, job, severity or summary"
    PALETTE_COMMANDS: ClassVar[list[PaletteCommand]] = [
        ("Open what the alert is about", "Its job on Transfers, its node's detail (key enter)", "open_alert"),
        ("Silence the selected alert", "Matchers from its labels, a duration and a comment (key s)", "silence"),
        ("Expire a silence", "End the selected silence now, after a confirmation (key x)", "expire"),
        ("Reload alerts", "Read Alertmanager's alerts and silences now (key r)", "reload"),
    ]
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open_alert", "Open"),
        Binding("s", "silence", "Silence"),
        Binding("x", "expire", "Expire silence"),
        Binding("r", "reload", "Reload"),
        FILTER_BINDING,
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | enter | Open what the alert is about: its job (Transfers), its node (detail), else its labels. |
    | s | Silence the selected alert (matchers prefilled from its labels; comment required). |
    | x | Expire the selected silence (or the one silencing the selected alert), after a confirmation. |
    | r | Read Alertmanager again now (it is read every 15 s). |
    | T | Triage the alert's Slurm job (its ``slurm_job_id`` label), else its node (console key). |
    | tab | Move between the alerts and the silences. |
    | / | Filter alerts by name, node, job, severity or summary. |
    """

    def __init__(self, services: Services, **kwargs: Any) -> None:
        super().__init__(services, **kwargs)
        self.alerts: list[SiteAlert] = []
        self.silences: list[Silence] = []
        self.status_text = ""

    def compose_body(self) -> ComposeResult:
        with Vertical(classes="screen-body", id="alerts-body"):
            yield PlainStatic("reading Alertmanager...", id="alerts-status")
            yield FittedTable(ALERT_COLUMNS, cursor_type="row", zebra_stripes=True, id="alerts-table")
            yield PlainStatic("Silences", id="alerts-silences-title")
            yield FittedTable(SILENCE_COLUMNS, cursor_type="row", zebra_stripes=True, id="alerts-silences")

    def start_reads(self) -> None:
        self._refresh()
        self.set_interval(REFRESH_S, self._tick)

    def _tick(self) -> None:
        if not any(w.group == "alerts-refresh" and w.is_running for w in self.workers):
            self._refresh()

    # -- reading -------------------------------------------------------------------------------

    @work(exclusive=True, group="alerts-refresh", exit_on_error=False)
    async def _refresh(self) -> None:
        ops = self.ops.alerts
        alerts: list[SiteAlert] | None = None
        silences: list[Silence] | None = None
        error: str | None = None
        try:
            alerts = await ops.site()
            silences = await ops.silences()
        except AlertingNotConfigured as exc:
            self.post_message(AlertsRead([], [], str(exc), False, configured=False))
            return
        except LoadmasterError as exc:
            error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        # The queue of `loadmaster watch` is in the state database: read off the event loop.
        status = await asyncio.to_thread(ops.status, error)
        if status.degraded:
            text = status.degraded
        else:
            assert alerts is not None and silences is not None
            firing = sum(1 for a in alerts if not a.silenced)
            active = sum(1 for s in silences if s.state == "active")
            text = (
                f"{len(alerts)} alert(s) from {ops.settings.alertmanager_url}: {firing} firing, "
                f"{len(alerts) - firing} silenced · {active} active silence(s) · enter opens, s silences"
            )
        self.post_message(AlertsRead(alerts, silences, text, status.degraded is not None))

    @on(AlertsRead)
    def _read(self, event: AlertsRead) -> None:
        self.show_alerts(
            event.alerts, event.silences, event.status, degraded=event.degraded, configured=event.configured
        )

    def show_alerts(
        self,
        alerts: list[SiteAlert] | None,
        silences: list[Silence] | None,
        status: str,
        *,
        degraded: bool = False,
        configured: bool = True,
    ) -> None:
        """Render one read (None keeps what is shown: a failed read leaves the last one on screen).

        ``configured`` False: no Alertmanager is set; the tables are empty, and Fleet is not told
        of a read (it would count "0 firing" where nothing was asked)."""
        self.status_text = status
        line = self.query_one("#alerts-status", Static)
        line.update(status)
        line.set_class(degraded, "-degraded")
        if alerts is not None:
            self.alerts = alerts
            set_alerts = getattr(self.app, "set_site_alerts", None)
            if set_alerts is not None and configured:
                set_alerts(alerted_nodes(alerts), silenced=silenced_nodes(alerts))
            self._show_alert_rows()
        if silences is not None:
            self.silences = [s for s in silences if s.state != "expired"]
            self._show_silence_rows()

    def _styles(self) -> dict[str, str]:
        variables = getattr(self.app, "theme_variables", {}) or {}
        return {k: v for k, v in variables.items() if k in ("error", "warning")}

    def _show_alert_rows(self) -> None:
        table = self.query_one("#alerts-table", FittedTable)
        styles = self._styles()
        keys: list[str] = []
        rows: list[tuple[str, list[Any]]] = []
        for a in self.alerts:
            labels = a.alert.labels
            if not self.filter_matches(
                a.name, a.node or "", labels.get("node", ""), a.job_id or "", a.severity, a.summary
            ):
                continue
            if a.alert.fingerprint in keys:
                continue
            rows.append((a.alert.fingerprint, alert_cells(a, styles)))
            keys.append(a.alert.fingerprint)
        table.set_rows(rows)  # the cursor stays on its row's key

    def _show_silence_rows(self) -> None:
        table = self.query_one("#alerts-silences", FittedTable)
        keys = []
        rows: list[tuple[str, list[Any]]] = []
        for s in self.silences:
            ends = age_of(None) if s.ends_at is None else _until(s.ends_at.timestamp())
            rows.append((s.id, [matcher_text(s), s.state, ends, s.created_by, s.comment, s.id]))
            keys.append(s.id)
        table.set_rows(rows)
        title = self.query_one("#alerts-silences-title", Static)
        title.update(f"Silences: {len(self.silences)} (x expires the selected one)" if keys else "Silences: none")

    def apply_filter(self) -> None:
        self._show_alert_rows()

    def action_reload(self) -> None:
        """Read Alertmanager again now."""
        self._refresh()

    # -- the selected rows ---------------------------------------------------------------------

    def selected_alert(self) -> SiteAlert | None:
        key = cursor_row_key(self.query_one("#alerts-table", DataTable))
        return next((a for a in self.alerts if a.alert.fingerprint == key), None)

    def selected_silence(self) -> Silence | None:
        """The silence to act on: the silences table's row when it has the focus, else the one
        silencing the selected alert, else the silences table's row."""
        table = self.query_one("#alerts-silences", DataTable)
        by_id = {s.id: s for s in self.silences}
        if self.focused is not table:
            alert = self.selected_alert()
            for sid in alert.alert.silenced_by if alert is not None else ():
                if sid in by_id:
                    return by_id[sid]
        key = cursor_row_key(table)
        return by_id.get(key) if key else None

    def main_table(self) -> DataTable[Any] | None:
        return self.query_one("#alerts-table", DataTable)

    def triage_target(self) -> dict[str, str] | None:
        """What the console's Triage (key T) reads for the selected alert: the Slurm job its
        ``slurm_job_id`` label names, else its node; None when it names neither."""
        a = self.selected_alert()
        if a is None:
            return None
        job = (a.alert.labels.get("slurm_job_id") or "").strip()
        if job.replace("_", "").isdigit():
            return {"job": job}
        return {"nodes": a.node} if a.node else None

    # -- enter: what the alert is about --------------------------------------------------------

    @on(DataTable.RowSelected, "#alerts-table")
    async def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        await self.action_open_alert()

    @on(DataTable.RowSelected, "#alerts-silences")
    def _silence_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        s = self.selected_silence()
        if s is not None:
            fields = [
                ("id", s.id),
                ("matchers", matcher_text(s)),
                ("state", s.state),
                ("starts", s.starts_at.isoformat() if s.starts_at else "-"),
                ("ends", s.ends_at.isoformat() if s.ends_at else "-"),
                ("created by", s.created_by),
                ("comment", s.comment),
            ]
            self.app.push_screen(DetailModal(f"silence {s.id[:8]}", fields, hint="x expires it · escape back"))

    async def action_open_alert(self) -> None:
        """The alert's job on the Transfers screen, its node's detail, else every label of it."""
        a = self.selected_alert()
        if a is None:
            self.notify("no alert selected", severity="warning")
            return
        kind, _, key = (a.ref or "").partition(":")
        if not a.ref:  # not one of loadmaster's own: what its labels name
            kind, key = ("job", a.job_id) if a.job_id else ("node", a.node or "")
        if kind == "job" and key:
            await self._open_job(key)
        elif kind == "node" and key:
            self._open_node(a.node or key)
        else:
            self._show_detail(a)

    async def _open_job(self, job_id: str) -> None:
        """Switch to Transfers with its filter on the job (its row selected)."""
        await self.app.switch_mode("transfers")
        screen = self.app.screen
        if not isinstance(screen, LoadmasterScreen) or not screen.FILTER_HINT:
            return
        box = screen.query_one("#screen-filter", Input)
        box.value = job_id
        box.display = True
        screen.filter_text = job_id
        screen.apply_filter()
        screen.action_leave_input()

    def _open_node(self, name: str) -> None:
        from tui.screens.node_detail import NodeDetailScreen

        if name not in {n.name for n in self.services.config.nodes}:
            self.notify(f"{name} is not in this console's inventory", severity="warning", markup=False)
            return
        self.app.push_screen(NodeDetailScreen(self.services, name))

    def _show_detail(self, a: SiteAlert) -> None:
        fields = [(f"label {k}", v) for k, v in sorted(a.alert.labels.items())]
        fields += [(f"annotation {k}", v) for k, v in sorted(a.alert.annotations.items())]
        fields += [
            ("state", a.alert.state),
            ("since", a.alert.starts_at.isoformat() if a.alert.starts_at else "-"),
            ("silenced by", ", ".join(a.alert.silenced_by) or "-"),
            ("fingerprint", a.alert.fingerprint),
        ]
        if a.alert.generator_url:
            fields.append(("source", a.alert.generator_url))
        self.app.push_screen(DetailModal(a.name, fields, hint="s silences it · escape back"))

    # -- silences ------------------------------------------------------------------------------

    def action_silence(self) -> None:
        """Silence the selected alert: its labels as matchers, a duration, a comment."""
        if not self.require_writable("create a silence"):
            return
        a = self.selected_alert()
        prefill = silence_prefill(a) if a is not None else ""
        about = f"{a.name} on {a.node or '-'}: {a.summary}" if a is not None else ""

        def made(sid: str | None) -> None:
            if sid:
                self.notify(f"silence {sid} created", markup=False)
                self._refresh()

        self.app.push_screen(SilenceModal(self.services, matchers=prefill, about=about), made)

    def action_expire(self) -> None:
        """Expire the selected silence after a confirmation."""
        if not self.require_writable("expire a silence"):
            return
        s = self.selected_silence()
        if s is None:
            self.notify("no silence selected (tab to the silences table)", severity="warning")
            return
        body = f"{matcher_text(s)}\nby {s.created_by}: {s.comment}\nThe alerts it holds back page again."

        def answered(ok: bool | None) -> None:
            if ok:
                self._expire(s.id)

        self.app.push_screen(ConfirmModal(title=f"Expire silence {s.id[:8]}?", body=body, yes_label="Expire"), answered)

    @work(exclusive=True, group="alerts-expire", exit_on_error=False)
    async def _expire(self, silence_id: str) -> None:
        try:
            await self.ops.alerts.expire(silence_id, reason="expired from the console")
        except LoadmasterError as exc:
            self.report_error("Could not expire the silence", exc)
            return
        self.notify(f"silence {silence_id} expired", markup=False)
        self._refresh()

    def escape_hook(self) -> Callable[[], None] | None:
        # From the silences table, escape goes back to the alerts.
        if self.focused is self.query_one("#alerts-silences", DataTable):
            return self.action_leave_input
        return None


def _until(ts: float) -> str:
    return age_text(ts - time.time())
