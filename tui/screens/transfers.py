"""Transfers screen: every job on every node (pulls, uploads, conversions) with live progress.

The table re-reads the nodes' job directories on a timer (one command per node), so jobs
launched from the CLI or another console appear here and vice versa. The selected job shows its
throughput over time and its log tail. A relay pull shows its chain above the table: who feeds
whom, Gbps per hop, progress per node. "New pull" plans (listing, free space, ETA at line rate,
egress quote and decision) before it can launch; cancel asks for a typed confirmation. All I/O
runs in workers through ``services.jobs`` and :mod:`backend.pulls.plan`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, DataTable, Static

from backend.errors import LoadmasterError
from backend.ops.pull import chain_lines, relay_groups
from backend.ops.types import JobProgress, JobRecord, JobSettings, LaunchCancel, fleet_rollup, nodes_text
from backend.units import bytes_text, duration_text, rate_text
from tui.screens.base import FILTER_BINDING, LoadmasterScreen
from tui.widgets.confirm import ConfirmTyped
from tui.widgets.plain import PlainStatic
from tui.widgets.transfers_detail import TransferDetail
from tui.widgets.transfers_form import PullForm
from tui.widgets.transfers_table import TransfersTable

if TYPE_CHECKING:
    from backend.ops import PullPreview, PullRequest
    from backend.ops.pull import PullStarted, SshHops
    from backend.services import Services


class JobsRefreshed(Message):
    """A fresh read of every node's jobs arrived."""

    def __init__(self, records: tuple[JobRecord, ...], unread: dict[str, str] | None = None) -> None:
        super().__init__()
        self.records = records
        self.unread = dict(unread or {})  # nodes whose jobs could not be read just now, with why


class JobDetailLoaded(Message):
    """The selected job's throughput history and log tail arrived."""

    def __init__(self, record: JobRecord, history: tuple[JobProgress, ...], log_tail: str) -> None:
        super().__init__()
        self.record = record
        self.history = history
        self.log_tail = log_tail


class PullPlanned(Message):
    """A pull's pre-launch estimate was computed (or could not be: ``error``)."""

    def __init__(self, preview: PullPreview | None, text: str, launchable: bool) -> None:
        super().__init__()
        self.preview = preview
        self.text = text
        self.launchable = launchable


class PullLaunched(Message):
    """Pull jobs were started, one per node."""

    def __init__(self, records: tuple[JobRecord, ...], started: PullStarted | None = None) -> None:
        super().__init__()
        self.records = records
        #: The started pull (a relay's dead nodes are retried; relay-ssh: the hops carried here).
        self.started = started


class JobCancelled(Message):
    """A job was cancelled (its final record)."""

    def __init__(self, record: JobRecord) -> None:
        super().__init__()
        self.record = record


class LaunchCancelled(Message):
    """Every running job of a launch was cancelled (or some could not be: ``result.errors``)."""

    def __init__(self, result: LaunchCancel) -> None:
        super().__init__()
        self.result = result


