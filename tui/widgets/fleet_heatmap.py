"""The Fleet heatmap: one character cell per GPU, for fleets of hundreds of nodes.

Each node is its GPUs side by side (a block glyph per GPU, its height and colour the utilisation
bucket), preceded by a one-letter problem code. Nodes are grouped by site, else their first tag,
else the hostlist prefix of their name (``gpu-a017`` -> ``gpu-a``), one summary line per group;
problem nodes (unreachable, an Xid, a lost GPU, starved, a site alert, stale, connecting) are pulled out of
their group into a "needs attention" group on top. 256 nodes x 8 GPUs fit a 120x40 terminal.

Cheap by construction: a tick re-derives only the nodes whose snapshot object changed (unchanged
nodes keep theirs, see FleetSnapshot.changed), compares each one's cells with what is drawn, and
refreshes only the lines whose cells or group summary changed; lines are drawn through the Line
API (``render_line``) from cached strips. Colours come from the component classes below, styled
with theme variables in ``themes/fleet.tcss``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import hostlist
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Static

from backend.ops.types import GpuSample, NodeSnapshot, XidEvent
from backend.ops.types import describe_xid as describe
from backend.textfmt import safe_text
from backend.units import gbps_text
from tui.widgets.plain import PlainStatic

#: Utilisation buckets: (upper bound exclusive, glyph, component suffix, legend text).
BUCKETS: tuple[tuple[float, str, str, str], ...] = (
    (10.0, "▁", "idle", "<10%"),
    (50.0, "▃", "low", "10-49%"),
    (80.0, "▅", "mid", "50-79%"),
    (math.inf, "▇", "high", "≥80%"),
)
#: A GPU with no utilisation reported yet (or a node that has not answered yet).
NO_DATA = "·"
#: A GPU that fell off the bus.
LOST = "×"
#: Problem codes, most urgent first: (code, legend text, component suffix of the letter).
PROBLEMS: tuple[tuple[str, str, str], ...] = (
    ("!", "unreachable", "down"),
    ("X", "Xid", "down"),
    ("L", "lost GPU", "down"),
    ("S", "starved", "alert"),
    ("A", "site alert", "alert"),  # SITE_ALERT
    ("?", "stale", "stale"),
    ("~", "connecting", "stale"),
)
#: The code of a node the site's Alertmanager alerts about. Left out of the legend (which stays
#: one line at 120 columns): the "needs attention" line and the cursor's status line name it.
SITE_ALERT = "A"
PROBLEM_RANK = {code: i for i, (code, _label, _kind) in enumerate(PROBLEMS)}
PROBLEM_LABEL = {code: label for code, label, _kind in PROBLEMS}
PROBLEM_KIND = {code: kind for code, _label, kind in PROBLEMS}
#: Group id of the "needs attention" group (never a site, tag or prefix: those have a kind prefix).
ATTENTION = "attention"
#: Row labels (the first and last node of each row) are cut to this many characters.
LABEL_MAX = 16
#: Fleet sizes above this open the Fleet screen on the heatmap (at most this many: the table).
HEATMAP_ABOVE = 16

_TRAILING_DIGITS = re.compile(r"^(.*?)(\d+)$")


def row_label(names: Sequence[str], width: int) -> str:
    """A heatmap row's label: ``gpu-001-007`` for a run of consecutive nodes (the shared prefix
    once), else ``gpu-001 +6``; the first name alone where that does not fit, cut in the middle."""
    first, last = names[0], names[-1]
    text = first
    if len(names) > 1:
        text = f"{first} +{len(names) - 1}"
        m = [_TRAILING_DIGITS.match(n) for n in names]
        if all(m) and len({x.group(1) for x in m if x}) == 1:
            nums = [int(x.group(2)) for x in m if x]
            if nums == list(range(nums[0], nums[0] + len(nums))):
                text = f"{first}-{m[-1].group(2) if m[-1] else last}"
    if len(text) <= width:
        return text
    if len(first) <= width:
        return first
    head = (width - 1) // 2
    return first[:head] + "…" + first[len(first) - (width - 1 - head) :]


def problem_code(n: NodeSnapshot, site_alerted: bool = False) -> str | None:
    """The one-letter code of a node that needs attention (most urgent wins), None when healthy.
    ``site_alerted``: the site's Alertmanager has an active, unsilenced alert about the node."""
    if n.state == "unreachable":
        return "!"
    xid, lost = bool(n.xids), False
    for g in n.gpus:
        xid = xid or bool(g.xid)
        lost = lost or g.lost
    if xid:
        return "X"
    if lost:
        return "L"
    if n.alerts and any(a.active for a in n.alerts):
        return "S"
    if site_alerted:
        return SITE_ALERT
    if n.state == "stale":
        return "?"
    if n.state == "connecting":
        return "~"
    return None


