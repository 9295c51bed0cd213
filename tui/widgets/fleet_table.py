"""The Fleet node table: one row per node, updated cell by cell, sortable and filterable."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

from backend.ops.types import NodeSnapshot
from tui.widgets.fleet_format import node_cells, slurm_reason_cell, slurm_state_cell
from tui.widgets.plain import PlainTable, plain_cell
from tui.widgets.table_cursor import cursor_row_key
from tui.widgets.table_fit import cut_end
from tui.widgets.text_filter import text_matches
from tui.widgets.transfers_format import short

if TYPE_CHECKING:
    from backend.ops.slurm import SlurmNodeRow

#: (key, label, width) of each column, in display order; the width is the column's natural one.
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("node", "Node", 12),
    ("state", "State", 11),
    # Slurm's state and flags (``draining*``, ``drained ×3``): only with [slurm] enabled.
    ("slurm", "Slurm", 11),
    ("gpus", "GPUs", 13),
    # Each width leaves room for the sort arrow after the label (" ▲").
    ("util", "Util avg/min", 14),
    ("rx", "RX Gbps (%)", 13),
    ("tx", "TX Gbps (%)", 13),
    # "STARVED line rate unknown" in full; the site's alerts and an Xid take what is left over.
    ("alerts", "Alerts", 25),
    # Slurm's reason, who set it and how long ago (in full in the node detail).
    ("reason", "Slurm reason", 30),
    ("trend", "Util trend", 20),
    ("disk", "Disk W MB/s", 13),
    ("mem", "GPU mem", 13),
    ("ssh", "SSH", 7),
    ("site", "Site", 20),
    ("error", "Last error", 40),
)
#: The order in which columns give way as the terminal narrows: the last goes first. What the
#: operator decides on (which node, its state, the alert on its row, its utilisation) stays at 80
#: columns; the NICs, GPU count and the reason a node is down come next.
PRIORITY: tuple[str, ...] = (
    "node",
    "state",
    "alerts",
    "util",
    "gpus",
    "rx",
    "error",
    "tx",
    "trend",
    "mem",
    "disk",
    "site",
    "ssh",
)
#: The Slurm columns, shown only with ``[slurm] enabled``.
SLURM_KEYS = frozenset({"slurm", "reason"})
#: PRIORITY with Slurm: its state stays beside the alerts at 80 columns (it is what a drain or a
#: resume is decided on); utilisation gives way first, then the reason (in full in node detail).
PRIORITY_SLURM: tuple[str, ...] = ("node", "state", "slurm", "alerts", "util", "reason", *PRIORITY[4:])
#: The narrowest a shown column may get (its cells are cut with an ellipsis below the natural width).
MIN_WIDTHS = {"gpus": 6, "error": 20, "trend": 10, "site": 12, "reason": 16}
#: Columns that take the width left over once every column that fits is shown, up to this much.
FLEX_WIDTHS = {"alerts": 48, "error": 80, "reason": 60}
COLUMN_KEYS = tuple(c[0] for c in COLUMNS)
#: The columns :func:`node_cells` fills (all but Slurm's), in its order.
BASE_KEYS = tuple(k for k in COLUMN_KEYS if k not in SLURM_KEYS)
ERROR_INDEX = COLUMN_KEYS.index("error")
#: Marks the sorted column's header: ascending, descending.
SORT_ARROWS = ("▲", "▼")
TREND_WIDTH = 20

#: Sort keys per column: raw values, not the formatted text (None sorts last).
SORT_KEYS: dict[str, Callable[[NodeSnapshot], Any]] = {
    "node": lambda n: n.name,
    "site": lambda n: n.site or "",
    "state": lambda n: ("unreachable", "stale", "connecting", "up").index(n.state),
    "ssh": lambda n: n.latency_ms,
    "gpus": lambda n: len(n.live_gpus),
    "util": lambda n: n.util_mean,
    "mem": lambda n: n.mem_used_mib,
    "rx": lambda n: n.rx_gbps,
    "tx": lambda n: n.tx_gbps,
    "disk": lambda n: n.disk_write_mbps,
    "alerts": lambda n: -len(n.alerts),
    "trend": lambda n: n.util_mean,
    "error": lambda n: n.error or "",
}


def column_layout(
    width: int, *, padding: int = 1, skip: frozenset[str] = frozenset(), slurm: bool = False
) -> tuple[tuple[str, int], ...]:
    """The columns shown in ``width`` cells and their widths, in display order.

    Columns are taken in PRIORITY order while their narrowest width (plus the cell padding) still
    fits, so they give way strictly in that order; what is left widens them toward their natural
    width, in the same order, then the flexible columns (FLEX_WIDTHS). The node column is always
    shown. ``skip``: columns with nothing to show (no node has an error). ``slurm``: the Slurm
    columns, in PRIORITY_SLURM order (without it they are never shown).
    """
    priority = PRIORITY_SLURM if slurm else PRIORITY
    if not slurm:
        skip = skip | SLURM_KEYS
    natural = {key: w for key, _label, w in COLUMNS}
    pad = 2 * padding
    chosen: dict[str, int] = {}
    used = 0
    for key in priority:
        if key in skip:
            continue
        need = MIN_WIDTHS.get(key, natural[key]) + pad
        if chosen and used + need > width:
            break
        chosen[key] = need - pad
        used += need
    for limits in (natural, FLEX_WIDTHS):
        for key in priority:
            if key in chosen and key in limits:
                grow = max(0, min(limits[key] - chosen[key], width - used))
                chosen[key] += grow
                used += grow
    return tuple((key, chosen[key]) for key in COLUMN_KEYS if key in chosen)


#: The alertname loadmaster's starvation check pages Alertmanager with (backend/alerts/conditions.py).
STARVED_ALERT = "GPUStarved"
STATE_STYLE = {"up": "node-up", "stale": "node-stale", "unreachable": "node-down", "connecting": "node-stale"}
#: Sort keys of the Slurm columns, on the node's Slurm row (None: not a Slurm node, sorts last).
SLURM_SORT_KEYS: dict[str, Callable[[SlurmNodeRow], Any]] = {
    "slurm": lambda r: (not r.unavailable, r.state),
    "reason": lambda r: -(r.reason_age_s or 0.0) if r.reason else None,
}


def reason_fit(text: str, width: int | None) -> str:
    """A reason cell cut to ``width``: the reason gives way, who set it and when stay whole."""
    if width is None or len(text) <= width:
        return text
    head, sep, tail = text.rpartition(" (")
    if not sep or len(tail) + 3 >= width:
        return short(text, width)
    return head[: width - len(tail) - 3] + "…" + sep + tail


def slurm_matches(row: SlurmNodeRow | None, pattern: str) -> bool:
    """Filter on Slurm: its state word, a partition, or ``job:N`` (the nodes running job N)."""
    if row is None:
        return False
    if pattern.startswith("job:"):
        want = pattern[4:].strip()
        return bool(want) and any(j.job_id == want for j in row.jobs)
    return text_matches(pattern, row.state, *row.partitions)


def matches(n: NodeSnapshot, pattern: str) -> bool:
    """Filter: a glob (``gpu-0*``) or a substring of the name, site or state."""
    return text_matches(pattern, n.name, n.site or "", n.state)


def _cell_identity(value: object) -> Hashable | None:
    """What a cell's rendering depends on, hashable; None for a value that is neither text nor a
    Rich Text (rendered afresh every time)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Text):
        return (value.plain, value.style, tuple(value.spans), value.justify, value.overflow, value.no_wrap, value.end)
    return None


