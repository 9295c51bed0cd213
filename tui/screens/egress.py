"""Egress screen: the month's spend per route against its budgets, and a live cost calculator.

Left: month-to-date bytes and $ per route (source store -> node site) from the egress ledger,
one budget gauge per configured budget, and the projection to month end. Right: a calculator
where the operator types dataset size, runs per month, nodes, source and destination and sees
the quote and its alternatives (read from R2, replicate once to R2, shards) update on every key.
The brief's scenario (40 TB x 5 runs, aws:us-east-1 -> coreweave:us-east-04, 16 nodes) is
preloaded. Pricing is pure (``backend.policy``); the ledger is read in a worker.

An over-budget transfer under ``[egress] action = "confirm"`` starts only with a reason: the
pull form's reason field (Transfers), which ``ops.pulls.start`` records as the override.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import DataTable, Input, Label, Select, Static

from backend.ops.egress import (
    EgressEstimate,
    EgressReport,
    EgressSettings,
    FanoutSavings,
    PriceTable,
    estimate,
    estimate_lines,
    parse_count_text,
    parse_site_text,
    parse_size_text,
)
from backend.units import bytes_text, usd_text
from tui.screens.base import FILTER_BINDING, LoadmasterScreen
from tui.widgets import Gauge, Summary
from tui.widgets.detail import DetailModal
from tui.widgets.plain import PlainLabel, PlainStatic, plain
from tui.widgets.table_fit import CellFor, FitColumn, FittedTable
from tui.widgets.transfers_format import short

if TYPE_CHECKING:
    from backend.services import Services


@dataclass(frozen=True)
class CalculatorInputs:
    """What the operator typed, as text (validated by :func:`read_inputs`)."""

    size: str = "40TB"
    runs: str = "5"
    nodes: str = "16"
    per_node: str = "sharded"
    source: str = "aws:us-east-1"
    dest: str = "coreweave:us-east-04"
    objects: str = "500e6"


#: The routes table's columns, the decisive ones first (key, header).
ROUTE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("route", "Store -> node site"),
    ("usd", "USD"),
    ("projected", "Projected"),
    ("bytes", "Bytes"),
    ("n", "N"),
    ("kind", "Kind"),
)
#: The route column is bounded (longer routes are cut in the middle, the full route is the table's
#: tooltip on the highlighted row) so that a long store or site name cannot push the money off.
ROUTE_WIDTH = 32
#: The same columns as a :class:`FittedTable` lays them out: at 80 columns N and Kind give way
#: whole (never cut by the edge); the widths are set with the rows, so the header always lines up.
ROUTE_FIT = tuple(
    FitColumn(key, label, ROUTE_WIDTH, least=28) if key == "route" else FitColumn(key, label)
    for key, label in ROUTE_COLUMNS
)

#: The brief's scenario: 40 TB read by 5 runs a month from S3 us-east-1 into 16 nodes elsewhere.
BRIEF_SCENARIO = CalculatorInputs()

_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("size", "Dataset size", "e.g. 40TB"),
    ("runs", "Runs / month", "e.g. 5"),
    ("nodes", "Nodes", "e.g. 16"),
    ("source", "Source site", "provider:region, e.g. aws:us-east-1"),
    ("dest", "Destination site", "provider:region, e.g. coreweave:us-east-04"),
    ("objects", "Objects", "files in the dataset, e.g. 500e6 (0: unknown)"),
)


def read_inputs(values: CalculatorInputs, table: PriceTable | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Parse the calculator's text fields: (estimate keyword arguments, errors by field).

    With ``table``, a site it does not know (``aws:us-east1``, ``mars:olympus-1``) is the field's
    error, never a price.
    """
    parsed: dict[str, Any] = {}
    errors: dict[str, str] = {}

    def take(field: str, fn: Any) -> None:
        try:
            parsed[field] = fn(getattr(values, field))
        except ValueError as exc:
            errors[field] = str(exc)

    take("size", lambda t: parse_size_text(t, what="size"))
    take("runs", lambda t: parse_count_text(t, what="runs", minimum=1))
    take("nodes", lambda t: parse_count_text(t, what="nodes", minimum=1))
    take("source", lambda t: parse_site_text(t, what="source", table=table))
    take("dest", lambda t: parse_site_text(t, what="destination", table=table))
    take("objects", lambda t: parse_count_text(t or "0", what="objects"))
    kwargs = {
        "dataset_bytes": parsed.get("size"),
        "runs": parsed.get("runs"),
        "nodes": parsed.get("nodes"),
        "source": parsed.get("source"),
        "dest": parsed.get("dest"),
        "objects": parsed.get("objects"),
        "per_node": values.per_node,
    }
    return kwargs, errors