class TransfersScreen(LoadmasterScreen):
    """Jobs on every node with progress, Gbps, ETA; detail with a throughput plot; new pull; cancel."""

    SCREEN_TITLE: ClassVar[str] = "Transfers"
    AUTO_FOCUS = "#transfers-jobs"
    FILTER_HINT: ClassVar[str] = "node, kind, state, source, destination or job id"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("n", "new_pull", "New"),
        Binding("c", "cancel_job", "Cancel"),
        Binding("r", "refresh_jobs", "Reload"),
        Binding("d", "toggle_detail", "Detail"),
        Binding("ctrl+s", "launch_pull", "Launch"),
        FILTER_BINDING,
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | n | Show or hide the new-pull form (enter in a field: estimate). |
    | ctrl+s | Launch the estimated pull (the estimate must allow it). |
    | c | Cancel the selected job's launch: every running job of it (typed confirmation). |
    | r | Re-read every node's jobs now. |
    | enter | Show the selected job's detail: throughput plot and log tail. |
    | d | Show or hide the job detail pane (more room for the table). |
    | / | Filter jobs by node, kind, state, source, destination or id. |
    | escape | Close the form / leave the filter. |
    """
    #: Below 150 columns the detail pane goes under the table (themes/transfers.tcss): beside it,
    #: it would leave the table too narrow for State and Progress.
    HORIZONTAL_BREAKPOINTS: list[tuple[int, str]] | None = [(0, "-narrow"), (150, "-wide")]
    PALETTE_COMMANDS: ClassVar[list[tuple[str, str, str]]] = [
        ("New pull", "Copy s3:// objects to nodes with s5cmd (estimate first) (key n)", "new_pull"),
        (
            "Launch the estimated pull",
            "Start the pull the form describes, once its estimate allows it (key ctrl+s)",
            "launch_pull",
        ),
        (
            "Cancel selected launch",
            "Stop every running job of the selected job's launch and clean their partial output (key c)",
            "cancel_job",
        ),
        ("Refresh jobs", "Re-read every node's job directories now (key r)", "refresh_jobs"),
        ("Show or hide the job detail", "Throughput plot and log tail of the selected job (key d)", "toggle_detail"),
    ]

    def __init__(self, services: Services, **kwargs: object) -> None:
        super().__init__(services, **kwargs)  # type: ignore[arg-type]
        self.records: tuple[JobRecord, ...] = ()
        self.unread: dict[str, str] = {}
        self.preview: PullPreview | None = None
        #: relay-ssh pulls launched here: the hops this console carries, until their jobs end.
        self.hops: list[tuple[SshHops, set[str]]] = []
        #: Relay pulls launched here, whose dead nodes this console fetches again from the store.
        self.relays: list[PullStarted] = []
        self.retried: set[str] = set()

    def compose_body(self) -> ComposeResult:
        with Vertical(id="transfers-body", classes="screen-body"):
            yield PlainStatic("Reading jobs from every node...", id="transfers-summary")
            # A relay pull's chain (who feeds whom, Gbps per hop, progress per node); hidden without one.
            relay = PlainStatic("", id="transfers-relay")
            relay.display = False
            yield relay
            yield PullForm(
                stores=sorted(n for n, s in self.services.config.stores.items() if s.is_s3),
                id="transfers-form",
                classes="-hidden",
            )
            with Horizontal(id="transfers-main"):
                yield TransfersTable(id="transfers-jobs")
                yield TransferDetail(id="transfers-detail")

    def start_reads(self) -> None:
        self._refresh_jobs()
        interval = max(1.0, float(self.services.config.section(JobSettings).poll_interval))
        self.set_interval(interval, self._tick)

    def _tick(self) -> None:
        if not any(w.group == "transfers-refresh" and w.is_running for w in self.workers):
            self._refresh_jobs()

    # -- reading -------------------------------------------------------------------------------

    @work(exclusive=True, group="transfers-refresh", exit_on_error=False)
    async def _refresh_jobs(self) -> None:
        listing = await self.ops.jobs.listing()
        self.post_message(JobsRefreshed(listing.records, listing.unread))

    @on(JobsRefreshed)
    def _jobs_refreshed(self, event: JobsRefreshed) -> None:
        self.records = event.records
        self.unread = event.unread
        self._show_records()
        # The jobs were read from their nodes; the database that records them is said once, in
        # the shell's status line, never once per node or per job.
        down = getattr(self.services.jobs, "state_down", None)
        if down is None and any(not r.recorded and not r.foreign for r in self.records):
            down = "the state database did not answer the last read of the jobs"
        self.note_state_down(down)
        for started in self.relays:
            ids = {r.id for r in started.records}
            for r in self.records:
                if r.id in ids and started.needs_retry(r) and r.id not in self.retried:
                    self.retried.add(r.id)
                    self._retry_node(started, r)
        ended = {r.id for r in self.records if r.terminal}
        for hops, ids in list(self.hops):
            if ids <= ended:
                self.hops.remove((hops, ids))
                self.run_worker(hops.close(), group="transfers-hops", exit_on_error=False)
        selected = self.query_one(TransfersTable).selected_job_id
        if selected:
            self._load_detail(selected)

    def _show_records(self) -> None:
        """The jobs matching the filter in the table, and the fleet roll-up of all of them above it."""
        variables = getattr(self.app, "theme_variables", {}) or {}
        shown = [
            r
            for r in self.records
            if self.filter_matches(r.node, r.kind, r.state, r.source, r.destination, r.id, r.label or "")
        ]
        self.query_one(TransfersTable).update_records(shown, variables)
        active = [r for r in self.records if not r.terminal]
        roll = fleet_rollup(active)
        unreachable = sorted({r.node for r in self.records if r.note and r.recorded} | set(self.unread))
        total = len(self.services.config.nodes)
        # A partial view says so: the count is of the nodes that answered, not of the fleet.
        scope = f" on {total - len(unreachable)} of {total} nodes (partial view)" if unreachable else ""
        text = (
            f"{len(self.records)} job(s){scope}: {roll.running} running"
            + (
                f" | active {bytes_text(roll.bytes_done)}/{bytes_text(roll.bytes_total)}, "
                f"{rate_text(roll.rate_bps)}, ETA {duration_text(roll.eta_s)}"
                if active
                else ""
            )
            + (f" | not answering: {', '.join(unreachable)}" if unreachable else "")
        )
        if self.filter_text:
            text += f" | showing {len(shown)} matching {self.filter_text!r} (escape shows all)"
        self.query_one("#transfers-summary", Static).update(text)
        chains = [line for group in relay_groups(self.records) for line in chain_lines(group)]
        box = self.query_one("#transfers-relay", Static)
        box.update("\n".join(chains))
        box.display = bool(chains)

    def apply_filter(self) -> None:
        self._show_records()

    @on(DataTable.RowSelected, "#transfers-jobs")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.query_one(TransferDetail).remove_class("-hidden")
        if event.row_key.value is not None:
            self._load_detail(str(event.row_key.value))

    @on(DataTable.RowHighlighted, "#transfers-jobs")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self._load_detail(str(event.row_key.value))

    @work(exclusive=True, group="transfers-detail", exit_on_error=False)
    async def _load_detail(self, job_id: str) -> None:
        jobs = self.services.jobs
        rec = next((r for r in self.records if r.id == job_id), None) or jobs.get(job_id)
        try:
            history = await jobs.progress_history(job_id, lines=120)
            log_tail, _ = await jobs.read_log(job_id, tail_lines=12)
        except LoadmasterError as exc:
            history, log_tail = [], f"(cannot read from {rec.node}: {exc})"
        self.post_message(JobDetailLoaded(rec, tuple(history), log_tail))

    @on(JobDetailLoaded)
    def _detail_loaded(self, event: JobDetailLoaded) -> None:
        rate = self.ops.pulls.settings.nic_gbps
        self.query_one(TransferDetail).show(event.record, event.history, event.log_tail, rate)

    def action_refresh_jobs(self) -> None:
        """Re-read every node's jobs now."""
        self._refresh_jobs()

    def action_toggle_detail(self) -> None:
        """Show or hide the job detail pane."""
        self.query_one(TransferDetail).toggle_class("-hidden")

    # -- new pull ------------------------------------------------------------------------------

    def action_new_pull(self) -> None:
        """Show or hide the new-pull form."""
        form = self.query_one(PullForm)
        if not form.has_class("-hidden"):
            self._close_form()
            return
        form.remove_class("-hidden")
        self.query_one("#pull-src").focus()

    def escape_hook(self) -> Callable[[], None] | None:
        form = self.query_one(PullForm)
        return None if form.has_class("-hidden") else self._close_form

    def _close_form(self) -> None:
        self.query_one(PullForm).add_class("-hidden")
        self.query_one(TransfersTable).focus()

    def action_launch_pull(self) -> None:
        """Launch the pull the form describes (its Launch button), once the estimate allows it."""
        form = self.query_one(PullForm)
        if form.has_class("-hidden"):
            self.notify(
                "Open the new-pull form first (n), fill it in and press enter for the estimate.",
                severity="warning",
                markup=False,
            )
            return
        button = form.query_one("#pull-launch", Button)
        if button.disabled:
            self.notify(
                "Launch needs a fresh estimate that allows it: press enter in a field of the form.",
                severity="warning",
                markup=False,
            )
            return
        button.press()

    @on(PullForm.EstimateRequested)
    def _estimate_requested(self, event: PullForm.EstimateRequested) -> None:
        if isinstance(event, PullForm.LaunchRequested):
            return
        self._plan_pull(event.request)

    @work(exclusive=True, group="transfers-plan", exit_on_error=False)
    async def _plan_pull(self, req: PullRequest) -> None:
        try:
            preview = await self.ops.pulls.plan(req)
        except LoadmasterError as exc:
            self.post_message(PullPlanned(None, f"cannot start: {exc}", False))
            return
        self.post_message(PullPlanned(preview, "\n".join(preview.lines()), preview.startable))

    @on(PullPlanned)
    def _pull_planned(self, event: PullPlanned) -> None:
        self.preview = event.preview
        form = self.query_one(PullForm)
        if event.preview is not None:
            form.show_preview(event.preview)
        else:
            form.show_estimate(event.text, launchable=event.launchable)

    @on(PullForm.LaunchRequested)
    def _launch_requested(self, event: PullForm.LaunchRequested) -> None:
        if not self.require_writable("launch a pull"):
            return
        self._launch_pull(event.request)

    @work(exclusive=True, group="transfers-launch", exit_on_error=False)
    async def _launch_pull(self, req: PullRequest) -> None:
        # The operation plans again unless the estimate shown is fresh, and re-quotes the egress.
        started = await self.ops.pulls.start(req, shown=self.preview)
        self.post_message(PullLaunched(started.records, started))

    @work(group="transfers-retry", exit_on_error=False)
    async def _retry_node(self, started: PullStarted, record: JobRecord) -> None:
        """A relay node that died: its copy from the store (priced), once the node answers."""
        from backend.errors import NodeUnreachable

        try:
            again = await self.ops.pulls.retry_from_store(started, record)
        except NodeUnreachable:
            self.retried.discard(record.id)  # tried again on a later refresh
            return
        except LoadmasterError as exc:
            self.notify(f"{record.node}: {record.state}; not retried: {exc}", severity="warning", markup=False)
            return
        self.notify(f"{record.node}: {record.state}; fetching its copy from the store as job {again.id}", markup=False)

    @on(PullLaunched)
    def _pull_launched(self, event: PullLaunched) -> None:
        started = event.started
        if started is not None and started.plan.topology is not None:
            self.relays.append(started)
        if started is not None and started.hops is not None:
            self.hops.append((started.hops, {r.id for r in event.records}))
        launch = started.launch if started is not None else None
        jobs = ", ".join(r.id for r in event.records)
        said = f"launch {launch}: {len(event.records)} pull job(s) ({jobs}); c cancels all of it" if launch else jobs
        self.notify(f"started {said}" if launch else f"started {len(event.records)} pull job(s): {jobs}", markup=False)
        self._close_form()  # the keys (c, /, digits) act on the jobs again
        self._refresh_jobs()

    # -- cancel --------------------------------------------------------------------------------

    def action_cancel_job(self) -> None:
        """Cancel the selected job's launch (every job of it still running; a job started alone:
        that job) after one typed confirmation."""
        if not self.require_writable("cancel a job"):
            return
        job_id = self.query_one(TransfersTable).selected_job_id
        rec = next((r for r in self.records if r.id == job_id), None)
        if rec is None:
            self.notify("select a job first", severity="warning")
            return
        mates = [r for r in self.records if rec.launch and r.launch == rec.launch and not r.foreign]
        active = [r for r in mates or [rec] if not r.terminal]
        if not active:
            what = f"launch {rec.launch}" if rec.launch else f"job {rec.id}"
            self.notify(f"{what} already ended ({rec.state})", severity="warning", markup=False)
            return
        grace = self.services.config.section(JobSettings).cancel_grace
        nodes = nodes_text(r.node for r in active)
        ended = len(mates) - len(active)
        head = (
            f"launch {rec.launch}: {len(active)} running {rec.kind} job(s) on {nodes}"
            + (f" ({ended} already ended, left alone)" if ended else "")
            if rec.launch
            else f"{rec.kind} job {rec.id} on {rec.node}"
        )
        body = (
            f"{head}\n{rec.source} -> {rec.destination}\n"
            f"SIGTERM to each job's process group, SIGKILL after {grace:g}s; partial output is removed."
        )

        def answered(ok: bool | None) -> None:
            if ok and rec.launch:
                self._cancel_launch(rec.launch)
            elif ok:
                self._cancel_job(rec.id)

        title = "Cancel this launch?" if rec.launch else "Cancel this job?"
        label = "Cancel launch" if rec.launch else "Cancel job"
        self.app.push_screen(ConfirmTyped(title=title, phrase="cancel", body=body, confirm_label=label), answered)

    @work(exclusive=True, group="transfers-cancel", exit_on_error=False)
    async def _cancel_job(self, job_id: str) -> None:
        rec = await self.ops.jobs.cancel(job_id, reason="cancelled from the console")
        self.post_message(JobCancelled(rec))

    @work(exclusive=True, group="transfers-cancel", exit_on_error=False)
    async def _cancel_launch(self, launch_id: str) -> None:
        done = await self.ops.jobs.cancel_launch(launch_id, reason="cancelled from the console")
        self.post_message(LaunchCancelled(done))

    @on(JobCancelled)
    def _job_cancelled(self, event: JobCancelled) -> None:
        self.notify(f"job {event.record.id}: {event.record.state}", markup=False)
        self._refresh_jobs()

    @on(LaunchCancelled)
    def _launch_cancelled(self, event: LaunchCancelled) -> None:
        done = event.result
        cancelled = sum(r.state == "cancelled" for r in done.finals)
        text = f"launch {done.launch}: {cancelled} job(s) cancelled" + (
            f"; not cancelled: {', '.join(f'{i} ({why})' for i, why in done.errors.items())}" if done.errors else ""
        )
        self.notify(text, severity="information" if done.ok else "warning", markup=False)
        self._refresh_jobs()