def hostlist_prefix(name: str) -> str:
    """The name without its trailing node number: ``gpu-a017`` -> ``gpu-a`` (itself when none)."""
    m = _TRAILING_DIGITS.match(name)
    return m.group(1) if m and m.group(1) else name


def group_key(name: str, site: str | None, tags: Sequence[str] = ()) -> str:
    """The group a node is shown in: its site, else its first tag, else its hostlist prefix."""
    if site:
        return f"site:{site}"
    if tags:
        return f"tag:{tags[0]}"
    return f"prefix:{hostlist_prefix(name)}"


def natural_key(name: str) -> tuple[str, int, str]:
    """Sort ``gpu-a2`` before ``gpu-a10``."""
    m = _TRAILING_DIGITS.match(name)
    return (m.group(1), int(m.group(2)), name) if m else (name, -1, name)


def _bucket(pct: float) -> tuple[str, str]:
    for bound, glyph, kind, _legend in BUCKETS:
        if pct < bound:
            return glyph, kind
    return BUCKETS[-1][1], BUCKETS[-1][2]  # NaN


#: (glyph, suffix) by whole percent, so a tick looks each GPU up instead of comparing bounds.
_BY_PCT = tuple(_bucket(float(p)) for p in range(101))


def util_bucket(g: GpuSample) -> tuple[str, str]:
    """(glyph, component suffix) of one GPU: its utilisation bucket, lost, or an Xid."""
    if g.lost:
        return LOST, "lost"
    u = g.util_pct
    if u is None or math.isnan(u):
        return NO_DATA, "none"
    # The bounds are whole percents, so the whole part of ``u`` is in the same bucket as ``u``.
    glyph, kind = _BY_PCT[int(u)] if 0 <= u <= 100 else _bucket(u)
    return (glyph, "xid") if g.xid else (glyph, kind)


def gpu_cells(n: NodeSnapshot) -> tuple[tuple[str, str], ...]:
    """(glyph, component suffix) of each GPU of a node; a GPU with an Xid is drawn as such."""
    cells = tuple(map(util_bucket, n.gpus))
    if n.xids:
        hit = {ev.gpu for ev in n.xids}
        cells = tuple(
            (glyph, "xid") if g.index in hit and kind != "lost" else (glyph, kind)
            for g, (glyph, kind) in zip(n.gpus, cells, strict=True)
        )
    return cells


def xid_of(n: NodeSnapshot, gpu: int) -> XidEvent | int | None:
    """The newest Xid of GPU ``gpu`` (the event when the console saw it, else the GPU's last code)."""
    for ev in reversed(n.xids):
        if ev.gpu == gpu:
            return ev
    for g in n.gpus:
        if g.index == gpu and g.xid:
            return g.xid
    return None


def xid_text(x: XidEvent | int) -> str:
    """'Xid 79 GPU_FELL_OFF_BUS: the GPU has fallen off the bus (PCIe link lost) - drain ...'."""
    if isinstance(x, XidEvent):
        return f"Xid {x.code} {x.mnemonic}: {x.meaning} - {x.action}"
    info = describe(x)
    return f"Xid {info.code} {info.mnemonic}: {info.meaning} - {info.action}"


