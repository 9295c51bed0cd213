"""Fleet screen: every node's GPUs, NICs and disks live, with the "GPU starved" alert list.

The backend (``services.telemetry``, a TelemetryHub) samples the nodes; this screen only renders
its FleetSnapshots. Ticks arrive as :class:`FleetSampled` messages that replace each other when
the UI falls behind (``can_replace``) and are applied inside ``batch_update()``, touching only
the cells whose text changed.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from backend.telemetry.model import FleetSnapshot
from backend.telemetry.report import unread_nodes
from tui.messages import FleetSampled
from tui.screens.base import LoadmasterScreen, PaletteCommand
from tui.screens.node_detail import NodeDetailScreen
from tui.widgets.fleet_alerts import AlertList
from tui.widgets.fleet_table import TREND_WIDTH, FleetTable
from tui.widgets.table_cursor import cursor_row_key

if TYPE_CHECKING:
    from backend.services import Services

STYLE_NAMES = ("node-up", "node-down", "node-stale", "alert")


class FleetScreen(LoadmasterScreen):
    """Nodes, GPUs, NICs, disks and alerts of the whole fleet."""

    SCREEN_TITLE: ClassVar[str] = "Fleet"
    FILTER_HINT: ClassVar[str] = "node name, site or state (glob or substring)"
    PALETTE_COMMANDS: ClassVar[list[PaletteCommand]] = [
        ("Open node detail", "Per-GPU rows and time series of the selected node (key enter)", "open_node"),
        ("Sort by next column", "Cycle the node table's sort column (key s)", "sort"),
    ]

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("enter", "open_node", "Node detail", show=True),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | / | Filter nodes by name, site or state (glob or substring). |
    | enter | Open the selected node's detail (per-GPU rows and time series). |
    | s / S | Sort by the next column / reverse (clicking a header also sorts). |
    | escape | Leave / clear the filter. |
    """

    def __init__(self, services: Services, **kwargs: Any) -> None:
        super().__init__(services, **kwargs)
        self._unsubscribe: Any = None
        self.last_snapshot: FleetSnapshot | None = None
        #: Wall and CPU seconds spent applying each tick (the benchmark reads these).
        self.apply_times: list[float] = []
        self.apply_cpu_times: list[float] = []
        self._theme_name: str | None = None

    @property
    def hub(self) -> Any:
        return self.services.telemetry

    def compose_body(self) -> ComposeResult:
        with Vertical(classes="screen-body", id="fleet-body"):
            yield Static("", id="fleet-summary", markup=False)
            local = frozenset(n.name for n in self.services.config.nodes if n.transport == "local")
            yield FleetTable(local_nodes=local, id="fleet-table")
            yield Static("Alerts", id="fleet-alerts-title", markup=False)
            yield AlertList(id="fleet-alerts")

    def on_mount(self) -> None:
        self._apply_theme()
        self._unsubscribe = self.hub.subscribe(self._on_tick)
        self.apply_snapshot(self.hub.snapshot())
        self.query_one(FleetTable).focus()
        if not getattr(self.hub, "running", False):
            self._start_sampling()

    def on_unmount(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    @work(exclusive=True, group="telemetry", exit_on_error=False)
    async def _start_sampling(self) -> None:
        await self.hub.start()

    def _on_tick(self, snapshot: FleetSnapshot) -> None:
        # Called by the hub on every tick (same event loop): hand over as a message.
        self.post_message(FleetSampled(snapshot))

    @on(FleetSampled)
    def _fleet_sampled(self, event: FleetSampled) -> None:
        self.apply_snapshot(event.snapshot)

    def _apply_theme(self) -> None:
        variables = getattr(self.app, "theme_variables", {}) or {}
        styles = {k: variables[k] for k in STYLE_NAMES if variables.get(k)}
        self.query_one(FleetTable).set_theme_styles(styles)
        self.query_one(AlertList).set_style(styles.get("alert"))
        self._theme_name = self.app.theme

    def apply_snapshot(self, snapshot: FleetSnapshot) -> None:
        """Render one FleetSnapshot (summary, changed cells, alerts) in one batch."""
        start, cpu = time.perf_counter(), time.thread_time()
        if self._theme_name != self.app.theme:
            self._apply_theme()
        table = self.query_one(FleetTable)
        with self.app.batch_update():
            unread = unread_nodes(snapshot)
            # A partial view says so, naming the nodes whose figures are missing from the totals.
            partial = ("   partial view: " + ", ".join(f"{n} ({why})" for n, why in unread.items())) if unread else ""
            self.query_one("#fleet-summary", Static).update(snapshot.summary_line() + partial)
            table.show(snapshot.nodes, self._trend)
            alerts = self.query_one(AlertList)
            alerts.show(snapshot.alerts)
            title = self.query_one("#fleet-alerts-title", Static)
            n = len(snapshot.active_alerts)
            title.update(f"Alerts: {n} active" if n else "Alerts: none active")
            title.set_class(n > 0, "-active")
        self.last_snapshot = snapshot
        self.apply_times.append(time.perf_counter() - start)
        self.apply_cpu_times.append(time.thread_time() - cpu)
        del self.apply_times[:-10000], self.apply_cpu_times[:-10000]

    def _trend(self, name: str) -> list[float]:
        try:
            return self.hub.history(name).series("util_mean", TREND_WIDTH)
        except KeyError:
            return []

    # -- filter and sort ------------------------------------------------------------------------

    def action_sort(self) -> None:
        """Sort by the next column."""
        self.query_one(FleetTable).action_cycle_sort()

    def apply_filter(self) -> None:
        table = self.query_one(FleetTable)
        if table.filter == self.filter_text:
            return
        table.filter = self.filter_text
        if self.last_snapshot is not None:
            with self.app.batch_update():
                table.show(self.last_snapshot.nodes, self._trend)

    # -- detail --------------------------------------------------------------------------------

    def action_open_node(self) -> None:
        """Open the node under the cursor."""
        name = cursor_row_key(self.query_one(FleetTable))
        if name is not None:
            self.open_node(name)

    @on(DataTable.RowSelected, "#fleet-table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.open_node(str(event.row_key.value))

    def open_node(self, name: str) -> None:
        """Push the detail screen of node ``name``."""
        self.app.push_screen(NodeDetailScreen(self.services, name))
