"""Text from outside is shown literally: never as markup, never as a terminal control.

A node's hostname and GPU name, Slurm's job names and reasons, Alertmanager's labels, a job's node,
error and log all reach the console from places someone else controls. Each is fed here through
the real app (``run_test``) as a hostile string: console markup that would style the screen or
bind an action to a click (``[@click=app.quit]``), and escape sequences that would clear the
terminal or write its clipboard (OSC 52). The screen must show the markup as typed, hold no
control character, carry no click action, and a click on it must not quit the console. The
helpers of :mod:`tui.widgets.plain` are checked over generated strings.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.errors import MarkupError as RichMarkupError
from rich.text import Text
from textual.content import Content
from textual.markup import MarkupError
from textual.widgets import Static
from textual.widgets._data_table import default_cell_formatter
from textual.widgets._toast import Toast

from backend.alerts.alertmanager import ActiveAlert, Matcher, Silence
from backend.jobs.records import JobRecord
from backend.ops.alerts import SiteAlert
from backend.services import Services
from backend.slurm.model import SlurmJob
from backend.telemetry.hub import TelemetryHub
from backend.telemetry.settings import TelemetrySettings
from backend.telemetry.synthetic import SyntheticNode, SyntheticPool
from backend.textfmt import safe_text
from tests.firsthour.screen_text import screen_render
from tests.helpers import wait_until
from tests.tui.snapshot_services import FROZEN_NOW, snapshot_config, snapshot_services
from tui.app import LoadmasterApp
from tui.screens.node_detail import NodeDetailScreen
from tui.screens.slurm_jobs import SlurmJobsScreen, job_rows
from tui.screens.transfers import TransfersScreen
from tui.widgets.fleet_table import FleetTable
from tui.widgets.plain import PlainStatic, PlainTable, plain, plain_block, plain_cell
from tui.widgets.transfers_detail import TransferDetail
from tui.widgets.transfers_table import TransfersTable

pytestmark = [pytest.mark.timeout(120)]

#: Markup that, parsed, binds a click to quitting the console.
CLICK = "[@click=app.quit]x[/]"
#: Markup that, parsed, shows a red bold fake alert with its tags gone.
FAKE = "[bold red]FAKE ALERT[/]"
#: Clear the screen, then write "evil" to the terminal's clipboard (OSC 52).
ESCAPES = "\x1b[2J\x1b]52;c;ZXZpbA==\x07"
#: A carriage return that would overwrite the start of its line.
CR = "a\rb"
#: A node name in markup, short enough for the Fleet table's node column.
BOLD_NODE = "[b]gpu[/]"
SIZE = (220, 50)


# -- what the screen holds ---------------------------------------------------------------------


def _segments(app: LoadmasterApp) -> list[Any]:
    """Every segment the terminal would be sent for the current screen; a control segment (the
    cursor move that starts each row) as None."""
    console, update = screen_render(app)
    return [None if seg.control else seg for seg in console.render(update)]


def screen_text(app: LoadmasterApp) -> str:
    """The current screen's text as the terminal gets it, one line per row."""
    return "".join("\n" if seg is None else seg.text for seg in _segments(app))


def assert_safe(app: LoadmasterApp) -> None:
    """No control character reaches the terminal, and nothing on screen binds app.quit to a click."""
    text = screen_text(app)
    bad = sorted({c for c in text if c != "\n" and not c.isprintable()})
    assert not bad, f"control characters on screen: {bad!r}"
    for seg in filter(None, _segments(app)):
        meta = seg.style.meta if seg.style is not None else {}
        assert "quit" not in str(meta.get("@click", "")), (seg, meta)
    assert "\x1b" not in text and "ZXZpbA==\x07" not in text


async def click_on(pilot: Any, app: LoadmasterApp, needle: str) -> None:
    """Click the first place the screen shows ``needle``; the console must still be running."""
    lines = screen_text(app).split("\n")
    for y, line in enumerate(lines):
        x = line.find(needle)
        if x >= 0:
            await pilot.click(offset=(x + 1, y))
            await pilot.pause()
            break
    else:
        raise AssertionError(f"{needle!r} not on screen")
    assert app.is_running and app.return_code is None, "a click on outside text ran an action"