def status_text(n: NodeSnapshot, gpu: int, group: str) -> str:
    """The status line for the cell under the cursor: node, GPU, state, util, memory, Xid meaning."""
    parts = [n.name, f"GPU {gpu}", n.state + (f" ({n.error})" if n.error and n.state != "up" else "")]
    g = next((x for x in n.gpus if x.index == gpu), None)
    if g is None:
        parts.append("no GPU data yet" if not n.gpus else "no such GPU")
    elif g.lost:
        parts.append("GPU is lost (fell off the bus)")
    else:
        parts.append("util -" if g.util_pct is None else f"util {g.util_pct:.0f}%")
        if g.mem_used_mib is not None and g.mem_total_mib:
            parts.append(f"mem {g.mem_used_mib / 1024:.1f}/{g.mem_total_mib / 1024:.0f} GiB")
        else:
            parts.append("mem -")
    parts.append(group_label(group, ()))
    active = [a for a in n.alerts if a.active]
    if active:
        a = active[0]
        parts.append(f"STARVED {a.hint} (mean {a.mean_util_pct:.0f}% for {a.duration:.0f}s)")
    x = xid_of(n, gpu)
    if x is not None:
        parts.append(xid_text(x))
    elif n.xids:
        # Another GPU's (or one the log did not name): the newest, with where it was.
        ev = n.xids[-1]
        parts.append(f"GPU {ev.gpu if ev.gpu >= 0 else '?'}: {xid_text(ev)}")
    else:
        others = [g for g in n.gpus if g.xid]
        if others:
            parts.append(f"GPU {others[0].index}: {xid_text(others[0].xid or 0)}")
    return " · ".join(parts)


def group_label(group: str, names: Iterable[str]) -> str:
    """How a group is named on screen: the site, ``tag T``, ``partition P`` (Slurm's), or the
    group's hostlist (``gpu-a[001-064]``)."""
    kind, _, value = group.partition(":")
    if kind == "site":
        return value
    if kind in ("tag", "partition"):
        return f"{kind} {value}"
    names = list(names)
    if names:
        text = hostlist.collect_hostlist(names)
        return text if len(text) <= 40 else value + "*"
    return value + "*"


@dataclass(frozen=True)
class _Line:
    """One line of the grid: a group's summary line, or a row of nodes."""

    kind: Literal["group", "nodes", "empty"]
    group: str
    names: tuple[str, ...] = ()


