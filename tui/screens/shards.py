"""Shards screen: start a WebDataset shard conversion and follow it to its manifest.

Left: the form (:class:`~tui.widgets.shard_form.ShardForm`: source, destination, shard size, node,
shuffle seed, incomplete-sample policy). Every change re-previews the conversion from the source
listing alone (sample count, shard count, GETs per epoch before and after, warnings and refusals),
so the operator sees what will happen before anything runs. Right: the conversions started from
this console (:class:`~tui.widgets.shard_runs.ShardRuns`), live progress of the selected one, and
its manifest summary when it ends. Conversions run in-process (this machine) or as durable
``shard`` jobs on a node, followed with ``JobManager.wait``; all the work is in ``backend.shards``.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import DataTable

from backend.errors import LoadmasterError
from backend.ops.shards import ConvertResult, ShardPreview, ShardProgress, ShardRequest, ShardSettings
from tui.screens.base import FILTER_BINDING, LoadmasterScreen
from tui.widgets.confirm import ConfirmTyped
from tui.widgets.detail import DetailModal
from tui.widgets.shard_form import LOCAL, ShardForm, ShardFormValues, form_request
from tui.widgets.shard_runs import Conversion, ShardRuns, from_job_record, progress_fields

if TYPE_CHECKING:
    from backend.ops.types import JobRecord
    from backend.services import Services

#: How often a node job's conversion is re-read (``JobManager.wait``'s poll).
JOB_POLL_S = 2.0


class ShardsScreen(LoadmasterScreen):
    """Start shard conversions with a previewing form; follow their progress and manifests."""

    SCREEN_TITLE: ClassVar[str] = "Shards"
    #: Below 100 columns the conversions go under the form; up to 160 they get three fifths of the
    #: width (themes/shards.tcss), so the table keeps room for State, Shards and the paths.
    HORIZONTAL_BREAKPOINTS: list[tuple[int, str]] | None = [(0, "-narrow"), (100, "-medium"), (160, "-wide")]
    AUTO_FOCUS = "#shards-table"  # the screen keys (digits, n, /) work at once; n goes to the form
    FILTER_HINT: ClassVar[str] = "state, source, destination or where it runs"
    PALETTE_COMMANDS: ClassVar[list[tuple[str, str, str]]] = [
        ("New conversion", "Fill in the conversion form, starting with its source (key n)", "new_conversion"),
        ("Preview the conversion", "Sample/shard counts and GET savings from the source listing", "preview"),
        ("Start the conversion", "Convert the form's source into shards (asks nothing more) (key ctrl+s)", "start"),
        ("Cancel the selected conversion", "Stop it at the next sample; --resume continues it (key c)", "cancel"),
        (
            "Show the selected conversion",
            "Paths, progress and manifest summary in full (key enter)",
            "conversion_detail",
        ),
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

        def __init__(self, form: ShardFormValues, preview: ShardPreview) -> None:
            self.form = form
            self.preview = preview
            super().__init__()

    class PreviewFailed(Message):
        """The form could not be previewed (bad field, unreachable store, ...)."""

        def __init__(self, form: ShardFormValues, errors: dict[str, str]) -> None:
            self.form = form
            self.errors = errors
            super().__init__()

    class ConversionUpdated(Message):
        """A conversion progressed, finished or failed (replaces an older update of the same one)."""

        def __init__(self, conversion: Conversion) -> None:
            self.conversion = conversion
            super().__init__()

        def can_replace(self, message: Message) -> bool:
            return (
                isinstance(message, ShardsScreen.ConversionUpdated)
                and message.conversion.key == self.conversion.key
                and message.conversion.state == "running"
            )

    def __init__(self, services: Services, **kwargs: Any) -> None:
        super().__init__(services, **kwargs)
        self.preview: ShardPreview | None = None
        self.conversions: dict[str, Conversion] = {}
        self.selected: str | None = None
        self._cancel_events: dict[str, threading.Event] = {}
        self._seq = 0

    # ------------------------------------------------------------------ layout

    def compose_body(self) -> ComposeResult:
        settings = self.services.config.section(ShardSettings)
        with Horizontal(id="shards-main", classes="screen-body"):
            yield ShardForm(
                shard_size=settings.shard_size, nodes=[n.name for n in self.services.config.nodes], id="shards-form"
            )
            yield ShardRuns(id="shards-runs")

    def form(self) -> ShardFormValues:
        """The form's current values."""
        return self.query_one(ShardForm).values()

    # ------------------------------------------------------------------ form and preview

    @on(ShardForm.Changed)
    def _form_changed(self, event: ShardForm.Changed) -> None:
        event.stop()
        self.action_preview()

    def action_preview(self) -> None:
        """Re-preview the form (debounced by the exclusive worker)."""
        form = self.form()
        self.query_one(ShardForm).set_startable(False)
        if not form.src.strip() or not form.dest.strip():
            return
        self._preview_form(form)

    @work(exclusive=True, group="shards-preview", exit_on_error=False)
    async def _preview_form(self, form: ShardFormValues) -> None:
        req, errors, _, _ = form_request(self.services, self.ops.shards, form)
        if req is None:
            self.post_message(self.PreviewFailed(form, errors))
            return
        if form.node != LOCAL and not req.src.startswith("s3://"):
            self.post_message(
                self.PreviewFailed(
                    form,
                    {
                        "preview": (
                            f"{req.src} is read on {form.node}; the preview lists sources on this machine or in s3://"
                        )
                    },
                )
            )
            return
        try:
            pv = await self.ops.shards.preview(req)
        except LoadmasterError as exc:
            self.post_message(self.PreviewFailed(form, {"preview": str(exc)}))
            return
        self.post_message(self.PreviewComputed(form, pv))

    @on(PreviewComputed)
    def _preview_computed(self, event: PreviewComputed) -> None:
        if event.form != self.form():
            return  # typed on since: a newer preview is coming
        self.preview = event.preview
        self.query_one(ShardForm).show_preview(event.preview)

    @on(PreviewFailed)
    def _preview_failed(self, event: PreviewFailed) -> None:
        if event.form != self.form():
            return
        self.preview = None
        form = self.query_one(ShardForm)
        form.show_errors(event.errors)
        # A node-local source cannot be previewed here, but may still be started on the node.
        form.set_startable(set(event.errors) == {"preview"} and event.form.node != LOCAL)

    # ------------------------------------------------------------------ starting

    @on(ShardForm.StartPressed)
    def _start_pressed(self, event: ShardForm.StartPressed) -> None:
        event.stop()
        self.action_start()

    def action_start(self) -> None:
        """Start the conversion the form describes (in-process, or as a job on the chosen node)."""
        if not self.require_writable("start a conversion"):
            return
        form = self.form()
        req, errors, _, _ = form_request(self.services, self.ops.shards, form)
        if req is None:
            self.query_one(ShardForm).show_errors(errors)
            return
        self._seq += 1
        key = f"c{self._seq}"
        where = "this machine" if form.node == LOCAL else form.node
        self._apply(Conversion(key, req.src, req.dest, where, detail="starting"))
        self.query_one(ShardForm).set_startable(False)
        self.main_table().focus()  # follow it: enter shows it in full, c cancels it
        # One worker group per conversion: several may run at once, and none cancels another.
        if form.node == LOCAL:
            cancel = threading.Event()
            self._cancel_events[key] = cancel
            self.run_worker(
                self._run_local(key, req, cancel), group=f"shards-run-{key}", exclusive=True, exit_on_error=False
            )
        else:
            self.run_worker(
                self._run_on_node(key, form.node, req), group=f"shards-run-{key}", exclusive=True, exit_on_error=False
            )

    def on_unmount(self) -> None:
        # The writer thread outlives a cancelled worker; stop it at its next sample.
        for event in self._cancel_events.values():
            event.set()

    async def _run_local(self, key: str, req: ShardRequest, cancel: threading.Event) -> None:
        base = self.conversions[key]
        last: list[ShardProgress] = []

        def on_progress(p: ShardProgress) -> None:  # called from the writer thread
            last[:] = [p]
            frac = p.bytes_done / p.bytes_total if p.bytes_total else None
            self.post_message(self.ConversionUpdated(replace(base, progress=p, fraction=frac, detail="")))

        try:
            result: ConvertResult = await self.ops.shards.convert_here(
                req, shown=self.preview, on_progress=on_progress, cancelled=cancel.is_set
            )
        except LoadmasterError as exc:
            state = "cancelled" if cancel.is_set() else "failed"
            # Built from the last progress seen, not from what the screen has applied so far:
            # progress messages may still be queued, and they are dropped once a run has ended.
            self.post_message(
                self.ConversionUpdated(replace(base, state=state, progress=last[0] if last else None, detail=str(exc)))
            )
            return
        self.post_message(
            self.ConversionUpdated(
                replace(
                    base,
                    state="succeeded",
                    fraction=1.0,
                    progress=last[0] if last else None,
                    detail=f"{len(result.written)} written, {len(result.resumed)} resumed in {result.elapsed:.1f}s",
                    summary=result.manifest.summary(),
                )
            )
        )

    async def _run_on_node(self, key: str, node: str, req: ShardRequest) -> None:
        base = self.conversions[key]
        try:
            rec = await self.ops.shards.start_on_node(node, req)
        except LoadmasterError as exc:
            self.post_message(self.ConversionUpdated(replace(base, state="failed", detail=str(exc))))
            return
        job_id = rec.id
        conv = replace(base, job_id=job_id, detail=f"job {job_id}")
        self.post_message(self.ConversionUpdated(conv))

        def on_update(rec: JobRecord) -> None:
            nonlocal conv
            conv = from_job_record(conv, rec)
            self.post_message(self.ConversionUpdated(conv))

        while True:  # an error reading the job is shown, and following it goes on
            try:
                await self.services.jobs.wait(job_id, poll=JOB_POLL_S, on_update=on_update)
                return
            except LoadmasterError as exc:
                conv = replace(conv, detail=f"job {job_id}: {exc}")
                self.post_message(self.ConversionUpdated(conv))
                await asyncio.sleep(JOB_POLL_S)

    def action_new_conversion(self) -> None:
        """Go to the form's Source field."""
        self.query_one(ShardForm).focus_source()

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
            self.notify(f"The conversion of {conv.src} already ended ({conv.state}).", severity="warning", markup=False)
            return
        event = self._cancel_events.get(conv.key)
        if event is not None:
            event.set()
            return
        if conv.job_id is None:
            self.notify("The job is still being launched; try again in a moment.", severity="warning", markup=False)
            return
        job_id = conv.job_id
        body = (
            f"shard job {job_id} on {conv.where}\n{conv.src} -> {conv.dest}\n"
            "Its process group is stopped; completed shards stay, and --resume continues from them."
        )

        def answered(ok: bool | None) -> None:
            if ok:
                self._cancel_job(job_id)

        self.app.push_screen(
            ConfirmTyped(
                title="Cancel this conversion?", phrase="cancel", body=body, confirm_label="Cancel conversion"
            ),
            answered,
        )

    @work(group="shards-cancel", exit_on_error=False)
    async def _cancel_job(self, job_id: str) -> None:
        rec = await self.ops.jobs.cancel(job_id, reason="cancelled from the console")
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
            fields += [*progress_fields(p), ("rate", f"{p.samples_per_s:,.0f} samples/s, {p.mb_per_s:,.1f} MB/s")]
        if conv.detail:
            fields.append(("detail", conv.detail))
        if conv.summary:
            fields += [("manifest", line) for line in conv.summary.splitlines()]
        self.app.push_screen(
            DetailModal(f"conversion {conv.key}", fields, hint="escape: back to the table, where c cancels it")
        )

    @on(DataTable.RowSelected, "#shards-table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value in self.conversions:
            self.selected = event.row_key.value
            self.action_conversion_detail()

    def main_table(self) -> DataTable[Any]:
        return self.query_one(ShardRuns).table

    def _visible(self, conv: Conversion) -> bool:
        return self.filter_matches(conv.state, conv.src, conv.dest, conv.where, conv.job_id or "")

    def apply_filter(self) -> None:
        self.query_one(ShardRuns).show_rows(c for c in self.conversions.values() if self._visible(c))

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
        self.query_one(ShardRuns).show_row(conv, visible=self._visible(conv))
        if conv.key == self.selected:
            self._show_selected()

    @on(DataTable.RowHighlighted, "#shards-table")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if event.row_key.value in self.conversions:
            self.selected = event.row_key.value
            self._show_selected()

    def _show_selected(self) -> None:
        conv = self.conversions.get(self.selected or "")
        if conv is not None:
            self.query_one(ShardRuns).show_selected(conv)