class EgressScreen(LoadmasterScreen):
    """Month-to-date egress per route with budget gauges, and the egress cost calculator."""

    SCREEN_TITLE: ClassVar[str] = "Egress"
    AUTO_FOCUS = "#egress-routes"
    #: Below 120 columns the calculator goes under the month's routes (beside them at 100 columns it
    #: left the routes no room for Projected); up to 160 it keeps a fixed width beside them
    #: (themes/egress.tcss), so the routes table keeps room for USD and Projected.
    HORIZONTAL_BREAKPOINTS: list[tuple[int, str]] | None = [(0, "-narrow"), (120, "-medium"), (160, "-wide")]
    FILTER_HINT: ClassVar[str] = "route (store or site) or kind"
    PALETTE_COMMANDS: ClassVar[list[tuple[str, str, str]]] = [
        ("Refresh month-to-date", "Re-read the egress ledger (key r)", "refresh"),
        (
            "Load the brief's scenario",
            "40 TB x 5 runs, aws:us-east-1 -> coreweave:us-east-04, 16 nodes (key x)",
            "load_example",
        ),
        ("Toggle full sync / sharded", "Every node syncs the whole dataset vs disjoint shards (key f)", "toggle_full"),
        (
            "Show the selected route",
            "Account, sites, bytes, $ and projection of one route in full (key enter)",
            "route_detail",
        ),
    ]
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "refresh", "Reload"),
        Binding("x", "load_example", "Example"),
        Binding("f", "toggle_full", "Full/sharded"),
        FILTER_BINDING,
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | r | Re-read the month-to-date spend from the ledger. |
    | x | Load the brief's scenario into the calculator. |
    | f | Toggle every-node-syncs-everything vs disjoint shards. |
    | enter | The selected route in full: account, sites, bytes, $ and projection. |
    | / | Filter routes by store, site or kind. |
    """

    class EstimateComputed(Message):
        """The calculator's inputs were valid and produced an estimate."""

        def __init__(self, estimate: EgressEstimate) -> None:
            self.estimate = estimate
            super().__init__()

    class EstimateRejected(Message):
        """The calculator's inputs did not validate; ``errors`` maps field -> message."""

        def __init__(self, errors: dict[str, str]) -> None:
            self.errors = errors
            super().__init__()

    class ReportLoaded(Message):
        """The month's spend was read from the ledger."""

        def __init__(self, report: EgressReport, savings: FanoutSavings | None = None) -> None:
            self.report = report
            #: What relay pulls saved this month (bytes peers sent instead of the store).
            self.savings = savings
            super().__init__()

    def __init__(self, services: Services, **kwargs: Any) -> None:
        super().__init__(services, **kwargs)
        self.prices: PriceTable = self.ops.egress.prices()
        self.estimate: EgressEstimate | None = None
        self.report: EgressReport | None = None
        self.errors: dict[str, str] = {}
        #: The routes in the table, in row order: (route spend, its full name).
        self.shown_routes: list[tuple[Any, str]] = []

    # ------------------------------------------------------------------ layout

    def compose_body(self) -> ComposeResult:
        with Horizontal(id="egress-main", classes="screen-body"):
            with Vertical(id="egress-month"):
                yield PlainStatic("Month to date", id="egress-month-title")
                yield Summary(id="egress-summary")
                yield Vertical(id="egress-budgets")
                yield FittedTable(ROUTE_FIT, id="egress-routes", cursor_type="row", zebra_stripes=True)
            with VerticalScroll(id="egress-calc"):
                yield PlainStatic("Calculator  (GB = 10^9 bytes)", id="egress-calc-title")
                for key, label, hint in _FIELDS:
                    with Horizontal(classes="egress-field"):
                        yield PlainLabel(label, classes="egress-label")
                        yield Input(getattr(BRIEF_SCENARIO, key), placeholder=hint, id=f"calc-{key}")
                with Horizontal(classes="egress-field"):
                    yield Label("Per node", classes="egress-label")
                    yield Select(
                        [("disjoint shards (sharded)", "sharded"), ("every node syncs all (full)", "full")],
                        value=BRIEF_SCENARIO.per_node,
                        allow_blank=False,
                        id="calc-per-node",
                    )
                yield PlainStatic("", id="egress-calc-error")
                yield PlainStatic("", id="egress-quote")

    def on_mount(self) -> None:
        self.recompute()

    def start_reads(self) -> None:
        self.action_refresh()

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        if self.report is not None and self.is_current:
            self.action_refresh()

    # ------------------------------------------------------------------ calculator

    def inputs(self) -> CalculatorInputs:
        """The calculator's current text values."""
        values = {key: self.query_one(f"#calc-{key}", Input).value for key, _, _ in _FIELDS}
        per_node = self.query_one("#calc-per-node", Select).value
        return CalculatorInputs(per_node=str(per_node), **values)

    def recompute(self) -> None:
        """Validate the inputs and show the quote and alternatives (pure arithmetic, no I/O)."""
        kwargs, errors = read_inputs(self.inputs(), self.prices)
        for key, _, _ in _FIELDS:
            self.query_one(f"#calc-{key}", Input).set_class(key in errors, "-invalid")
        error_box = self.query_one("#egress-calc-error", Static)
        quote_box = self.query_one("#egress-quote", Static)
        if not errors:
            try:
                est = estimate(self.prices, **kwargs)
            except ValueError as exc:
                errors = {"calculator": str(exc)}
            else:
                self.errors = {}
                self.estimate = est
                error_box.update("")
                error_box.set_class(False, "-active")
                quote_box.set_class(False, "-stale")
                quote_box.update("\n".join(estimate_lines(est, self.prices)))
                self.post_message(self.EstimateComputed(est))
                return
        self.errors = errors
        error_box.update("\n".join(errors.values()))
        error_box.set_class(True, "-active")
        # Keep the last good quote visible but marked stale, so the operator sees what changed.
        quote_box.set_class(True, "-stale")
        self.post_message(self.EstimateRejected(errors))

    @on(Input.Changed, "#egress-calc Input")
    def _input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.recompute()

    @on(Select.Changed, "#calc-per-node")
    def _per_node_changed(self, event: Select.Changed) -> None:
        event.stop()
        self.recompute()

    def action_load_example(self) -> None:
        """Fill the calculator with the brief's scenario."""
        with self.prevent(Input.Changed, Select.Changed):
            for key, _, _ in _FIELDS:
                self.query_one(f"#calc-{key}", Input).value = getattr(BRIEF_SCENARIO, key)
            self.query_one("#calc-per-node", Select).value = BRIEF_SCENARIO.per_node
        self.recompute()

    def action_toggle_full(self) -> None:
        """Switch between every node syncing the whole dataset and disjoint shards."""
        sel = self.query_one("#calc-per-node", Select)
        sel.value = "sharded" if sel.value == "full" else "full"

    # ------------------------------------------------------------------ month to date

    def action_refresh(self) -> None:
        """Re-read the month's spend from the egress ledger."""
        self._load_report()

    @work(thread=True, exclusive=True, group="egress-report", exit_on_error=False)
    def _load_report(self) -> None:
        egress = self.ops.egress
        report = egress.report()
        self.post_message(self.ReportLoaded(report, egress.fanout_savings(report.month)))

    @on(ReportLoaded)
    def _report_loaded(self, event: ReportLoaded) -> None:
        self.report = rep = event.report
        as_of = datetime.fromtimestamp(rep.as_of, UTC).strftime("%Y-%m-%d %H:%M UTC")
        self.query_one("#egress-month-title", Static).update(
            f"Month to date {rep.month}  ({rep.elapsed:.0%} of the month, as of {as_of})"
        )
        self.query_one("#egress-summary", Summary).set_items(
            [
                ("spent", usd_text(rep.usd)),
                ("moved", bytes_text(rep.bytes)),
                ("projected", f"{usd_text(rep.projected_usd)} / {bytes_text(rep.projected_bytes)}"),
                *([("in flight", f"{rep.in_flight} at {usd_text(rep.in_flight_usd)}")] if rep.in_flight else []),
                *([("unpriced", bytes_text(rep.unpriced_bytes))] if rep.unpriced_bytes else []),
                *(
                    [("fan-out saved", f"{usd_text(sv.usd)} / {bytes_text(sv.bytes)} ({sv.jobs} node copies)")]
                    if (sv := event.savings) is not None and sv.jobs
                    else []
                ),
            ]
        )
        box = self.query_one("#egress-budgets", Vertical)
        box.remove_children()
        gauges: list[Any] = []
        for b in rep.budgets:
            gauges.append(
                Gauge(
                    b.key,
                    value=b.spent_usd,
                    total=max(b.budget_usd, 1e-9),
                    text=f"{usd_text(b.spent_usd)}/{usd_text(b.budget_usd)} -> {usd_text(b.projected_usd)}",
                    warn_at=self.services.config.section(EgressSettings).warn_at,
                    label_width=14,
                    classes="egress-budget",
                )
            )
            gauges[-1].tooltip = plain(
                f"{b.scope} {b.key!r}: {usd_text(b.spent_usd)} spent of "
                f"{usd_text(b.budget_usd)} this month, {usd_text(b.projected_usd)} projected"
            )
        if not gauges:
            gauges.append(
                PlainStatic(
                    "no budget configured: set [egress] monthly_budget_usd or budgets",
                    classes="egress-no-budget",
                )
            )
        box.mount_all(gauges)
        self._render_routes()

    def _render_routes(self) -> None:
        rep = self.report
        if rep is None:
            return
        table = self.query_one("#egress-routes", FittedTable)
        rows: list[tuple[str, list[CellFor]]] = []
        named = [(r, f"{r.store} -> {r.dest_site or '?'}") for r in rep.routes]
        self.shown_routes = [(r, name) for r, name in named if self.filter_matches(name, r.kind)]
        for r, route in self.shown_routes:
            cells: dict[str, CellFor] = {
                "route": partial(short, route),  # cut in the middle to the column's width
                "usd": usd_text(r.usd),
                "projected": usd_text(r.projected_usd),
                "bytes": bytes_text(r.bytes),
                "n": str(r.transfers),
                "kind": r.kind,
            }
            rows.append((f"{len(rows)}:{route}", [cells[k] for k, _ in ROUTE_COLUMNS]))
        if not self.shown_routes:
            empty = f"no route matches {self.filter_text!r}" if rep.routes else "no transfers recorded this month"
            rows.append(("empty", [empty if k == "route" else "" for k, _ in ROUTE_COLUMNS]))
        table.set_rows(rows)

    def apply_filter(self) -> None:
        self._render_routes()

    @on(DataTable.RowHighlighted, "#egress-routes")
    def _route_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        row = event.cursor_row
        event.data_table.tooltip = plain(self.shown_routes[row][1]) if 0 <= row < len(self.shown_routes) else None

    @on(DataTable.RowSelected, "#egress-routes")
    def _route_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_route_detail()

    def action_route_detail(self) -> None:
        """The selected route in full (the table cuts the route name to fit)."""
        row = self.query_one("#egress-routes", DataTable).cursor_row
        if not 0 <= row < len(self.shown_routes):
            self.notify("No route selected: nothing was transferred this month yet.", severity="warning", markup=False)
            return
        r, name = self.shown_routes[row]
        fields = [
            ("route", name),
            ("store", r.store),
            ("account", r.account or "-"),
            ("from site", r.source_site or "unknown"),
            ("to site", r.dest_site or "unknown"),
            ("kind", r.kind),
            ("transfers", f"{r.transfers:,}"),
            ("moved", bytes_text(r.bytes)),
            ("spent", usd_text(r.usd)),
            ("projected", f"{usd_text(r.projected_usd)} / {bytes_text(r.projected_bytes)} by month end"),
        ]
        self.app.push_screen(DetailModal(name, fields, hint="escape back"))