class HeatmapGrid(ScrollView, can_focus=True):
    """The cells: arrows move a cursor over GPUs, enter opens the node under it."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "fleet-heatmap--idle",
        "fleet-heatmap--low",
        "fleet-heatmap--mid",
        "fleet-heatmap--high",
        "fleet-heatmap--none",
        "fleet-heatmap--lost",
        "fleet-heatmap--xid",
        "fleet-heatmap--stale",
        "fleet-heatmap--down",
        "fleet-heatmap--code-down",
        "fleet-heatmap--code-alert",
        "fleet-heatmap--code-stale",
        "fleet-heatmap--label",
        "fleet-heatmap--group",
        "fleet-heatmap--attention",
        "fleet-heatmap--cursor",
    }

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "Node detail"),
        Binding("left", "cursor_left", "GPU left", show=False),
        Binding("right", "cursor_right", "GPU right", show=False),
        Binding("up", "cursor_up", "Row up", show=False),
        Binding("down", "cursor_down", "Row down", show=False),
        Binding("home", "cursor_first", "First node", show=False),
        Binding("end", "cursor_last", "Last node", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | left / right | Move the cursor one GPU (across nodes and rows). |
    | up / down | Move the cursor one row of nodes. |
    | home / end | First / last node. |
    | pageup / pagedown | A screenful of rows. |
    | enter | Open the node under the cursor (clicking the cursor's cell does too). |
    """

    class NodeSelected(Message):
        """Enter (or a click on the cursor's cell): open ``node``."""

        def __init__(self, node: str) -> None:
            self.node = node
            super().__init__()

    class CursorMoved(Message):
        """The cursor is on another cell, or the node under it changed."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._snaps: dict[str, NodeSnapshot] = {}
        #: Name -> (problem code or "", GPU cells as (glyph, style suffix)).
        self._cells: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {}
        self._group_of: dict[str, str] = {}
        self._codes: dict[str, str] = {}
        self._lines: list[_Line] = []
        self._line_of: dict[str, int] = {}
        self._summaries: dict[str, str] = {}
        #: Group -> names shown in it; "everyone": its nodes including those pulled up for attention.
        self._members: dict[str, list[str]] = {}
        self._everyone: dict[str, list[str]] = {}
        self._strips: dict[int, Strip] = {}
        self._styles: dict[str, Style] = {}
        self._gpu_width = 8
        self._label_width = 0
        self._layout_width = -1
        self._empty_text = "no nodes"
        #: (node, GPU index) under the cursor.
        self.cursor: tuple[str, int] | None = None
        self._cursor_moved = False
        self._groups: Callable[[NodeSnapshot], str] = lambda n: group_key(n.name, n.site)
        #: Name -> (the site it was grouped with, its group): a node's group is worked out once.
        self._group_cache: dict[str, tuple[str | None, str]] = {}
        #: Lines refreshed by the last :meth:`show` (tests and benchmarks read it).
        self.last_refreshed = 0
        #: Node -> alertnames of its active, unsilenced site alerts (code ``A``).
        self._site_alerts: Mapping[str, Sequence[str]] = {}
        self._site_alerted: frozenset[str] = frozenset()

    def set_site_alerts(self, alerts: Mapping[str, Sequence[str]]) -> None:
        """The site's alerts by node; a change of which nodes have one re-derives every node's code
        at the next :meth:`show` (rare: an alert firing or clearing)."""
        self._site_alerts = alerts
        names = frozenset(alerts)
        if names != self._site_alerted:
            self._site_alerted = names
            self._layout_width = -1

    @property
    def groups(self) -> Callable[[NodeSnapshot], str]:
        """A node's group (site, first tag or hostlist prefix); see :func:`group_key`."""
        return self._groups

    @groups.setter
    def groups(self, groups: Callable[[NodeSnapshot], str]) -> None:
        self._groups = groups
        self._group_cache = {}
        self._layout_width = -1  # re-group on the next tick

    def _group(self, n: NodeSnapshot) -> str:
        cached = self._group_cache.get(n.name)
        if cached is not None and cached[0] == n.site:
            return cached[1]
        group = self._groups(n)
        self._group_cache[n.name] = (n.site, group)
        return group

    # -- applying ticks ------------------------------------------------------------------------

    def show(self, nodes: Sequence[NodeSnapshot], *, empty: str = "no nodes") -> int:
        """Apply one tick; returns how many lines were redrawn (all of them after a re-layout)."""
        self._empty_text = empty
        names = [n.name for n in nodes]
        relayout = names != list(self._snaps) or self._layout_width != self._width()
        dirty_lines: set[int] = set()
        dirty_groups: set[str] = set()
        for n in nodes:
            if self._snaps.get(n.name) is n and not relayout:
                continue
            old_cells = self._cells.get(n.name)
            old_code = self._codes.get(n.name, "")
            code = problem_code(n, n.name in self._site_alerted) or ""
            cells = (code, gpu_cells(n))
            self._snaps[n.name] = n
            group = self._group(n)
            if self._group_of.get(n.name) != group or code != old_code or len(n.gpus) > self._gpu_width:
                relayout = True
            self._group_of[n.name] = group
            self._codes[n.name] = code
            dirty_groups.add(group)
            if cells != old_cells:
                self._cells[n.name] = cells
                line = self._line_of.get(n.name)
                if line is not None:
                    dirty_lines.add(line)
        if relayout:
            self._snaps = {n.name: n for n in nodes}
            self._cells = {k: v for k, v in self._cells.items() if k in self._snaps}
            self._group_of = {k: v for k, v in self._group_of.items() if k in self._snaps}
            self._codes = {k: v for k, v in self._codes.items() if k in self._snaps}
            self._layout()
            self.last_refreshed = len(self._lines)
            self.refresh()
        else:
            for group in dirty_groups:
                line = self._line_of.get(f"#{group}")
                if line is None:
                    continue
                text = self._summary(group)
                if text != self._summaries.get(group):
                    self._summaries[group] = text
                    dirty_lines.add(line)
            for line in dirty_lines:
                self._strips.pop(line, None)
                self.refresh_line(line)
            self.last_refreshed = len(dirty_lines)
        if not self._cursor_moved or self.cursor is None or self.cursor[0] not in self._snaps:
            # Until the operator moves it, the cursor is on the top left cell: the most urgent node.
            first = next((ln.names[0] for ln in self._lines if ln.kind == "nodes"), None)
            cursor = None if first is None else (first, 0)
            if cursor != self.cursor:
                self._move_cursor(cursor)
        self.post_message(self.CursorMoved())
        return self.last_refreshed

    def _width(self) -> int:
        return self.scrollable_content_region.width or self.size.width

    def _layout(self) -> None:
        """Place groups and nodes for the current width (every line is redrawn)."""
        self._strips.clear()
        self._layout_width = width = self._width()
        known = [len(n.gpus) for n in self._snaps.values() if n.gpus]
        self._gpu_width = max(known) if known else 8
        attention = sorted((name for name, code in self._codes.items() if code), key=self._problem_rank)
        by_group: dict[str, list[str]] = {}
        self._everyone = {}
        for name in self._snaps:
            self._everyone.setdefault(self._group_of[name], []).append(name)
            if not self._codes.get(name):
                by_group.setdefault(self._group_of[name], []).append(name)
        node_w = self._gpu_width + 2
        # A row's label names its first and last node (gpu-001-007) where that costs no node per
        # row; else the first node's name.
        longest = max((len(n) for n in self._snaps), default=0)
        ranged = max((len(n) + len(_TRAILING_DIGITS.sub(r"\2", n)) + 1 for n in self._snaps), default=0)
        short_w, long_w = min(longest, LABEL_MAX) + 1, min(ranged, LABEL_MAX) + 1
        sizes = [len(attention), *(len(m) for m in by_group.values())]

        def rows(label_w: int) -> int:
            per = max(1, (width - label_w + 1) // node_w)
            return sum(-(-n // per) for n in sizes if n)

        self._label_width = long_w if rows(long_w) == rows(short_w) else short_w
        if width - self._label_width < 4 * node_w:
            self._label_width = 0  # too narrow for labels: every column goes to nodes
        # The last node of a row needs no space after it.
        per_row = max(1, (width - self._label_width + 1) // node_w)
        lines: list[_Line] = []
        groups: list[tuple[str, list[str]]] = []
        if attention:
            groups.append((ATTENTION, attention))
        for group in sorted(by_group, key=lambda g: group_label(g, ()).lower()):
            groups.append((group, sorted(by_group[group], key=natural_key)))
        self._members = {group: members for group, members in groups}
        for group, members in groups:
            lines.append(_Line("group", group))
            for i in range(0, len(members), per_row):
                lines.append(_Line("nodes", group, tuple(members[i : i + per_row])))
        if not lines:
            lines.append(_Line("empty", ""))
        self._lines = lines
        self._line_of = {}
        for i, ln in enumerate(lines):
            if ln.kind == "group":
                self._line_of[f"#{ln.group}"] = i
            for name in ln.names:
                self._line_of[name] = i
        self._summaries = {}
        self.virtual_size = Size(self._label_width + per_row * node_w - 1, len(lines))

    def _problem_rank(self, name: str) -> tuple[int, tuple[str, int, str]]:
        return (PROBLEM_RANK.get(self._codes.get(name, ""), len(PROBLEMS)), natural_key(name))

    def _summary(self, group: str) -> str:
        """The group line: nodes up/total, mean util, rx, problem nodes (attention: what is wrong)."""
        members = self._members.get(group, [])
        if group == ATTENTION:
            counts: dict[str, int] = {}
            for name in members:
                counts[self._codes[name]] = counts.get(self._codes[name], 0) + 1
            what = ", ".join(f"{counts[c]} {PROBLEM_LABEL[c]}" for c, _l, _k in PROBLEMS if c in counts)
            return f"needs attention · {len(members)} node{'s' * (len(members) != 1)}: {what}"
        # A group's totals count the nodes pulled up into "needs attention" too.
        everyone = [self._snaps[name] for name in self._everyone.get(group, ())]
        up = [n for n in everyone if n.state == "up"]
        vals = [g.util_pct for n in up for g in n.gpus if g.util_pct is not None]
        util = f"{sum(vals) / len(vals):.0f}%" if vals else "-"
        rx = sum(n.rx_gbps or 0.0 for n in up)
        problems = sum(1 for n in everyone if self._codes.get(n.name))
        label = group_label(group, (n.name for n in everyone))
        tail = f" · {problems} need attention" if problems else ""
        return f"{label} · nodes {len(up)}/{len(everyone)} up · util {util} · rx {gbps_text(rx)}{tail}"

    # -- drawing -------------------------------------------------------------------------------

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = {}
        self._strips = {}

    def restyle(self) -> None:
        """Draw every line again in the current theme's colours."""
        self._styles = {}
        self._strips = {}
        self.refresh()

    def _style(self, part: str) -> Style:
        style = self._styles.get(part)
        if style is None:
            style = self.rich_style + self.get_component_rich_style(f"fleet-heatmap--{part}", partial=True)
            self._styles[part] = style
        return style

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = y + scroll_y
        width = self.scrollable_content_region.width
        if index >= len(self._lines):
            return Strip.blank(width, self.rich_style)
        strip = self._strips.get(index)
        if strip is None:
            strip = self._render_index(index)
            self._strips[index] = strip
        return strip.crop_extend(scroll_x, scroll_x + width, self.rich_style)

    def _render_index(self, index: int) -> Strip:
        line = self._lines[index]
        if line.kind == "empty":
            return Strip([Segment(self._empty_text, self._style("label"))])
        if line.kind == "group":
            text = self._summaries.get(line.group)
            if text is None:
                # a group is named by a site, tag or Slurm partition (outside text): a Segment
                # reaches the terminal as it is, so it holds no escape sequence or control
                text = self._summaries[line.group] = safe_text(self._summary(line.group), None)
            part = "attention" if line.group == ATTENTION else "group"
            return Strip([Segment(text, self._style(part))])
        segments: list[Segment] = []
        if self._label_width:
            label = safe_text(row_label(line.names, self._label_width - 1), None).ljust(self._label_width)
            segments.append(Segment(label, self._style("label")))
        cursor_node, cursor_gpu = self.cursor if self.cursor is not None else ("", -1)
        base = self.rich_style
        for name in line.names:
            code, cells = self._cells.get(name, ("", ()))
            segments.append(Segment(code or " ", self._style(f"code-{PROBLEM_KIND[code]}") if code else base))
            state = self._snaps[name].state
            dim = "down" if state == "unreachable" else ("stale" if state in ("stale", "connecting") else "")
            for i in range(self._gpu_width):
                # A node not heard from yet is all "no data"; one with fewer GPUs ends early.
                glyph, part = cells[i] if i < len(cells) else (" " if cells else NO_DATA, "none")
                if dim and part != "lost":
                    part = dim
                style = self._style(part)
                if name == cursor_node and i == cursor_gpu:
                    style = style + self._style("cursor")
                segments.append(Segment(glyph, style))
            segments.append(Segment(" ", base))
        return Strip(Segment.simplify(segments))

    # -- the cursor ----------------------------------------------------------------------------

    def cursor_cell(self) -> tuple[int, int] | None:
        """(x, line) of the cursor in the grid's virtual space, None without one."""
        if self.cursor is None:
            return None
        name, gpu = self.cursor
        line = self._line_of.get(name)
        if line is None:
            return None
        i = self._lines[line].names.index(name)
        return (self._label_width + i * (self._gpu_width + 2) + 1 + gpu, line)

    def node_region(self, name: str) -> Region | None:
        """Where a node's code letter and GPU cells are, in the grid's virtual space."""
        line = self._line_of.get(name)
        if line is None:
            return None
        i = self._lines[line].names.index(name)
        return Region(self._label_width + i * (self._gpu_width + 2), line, self._gpu_width + 1, 1)

    def node_lines(self) -> list[tuple[str, tuple[str, ...]]]:
        """(group, node names) of every row of nodes, top to bottom (tests read the layout)."""
        return [(ln.group, ln.names) for ln in self._lines if ln.kind == "nodes"]

    def group_lines(self) -> list[str]:
        """The text of every group line, top to bottom."""
        return [self._summary(ln.group) for ln in self._lines if ln.kind == "group"]

    def _gpus_of(self, name: str) -> int:
        return max(1, len(self._snaps[name].gpus)) if name in self._snaps else 1

    def _set_cursor(self, name: str, gpu: int) -> None:
        """Move the cursor (the operator's doing: from now on it stays with that node)."""
        self._cursor_moved = True
        gpu = max(0, min(gpu, self._gpus_of(name) - 1))
        if self.cursor == (name, gpu):
            return
        self._move_cursor((name, gpu))
        cell = self.cursor_cell()
        if cell is not None:
            self.scroll_to_region(Region(cell[0], cell[1], 1, 1), animate=False, immediate=True)
            if cell[1] == self._first_node_line_of_group(cell[1]):
                self.scroll_to_region(Region(0, cell[1] - 1, 1, 2), animate=False, immediate=True)
        self.post_message(self.CursorMoved())

    def _move_cursor(self, cursor: tuple[str, int] | None) -> None:
        old, self.cursor = self.cursor, cursor
        for node in {old[0] if old else "", cursor[0] if cursor else ""}:
            line = self._line_of.get(node)
            if line is not None:
                self._strips.pop(line, None)
                self.refresh_line(line)

    def _first_node_line_of_group(self, line: int) -> int:
        # The row right under a group line: scrolling to it shows the group line too.
        return line if line > 0 and self._lines[line - 1].kind == "group" else -1

    def _node_rows(self) -> list[int]:
        return [i for i, ln in enumerate(self._lines) if ln.kind == "nodes"]

    def _move_row(self, delta: int) -> None:
        if self.cursor is None:
            return
        name, gpu = self.cursor
        rows = self._node_rows()
        line = self._line_of.get(name)
        if line is None or not rows:
            return
        pos = rows.index(line)
        target = rows[max(0, min(len(rows) - 1, pos + delta))]
        col = self._lines[line].names.index(name)
        names = self._lines[target].names
        self._set_cursor(names[min(col, len(names) - 1)], gpu)

    def _ordered(self) -> list[str]:
        return [name for ln in self._lines for name in ln.names]

    def action_cursor_right(self) -> None:
        """Next GPU; past a node's last one, the next node's first."""
        if self.cursor is None:
            return
        name, gpu = self.cursor
        if gpu + 1 < self._gpus_of(name):
            self._set_cursor(name, gpu + 1)
            return
        order = self._ordered()
        i = order.index(name)
        if i + 1 < len(order):
            self._set_cursor(order[i + 1], 0)

    def action_cursor_left(self) -> None:
        """Previous GPU; before a node's first one, the previous node's last."""
        if self.cursor is None:
            return
        name, gpu = self.cursor
        if gpu > 0:
            self._set_cursor(name, gpu - 1)
            return
        order = self._ordered()
        i = order.index(name)
        if i > 0:
            self._set_cursor(order[i - 1], self._gpus_of(order[i - 1]) - 1)

    def action_cursor_up(self) -> None:
        """The row of nodes above (group lines are skipped)."""
        self._move_row(-1)

    def action_cursor_down(self) -> None:
        """The row of nodes below."""
        self._move_row(1)

    def action_cursor_first(self) -> None:
        """The first node (the most urgent one when any needs attention)."""
        order = self._ordered()
        if order:
            self._set_cursor(order[0], 0)

    def action_cursor_last(self) -> None:
        """The last node."""
        order = self._ordered()
        if order:
            self._set_cursor(order[-1], 0)

    def action_page_up(self) -> None:
        """A screenful of rows up."""
        self._move_row(-max(1, self.scrollable_content_region.height - 1))

    def action_page_down(self) -> None:
        """A screenful of rows down."""
        self._move_row(max(1, self.scrollable_content_region.height - 1))

    def action_select_cursor(self) -> None:
        """Open the node under the cursor."""
        if self.cursor is not None:
            self.post_message(self.NodeSelected(self.cursor[0]))

    def cell_at(self, x: int, line: int) -> tuple[str, int] | None:
        """The (node, GPU) drawn at virtual (x, line), None off the cells."""
        if not 0 <= line < len(self._lines) or self._lines[line].kind != "nodes":
            return None
        node_w = self._gpu_width + 2
        offset = x - self._label_width
        if offset < 0:
            return None
        i, within = divmod(offset, node_w)
        names = self._lines[line].names
        if i >= len(names):
            return None
        return names[i], max(0, min(within - 1, self._gpu_width - 1))

    def on_click(self, event: events.Click) -> None:
        scroll_x, scroll_y = self.scroll_offset
        hit = self.cell_at(event.x + scroll_x, event.y + scroll_y)
        if hit is None:
            return
        if hit == self.cursor or (self.cursor is not None and hit[0] == self.cursor[0] and event.chain > 1):
            self.post_message(self.NodeSelected(hit[0]))
        else:
            self._set_cursor(*hit)

    def on_resize(self, event: events.Resize) -> None:
        if self._snaps and self._width() != self._layout_width:
            self._layout()
            self.refresh()

    # -- what the status line says -------------------------------------------------------------

    def cursor_status(self) -> str:
        """Node, GPU, state, util, memory and Xid meaning of the cell under the cursor."""
        if self.cursor is None or self.cursor[0] not in self._snaps:
            return self._empty_text
        name, gpu = self.cursor
        text = status_text(self._snaps[name], gpu, self._group_of.get(name, ""))
        site = self._site_alerts.get(name)
        return f"{text} · site alert: {', '.join(site)}" if site else text

    def legend(self) -> Text:
        """The legend line, in the cells' own colours."""
        label = self._style("label")
        text = Text("util ", style=label)
        for _bound, glyph, part, legend in BUCKETS:
            text.append(glyph, style=self._style(part))
            text.append(f"{legend} ", style=label)
        text.append(NO_DATA, style=self._style("none"))
        text.append("no data ", style=label)
        text.append(LOST, style=self._style("lost"))
        text.append("lost │ ", style=label)
        for code, legend, kind in PROBLEMS:
            if code == SITE_ALERT:
                continue
            text.append(code, style=self._style(f"code-{kind}"))
            text.append(f" {legend} ", style=label)
        text.rstrip()
        return text


class FleetHeatmap(Vertical):
    """The heatmap view of the Fleet screen: legend, the grid, and the cursor's status line."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.grid = HeatmapGrid(id="fleet-heatmap-grid")
        self._status = ""

    def compose(self) -> ComposeResult:
        yield PlainStatic("", id="fleet-heatmap-legend")
        yield self.grid
        yield PlainStatic("", id="fleet-heatmap-status")

    def on_mount(self) -> None:
        self.restyle()

    def restyle(self) -> None:
        """Rebuild the legend in the current theme's colours (the grid restyles itself)."""
        self.grid.restyle()
        self.query_one("#fleet-heatmap-legend", Static).update(self.grid.legend())

    def show(self, nodes: Sequence[NodeSnapshot], *, empty: str = "no nodes") -> int:
        """Apply one tick to the grid; returns the lines redrawn."""
        return self.grid.show(nodes, empty=empty)

    def on_heatmap_grid_cursor_moved(self, event: HeatmapGrid.CursorMoved) -> None:
        event.stop()
        status = self.grid.cursor_status()
        if status != self._status:
            self._status = status
            self.query_one("#fleet-heatmap-status", Static).update(status)
