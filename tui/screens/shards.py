"""Shards screen: start a WebDataset shard conversion and follow it to its manifest.

Left: a form (source, destination, shard size, node, shuffle seed, incomplete-sample policy).
Every change re-previews the conversion from the source listing alone (sample count, shard count,
GETs per epoch before and after, warnings and refusals), so the operator sees what will happen
before anything runs. Right: the conversions started from this console, live progress of the
selected one, and its manifest summary when it ends. Conversions run in-process (this machine) or
as durable ``shard`` jobs on a node; all the work is in ``backend.shards``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Button, DataTable, Input, Label, ProgressBar, Select, Static

from backend.errors import LoadmasterError
from backend.schema import parse_size
from backend.shards.convert import convert, preview
from backend.shards.job import launch_on_node
from backend.shards.locations import resolve_location
from backend.shards.manifest import fmt_size, fmt_usd
from backend.shards.model import ConvertResult, ShardPreview, ShardProgress, ShardRequest
from tui.screens.base import FILTER_BINDING, LoadmasterScreen
from tui.widgets import Summary
from tui.widgets.confirm import ConfirmTyped
from tui.widgets.detail import DetailModal
from tui.widgets.transfers_format import short

if TYPE_CHECKING:
    from backend.services import Services

LOCAL = "__local__"
#: The conversions table's columns, the decisive ones first (key, header): on a narrow terminal
#: the columns that scroll off are the rates, never the state.
RUN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("state", "State"), ("shards", "Shards"), ("route", "Source -> destination"), ("where", "Where"),
    ("rate", "smp/s"), ("mbps", "MB/s"))
#: Source -> destination is cut to this width (each path in the middle); the full paths are shown
#: under the table for the selected conversion.
ROUTE_WIDTH = 36
#: Fixed widths: the route is cut to fit; State fits its longest word ("succeeded", "cancelled")
#: from the start, since a cell update does not widen its column.
COLUMN_WIDTHS = {"route": ROUTE_WIDTH, "state": 9}
JOB_POLL_S = 2.0


@dataclass(frozen=True)
class ShardForm:
    """What the operator typed, as text."""

    src: str = ""
    dest: str = ""
    shard_size: str = "512MB"
    node: str = LOCAL
    seed: str = ""
    incomplete: str = "error"


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


def form_request(services: Services, form: ShardForm) -> tuple[ShardRequest | None, dict[str, str], Any, Any]:
    """Validate the form: (request, errors by field, source profile, destination profile)."""
    errors: dict[str, str] = {}
    settings = services.config.section("shards")
    size = seed = None
    sprof = dprof = None
    src = dest = ""
    try:
        size = parse_size(form.shard_size) if form.shard_size.strip() else settings.shard_size
    except ValueError as exc:
        errors["shard-size"] = str(exc)
    if form.seed.strip():
        try:
            seed = int(form.seed)
        except ValueError:
            errors["seed"] = f"the shuffle seed must be a whole number, got {form.seed!r}"
    for name, text in (("src", form.src), ("dest", form.dest)):
        try:
            url, prof = resolve_location(services.config, text)
        except LoadmasterError as exc:
            errors[name] = str(exc)
            continue
        if name == "src":
            src, sprof = url, prof
        else:
            dest, dprof = url, prof
    if errors:
        return None, errors, sprof, dprof
    req = ShardRequest.from_settings(settings, src, dest, shard_size=size, seed=seed,
                                     incomplete=form.incomplete)
    try:
        req.validate()
    except LoadmasterError as exc:
        return None, {"form": str(exc)}, sprof, dprof
    return req, {}, sprof, dprof


def preview_lines(pv: ShardPreview) -> list[str]:
    """The preview as the form shows it."""
    r = pv.requests
    lines = [
        f"{pv.samples:,} samples ({pv.files:,} files, {fmt_size(pv.source_bytes)}) -> {pv.shards:,} shard(s)",
        f"GETs per epoch {r.gets_before:,} -> {r.gets_after:,}  ({r.reduction:,.0f}x fewer)",
        f"{fmt_usd(r.usd_per_epoch_before)} -> {fmt_usd(r.usd_per_epoch_after)} per epoch ({r.price_source})",
    ]
    lines += [f"warning: {w}" for w in pv.warnings]
    lines += [f"refused: {e}" for e in pv.errors]
    return lines


class ShardsScreen(LoadmasterScreen):
    """Start shard conversions with a previewing form; follow their progress and manifests."""

    SCREEN_TITLE: ClassVar[str] = "Shards"
    #: Below 100 columns the conversions go under the form; up to 160 they get three fifths of the
    #: width (themes/shards.tcss), so the table keeps room for State, Shards and the paths.
    HORIZONTAL_BREAKPOINTS: list[tuple[int, str]] | None = [
        (0, "-narrow"), (100, "-medium"), (160, "-wide")]
    AUTO_FOCUS = "#shards-table"  # the screen keys (digits, n, /) work at once; n goes to the form
    FILTER_HINT: ClassVar[str] = "state, source, destination or where it runs"
    PALETTE_COMMANDS: ClassVar[list[tuple[str, str, str]]] = [
        ("New conversion", "Fill in the conversion form, starting with its source (key n)", "new_conversion"),
        ("Preview the conversion", "Sample/shard counts and GET savings from the source listing", "preview"),
        ("Start the conversion", "Convert the form's source into shards (asks nothing more) (key ctrl+s)", "start"),
        ("Cancel the selected conversion", "Stop it at the next sample; --resume continues it (key c)", "cancel"),
        ("Show the selected conversion", "Paths, progress and manifest summary in full (key enter)",
         "conversion_detail"),
    ]
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("n", "new_conversion", "New"),
        Binding("ctrl+s", "start", "Start"),
        Binding("c", "cancel", "Cancel"),
        FILTER_BINDING,
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | n | Go to the form (its Source field); every change re-previews the conversion. |
    | ctrl+s | Start the conversion the form describes (also works while typing in the form). |
    | c | Cancel the selected conversion: in-process after a sample, a node job after a typed confirmation; completed shards stay for --resume. |
    | enter | The selected conversion in full: paths, progress, manifest summary. |
    | / | Filter conversions by state, source, destination or where they run. |
    | escape | Leave the form / the filter. |
    """

    class PreviewComputed(Message):
        """The form's conversion was previewed from the source listing."""

        def __init__(self, form: ShardForm, preview: ShardPreview) -> None:
            self.form = form
            self.preview = preview
            super().__init__()

    class PreviewFailed(Message):
        """The form could not be previewed (bad field, unreachable store, ...)."""

        def __init__(self, form: ShardForm, errors: dict[str, str]) -> None:
            self.form = form
            self.errors = errors
            super().__init__()

    class ConversionUpdated(Message):
        """A conversion progressed, finished or failed (replaces an older update of the same one)."""

        def __init__(self, conversion: Conversion) -> None:
            self.conversion = conversion
            super().__init__()

        def can_replace(self, message: Message) -> bool:
            return (isinstance(message, ShardsScreen.ConversionUpdated)
                    and message.conversion.key == self.conversion.key
                    and message.conversion.state == "running")

    def __init__(self, services: Services, **kwargs: Any) -> None:
        super().__init__(services, **kwargs)
        self.preview: ShardPreview | None = None
        self.conversions: dict[str, Conversion] = {}
        self.selected: str | None = None
        self._cancel_events: dict[str, threading.Event] = {}
        self._seq = 0

    # ------------------------------------------------------------------ layout

    def compose_body(self) -> ComposeResult:
        settings = self.services.config.section("shards")
        nodes = [("this machine", LOCAL)] + [(n.name, n.name) for n in self.services.config.nodes]
        with Horizontal(id="shards-main", classes="screen-body"):
            with VerticalScroll(id="shards-form"):
                yield Static("New conversion", id="shards-form-title", markup=False)
                for key, label, hint, value in (
                    ("src", "Source", "directory or s3://bucket/prefix of small files", ""),
                    ("dest", "Destination", "directory or s3://bucket/prefix for shards", ""),
                    ("shard-size", "Shard size", "256MB - 1GB", f"{settings.shard_size / 1e6:g}MB"),
                    ("seed", "Shuffle seed", "blank: sorted by key", ""),
                ):
                    with Horizontal(classes="shards-field"):
                        yield Label(label, classes="shards-label")
                        yield Input(value, placeholder=hint, id=f"shards-{key}", compact=True)
                with Horizontal(classes="shards-field"):
                    yield Label("Node", classes="shards-label")
                    yield Select(nodes, value=LOCAL, allow_blank=False, id="shards-node", compact=True)
                with Horizontal(classes="shards-field"):
                    yield Label("Incomplete", classes="shards-label")
                    yield Select([("refuse (report them)", "error"), ("leave them out", "skip"),
                                  ("shard as they are", "keep")], value="error", allow_blank=False,
                                 id="shards-incomplete", compact=True)
                yield Static("", id="shards-errors", markup=False)
                yield Static("Type a source and a destination to preview.", id="shards-preview", markup=False)
                with Horizontal(id="shards-buttons"):
                    yield Button("Start conversion", id="shards-start", variant="primary", disabled=True)
            with Vertical(id="shards-runs"):
                yield Static("Conversions", id="shards-runs-title", markup=False)
                yield DataTable(id="shards-table", cursor_type="row", zebra_stripes=True)
                yield ProgressBar(id="shards-progress", total=1.0, show_eta=False)
                yield Summary(id="shards-run-summary")
                yield Static("", id="shards-manifest", markup=False)

    def on_mount(self) -> None:
        table = self.query_one("#shards-table", DataTable)
        for key, label in RUN_COLUMNS:
            table.add_column(label, key=key, width=COLUMN_WIDTHS.get(key))

    # ------------------------------------------------------------------ form and preview

    def form(self) -> ShardForm:
        """The form's current values."""
        def text(key: str) -> str:
            return self.query_one(f"#shards-{key}", Input).value

        return ShardForm(
            src=text("src"), dest=text("dest"), shard_size=text("shard-size"), seed=text("seed"),
            node=str(self.query_one("#shards-node", Select).value),
            incomplete=str(self.query_one("#shards-incomplete", Select).value),
        )

    @on(Input.Changed, "#shards-form Input")
    @on(Select.Changed, "#shards-form Select")
    def _form_changed(self, event: Message) -> None:
        event.stop()
        self.action_preview()

    def action_preview(self) -> None:
        """Re-preview the form (debounced by the exclusive worker)."""
        form = self.form()
        self.query_one("#shards-start", Button).disabled = True
        if not form.src.strip() or not form.dest.strip():
            return
        self._preview_form(form)

    @work(exclusive=True, group="shards-preview", exit_on_error=False)
    async def _preview_form(self, form: ShardForm) -> None:
        req, errors, sprof, dprof = form_request(self.services, form)
        if req is None:
            self.post_message(self.PreviewFailed(form, errors))
            return
        if form.node != LOCAL and not req.src.startswith("s3://"):
            self.post_message(self.PreviewFailed(form, {"preview": (
                f"{req.src} is read on {form.node}; the preview lists sources on this machine or in s3://")}))
            return
        try:
            pv = await preview(req, config=self.services.config, src_profile=sprof, dest_profile=dprof)
        except LoadmasterError as exc:
            self.post_message(self.PreviewFailed(form, {"preview": str(exc)}))
            return
        self.post_message(self.PreviewComputed(form, pv))

    @on(PreviewComputed)
    def _preview_computed(self, event: PreviewComputed) -> None:
        if event.form != self.form():
            return  # typed on since: a newer preview is coming
        self.preview = event.preview
        self._show_errors({})
        box = self.query_one("#shards-preview", Static)
        box.update("\n".join(preview_lines(event.preview)))
        box.set_class(not event.preview.ok, "-refused")
        box.set_class(bool(event.preview.warnings), "-warned")
        self.query_one("#shards-start", Button).disabled = not event.preview.ok

    @on(PreviewFailed)
    def _preview_failed(self, event: PreviewFailed) -> None:
        if event.form != self.form():
            return
        self.preview = None
        self._show_errors(event.errors)
        # A node-local source cannot be previewed here, but may still be started on the node.
        self.query_one("#shards-start", Button).disabled = set(event.errors) != {"preview"} or event.form.node == LOCAL

    def _show_errors(self, errors: dict[str, str]) -> None:
        for key in ("src", "dest", "shard-size", "seed"):
            self.query_one(f"#shards-{key}", Input).set_class(key in errors, "-invalid")
        box = self.query_one("#shards-errors", Static)
        box.update("\n".join(errors.values()))
        box.set_class(bool(errors), "-active")

    # ------------------------------------------------------------------ starting

    @on(Button.Pressed, "#shards-start")
    def _start_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_start()

    def action_start(self) -> None:
        """Start the conversion the form describes (in-process, or as a job on the chosen node)."""
        if not self.require_writable("start a conversion"):
            return
        form = self.form()
        req, errors, sprof, dprof = form_request(self.services, form)
        if req is None:
            self._show_errors(errors)
            return
        self._seq += 1
        key = f"c{self._seq}"
        where = "this machine" if form.node == LOCAL else form.node
        self._apply(Conversion(key, req.src, req.dest, where, detail="starting"))
        self.query_one("#shards-start", Button).disabled = True
        self.main_table().focus()  # follow it: enter shows it in full, c cancels it
        # One worker group per conversion: several may run at once, and none cancels another.
        if form.node == LOCAL:
            cancel = threading.Event()
            self._cancel_events[key] = cancel
            self.run_worker(self._run_local(key, req, sprof, dprof, cancel), group=f"shards-run-{key}",
                            exclusive=True, exit_on_error=False)
        else:
            self.run_worker(self._run_on_node(key, form.node, req, sprof, dprof), group=f"shards-run-{key}",
                            exclusive=True, exit_on_error=False)

    def on_unmount(self) -> None:
        # The writer thread outlives a cancelled worker; stop it at its next sample.
        for event in self._cancel_events.values():
            event.set()

    async def _run_local(self, key: str, req: ShardRequest, sprof: Any, dprof: Any, cancel: threading.Event) -> None:
        base = self.conversions[key]
        last: list[ShardProgress] = []

        def on_progress(p: ShardProgress) -> None:  # called from the writer thread
            last[:] = [p]
            frac = p.bytes_done / p.bytes_total if p.bytes_total else None
            self.post_message(self.ConversionUpdated(replace(base, progress=p, fraction=frac, detail="")))

        try:
            result: ConvertResult = await convert(req, config=self.services.config, src_profile=sprof,
                                                  dest_profile=dprof, on_progress=on_progress,
                                                  cancelled=cancel.is_set, prepared=self.preview)
        except LoadmasterError as exc:
            state = "cancelled" if cancel.is_set() else "failed"
            # Built from the last progress seen, not from what the screen has applied so far:
            # progress messages may still be queued, and they are dropped once a run has ended.
            self.post_message(self.ConversionUpdated(replace(
                base, state=state, progress=last[0] if last else None, detail=str(exc))))
            return
        self.post_message(self.ConversionUpdated(replace(
            base, state="succeeded", fraction=1.0, progress=last[0] if last else None,
            detail=f"{len(result.written)} written, {len(result.resumed)} resumed in {result.elapsed:.1f}s",
            summary=result.manifest.summary())))

    async def _run_on_node(self, key: str, node: str, req: ShardRequest, sprof: Any, dprof: Any) -> None:
        base = self.conversions[key]
        try:
            rec = await launch_on_node(self.services, node, req, sprof, dprof)
        except LoadmasterError as exc:
            self.post_message(self.ConversionUpdated(replace(base, state="failed", detail=str(exc))))
            return
        conv = replace(base, job_id=rec.id, detail=f"job {rec.id}")
        self.post_message(self.ConversionUpdated(conv))
        while True:
            try:
                rec = await self.services.jobs.refresh_job(rec.id)
            except LoadmasterError as exc:
                conv = replace(conv, detail=f"job {rec.id}: {exc}")
                self.post_message(self.ConversionUpdated(conv))
                await _sleep(JOB_POLL_S)
                continue
            prog = rec.progress
            if prog is not None:
                ex = prog.extra
                conv = replace(conv, fraction=prog.fraction, progress=ShardProgress(
                    prog.items_done, prog.items_total or 0, prog.bytes_done, prog.bytes_total or 0,
                    int(ex.get("shards_done", 0)), int(ex.get("shards_total", 0)), 0.0,
                    float(ex.get("samples_per_s", 0.0)), float(ex.get("mb_per_s", 0.0))))
            if rec.terminal:
                res = rec.result or {}
                summary = ""
                if rec.state == "succeeded" and res:
                    r = res.get("requests", {})
                    summary = (f"{res.get('shards', 0):,} shards, {res.get('samples', 0):,} samples, "
                               f"{fmt_size(res.get('bytes', 0))}\nGETs per epoch {r.get('gets_before', 0):,} -> "
                               f"{r.get('gets_after', 0):,} ({r.get('reduction', 0):,.0f}x fewer)")
                self.post_message(self.ConversionUpdated(replace(
                    conv, state=rec.state, detail=rec.error or f"job {rec.id}", summary=summary)))
                return
            self.post_message(self.ConversionUpdated(conv))
            await _sleep(JOB_POLL_S)

    def action_new_conversion(self) -> None:
        """Go to the form's Source field."""
        self.query_one("#shards-src", Input).focus()

    def action_cancel(self) -> None:
        """Cancel the selected conversion: in-process at its next sample, a node job after a typed
        confirmation (its process group is stopped; completed shards stay for ``--resume``)."""
        if not self.require_writable("cancel a conversion"):
            return
        conv = self.conversions.get(self.selected or "")
        if conv is None:
            self.notify("No conversion selected: start one first (n).", severity="warning", markup=False)
            return
        if conv.state != "running":
            self.notify(f"The conversion of {conv.src} already ended ({conv.state}).", severity="warning",
                        markup=False)
            return
        event = self._cancel_events.get(conv.key)
        if event is not None:
            event.set()
            return
        if conv.job_id is None:
            self.notify("The job is still being launched; try again in a moment.", severity="warning", markup=False)
            return
        job_id = conv.job_id
        body = (f"shard job {job_id} on {conv.where}\n{conv.src} -> {conv.dest}\n"
                "Its process group is stopped; completed shards stay, and --resume continues from them.")

        def answered(ok: bool | None) -> None:
            if ok:
                self._cancel_job(job_id)

        self.app.push_screen(ConfirmTyped(title="Cancel this conversion?", phrase="cancel", body=body,
                                          confirm_label="Cancel conversion"), answered)

    @work(group="shards-cancel", exit_on_error=False)
    async def _cancel_job(self, job_id: str) -> None:
        rec = await self.services.jobs.cancel(job_id, reason="cancelled from the console")
        self.notify(f"job {rec.id}: {rec.state}", markup=False)

    def action_conversion_detail(self) -> None:
        """The selected conversion in full (the table cuts the paths to fit)."""
        conv = self.conversions.get(self.selected or "")
        if conv is None:
            self.notify("No conversion selected: start one first (n).", severity="warning", markup=False)
            return
        p = conv.progress
        fields = [("source", conv.src), ("destination", conv.dest), ("runs on", conv.where), ("state", conv.state)]
        if conv.job_id:
            fields.append(("job", f"{conv.job_id} (loadmaster job show {conv.job_id})"))
        if p is not None:
            fields += [("samples", f"{p.samples_done:,}/{p.samples_total:,}"),
                       ("shards", f"{p.shards_done}/{p.shards_total}"),
                       ("bytes", f"{fmt_size(p.bytes_done)}/{fmt_size(p.bytes_total)}"),
                       ("rate", f"{p.samples_per_s:,.0f} samples/s, {p.mb_per_s:,.1f} MB/s")]
        if conv.detail:
            fields.append(("detail", conv.detail))
        if conv.summary:
            fields += [("manifest", line) for line in conv.summary.splitlines()]
        self.app.push_screen(DetailModal(f"conversion {conv.key}", fields, hint="escape: back to the table, where c cancels it"))

    @on(DataTable.RowSelected, "#shards-table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value in self.conversions:
            self.selected = event.row_key.value
            self.action_conversion_detail()

    def main_table(self) -> DataTable[Any]:
        return self.query_one("#shards-table", DataTable)

    def _visible(self, conv: Conversion) -> bool:
        return self.filter_matches(conv.state, conv.src, conv.dest, conv.where, conv.job_id or "")

    def apply_filter(self) -> None:
        table = self.main_table()
        with self.app.batch_update():
            table.clear()
            for conv in self.conversions.values():
                if self._visible(conv):
                    table.add_row(*self._cells(conv), key=conv.key)

    # ------------------------------------------------------------------ conversions list

    @on(ConversionUpdated)
    def _conversion_updated(self, event: ConversionUpdated) -> None:
        self._apply(event.conversion)

    def _apply(self, conv: Conversion) -> None:
        old = self.conversions.get(conv.key)
        if old is not None and old.state != "running" and conv.state == "running":
            return  # a late progress line after the end
        self.conversions[conv.key] = conv
        if self.selected is None or conv.state == "running" and old is None:
            self.selected = conv.key
        table = self.query_one("#shards-table", DataTable)
        shown = conv.key in table.rows
        if not self._visible(conv):
            if shown:
                table.remove_row(conv.key)
        elif not shown:
            table.add_row(*self._cells(conv), key=conv.key)
        else:
            for (key, _), cell in zip(RUN_COLUMNS, self._cells(conv), strict=True):
                table.update_cell(conv.key, key, cell)
        if conv.key == self.selected:
            self._show_selected()

    @staticmethod
    def _cells(conv: Conversion) -> list[str]:
        p = conv.progress
        half = (ROUTE_WIDTH - 4) // 2  # both paths keep their ends; the full ones are under the table
        cells = {
            "state": conv.state, "shards": f"{p.shards_done}/{p.shards_total}" if p else "",
            "route": f"{short(conv.src, half)} -> {short(conv.dest, half)}", "where": conv.where,
            "rate": f"{p.samples_per_s:,.0f}" if p else "", "mbps": f"{p.mb_per_s:,.1f}" if p else "",
        }
        return [cells[k] for k, _ in RUN_COLUMNS]

    @on(DataTable.RowHighlighted, "#shards-table")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if event.row_key.value in self.conversions:
            self.selected = event.row_key.value
            self._show_selected()

    def _show_selected(self) -> None:
        conv = self.conversions.get(self.selected or "")
        if conv is None:
            return
        bar = self.query_one("#shards-progress", ProgressBar)
        bar.update(total=1.0, progress=conv.fraction or (1.0 if conv.state == "succeeded" else 0.0))
        p = conv.progress
        items: list[tuple[str, object]] = [("state", conv.state)]
        if p is not None:
            items += [("samples", f"{p.samples_done:,}/{p.samples_total:,}"),
                      ("shards", f"{p.shards_done}/{p.shards_total}"),
                      ("bytes", f"{fmt_size(p.bytes_done)}/{fmt_size(p.bytes_total)}"),
                      ("samples/s", f"{p.samples_per_s:,.0f}"), ("MB/s", f"{p.mb_per_s:,.1f}")]
        self.query_one("#shards-run-summary", Summary).set_items(items)
        box = self.query_one("#shards-manifest", Static)
        box.update("\n".join(x for x in (f"{conv.src} -> {conv.dest}", conv.detail, conv.summary) if x))
        box.set_class(conv.state == "failed", "-failed")
        box.set_class(conv.state == "succeeded", "-succeeded")


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)