def cell_texts(table: PlainTable) -> list[str]:
    return [str(c) for r in range(table.row_count) for c in table.get_row_at(r)]


# -- fleet and telemetry: an inventory name, nvidia-smi's GPU name -------------------------------


def _hostile_fleet() -> Services:
    """The snapshot config with one node named in markup; every GPU reports a hostile name."""
    base = snapshot_config()
    nodes = (replace(base.nodes[0], name=BOLD_NODE), *base.nodes[1:])
    services = Services(config=replace(base, nodes=nodes))
    hub = TelemetryHub(
        SyntheticPool(nodes),  # type: ignore[arg-type]
        TelemetrySettings(),
        clock=lambda: 10.0,
        wall_clock=lambda: FROZEN_NOW,
        feed_only=True,
    )
    gens = [SyntheticNode(n.name, seed=i, model=f"{CLICK} {ESCAPES}") for i, n in enumerate(nodes, start=1)]
    for t in range(11):
        for g in gens:
            hub.ingest(g.name, g.block(float(t)), float(t))
        hub.tick(float(t))
    services.__dict__["telemetry"] = hub
    return services


async def test_fleet_and_node_detail_show_names_literally() -> None:
    app = LoadmasterApp(_hostile_fleet(), theme="loadmaster-dark", mode="fleet")
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(FleetTable)
        await wait_until(pilot, lambda: table.row_count == 4, delay=0.05)
        table.flush_all()
        await pilot.pause()
        assert BOLD_NODE in screen_text(app), "the node's name is not shown as typed"
        assert_safe(app)
        await click_on(pilot, app, BOLD_NODE)

        app.push_screen(NodeDetailScreen(app.services, BOLD_NODE))
        await wait_until(pilot, lambda: CLICK in screen_text(app), delay=0.05)
        assert_safe(app)
        await click_on(pilot, app, CLICK)


# -- Slurm: job names, users, reasons ------------------------------------------------------------


async def test_slurm_jobs_show_names_users_and_reasons_literally(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = [
        SlurmJob("41", CLICK, FAKE, "RUNNING", nodes=("gpu-a01",), start_time=FROZEN_NOW - 60),
        SlurmJob("42", f"name{ESCAPES}", CR, "PENDING", reason=f"{FAKE}{ESCAPES}"),
    ]

    def read(self: SlurmJobsScreen, fresh: bool) -> None:
        self.rows = job_rows(jobs, now=FROZEN_NOW)
        self._show()

    monkeypatch.setattr(SlurmJobsScreen, "enabled", property(lambda self: True))
    monkeypatch.setattr(SlurmJobsScreen, "_read", read)
    app = LoadmasterApp(snapshot_services(), theme="loadmaster-dark", mode="fleet")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.push_screen(SlurmJobsScreen(app.services))
        await wait_until(pilot, lambda: CLICK in screen_text(app), delay=0.05)
        text = screen_text(app)
        assert FAKE in text and "FAKE ALERT" in text
        assert "a b" in text  # the user's carriage return shown as a space, not a jump to column 0
        assert_safe(app)
        await click_on(pilot, app, CLICK)


# -- alerts: labels, annotations, silences -------------------------------------------------------


def _hostile_alerts() -> tuple[list[SiteAlert], list[Silence]]:
    at = datetime.fromtimestamp(FROZEN_NOW, UTC)
    alert = ActiveAlert(
        labels={"alertname": CLICK, "node": "gpu-a01", "severity": FAKE, "instance": ESCAPES},
        annotations={"summary": f"{FAKE} {ESCAPES} {CR}"},
        starts_at=at - timedelta(minutes=3),
        ends_at=at + timedelta(minutes=15),
        updated_at=at,
        fingerprint="00000000000000aa",
        state="active",
        silenced_by=(),
        inhibited_by=(),
        receivers=("oncall",),
    )
    silence = Silence(
        id="5b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d",
        matchers=(Matcher("alertname", CLICK),),
        starts_at=at - timedelta(minutes=30),
        ends_at=at + timedelta(hours=2),
        updated_at=at,
        created_by=f"{FAKE}{ESCAPES}",
        comment=f"{CLICK}{CR}",
        state="active",
    )
    return [SiteAlert(alert, None, None, None)], [silence]


async def test_alerts_show_labels_annotations_and_silences_literally() -> None:
    services = snapshot_services()
    services.config = replace(services.config, sections={})
    alerts, silences = _hostile_alerts()
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="alerts")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await app.workers.wait_for_complete()
        app.screen.show_alerts(alerts, silences, f"status from {FAKE}{ESCAPES}")  # type: ignore[attr-defined]
        await wait_until(pilot, lambda: f"{CLICK}  gpu-a01" in screen_text(app), delay=0.05)
        assert FAKE in screen_text(app)
        silences_table = app.screen.query_one("#alerts-silences", PlainTable)
        cells = cell_texts(silences_table)
        assert f'alertname="{CLICK}"' in cells and f"{CLICK}a b" in cells, cells
        assert_safe(app)
        await click_on(pilot, app, CLICK)
        # enter on the alert: every label and annotation, in a dialog
        app.screen._show_detail(alerts[0])  # type: ignore[attr-defined]
        await wait_until(pilot, lambda: "annotation summary" in screen_text(app), delay=0.05)
        assert f"{FAKE} " in screen_text(app)
        assert_safe(app)


