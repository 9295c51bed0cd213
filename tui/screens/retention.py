"""Retention (pruning) screen: a run's steps with the proposed action per step, live as the policy
changes; pin/unpin, mark milestones, and apply with a typed confirmation.

The listing and the plan come from the operation layer (``ops.retention.listing`` and
``.plan``), the same query ``loadmaster retention plan`` prints: the steps the plan keeps full are
deep-checked there, so both front ends show one plan. Both run in workers; the plan is asked for
again (reusing the listing) on every policy change; applying runs in a worker that reports each
action as it goes. No store or DB access happens here directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
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
from backend.ops.retention import Pin, RetentionPlan, RetentionPolicy, parse_step_list
from backend.ops.types import middle, parse_duration
from backend.units import bytes_text, duration_spec, usd_text
from tui.screens.base import FILTER_BINDING, RUN_FOLDER_BINDINGS, LoadmasterScreen
from tui.widgets.confirm import ConfirmTyped
from tui.widgets.detail import DetailModal
from tui.widgets.plain import PlainStatic, PlainTable
from tui.widgets.table_cursor import cursor_row_key
from tui.widgets.table_fit import cut_end, room_for

if TYPE_CHECKING:
    from backend.ops.retention import ActionOutcome, ApplyReport, Catalog, RunListing
    from backend.services import Services

#: Theme variable per action (cells are coloured by meaning, never by literal colour).
ACTION_STYLE = {
    "keep-full": "action-keep",
    "keep-weights": "action-keep",
    "strip-to-weights": "action-strip",
    "delete": "action-delete",
    "skip": "action-skip",
}
#: Table columns: (key, label, shown from this terminal width up). Step, action, freed and the
#: reason are what the operator decides on: they show at every size; sizes before/after give way.
COLUMNS = (
    ("step", "Step", 0),
    ("action", "Action", 0),
    ("before", "Before", 100),
    ("after", "After", 100),
    ("freed", "Freed", 0),
    ("reason", "Reason", 0),
    ("result", "Result", 0),
)
#: A step without a number shows its path in the Step column, cut in the middle to this width.
STEP_PATH_WIDTH = 24
#: Seconds a policy edit waits for the next keystroke before the plan is asked for (each plan
#: deep-checks the steps it keeps).
TYPING_SETTLE_S = 0.3
#: Rows are shown kept first (what stays, and why), then the deletes; each part in step order.
ROW_ORDER = {"keep-full": 0, "keep-weights": 1, "strip-to-weights": 2, "skip": 3, "delete": 4}
#: Storage bar segments: (css class, label, actions whose bytes-after fall in it).
BAR_SEGMENTS = (
    ("-keep", "full", ("keep-full",)),
    ("-strip", "weights", ("strip-to-weights", "keep-weights")),
    ("-skip", "untouched", ("skip",)),
    ("-delete", "freed", ()),
)


def _reason_text(a: Any) -> str:
    """The reason, with the deep resumable check of a kept full step."""
    if a.resumable is None:
        return str(a.reason)
    if a.resumable == "verified":
        return f"{a.reason} · verified resumable"
    return f"{a.reason} · NOT resumable: {a.resumable}"


class CatalogLoaded(Message):
    """A fresh listing of the run arrived, with the pins and milestones recorded for it."""

    def __init__(self, listing: RunListing) -> None:
        super().__init__()
        self.listing = listing
        self.url, self.catalog = listing.url, listing.catalog


class PlanComputed(Message):
    """The plan was recomputed (after a listing or a policy change)."""

    def __init__(self, plan: RetentionPlan) -> None:
        super().__init__()
        self.plan = plan


class ActionProgressed(Message):
    """One planned action started or finished during an apply."""

    def __init__(self, outcome: ActionOutcome) -> None:
        super().__init__()
        self.outcome = outcome


class PlanApplied(Message):
    """An apply finished (the report carries each outcome and the audit record id)."""

    def __init__(self, report: ApplyReport) -> None:
        super().__init__()
        self.report = report


class RetentionScreen(LoadmasterScreen):
    """Plan and apply checkpoint retention for one run folder."""

    SCREEN_TITLE: ClassVar[str] = "Retention"
    # The table, not an input, has focus first so the shell's digit keys keep switching screens.
    AUTO_FOCUS = "#retention-steps"
    FILTER_HINT: ClassVar[str] = "step, action or reason"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("p", "toggle_pin", "Pin", show=True, tooltip="Pin or unpin the selected step"),
        Binding("m", "toggle_milestone", "Milestone", show=True),
        Binding("d", "dry_run", "Dry run", show=True),
        Binding("a", "apply_plan", "Apply…", show=True),
        *RUN_FOLDER_BINDINGS,
        FILTER_BINDING,
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | p | Pin (or unpin) the selected step: a pinned step is never touched. |
    | m | Mark (or unmark) the selected step as a milestone. |
    | d | Dry run: re-check the plan against a fresh listing, change nothing. |
    | a | Apply the plan after a typed confirmation. |
    | enter | The selected step's planned action in full: sizes, reason, pin, milestone. |
    | r, ctrl+r | List the run folder again and recompute the plan (ctrl+r also works while typing). |
    | o | Edit the run folder (enter lists it). |
    | / | Filter steps by number, action or reason. |
    """

    PALETTE_COMMANDS: ClassVar[list[tuple[str, str, str]]] = [
        ("Reload listing", "List the run folder again and recompute the plan (key r)", "reload"),
        ("Edit the run folder", "Type another run folder; enter lists it (key o)", "focus_url"),
        ("Pin or unpin the selected step", "A pinned step is never touched (key p)", "toggle_pin"),
        ("Mark or unmark a milestone", "Milestones stay as weights at least (key m)", "toggle_milestone"),
        ("Dry run the retention plan", "Re-check the plan against a fresh listing, change nothing (key d)", "dry_run"),
        ("Apply retention plan", "Delete/strip as planned, after a typed confirmation (key a)", "apply_plan"),
        ("Show the selected step's plan", "Sizes, reason, pin and milestone in full (key enter)", "step_detail"),
    ]

    def __init__(self, services: Services, **kwargs: Any) -> None:
        super().__init__(services, **kwargs)
        self.catalog: Catalog | None = None
        self.url = ""
        self.plan: RetentionPlan | None = None
        self.base_policy: RetentionPolicy = services.config.section(RetentionPolicy)
        self.pins: dict[int, str] = {p.step: p.reason for p in self.base_policy.pins}
        self.db_pins: set[int] = set()
        self.db_milestones: set[int] = set()
        self.applying = False
        self.results: dict[str, str] = {}

    # ----------------------------------------------------------------- layout

    def compose_body(self) -> ComposeResult:
        p = self.base_policy
        first, self._list_on_mount = self.ops.retention.opening_run()
        with Vertical(classes="screen-body", id="retention-body"):
            with Horizontal(id="retention-source", classes="retention-row"):
                yield Label("Run folder", classes="retention-label")
                yield Input(value=first, placeholder="s3://bucket/run, a store name or a directory", id="retention-url")
            with Horizontal(id="retention-policy", classes="retention-row"):
                yield Label("keep full", classes="retention-label")
                yield Input(str(p.keep_full_latest), id="keep-full", classes="retention-num")
                yield Label("milestone every", classes="retention-label")
                yield Input(
                    str(p.milestone_every or ""), placeholder="off", id="milestone-every", classes="retention-num"
                )
                yield Label("milestones", classes="retention-label")
                yield Input(",".join(map(str, p.milestones)), placeholder="48000,96000", id="milestones")
                yield Label("others", classes="retention-label")
                yield Select(
                    [("delete", "delete"), ("keep weights", "keep-weights")],
                    value=p.others,
                    allow_blank=False,
                    id="others",
                )
                yield Label("min age", classes="retention-label")
                yield Input(
                    duration_spec(p.min_age) if p.min_age else "",
                    placeholder="0",
                    id="min-age",
                    classes="retention-num",
                )
            yield PlainStatic("Press o to type a run folder, then enter to list it.", id="retention-summary")
            with Horizontal(id="retention-bar"):
                for cls, label, _ in BAR_SEGMENTS:
                    yield PlainStatic(label, classes=f"retention-bar-seg {cls}")
            yield PlainTable(id="retention-steps", cursor_type="row", zebra_stripes=True)
            yield ProgressBar(id="retention-progress", show_eta=False)
            yield PlainStatic("", id="retention-status")

    def on_mount(self) -> None:
        self._columns: tuple[str, ...] = ()
        self._hides = False
        self._set_columns()
        self.query_one("#retention-progress", ProgressBar).display = False
        self.query_one("#retention-status", Static).display = False
        for seg in self.query(".retention-bar-seg"):
            seg.display = False

    def start_reads(self) -> None:
        if self._list_on_mount:  # the last run listed here, or the lab's demo run: open on it
            self.action_reload()

    # ----------------------------------------------------------------- loading

    def action_focus_url(self) -> None:
        """Edit the run folder (enter lists it)."""
        self.query_one("#retention-url", Input).focus()

    def _set_columns(self) -> bool:
        """The columns that fit this width (the result column once an apply reports); True when
        they changed (the table is then cleared)."""
        width = self.size.width or self.app.size.width
        keys = tuple(k for k, _label, min_width in COLUMNS if width >= min_width and (k != "result" or self.results))
        hides = self.plan is not None and self.plan.keeps_versions
        if keys == self._columns and hides == self._hides:
            return False
        table = self.query_one("#retention-steps", DataTable)
        table.clear(columns=True)
        for k, label, _w in COLUMNS:
            if k in keys:
                # a versioned bucket keeps what a delete removes: the column says what it does
                table.add_column("Hides" if hides and k == "freed" else label, key=k)
        self._columns, self._hides = keys, hides
        return True

    def on_resize(self, event: Any) -> None:
        super().on_resize(event)
        if self.plan is not None:  # new columns, or the reasons' room changed
            self.call_after_refresh(self._rerender)

    def _rerender(self) -> None:
        if self.plan is not None:
            self.render_plan(self.plan)

    def main_table(self) -> DataTable[Any]:
        return self.query_one("#retention-steps", DataTable)

    def apply_filter(self) -> None:
        if self.plan is not None:
            self.render_plan(self.plan)

    @on(Input.Submitted, "#retention-url")
    def _url_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_reload()

    def action_reload(self) -> None:
        url = self.query_one("#retention-url", Input).value.strip()
        if not url:
            self.notify("Enter a run folder first (s3://bucket/run or a directory).", severity="warning", markup=False)
            return
        self.query_one("#retention-summary", Static).update(f"Listing {url} …")
        self._load_catalog(url)

    # The listing and the plan run in a thread, on an event loop of their own: each has parts
    # that do not yield (the database's pins, milestones and jobs, reading the checkpoints'
    # metadata, the deep check's hashing), which on a loaded machine held up the keys for
    # seconds when they ran on the console's loop. Their stores are opened on that loop.

    @work(thread=True, exclusive=True, group="retention-load", exit_on_error=False)
    def _load_catalog(self, url: str) -> None:
        try:
            listing = asyncio.run(self.ops.retention.listing(url))
        except LoadmasterError as exc:
            self.app.call_from_thread(self._not_read, f"Listing {url}", f"Could not list {url}: {exc}", exc)
            return
        if not get_current_worker().is_cancelled:
            self.post_message(CatalogLoaded(listing))

    def _not_read(self, title: str, summary: str, exc: LoadmasterError) -> None:
        self.report_error(title, exc)
        self.query_one("#retention-summary", Static).update(summary)

    @on(CatalogLoaded)
    def _catalog_loaded(self, event: CatalogLoaded) -> None:
        self.url, self.catalog = event.url.rstrip("/"), event.catalog
        self.ops.retention.remember_run(self.url)
        self.db_pins = {p.step for p in event.listing.pins}
        self.db_milestones = set(event.listing.milestones)
        for p in event.listing.pins:
            self.pins.setdefault(p.step, p.reason)
        self.results = {}
        self.recompute()
        if self.focused is None or self.focused.id == "retention-url":
            self.query_one("#retention-steps", DataTable).focus()  # p / m / a act on the table

    # ----------------------------------------------------------------- the plan

    def policy(self) -> RetentionPolicy:
        """The policy the inputs describe; LoadmasterError naming the bad input otherwise."""

        def num(id_: str, what: str) -> int:
            text = self.query_one(f"#{id_}", Input).value.strip()
            if not text:
                return 0
            try:
                return int(text)
            except ValueError:
                raise LoadmasterError(f"{what} must be a whole number, got {text!r}") from None

        try:
            min_age = parse_duration(self.query_one("#min-age", Input).value.strip() or 0)
        except ValueError as exc:
            raise LoadmasterError(f"min age: {exc}") from None
        others = self.query_one("#others", Select).value
        try:
            return dataclasses.replace(
                self.base_policy,
                keep_full_latest=num("keep-full", "keep full"),
                milestone_every=num("milestone-every", "milestone every"),
                milestones=tuple(
                    sorted(set(parse_step_list(self.query_one("#milestones", Input).value)) | self.db_milestones)
                ),
                others=others if others in ("delete", "keep-weights") else "delete",  # type: ignore[arg-type]
                min_age=min_age,
                pins=tuple(Pin(s, r) for s, r in self.pins.items()),
            )
        except ValueError as exc:
            raise LoadmasterError(str(exc)) from None

    @on(Input.Changed, "#retention-policy Input")
    @on(Select.Changed, "#others")
    def _policy_changed(self, event: Message) -> None:
        if self.catalog is not None:
            self.recompute(settle_s=TYPING_SETTLE_S)

    def recompute(self, *, settle_s: float = 0.0) -> None:
        """Ask the operation layer for the plan of the last listing under the current policy."""
        if self.catalog is None:
            return
        try:
            policy = self.policy()
        except LoadmasterError as exc:
            self.query_one("#retention-summary", Static).update(f"Policy: {exc}")
            return
        self._compute_plan(self.url, self.catalog, policy, settle_s)

    @work(thread=True, exclusive=True, group="retention-plan", exit_on_error=False)
    def _compute_plan(self, url: str, catalog: Catalog, policy: RetentionPolicy, settle_s: float) -> None:
        worker = get_current_worker()
        if settle_s:  # typing: a newer keystroke cancels this worker before it deep-checks anything
            time.sleep(settle_s)
        if worker.is_cancelled:
            return
        try:
            plan = asyncio.run(self.ops.retention.plan(url, policy, catalog=catalog))
        except LoadmasterError as exc:
            self.app.call_from_thread(self._not_read, f"Planning {url}", f"Could not plan {url}: {exc}", exc)
            return
        if not worker.is_cancelled:
            self.post_message(PlanComputed(plan))

    @on(PlanComputed)
    def _plan_computed(self, event: PlanComputed) -> None:
        if event.plan.url.rstrip("/") != self.url:
            return  # a plan of the run listed before this one
        self.plan = event.plan
        self.render_plan(event.plan)

    def _cells(self, a: Any, variables: dict[str, str]) -> dict[str, str | Text]:
        """One step's cells by column key; a step without a number shows its path, cut in the middle."""
        est = "~" if a.estimated else ""
        return {
            "step": str(a.step) if a.step is not None else middle(a.path, STEP_PATH_WIDTH),
            "action": Text(a.action, style=variables.get(ACTION_STYLE[a.action], "")),
            "before": bytes_text(a.bytes_before),
            "after": est + bytes_text(a.bytes_after),
            "freed": est + bytes_text(a.bytes_freed),
            "reason": Text(_reason_text(a)),
            "result": self.results.get(a.path, ""),
        }

    def render_plan(self, plan: RetentionPlan) -> None:
        """Show the plan: rows coloured by action, totals, and the storage bar."""
        variables = getattr(self.app, "theme_variables", {}) or {}
        table = self.query_one("#retention-steps", DataTable)
        selected = self._selected()
        shown = sorted(
            (
                a
                for a in plan.actions
                if self.filter_matches(str(a.step) if a.step is not None else "", a.path, a.action, a.reason)
            ),
            key=lambda a: ROW_ORDER.get(a.action, 5),  # stable: step order within each part
        )
        self._set_columns()
        rows = [[self._cells(a, variables)[k] for k in self._columns] for a in shown]
        # The reason takes the room the other columns leave and is cut with "…" (enter shows it whole).
        flex = self._columns.index("reason")
        labels = {k: label for k, label, _w in COLUMNS}
        room = room_for(table, [labels[k] for k in self._columns], rows, flex, table.size.width or self.size.width)
        with self.app.batch_update():
            table.clear()
            for a, row in zip(shown, rows, strict=True):
                row[flex] = cut_end(row[flex], room)
                table.add_row(*row, key=a.path)
            paths = [a.path for a in shown]
            if selected is not None and selected.path in paths:
                table.move_cursor(row=paths.index(selected.path))
            t = plan.totals
            money = (
                f", {usd_text(t.usd_month_saved)}/month"
                if t.usd_month_saved is not None
                else f" ({plan.price_note})"
                if plan.price_note and self.size.width >= 120
                else ""
            )
            counts = "  ".join(
                f"{plan.count(x)} {x}"
                for x in ("keep-full", "strip-to-weights", "keep-weights", "delete", "skip")
                if plan.count(x)
            )
            by = plan.bytes_by_action()
            # on a versioned bucket the deleted part is hidden, not freed
            segments = [
                (c, "hidden" if plan.keeps_versions and c == "-delete" else lbl, a) for c, lbl, a in BAR_SEGMENTS
            ]
            sizes = [sum(by[x] for x in acts) if acts else by["freed"] for _c, _l, acts in segments]
            total = sum(sizes) or 1
            width = max(self.size.width - 4, 20)
            for seg, (_cls, label, _acts), n in zip(self.query(".retention-bar-seg"), segments, sizes, strict=True):
                seg.display = n > 0
                seg.styles.width = f"{max(n, 1)}fr"
                text = f"{label} {bytes_text(n)}"
                seg.tooltip = text
                if isinstance(seg, Static):
                    # A label that does not fit its share would be cut into nonsense ("weigh"):
                    # narrow segments stay colour only; the legend line below names them all.
                    seg.update(text if n / total * width >= len(text) + 1 else "")
            labelled = all(
                not n or n / total * width >= len(f"{label} {bytes_text(n)}") + 1
                for (_c, label, _a), n in zip(segments, sizes, strict=True)
            )
            line = f"{counts}   plan {plan.hash[:12]}" + (
                f"   showing {len(shown)} matching {self.filter_text!r}" if self.filter_text else ""
            )
            # The order note only where it fits: wrapped, it is a line of its own reading "first".
            if any(a.action == "delete" for a in shown) and len(line) + 13 <= width:
                line += "   kept first"
            # The run folder is in the box above; the bar names its parts unless one is too narrow.
            self.query_one("#retention-summary", Static).update(
                f"before {bytes_text(t.bytes_before)} → after {bytes_text(t.bytes_after)}, "
                + (
                    f"hides {bytes_text(t.bytes_saved)}: the bucket keeps versions, nothing is freed"
                    if plan.keeps_versions
                    else f"saves {bytes_text(t.bytes_saved)} ({t.percent_saved:.1f}%){money}"
                )
                + f"\n{line}"
                + (
                    ""
                    if labelled
                    else "\nstorage: "
                    + " · ".join(
                        f"{label} {bytes_text(n)}" for (_c, label, _a), n in zip(segments, sizes, strict=True) if n
                    )
                )
            )

    def _selected(self) -> Any:
        if self.plan is None:
            return None
        key = cursor_row_key(self.query_one("#retention-steps", DataTable))
        return next((a for a in self.plan.actions if a.path == key), None)

    @on(DataTable.RowSelected, "#retention-steps")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_step_detail()

    def action_step_detail(self) -> None:
        """The selected step's planned action in full (the table cuts long reasons at 80 columns)."""
        a = self._selected()
        if a is None:
            self.notify("List a run folder and select a step first.", severity="warning", markup=False)
            return
        est = " (estimated: no BF16 export yet)" if a.estimated else ""
        fields = [
            ("folder", f"{self.url}/{a.path}"),
            ("layout", f"{a.layout} ({a.kind})"),
            ("action", a.action),
            ("reason", a.reason),
            ("before", f"{bytes_text(a.bytes_before)} in {a.object_count:,} objects"),
            ("after", bytes_text(a.bytes_after) + est),
            ("freed", bytes_text(a.bytes_freed) + est),
            ("pinned", a.pinned or "no"),
            ("milestone", "yes" if a.milestone else "no"),
        ]
        if a.note:
            fields.append(("contents", a.note))
        if a.resumable is not None:
            fields.append(
                (
                    "resumable",
                    "verified (deep check passed)" if a.resumable == "verified" else f"NOT proven: {a.resumable}",
                )
            )
        if a.path in self.results:
            fields.append(("result", self.results[a.path]))
        self.app.push_screen(
            DetailModal(
                f"step {a.step}" if a.step is not None else a.path,
                fields,
                hint="escape: back to the table, where p pins or unpins it and m marks it a milestone",
            )
        )

    # ----------------------------------------------------------------- pins and milestones

    def action_toggle_pin(self) -> None:
        if not self.require_writable("change pins"):
            return
        a = self._selected()
        if a is None or a.step is None:
            self.notify("Select a numbered step to pin.", severity="warning", markup=False)
            return
        if a.step in self.pins:
            if a.step not in self.db_pins:
                self.notify(
                    f"Step {a.step} is pinned in the config file ([retention] pins).", severity="warning", markup=False
                )
                return
            del self.pins[a.step]
            self.db_pins.discard(a.step)
            self._save_pin(a.step, None)
        else:
            self.pins[a.step] = "pinned in the console"
            self.db_pins.add(a.step)
            self._save_pin(a.step, "pinned in the console")
        self.recompute()

    @work(group="retention-pins", exit_on_error=False)
    async def _save_pin(self, step: int, reason: str | None) -> None:
        ops = self.ops.retention
        try:
            if reason is None:
                ops.unpin(self.url, step)
            else:
                ops.pin(self.url, step, reason)
        except LoadmasterError as exc:
            self.report_error(f"{'Unpinning' if reason is None else 'Pinning'} step {step}", exc)
        self.recompute()  # the recorded pins are part of the plan

    def action_toggle_milestone(self) -> None:
        if not self.require_writable("change milestones"):
            return
        a = self._selected()
        if a is None or a.step is None:
            self.notify("Select a numbered step to mark.", severity="warning", markup=False)
            return
        box = self.query_one("#milestones", Input)
        try:
            typed = list(parse_step_list(box.value))
        except LoadmasterError as exc:
            self.notify(str(exc), severity="warning", markup=False)
            return
        if a.step in typed:  # typed into the policy form: unmark it there
            box.value = ",".join(str(s) for s in typed if s != a.step)  # Input.Changed recomputes
            return
        # Recorded in the state DB (audited) like a pin, so the next plan honours it, CLI or console.
        if a.step in self.db_milestones:
            self.db_milestones.discard(a.step)
            self._save_milestone(a.step, False)
        else:
            self.db_milestones.add(a.step)
            self._save_milestone(a.step, True)
        self.recompute()

    @work(group="retention-pins", exit_on_error=False)
    async def _save_milestone(self, step: int, marked: bool) -> None:
        ops = self.ops.retention
        try:
            if marked:
                ops.mark_milestone(self.url, step)
            else:
                ops.unmark_milestone(self.url, step)
        except LoadmasterError as exc:
            self.report_error(f"{'Marking' if marked else 'Unmarking'} milestone {step}", exc)
        self.recompute()  # the recorded milestones are part of the plan

    # ----------------------------------------------------------------- applying

    def confirm_phrase(self, plan: RetentionPlan) -> str:
        """What the operator types: the run's name."""
        return plan.url.rstrip("/").rsplit("/", 1)[-1] or plan.url

    def action_apply_plan(self) -> None:
        if not self.require_writable("apply a retention plan"):
            return
        plan = self.plan
        if plan is None:
            self.notify("List a run folder first.", severity="warning", markup=False)
            return
        if self.applying:
            self.notify("An apply is already running.", severity="warning", markup=False)
            return
        if not plan.destructive_actions:
            self.notify("Nothing to apply: the plan keeps everything.", markup=False)
            return
        t = plan.totals
        body = (
            f"{plan.count('delete')} steps deleted, {plan.count('strip-to-weights')} stripped to BF16 weights "
            f"(optimizer state removed after the export verifies), {plan.count('keep-full')} kept full, "
            f"{plan.count('skip')} untouched.\n"
            + (
                f"Frees nothing now: {plan.versions_note()}.\n"
                if plan.keeps_versions
                else f"Frees {bytes_text(t.bytes_saved)} ({t.percent_saved:.1f}%). "
            )
            + f"Plan {plan.hash[:12]}. The listing is checked again first; changed steps are skipped."
        )

        def confirmed(ok: bool | None) -> None:
            if ok:
                self._apply(plan)

        self.app.push_screen(
            ConfirmTyped(
                title=f"Apply retention to {plan.url}?",
                phrase=self.confirm_phrase(plan),
                body=body,
                confirm_label="Apply",
            ),
            confirmed,
        )

    def action_dry_run(self) -> None:
        if self.plan is None:
            self.notify("List a run folder first.", severity="warning", markup=False)
            return
        if self.applying:
            self.notify("An apply is already running.", severity="warning", markup=False)
            return
        self._apply(self.plan, dry_run=True)

    @work(exclusive=True, group="retention-apply", exit_on_error=False)
    async def _apply(self, plan: RetentionPlan, *, dry_run: bool = False) -> None:
        self.applying = True
        bar = self.query_one("#retention-progress", ProgressBar)
        bar.display = True
        bar.update(total=len(plan.actions), progress=0)
        try:
            report = await self.ops.retention.apply(
                plan, dry_run=dry_run, progress=lambda o: self.post_message(ActionProgressed(o))
            )
        except LoadmasterError as exc:
            self.report_error("Applying the retention plan", exc)
            return
        finally:
            self.applying = False
        self.post_message(PlanApplied(report))

    @on(ActionProgressed)
    def _action_progressed(self, event: ActionProgressed) -> None:
        o = event.outcome
        self.results[o.path] = o.outcome + (f": {o.detail}" if o.outcome in ("failed", "stopped") else "")
        table = self.query_one("#retention-steps", DataTable)
        if "result" not in self._columns and self.plan is not None:
            self.render_plan(self.plan)  # the first result: the result column appears
        try:
            table.update_cell(o.path, "result", self.results[o.path])
        except Exception:  # noqa: BLE001 - the row may be gone after a re-listing
            pass
        bar = self.query_one("#retention-progress", ProgressBar)
        if o.outcome != "running":
            bar.advance(1)  # actions of different steps finish in any order
        status = self.query_one("#retention-status", Static)
        status.display = True
        status.update(f"[{int(bar.progress)}/{o.total}] {o.path}: {o.action} → {o.outcome}")

    @on(PlanApplied)
    def _plan_applied(self, event: PlanApplied) -> None:
        r = event.report
        if r.dry_run:
            lines = [
                f"Dry run of plan {r.plan_hash[:12]}: {r.count('would-do')} would run, "
                f"{r.count('stopped')} would stop, {r.count('kept')} kept. Nothing was changed."
            ]
        else:
            lines = [
                f"Applied plan {r.plan_hash[:12]}: {r.outcome}. {r.count('done')} done, "
                f"{r.count('already-done')} already done, {r.count('stopped')} stopped, "
                f"{r.count('failed')} failed; freed {bytes_text(r.bytes_freed)}. Audit record #{r.audit_id}."
            ]
            if r.hidden_note():
                lines.append(r.hidden_note()[0].upper() + r.hidden_note()[1:] + ".")
        lines += [f"changed: {c}" for c in r.changes[:5]]
        lines += [f"failed: {o.path}: {o.detail}" for o in r.outcomes if o.outcome == "failed"][:5]
        status = self.query_one("#retention-status", Static)
        status.display = True
        status.update("\n".join(lines))
        self.notify(lines[0], severity="information" if r.ok else "warning", markup=False)
        if not r.dry_run:
            self._load_catalog(self.url)  # show what the store holds now
