"""Checkpoints screen: a run's steps (kind, size, age, BF16 export), footprint figures, the upload
backlog alert, and actions: strip a step, upload a local step folder, inspect a step.

Listing, inspecting, stripping and uploading run in workers through :mod:`backend.checkpoints`;
results arrive as past-tense messages. Nothing here touches a store directly.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import DataTable, Input, Label, ProgressBar, Select, Static
from textual.worker import get_current_worker

from backend.errors import LoadmasterError
from backend.ops.checkpoints import StripRequest, StripResult, UploadRequest, UploadResult, footprint
from backend.units import age_of, bytes_gib_text, bytes_text, gbps_text
from tui.screens.base import FILTER_BINDING, RUN_FOLDER_BINDINGS, LoadmasterScreen
from tui.widgets.confirm import ConfirmModal, ConfirmTyped
from tui.widgets.plain import PlainStatic, PlainTable
from tui.widgets.table_cursor import cursor_row_key
from tui.widgets.transfers_format import short

if TYPE_CHECKING:
    from backend.ops.checkpoints import BacklogAlert, Catalog, CheckpointStep, StepInspection
    from backend.services import Services

#: Theme variable per kind (cells coloured by meaning, never by literal colour).
KIND_STYLE = {
    "full": "action-keep",
    "weights": "action-strip",
    "incomplete": "job-running",
    "corrupt": "action-delete",
    "unknown": "action-skip",
}

#: The Params field's default: the brief's 70B model, used only while the run's own size is unknown.
DEFAULT_PARAMS = "70e9"


class CatalogListed(Message):
    """A fresh listing of the run prefix arrived, with the current upload-backlog alerts."""

    def __init__(self, url: str, catalog: Catalog, alerts: list[BacklogAlert]) -> None:
        super().__init__()
        self.url, self.catalog, self.alerts = url, catalog, alerts


class StepInspected(Message):
    """A step's tensor table / key list was read."""

    def __init__(self, inspection: StepInspection) -> None:
        super().__init__()
        self.inspection = inspection


class ActionProgressed(Message):
    """A strip or upload running in this console moved on (bytes done of bytes total)."""

    def __init__(self, done: int, total: int) -> None:
        super().__init__()
        self.done, self.total = done, total

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ActionProgressed)  # only the latest matters


class ActionFinished(Message):
    """A strip or upload finished (or launched as a node job); ``ok`` False with the error text."""

    def __init__(self, what: str, ok: bool, detail: str) -> None:
        super().__init__()
        self.what, self.ok, self.detail = what, ok, detail