# -- transfers: a job's node, error and log ------------------------------------------------------


async def test_transfer_rows_detail_and_log_show_literally() -> None:
    rec = JobRecord(
        id="pull-0001",
        node=FAKE,
        kind="pull",
        state="failed",
        created=FROZEN_NOW - 300,
        launched_by=CLICK,
        launched_from="bastion",
        error=f"s5cmd: {FAKE} {ESCAPES}",
        note=f"{CR}",
        params={"src": f"s3://bucket/{CLICK}", "dest": "x"},
    )
    log = f"line 1 {CLICK}\n{ESCAPES}line 2 {FAKE}\n{CR}\n"
    app = LoadmasterApp(snapshot_services(), theme="loadmaster-dark", mode="transfers")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TransfersScreen)
        await app.workers.wait_for_complete()
        screen.records = (rec,)
        screen._show_records()
        detail = screen.query_one(TransferDetail)
        detail.remove_class("-hidden")
        detail.show(rec, (), log)
        await wait_until(pilot, lambda: "line 2" in screen_text(app), delay=0.05)
        text = screen_text(app)
        assert FAKE in cell_texts(screen.query_one(TransfersTable))
        assert f"line 1 {CLICK}" in text and f"line 2 {FAKE}" in text, text
        info = detail.query_one("#transfers-detail-info", Static).visual.plain  # type: ignore[attr-defined]
        assert f"error: s5cmd: {FAKE} " in info and f"by {CLICK} from" in info, info
        assert_safe(app)
        await click_on(pilot, app, CLICK)


# -- notifications and the error log -------------------------------------------------------------


async def test_notifications_and_errors_show_what_a_node_said_literally() -> None:
    app = LoadmasterApp(snapshot_services(), theme="loadmaster-dark", mode="fleet")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.report_error("pull on gpu-a01", RuntimeError(f"{CLICK} {ESCAPES}"))
        app.screen.notify(f"{FAKE}{CR}")  # a widget's notify passes markup=True: not honoured
        app.notify(CLICK, title=f"{FAKE}{ESCAPES}", markup=True)
        await pilot.pause()
        # each toast as Textual draws it: its message as markup only where the notification says so
        notes = list(app._notifications)
        assert len(notes) == 3 and not any(n.markup for n in notes), notes
        shown = [Toast(n).render().plain if not n.title else n.message for n in notes]
        assert f"RuntimeError: {CLICK} " in shown[0] and shown[1] == f"{FAKE}ab" and shown[2] == CLICK, shown
        assert notes[2].title == FAKE, notes[2]
        assert all(c.isprintable() for n in notes for c in n.title + n.message), notes
        await pilot.press("e")  # the error log: its table and the detail below it
        await wait_until(pilot, lambda: "RuntimeError" in screen_text(app), delay=0.05)
        assert CLICK in screen_text(app)
        assert_safe(app)
        await click_on(pilot, app, CLICK)


# -- the helpers, over generated strings ---------------------------------------------------------