class CellCachedTable(PlainTable):
    """A DataTable that re-renders a cell only when what it shows changed.

    DataTable keys its cell cache on the table's update count, which any cell update bumps, so
    one changed cell makes every visible cell go through Rich again (at 256 nodes, the whole
    screenful each tick: most of the table view's CPU). Here each screen position keeps its last
    rendering with a key of everything the rendering reads (the cell's text and style, the
    position, width, cursor and hover, the widget's styles); a cell whose key is unchanged is
    reused, any other goes through DataTable's own rendering, so the look is DataTable's.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: (row index, column index) -> (key, rendered lines): at most one entry per position
        #: (set first: DataTable's constructor already clears its caches).
        self._cell_lines: dict[tuple[int, int], tuple[Hashable, list[list[Segment]]]] = {}
        super().__init__(*args, **kwargs)

    def _clear_caches(self) -> None:
        super()._clear_caches()
        self._cell_lines.clear()

    def notify_style_update(self) -> None:
        self._cell_lines.clear()
        super().notify_style_update()

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> list[list[Segment]]:
        render = super()._render_cell
        if column_index < 0:  # row labels: not used here
            return render(row_index, column_index, base_style, width, cursor, hover)
        column_key = self._column_locations.get_key(column_index)
        row_key = self._row_locations.get_key(row_index) if row_index >= 0 else None
        value: object = None
        height = self.header_height
        if column_key is None:
            pass
        elif row_index < 0:
            column = self.columns.get(column_key)
            value = column.label if column is not None else None
        elif row_key is not None:
            value = self._data.get(row_key, {}).get(column_key)
            row = self.rows.get(row_key)
            height = row.height if row is not None else 0
        identity = _cell_identity(value)
        if identity is None:
            return render(row_index, column_index, base_style, width, cursor, hover)
        key = (
            identity,
            column_key,
            height,
            base_style,
            width,
            cursor,
            hover,
            self._show_hover_cursor,
            self._pseudo_class_state,
            self.show_cursor,
            self.zebra_stripes,
            self.fixed_rows,
            self.fixed_columns,
            self.cell_padding,
        )
        slot = (row_index, column_index)
        kept = self._cell_lines.get(slot)
        if kept is not None and kept[0] == key:
            return kept[1]
        lines = render(row_index, column_index, base_style, width, cursor, hover)
        self._cell_lines[slot] = (key, lines)
        return lines


class FleetTable(CellCachedTable):
    """Nodes of the fleet; :meth:`show` applies a tick, touching only the cells that changed.

    Enter posts ``DataTable.RowSelected`` (the row key is the node name).
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "cycle_sort", "Sort"),
        Binding("S", "reverse_sort", "Reverse", show=False),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | s | Sort by the next column. |
    | S | Reverse the sort order. |
    """

    def __init__(
        self,
        *,
        local_nodes: frozenset[str] = frozenset(),
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        #: Nodes reached over the local transport: their SSH column says ``local``.
        self.local_nodes = local_nodes
        self.sort_column = "node"
        self.sort_reverse = False
        self.filter = ""
        self._row_cells: dict[str, tuple[str, ...]] = {}
        self._snaps: dict[str, NodeSnapshot] = {}
        self._row_order: list[str] = []
        self._theme_styles: dict[str, str] = {}
        #: The columns on screen (key -> ColumnKey) and their widths, as laid out for the width.
        self._column_keys: dict[str, ColumnKey] = {}
        self._layout: tuple[tuple[str, int], ...] = ()
        self._scrolls = False
        self._pending: dict[str, NodeSnapshot] = {}
        self._trend: Callable[[str], Sequence[float]] = lambda name: ()
        #: Node -> alertnames of the site's active alerts about it (the Alerts column marks them).
        self.site_alerts: Mapping[str, Sequence[str]] = {}
        #: Node -> alertnames of its silenced site alerts (a silenced GPUStarved page is said so).
        self.site_silenced: Mapping[str, Sequence[str]] = {}
        #: Whether the Slurm columns are laid out ([slurm] enabled), and each node's Slurm row.
        self.slurm_enabled = False
        self.slurm_rows: Mapping[str, SlurmNodeRow] = {}
        #: A preset filter on node names (drained/down, a job's nodes, the slowest GPUs), or None.
        self.only: Callable[[str], bool] | None = None

    def on_mount(self) -> None:
        self._relayout()

    def on_resize(self) -> None:
        self._relayout()

    @property
    def shown_columns(self) -> tuple[str, ...]:
        """The keys of the columns on screen, in display order."""
        return tuple(key for key, _width in self._layout)

    def _relayout(self) -> None:
        """Lay the columns out for the table's width; rebuild them when the set or widths changed."""
        width = self.size.width or 80
        if len(self._row_cells) >= self.size.height - 1:
            width -= self.styles.scrollbar_size_vertical  # more rows than lines: a scrollbar
        has_error = any(cells and cells[ERROR_INDEX] for cells in self._row_cells.values())
        layout = column_layout(
            width,
            padding=self.cell_padding,
            skip=frozenset() if has_error else frozenset({"error"}),
            slurm=self.slurm_enabled,
        )
        self._scrolls = len(self._row_cells) >= self.size.height - 1
        if layout == self._layout:
            return
        self._layout = layout
        selected = cursor_row_key(self) if self.row_count else None
        self.clear(columns=True)
        labels = {key: label for key, label, _w in COLUMNS}
        self._column_keys = {key: self.add_column(labels[key], key=key, width=w) for key, w in layout}
        for name in self._row_order or list(self._row_cells):
            snap = self._snaps.get(name)
            if snap is not None:
                self._pending.pop(name, None)
                cells = self._cells(snap)
                self._row_cells[name] = cells
                self.add_row(*self._style_row(snap, cells), key=name)
        if self.sort_column not in self._column_keys:
            self.sort_column = "node"
            self.sort_reverse = False
        self._row_order = []
        self._mark_sorted_column()
        if self._row_cells:
            self._resort()
        if selected is not None and selected in self._row_order:
            self.move_cursor(row=self._row_order.index(selected))

    def header_label(self, key: str) -> str:
        """A column's header as shown: the sorted column carries the direction arrow."""
        label = COLUMNS[COLUMN_KEYS.index(key)][1]
        if key != self.sort_column:
            return label
        return f"{label} {SORT_ARROWS[self.sort_reverse]}"

    def _mark_sorted_column(self) -> None:
        for ckey in self._column_keys.values():
            column = self.columns.get(ckey)
            if column is not None:
                column.label = Text(self.header_label(str(ckey.value)))
        self._update_count += 1  # the header row is cached per update count
        self.refresh()

    def set_theme_styles(self, styles: dict[str, str]) -> None:
        """Theme colours by semantic name (node-up, node-down, node-stale, alert)."""
        self._theme_styles = styles
        # The rows stay in the table (re-adding them would collide on their keys): mark every
        # cell stale so the next flush rewrites it in the new colours.
        for name, cells in self._row_cells.items():
            self._row_cells[name] = (None,) * len(cells)  # type: ignore[assignment]
            snap = self._snaps.get(name)
            if snap is not None:
                self._pending[name] = snap
        self._flush_window()

    def set_site_alerts(
        self, alerts: Mapping[str, Sequence[str]], silenced: Mapping[str, Sequence[str]] | None = None
    ) -> None:
        """The site's alerts by node (and the silenced ones): the rows whose marks change are
        rewritten on the next flush."""
        old, self.site_alerts = self.site_alerts, alerts
        old_quiet, self.site_silenced = self.site_silenced, silenced or {}
        for name in set(old) | set(alerts) | set(old_quiet) | set(self.site_silenced):
            snap = self._snaps.get(name)
            changed = old.get(name) != alerts.get(name) or old_quiet.get(name) != self.site_silenced.get(name)
            if snap is not None and changed:
                self._pending[name] = snap

    def set_slurm(self, rows: Mapping[str, SlurmNodeRow], *, enabled: bool = True) -> None:
        """Slurm's rows by node: the rows whose Slurm cells change are rewritten on the next
        flush; the Slurm columns are laid out once ``enabled``."""
        old, self.slurm_rows = self.slurm_rows, rows
        for name in set(old) | set(rows):
            snap = self._snaps.get(name)
            if snap is not None and old.get(name) != rows.get(name):
                self._pending[name] = snap
        if enabled != self.slurm_enabled:
            self.slurm_enabled = enabled
            self._layout = ()  # rebuild the columns
            if self.is_mounted:
                self._relayout()

    def passes(self, n: NodeSnapshot) -> bool:
        """Whether the node is shown: the preset filter, then the typed one (name, site, state,
        Slurm's state, a partition, ``job:N``)."""
        if self.only is not None and not self.only(n.name):
            return False
        if not self.filter:
            return True
        if self.filter.startswith("job:"):
            return slurm_matches(self.slurm_rows.get(n.name), self.filter)
        return matches(n, self.filter) or slurm_matches(self.slurm_rows.get(n.name), self.filter)

    # -- applying ticks ------------------------------------------------------------------------

    def show(self, nodes: Sequence[NodeSnapshot], trend: Callable[[str], Sequence[float]]) -> int:
        """Apply one tick; returns how many cells were rewritten now.

        Rows whose node changed are reformatted only when they are in (or near) the viewport;
        rows scrolled out of sight are marked pending and formatted when scrolled back in, so
        a 256-node fleet costs about one screenful of formatting per tick.
        """
        self._trend = trend
        visible = [n for n in nodes if self.passes(n)]
        names = {n.name for n in visible}
        changed = 0
        for gone in [k for k in self._row_cells if k not in names]:
            self.remove_row(gone)
            del self._row_cells[gone]
            self._snaps.pop(gone, None)
            self._pending.pop(gone, None)
        for n in visible:
            if n.name not in self._row_cells:
                cells = self._cells(n)
                self.add_row(*self._style_row(n, cells), key=n.name)
                self._row_cells[n.name] = cells
                self._snaps[n.name] = n
                changed += len(cells)
            elif self._snaps.get(n.name) is not n:
                # A new snapshot object means something about this node changed.
                self._snaps[n.name] = n
                self._pending[n.name] = n
        self._resort()
        changed += self._flush_window()
        self._relayout_for_errors()
        return changed

    def _relayout_for_errors(self) -> None:
        """Show the Last error column once a node has one (and give its room back after), and
        make room for the scrollbar once the rows overflow."""
        has_error = any(cells and cells[ERROR_INDEX] for cells in self._row_cells.values())
        scrolls = len(self._row_cells) >= self.size.height - 1
        if self._layout and (has_error != ("error" in self._column_keys) or scrolls != self._scrolls):
            self._relayout()

    def _window(self) -> list[str]:
        """Names of the rows on screen, plus half a screen either side."""
        height = self.scrollable_content_region.height
        if height <= 0:
            return list(self._pending)  # not laid out yet: format everything
        top = int(self.scroll_y)
        margin = height // 2 + 1
        return self._row_order[max(0, top - margin) : top + height + margin]

    def _flush_window(self, names: Sequence[str] | None = None) -> int:
        """Format the pending rows among ``names`` (default: the window); returns cells changed."""
        if not self._pending:
            return 0
        changed = 0
        for name in list(self._window() if names is None else names):
            n = self._pending.pop(name, None)
            if n is None:
                continue
            cells = self._cells(n)
            old = self._row_cells[name]
            row = self._data.get(RowKey(name))
            for i, (a, b) in enumerate(zip(old, cells, strict=True)):
                ckey = self._column_keys.get(COLUMN_KEYS[i])
                if a != b and ckey is not None:
                    if row is not None:
                        row[ckey] = self._style_cell(n, i, b)
                    else:
                        self.update_cell(name, ckey, self._style_cell(n, i, b))
                    changed += 1
            self._row_cells[name] = cells
        if changed:
            # One invalidation for the whole tick instead of one per cell (update_cell would
            # refresh the widget for every changed cell: the dominant cost with 256 nodes).
            # Columns have fixed widths, so no width recalculation is needed.
            self._update_count += 1
            self.refresh()
        return changed

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self._pending and round(old_value) != round(new_value):
            self._flush_window()

    def flush_all(self) -> None:
        """Format every pending row now (tests and exports read cells directly)."""
        self._flush_window(list(self._pending))

    def _cells(self, n: NodeSnapshot) -> tuple[str, ...]:
        site = self.site_alerts.get(n.name, ()) if self.site_alerts else ()
        quiet = STARVED_ALERT in self.site_silenced.get(n.name, ())
        base = node_cells(
            n, self._trend(n.name), TREND_WIDTH, local=n.name in self.local_nodes, site_alerts=site, silenced=quiet
        )
        cells = dict(zip(BASE_KEYS, base, strict=True))
        row = self.slurm_rows.get(n.name)
        cells["slurm"] = slurm_state_cell(row) if self.slurm_enabled else ""
        cells["reason"] = slurm_reason_cell(row) if self.slurm_enabled else ""
        return tuple(cells[k] for k in COLUMN_KEYS)

    def _style_row(self, n: NodeSnapshot, cells: tuple[str, ...]) -> list[Any]:
        """The cells of the columns on screen, styled."""
        return [self._style_cell(n, i, c) for i, c in enumerate(cells) if COLUMN_KEYS[i] in self._column_keys]

    def _style_cell(self, n: NodeSnapshot, i: int, text: str) -> Any:
        key = COLUMN_KEYS[i]
        width = dict(self._layout).get(key)
        if key in ("site", "error"):
            if width is not None:
                text = short(text, width)  # both ends carry meaning (the node column sorts by its text)
        elif key == "reason":
            text = reason_fit(text, width)
        style = None
        if key == "state":
            style = self._theme_styles.get(STATE_STYLE.get(n.state, ""))
        elif key == "alerts" and text and not text.endswith("(silenced)"):
            style = self._theme_styles.get("alert")
        elif key == "gpus" and "lost" in text:
            style = self._theme_styles.get("node-down")
        elif key == "slurm":
            row = self.slurm_rows.get(n.name)
            if row is not None and row.repeat_offender:
                style = self._theme_styles.get("alert")
            elif row is not None and row.unavailable:
                style = self._theme_styles.get("node-stale" if row.state.startswith("draining") else "node-down")
        if width is not None and key == "trend":
            text = text[-width:]  # a narrower sparkline keeps its newest samples (the right end)
        elif width is not None and key != "node":  # the node cell is its row's sort identity: kept whole
            text = str(cut_end(text, width))  # wider than its column: ends in '…', never cut bare
        # Node names, GPU errors and Slurm reasons come from outside: a cell is shown literally
        # (cells set straight into the row below bypass PlainTable.update_cell).
        return plain_cell(Text(text, style=style) if style else text)

    # -- sorting -------------------------------------------------------------------------------

    def _sort_key(self, column: str) -> Callable[[NodeSnapshot], Any]:
        slurm_key = SLURM_SORT_KEYS.get(column)
        if slurm_key is None:
            return SORT_KEYS[column]

        def key(n: NodeSnapshot) -> Any:
            row = self.slurm_rows.get(n.name)
            return None if row is None else slurm_key(row)

        return key

    def _resort(self) -> None:
        key = self._sort_key(self.sort_column)

        def rank(name: str) -> tuple[int, Any, str]:
            v = key(self._snaps[name])
            # None (unknown) always last, whatever the direction.
            missing = v is None
            return (1 if missing else 0, 0 if missing else v, name)

        present = [name for name in self._row_cells]
        order = sorted(present, key=rank)
        if self.sort_reverse:
            known = [o for o in order if key(self._snaps[o]) is not None]
            order = known[::-1] + [o for o in order if key(self._snaps[o]) is None]
        if order != self._row_order or len(order) != self.row_count:
            position = {name: i for i, name in enumerate(order)}
            self.sort("node", key=lambda cell: position[str(cell)])
            self._row_order = order

    def set_sort(self, column: str, *, reverse: bool | None = None) -> None:
        """Sort by ``column`` (a COLUMNS key)."""
        if column not in SORT_KEYS and column not in SLURM_SORT_KEYS:
            raise ValueError(f"unknown column {column!r}")
        if reverse is not None:
            self.sort_reverse = reverse
        self.sort_column = column
        self._row_order = []
        self._mark_sorted_column()
        if self._row_cells:
            self._resort()

    def action_cycle_sort(self) -> None:
        """Sort by the next column on screen."""
        shown = self.shown_columns or COLUMN_KEYS
        i = shown.index(self.sort_column) if self.sort_column in shown else -1
        self.set_sort(shown[(i + 1) % len(shown)])
        self.notify(f"Sorted by {COLUMNS[COLUMN_KEYS.index(self.sort_column)][1]}", timeout=1.5)

    def action_reverse_sort(self) -> None:
        """Reverse the sort order."""
        self.set_sort(self.sort_column, reverse=not self.sort_reverse)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        column = str(event.column_key.value)
        if column == self.sort_column:
            self.set_sort(column, reverse=not self.sort_reverse)
        else:
            self.set_sort(column, reverse=False)