class CheckpointsScreen(LoadmasterScreen):
    """Steps of a run prefix in any configured store, with strip / upload / inspect."""

    SCREEN_TITLE: ClassVar[str] = "Checkpoints"
    AUTO_FOCUS = "#ckpt-steps"  # the screen keys work at once; o edits the run prefix
    FILTER_HINT: ClassVar[str] = "step, kind or layout"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("i", "inspect_step", "Inspect", show=True),
        Binding("s", "strip_step", "Strip…", show=True),
        Binding("u", "upload_step", "Upload…", show=True),
        *RUN_FOLDER_BINDINGS,
        FILTER_BINDING,
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | enter, i | Show the selected step's tensors (safetensors headers / DCP metadata). |
    | s | Strip the selected step to BF16 safetensors in its own folder (after confirmation). |
    | u | Upload the local step folder typed in "Local step" into the run prefix (after confirmation). |
    | r, ctrl+r | List the run prefix again (ctrl+r also works while typing). |
    | o | Edit the run prefix (enter lists it). |
    | / | Filter steps by number, kind or layout. |
    | escape | Close the tensor table / leave a field / clear the filter. |
    """

    PALETTE_COMMANDS: ClassVar[list[tuple[str, str, str]]] = [
        ("Reload checkpoints", "List the run prefix again (key r)", "reload"),
        ("Edit the run prefix", "Type another run prefix; enter lists it (key o)", "focus_url"),
        ("Strip checkpoint to BF16", "Write the selected step's weights as BF16 safetensors (key s)", "strip_step"),
        ("Upload local checkpoint", "Upload the local step folder into the run prefix (key u)", "upload_step"),
        ("Inspect checkpoint", "Show the selected step's tensors (key enter or i)", "inspect_step"),
    ]

    def __init__(self, services: Services, **kwargs: Any) -> None:
        super().__init__(services, **kwargs)
        self.catalog: Catalog | None = None
        self.url = ""
        self.alerts: list[BacklogAlert] = []

    # ----------------------------------------------------------------- layout

    def compose_body(self) -> ComposeResult:
        stores = list(self.services.config.stores.items())
        first, self._list_on_mount = self.ops.retention.opening_run()
        with Vertical(classes="screen-body", id="ckpt-body"):
            with Horizontal(classes="ckpt-row"):
                yield Label("Store", classes="ckpt-label")
                urls = {p.url for _, p in stores}
                yield Select(
                    [(n, p.url) for n, p in stores],
                    prompt="store",
                    id="ckpt-store",
                    value=first if first in urls else Select.NULL,
                )
                yield Label("Run prefix", classes="ckpt-label")
                yield Input(value=first, placeholder="s3://bucket/run, a store name/run or a directory", id="ckpt-url")
            with Horizontal(classes="ckpt-row"):
                yield Label("Params", classes="ckpt-label")
                yield Input(DEFAULT_PARAMS, id="ckpt-params", classes="ckpt-num")
                yield Label("Local step", classes="ckpt-label")
                yield Input(placeholder="/nvme/ckpt/step-48000 (for u: upload)", id="ckpt-local")
                yield Label("Node", classes="ckpt-label")
                yield Input(placeholder="run here", id="ckpt-node", classes="ckpt-num")
            yield PlainStatic("", id="ckpt-footprint")
            yield PlainStatic("", id="ckpt-backlog")
            yield PlainStatic(
                "Press o to type a run prefix (or pick a store), then enter to list it.",
                id="ckpt-summary",
            )
            yield PlainTable(id="ckpt-steps", cursor_type="row", zebra_stripes=True)
            yield PlainTable(id="ckpt-tensors", cursor_type="row", zebra_stripes=True)
            yield PlainStatic("", id="ckpt-status")
            yield ProgressBar(id="ckpt-progress", show_eta=True)

    def on_mount(self) -> None:
        steps = self.query_one("#ckpt-steps", DataTable)
        for key, label in (
            ("step", "Step"),
            ("kind", "Kind"),
            ("layout", "Layout"),
            ("size", "Size"),
            ("objects", "Objects"),
            ("age", "Age"),
            ("export", "BF16 export"),
        ):
            steps.add_column(label, key=key)
        tensors = self.query_one("#ckpt-tensors", DataTable)
        for key, label in (
            ("name", "Tensor"),
            ("dtype", "Dtype"),
            ("shape", "Shape"),
            ("bytes", "Bytes"),
            ("file", "File"),
        ):
            tensors.add_column(label, key=key)
        tensors.display = False
        self.query_one("#ckpt-progress", ProgressBar).display = False
        self.query_one("#ckpt-backlog", Static).display = False
        self.render_footprint()

    def start_reads(self) -> None:
        if self._list_on_mount:  # the last run listed here, or the lab's demo run: open on it
            self.action_reload()

    def on_resize(self, event: Any) -> None:
        super().on_resize(event)
        self.render_catalog()  # the run prefix is shortened to the width, the footprint reflowed
        self.render_footprint()

    # ----------------------------------------------------------------- footprint

    @on(Input.Changed, "#ckpt-params")
    def _params_changed(self, event: Input.Changed) -> None:
        self.render_footprint()

    def run_params(self) -> tuple[int, str] | None:
        """The run's own parameter count, from the newest full step whose model tensors were read."""
        for s in reversed(self.catalog.steps if self.catalog else ()):
            if s.kind == "full" and s.weights_bytes:
                return s.weights_bytes // 2, s.name
        return None

    def render_footprint(self) -> None:
        """Footprint for the run's own model size when its tensors were read (else the size typed
        in Params, said to be assumed), for the run's retained full checkpoints."""
        text = self.query_one("#ckpt-params", Input).value.strip()
        out = self.query_one("#ckpt-footprint", Static)
        own = self.run_params()
        try:
            if own is not None and text in ("", DEFAULT_PARAMS):
                params, source = float(own[0]), f"from {own[1]}'s tensors"
            else:
                params = float(text)
                source = "typed in" if text != DEFAULT_PARAMS else "assumed: type the model's size"
            retained = max(1, sum(1 for s in self.catalog.steps if s.kind == "full")) if self.catalog else 1
            fp = footprint(params, retained)
        except ValueError:
            out.update(f"Params: expected a number like 70e9, got {text!r}")
            return
        size = f"{params / 1e9:g}B" if params >= 1e9 else f"{params:,.0f}"
        if (self.size.width or self.app.size.width) < 120:  # two lines at 80 columns, same figures
            out.update(
                f"{size} params ({source}): BF16 {bytes_text(fp.weights_bytes)}, full {bytes_text(fp.full_bytes)}\n"
                f"{retained} full checkpoint(s): {bytes_text(fp.retained_full_bytes)}, "
                f"as weights {bytes_text(fp.retained_weights_bytes)} (saves {fp.saving_fraction:.1%})"
            )
            return
        out.update(
            f"{size} params ({source}): BF16 weights {bytes_gib_text(fp.weights_bytes)}, full AdamW state "
            f"{bytes_gib_text(fp.full_bytes)} (14 B/param); weights only saves {fp.saving_fraction:.1%}. "
            f"For {retained} full checkpoint(s): {bytes_gib_text(fp.retained_full_bytes)} vs "
            f"{bytes_gib_text(fp.retained_weights_bytes)}.  GB = 10^9 bytes"
        )

    # ----------------------------------------------------------------- listing

    @on(Select.Changed, "#ckpt-store")
    def _store_picked(self, event: Select.Changed) -> None:
        if isinstance(event.value, str) and event.value:
            self.query_one("#ckpt-url", Input).value = event.value

    @on(Input.Submitted, "#ckpt-url")
    def _url_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_reload()
        self.main_table().focus()  # the step keys (i, s, digits) act on the table

    def action_focus_url(self) -> None:
        """Edit the run prefix (enter lists it)."""
        self.query_one("#ckpt-url", Input).focus()

    def main_table(self) -> DataTable[Any]:
        return self.query_one("#ckpt-steps", DataTable)

    def escape_hook(self) -> Callable[[], None] | None:
        return self._close_tensors if self.query_one("#ckpt-tensors", DataTable).display else None

    def _close_tensors(self) -> None:
        self.query_one("#ckpt-tensors", DataTable).display = False
        self.query_one("#ckpt-status", Static).update("")
        self.main_table().focus()

    def apply_filter(self) -> None:
        self.render_catalog()

    @on(DataTable.RowSelected, "#ckpt-steps")
    def _step_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_inspect_step()

    def action_reload(self) -> None:
        url = self.query_one("#ckpt-url", Input).value.strip()
        if not url:
            self.notify("Enter a run prefix first.", severity="warning", markup=False)
            return
        self.query_one("#ckpt-summary", Static).update(f"Listing {url} …")
        self._list(url)

    @work(thread=True, exclusive=True, group="checkpoints-list", exit_on_error=False)
    def _list(self, url: str) -> None:
        # In a thread, on an event loop of its own, as Retention's listing: reading the steps'
        # metadata and the job records (the backlog) do not yield, and must not hold up the keys.
        try:
            catalog = asyncio.run(self.ops.checkpoints.listing(url))
        except LoadmasterError as exc:
            self.app.call_from_thread(self._not_listed, url, exc)
            return
        try:
            alerts = self.ops.checkpoints.backlog()
        except LoadmasterError:
            alerts = []
        if not get_current_worker().is_cancelled:
            self.post_message(CatalogListed(url, catalog, alerts))

    def _not_listed(self, url: str, exc: LoadmasterError) -> None:
        self.report_error(f"Listing {url}", exc)
        self.query_one("#ckpt-summary", Static).update(f"Could not list {url}: {exc}")

    @on(CatalogListed)
    def _listed(self, event: CatalogListed) -> None:
        self.url, self.catalog, self.alerts = event.url, event.catalog, event.alerts
        self.ops.retention.remember_run(event.url)
        # The store picker names the store the listed run is in, or none (a local directory).
        picker = self.query_one("#ckpt-store", Select)
        url = event.url.rstrip("/")
        store = next(
            (p.url for p in self.services.config.stores.values() if url == p.url or url.startswith(p.url + "/")), None
        )
        with self.prevent(Select.Changed):  # choosing a store would type its root over the run
            if store is None:
                picker.clear()
            elif picker.value != store:
                picker.value = store
        self.render_catalog()

    def render_catalog(self) -> None:
        """Rows per step (kind coloured by theme variable), totals by kind, backlog alerts."""
        cat = self.catalog
        if cat is None:
            return
        variables = getattr(self.app, "theme_variables", {}) or {}
        table = self.query_one("#ckpt-steps", DataTable)
        selected = self.selected()
        shown = [
            s
            for s in cat.steps
            if self.filter_matches(str(s.step) if s.step is not None else "", s.name, s.kind, s.layout)
        ]
        with self.app.batch_update():
            table.clear()
            for s in shown:
                table.add_row(
                    str(s.step) if s.step is not None else s.name,
                    Text(s.kind, style=variables.get(KIND_STYLE[s.kind], "")),
                    s.layout,
                    bytes_text(s.total_bytes),
                    str(s.object_count),
                    age_of(s.mtime),
                    "yes" if s.has_bf16_export else "no",
                    key=s.path,
                )
            paths = [s.path for s in shown]
            if selected is not None and selected.path in paths:
                table.move_cursor(row=paths.index(selected.path))
        by = cat.bytes_by_kind()
        kinds = "  ".join(f"{k} {bytes_text(by[k])}" for k in KIND_STYLE if k in by)
        bad = [s for s in cat.steps if s.kind == "corrupt"]
        if bad:  # red in the table; say which file is at fault, since the table has no room for it
            kinds += f"\ncorrupt (never counted or deleted): {bad[0].name}: {bad[0].note}" + (
                f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
            )
        matching = f"   showing {len(shown)} matching {self.filter_text!r}" if self.filter_text else ""
        tail = f": {len(cat.steps)} steps, {bytes_text(sum(by.values()))}   by kind: {kinds or '-'}{matching}"
        room = (self.size.width or self.app.size.width) - 4 - len(tail.split("\n", 1)[0])  # padding, scrollbar
        self.query_one("#ckpt-summary", Static).update(short(self.url, max(room, 24)) + tail)
        backlog = self.query_one("#ckpt-backlog", Static)
        backlog.display = bool(self.alerts)
        backlog.update("\n".join(f"ALERT {a.message}" for a in self.alerts))
        self.render_footprint()

    def selected(self) -> CheckpointStep | None:
        """The step under the table cursor."""
        if self.catalog is None:
            return None
        key = cursor_row_key(self.main_table())
        return next((s for s in self.catalog.steps if s.path == key), None)

    # ----------------------------------------------------------------- inspect

    def action_inspect_step(self) -> None:
        step = self.selected()
        if step is None:
            self.notify("List a run and select a step first.", severity="warning", markup=False)
            return
        self._inspect(self.url, step.path)

    @work(exclusive=True, group="checkpoints-inspect", exit_on_error=False)
    async def _inspect(self, url: str, path: str) -> None:
        try:
            ins = await self.ops.checkpoints.inspect(url, path)
        except LoadmasterError as exc:
            self.report_error(f"Inspecting {path}", exc)
            return
        self.post_message(StepInspected(ins))

    @on(StepInspected)
    def _inspected(self, event: StepInspected) -> None:
        ins = event.inspection
        table = self.query_one("#ckpt-tensors", DataTable)
        with self.app.batch_update():
            table.clear()
            for t in ins.tensors:
                table.add_row(
                    short(t.name, 48),
                    t.dtype,
                    "×".join(map(str, t.shape)) or "scalar",
                    f"{t.nbytes:,}",
                    short(t.file, 32),
                )
            table.display = True
        problems = "; ".join(ins.problems)
        self.query_one("#ckpt-status", Static).update(
            f"{ins.step.path}: {len(ins.tensors)} tensors/keys" + (f"  problems: {problems}" if problems else "")
        )

    # ----------------------------------------------------------------- strip

    def action_strip_step(self) -> None:
        if not self.require_writable("strip a checkpoint"):
            return
        step = self.selected()
        if step is None:
            self.notify("List a run and select a step first.", severity="warning", markup=False)
            return
        if step.kind not in ("full", "weights") or step.layout in ("hf-safetensors", "unknown"):
            why = f": {step.note}" if step.note else ""
            self.notify(
                f"{step.name} is {step.kind} ({step.layout}{why}); only complete checkpoints can be stripped.",
                severity="warning",
                markup=False,
            )
            return
        if step.has_bf16_export:
            self.notify(f"{step.name} already has a BF16 export.", severity="warning", markup=False)
            return
        node = self.query_one("#ckpt-node", Input).value.strip() or None
        body = (
            f"Read the model weights of {self.url}/{step.path} ({step.layout}, {bytes_text(step.total_bytes)}), cast "
            f"to BF16 and write model-0000i-of-0000N.safetensors + model.safetensors.index.json into the same "
            f"folder, then verify them. Nothing is deleted. Runs {'on ' + node if node else 'in this console'}."
        )
        self._confirm_strip(step.path, node, body)

    @work(group="checkpoints-action", exit_on_error=False)
    async def _confirm_strip(self, path: str, node: str | None, body: str) -> None:
        if not await self.app.push_screen_wait(
            ConfirmModal(title=f"Strip {path} to BF16?", body=body, yes_label="Strip")
        ):
            return
        req = StripRequest(src=f"{self.url}/{path}", node=node)

        async def run() -> str:
            done = await self.ops.checkpoints.strip(
                req,
                progress=lambda **kw: self.post_message(
                    ActionProgressed(int(kw.get("bytes_done") or 0), int(kw.get("bytes_total") or 0))
                ),
            )
            if done.job is not None:
                return f"strip of {path} launched on {node} as job {done.job.id}"
            res = done.result
            assert isinstance(res, StripResult)
            return (
                f"stripped {path}: {res.tensor_count} tensors, {bytes_text(res.weight_bytes)} BF16 in "
                f"{len(res.shards)} shard(s), verified"
            )

        await self._run_action("strip", path, f"Stripping {path} …", run)

    async def _run_action(self, what: str, target: str, status: str, run: Callable[[], Awaitable[str]]) -> None:
        """Run the operation ``run`` (it audits) and post :class:`ActionFinished` (``what`` = strip|upload)."""
        self.query_one("#ckpt-status", Static).update(status)
        try:
            detail = await run()
        except LoadmasterError as exc:
            self.report_error(f"{what.capitalize()} {target}", exc)
            self.post_message(ActionFinished(what, False, str(exc)))
            return
        self.post_message(ActionFinished(what, True, detail))

    # ----------------------------------------------------------------- upload

    def action_upload_step(self) -> None:
        if not self.require_writable("upload a checkpoint"):
            return
        local = self.query_one("#ckpt-local", Input).value.strip()
        if not local or not self.url:
            self.notify(
                "Type a local step folder in 'Local step' and list a run prefix first.",
                severity="warning",
                markup=False,
            )
            return
        node = self.query_one("#ckpt-node", Input).value.strip() or None
        name = os.path.basename(local.rstrip("/"))
        body = (
            f"Upload every file of {local} to {self.url}/{name} (multipart, each object verified by size and "
            f"checksum, DCP .metadata last). Runs {'as a job on ' + node if node else 'in this console'}."
        )
        self._confirm_upload(local, name, node, body)

    @work(group="checkpoints-action", exit_on_error=False)
    async def _confirm_upload(self, local: str, name: str, node: str | None, body: str) -> None:
        dest = f"{self.url}/{name}"
        try:
            present = await self.ops.checkpoints.present(dest)
        except LoadmasterError as exc:
            self.report_error(f"Upload {name}", exc)
            return
        overwrite = False
        if present:
            # A complete step must never be replaced by a keypress: the step's name is typed.
            overwrite = bool(
                await self.app.push_screen_wait(
                    ConfirmTyped(  # type: ignore[arg-type]
                        title=f"{dest} already holds {present} object(s)",
                        body=f"{body}\n\nUploading there replaces what it holds. Type the step's name to overwrite it.",
                        phrase=name,
                        confirm_label="Overwrite",
                    )
                )
            )
            if not overwrite:
                self.notify(f"Nothing uploaded: {name} already exists in {self.url}.", markup=False)
                return
        elif not await self.app.push_screen_wait(ConfirmModal(title=f"Upload {name}?", body=body, yes_label="Upload")):
            return
        req = UploadRequest(local_dir=local, dest=dest, node=node, overwrite=overwrite)

        async def run() -> str:
            done = await self.ops.checkpoints.upload(
                req, progress=lambda done, total, _f, _ft: self.post_message(ActionProgressed(done, total))
            )
            if done.job is not None:
                return f"upload of {name} launched on {node} as job {done.job.id}"
            res = done.result
            assert isinstance(res, UploadResult)
            verb = "overwrote" if overwrite else "uploaded"
            return (
                f"{verb} {name}: {len(res.objects)} objects, {bytes_text(res.bytes)}, {gbps_text(res.gbps)}, verified"
            )

        await self._run_action("upload", name, f"Uploading {local} …", run)

    @on(ActionProgressed)
    def _action_progressed(self, event: ActionProgressed) -> None:
        bar = self.query_one("#ckpt-progress", ProgressBar)
        bar.display = True
        bar.update(total=max(event.total, 1), progress=event.done)

    @on(ActionFinished)
    def _action_finished(self, event: ActionFinished) -> None:
        self.query_one("#ckpt-progress", ProgressBar).display = False
        self.query_one("#ckpt-status", Static).update(
            event.detail if event.ok else f"{event.what} failed: {event.detail}"
        )
        if event.ok:
            self.notify(event.detail, markup=False)
            self.action_reload()