#: Characters that make markup and escape sequences, letters and controls (no letters of the words
#: :func:`backend.textfmt.redact` looks for, so nothing is masked).
_ALPHABET = st.sampled_from(
    list("[]@=/\\$#:.ab x01") + ["\x1b", "\x07", "\x08", "\r", "\n", "\t", "\x9b", "\x00", "\u202e"]
)
_HOSTILE = st.text(_ALPHABET, max_size=60) | st.sampled_from([CLICK, FAKE, ESCAPES, CR, f"{CLICK}{ESCAPES}{FAKE}"])
_PRINTABLE = st.text(st.sampled_from(list("[]@=/\\$#.ab x01")), max_size=60)


@settings(max_examples=300, deadline=None)
@given(_HOSTILE)
def test_plain_text_holds_no_control_and_no_sink_reads_it_as_markup(raw: str) -> None:
    expected = safe_text(raw, None)
    for made in (plain(raw, None), plain_cell(raw)):
        assert isinstance(made, Text)
        assert made.plain == expected
        assert all(c.isprintable() for c in made.plain), repr(made.plain)
        # the sinks that parse a str as markup take the Text as it is
        assert default_cell_formatter(made).plain == expected  # type: ignore[union-attr]
        assert Content.from_rich_text(made).plain == expected  # what a Static, a tooltip, an option shows
        assert not made.spans
    block = plain_block(raw)
    assert all(c.isprintable() or c in "\n\t" for c in block.plain), repr(block.plain)


@settings(max_examples=300, deadline=None)
@given(_PRINTABLE)
def test_printable_text_is_shown_exactly_as_it_is(raw: str) -> None:
    assert plain(raw, None).plain == raw
    assert plain_cell(raw) == raw and str(plain_cell(raw)) == raw
    assert default_cell_formatter(plain_cell(raw)).plain == raw  # type: ignore[union-attr]
    assert Content.from_rich_text(plain(raw, None)).plain == raw


@pytest.mark.parametrize("raw", [CLICK, FAKE, "[/]", "[link=https://evil.example]docs[/link]"])
def test_a_str_cell_is_markup_and_a_plain_cell_is_not(raw: str) -> None:
    """What a DataTable makes of a str (the defect): markup parsed, or a MarkupError raised while
    the screen is drawn; of the helper's cell: the text as it is, with no style or action."""
    try:
        parsed: Any = default_cell_formatter(raw)
    except (MarkupError, RichMarkupError):
        parsed = None
    assert parsed is None or parsed.plain != raw or parsed.spans
    cell = default_cell_formatter(plain_cell(raw))
    assert cell.plain == raw and not cell.spans  # type: ignore[union-attr]


@settings(max_examples=100, deadline=None)
@given(_HOSTILE)
def test_plain_static_shows_any_string_literally(raw: str) -> None:
    widget = PlainStatic(raw)
    shown = widget.visual.plain  # type: ignore[attr-defined]
    assert all(c.isprintable() or c in "\n\t" for c in shown), repr(shown)
    if all(c.isprintable() for c in raw):
        assert shown == raw
    widget.update(raw)
    assert widget.visual.plain == shown  # type: ignore[attr-defined]


# -- every table, label and static of the console goes through the helpers -----------------------

TUI = Path(__file__).resolve().parents[2] / "tui"


def _calls(name: str) -> list[str]:
    """``file:line`` of each call to ``name(...)`` under tui/ (the console, not the CLI)."""
    out = []
    for path in sorted(TUI.rglob("*.py")):
        if "cli" in path.parts or path.name == "plain.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
                out.append((f"{path.relative_to(TUI.parent)}:{node.lineno}", node))
    return out  # type: ignore[return-value]


def test_no_console_table_or_text_widget_reads_markup() -> None:
    """A DataTable reads a str cell as markup: every table is a PlainTable. A Static or Label with
    text that is not a literal is a PlainStatic / PlainLabel (markup off, controls cleaned)."""
    tables = [where for where, _ in _calls("DataTable")]  # type: ignore[misc]
    assert not tables, f"use PlainTable: {tables}"
    loose = []
    for name in ("Static", "Label"):
        for where, node in _calls(name):  # type: ignore[misc]
            first = node.args[0] if node.args else None
            literal = isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value
            if not literal:
                loose.append(where)
    assert not loose, f"use PlainStatic / PlainLabel for text that is not a literal: {loose}"
