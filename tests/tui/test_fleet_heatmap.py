"""The Fleet screen's heatmap view (one cell per GPU) in the real console, on synthetic fleets.

Samples enter the hub where real ones do (``hub.ingest`` right after the transport) at explicit
hub times, and reach the screen as the hub's FleetSampled messages. A lost GPU is nvidia-smi's
"GPU is lost" line in place of its CSV row, an Xid the driver's kernel-log line in the block's
``@@xid`` section (with the GPUs' PCI bus ids in ``@@xidbus``), as the sampler prints them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.color import Color
from rich.style import Style
from rich.text import Text
from textual.widgets import Static

from backend.config import Config, Node
from backend.services import Services
from backend.telemetry.hub import TelemetryHub
from backend.telemetry.model import FleetSnapshot
from backend.telemetry.settings import TelemetrySettings
from backend.telemetry.synthetic import SyntheticNode, SyntheticPool, synthetic_fleet
from tests.tui.test_terminal_sizes import screen_text
from themes.palette import THEMES
from tui.app import LoadmasterApp
from tui.screens.fleet import FleetScreen
from tui.screens.node_detail import NodeDetailScreen
from tui.widgets.fleet_heatmap import ATTENTION, BUCKETS, LOST, NO_DATA, FleetHeatmap, HeatmapGrid, group_key
from tui.widgets.fleet_table import FleetTable

GLYPHS = {glyph for _bound, glyph, _part, _legend in BUCKETS} | {NO_DATA, LOST}
#: What nvidia-smi prints in place of a GPU's CSV row once it fell off the bus.
LOST_LINE = (
    "Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost.  Reboot the system to recover this GPU"
)


class Fleet:
    """A feed-only hub over synthetic nodes (explicit clock), and the services that carry it."""

    def __init__(self, nodes: list[Node], gens: list[SyntheticNode], window: float = 5) -> None:
        self.nodes, self.gens = nodes, gens
        self.t = 0.0
        self.hub = TelemetryHub(
            SyntheticPool(nodes),
            TelemetrySettings(starved_window=window),
            feed_only=True,
            clock=lambda: self.t,
            wall_clock=lambda: 1_700_000_000.0 + self.t,
        )
        self.services = Services(Config(nodes=tuple(nodes), stores={}))
        self.services.__dict__["telemetry"] = self.hub  # the composition root's cached service
        #: Nodes whose first GPU is reported lost from now on.
        self.lost: set[str] = set()
        #: Node -> (GPU index, Xid code) its kernel log shows from now on.
        self.xid: dict[str, tuple[int, int]] = {}

    @classmethod
    def synthetic(cls, count: int, *, starved: tuple[int, ...] = (), sites: int = 1) -> Fleet:
        nodes, gens = synthetic_fleet(count, starved=starved)
        if sites > 1:
            nodes = [replace(n, site=f"site-{i % sites}") for i, n in enumerate(nodes)]
        return cls(nodes, gens)

    def feed(self, ticks: int, *, skip: tuple[str, ...] = ()) -> FleetSnapshot:
        snap = self.hub.snapshot()
        for _ in range(ticks):
            for g in self.gens:
                if g.name in skip:
                    continue
                block = g.block(self.t)
                if g.name in self.lost:
                    block = block.replace(g.gpu_csv(self.t).splitlines()[0], LOST_LINE)
                if g.name in self.xid:
                    block += "\n" + xid_sections(g.gpus, *self.xid[g.name])
                self.hub.ingest(g.name, block, self.t)
            snap = self.hub.tick(self.t)
            self.t += 1.0
        return snap


def xid_sections(gpus: int, gpu: int, code: int) -> str:
    """The sampler's ``@@xidbus`` (index, PCI bus id) and ``@@xid`` (the driver's log line) sections."""
    bus = "\n".join(f"{i}, 00000000:{0x18 + 0x10 * i:02X}:00.0" for i in range(gpus))
    line = f"[ 4242.123456] NVRM: Xid (PCI:0000:{0x18 + 0x10 * gpu:02x}:00): {code}, pid=1234, name=python3"
    return f"@@xidbus\n{bus}\n@@xid\n{line}\n@@xid-rc 0"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Clock times in UTC; never the operator's prefs."""
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "cfg"))
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def grid_of(app: Any) -> HeatmapGrid:
    return app.screen.query_one(FleetHeatmap).grid


def viewport_text(grid: HeatmapGrid) -> list[str]:
    """What the grid draws on screen right now, line by line (its render_line output)."""
    return ["".join(seg.text for seg in grid.render_line(y)) for y in range(grid.scrollable_content_region.height)]


def status(app: Any) -> str:
    return str(app.screen.query_one("#fleet-heatmap-status").render())


@pytest.mark.parametrize("sites", [1, 4], ids=["one-site", "four-sites"])
async def test_256_nodes_fit_120x40(sites: int) -> None:
    fleet = Fleet.synthetic(256, starved=(3, 130), sites=sites)
    app = LoadmasterApp(fleet.services)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, FleetScreen) and screen.view == "heatmap"
        fleet.feed(8)  # the starvation window is 5 s
        await pilot.pause()
        fleet.feed(2, skip=("gpu-200",))
        fleet.hub.mark_unreachable("gpu-017", "connection refused")
        fleet.feed(3, skip=("gpu-017", "gpu-200"))
        await pilot.pause()
        grid = grid_of(app)
        view = grid.scrollable_content_region
        # Nothing to scroll: every line of the layout is inside the viewport.
        assert grid.virtual_size.height <= view.height and grid.virtual_size.width <= view.width
        assert grid.scroll_offset == (0, 0)
        for n in fleet.nodes:
            region = grid.node_region(n.name)
            assert region is not None and region.bottom <= view.height and region.right <= view.width, n.name
        lines = viewport_text(grid)
        groups = grid.group_lines()
        cells = [line for line in lines if line.rstrip() not in groups]  # group lines use "·" too
        assert sum(ch in GLYPHS for line in cells for ch in line) == 256 * 8
        assert len(groups) == sites + 1  # and "needs attention" on top
        assert groups[0].startswith("needs attention · 4 nodes: 1 unreachable, 2 starved, 1 stale")
        text = screen_text(app.export_screenshot())
        for line in groups:
            assert line in text
        assert "nodes 254/256 up" in text
        # Cost of a tick at 256 nodes x 8 GPUs: the screen's whole apply, and the heatmap's part.
        applies, applies_cpu = screen.apply_times[-10:], screen.apply_cpu_times[-10:]
        heatmap = screen.query_one(FleetHeatmap)
        timings, cpu, redrawn = [], [], []
        for _ in range(5):
            snap = fleet.feed(1)
            start, start_cpu = time.perf_counter(), time.thread_time()
            redrawn.append(heatmap.show(snap.nodes))
            timings.append(time.perf_counter() - start)
            cpu.append(time.thread_time() - start_cpu)
        await pilot.pause()
        print(
            f"\n256 nodes x 8 GPUs, {sites} site(s), 120x40: screen apply per tick median "
            f"{1000 * statistics.median(applies):.1f} ms wall, {1000 * statistics.median(applies_cpu):.1f} ms CPU "
            f"(max {1000 * max(applies):.1f} wall); heatmap show "
            f"median {1000 * statistics.median(timings):.2f} ms wall, {1000 * statistics.median(cpu):.2f} ms CPU "
            f"(max {1000 * max(timings):.2f} wall); lines redrawn per tick {redrawn} of "
            f"{len(grid.group_lines()) + len(grid.node_lines())}"
        )


async def test_problem_nodes_are_on_top_with_their_codes() -> None:
    fleet = Fleet.synthetic(32, starved=(5,))
    app = LoadmasterApp(fleet.services)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        fleet.feed(3)
        fleet.lost.add("gpu-030")
        fleet.feed(5, skip=("gpu-020",))  # gpu-020 misses 5 samples: stale
        fleet.hub.mark_unreachable("gpu-011", "connection refused")
        fleet.xid["gpu-027"] = (5, 79)
        fleet.feed(1, skip=("gpu-011", "gpu-020"))
        await pilot.pause()
        grid = grid_of(app)
        rows = grid.node_lines()
        # Most urgent first: unreachable, Xid, lost GPU, starved, stale.
        assert rows[0] == (ATTENTION, ("gpu-011", "gpu-027", "gpu-030", "gpu-005", "gpu-020"))
        assert all(ATTENTION not in group for group, _names in rows[1:])
        assert [name for _g, names in rows[1:] for name in names] == [
            n.name for n in fleet.nodes if n.name not in rows[0][1]
        ]
        lines = viewport_text(grid)
        assert lines[0].startswith("needs attention · 5 nodes: 1 unreachable, 1 Xid, 1 lost GPU, 1 starved, 1 stale")
        codes = [lines[1][r.x] for r in (grid.node_region(n) for n in rows[0][1]) if r is not None]
        assert codes == ["!", "X", "L", "S", "?"]
        row = lines[1]
        lost = grid.node_region("gpu-030")
        assert lost is not None and row[lost.x + 1] == LOST
        assert lines[2].startswith("coreweave:us-east-04 · nodes 30/32 up") and "5 need attention" in lines[2]
        legend = str(app.screen.query_one("#fleet-heatmap-legend").render())
        for code, label in (("!", "unreachable"), ("X", "Xid"), ("S", "starved"), ("?", "stale")):
            assert f"{code} {label}" in legend
        # The cursor starts on the most urgent node; the status line explains the cell under it.
        assert grid.cursor == ("gpu-011", 0)
        assert status(app).startswith("gpu-011 · GPU 0 · unreachable (connection refused)")
        await pilot.press(*["right"] * 13)  # past gpu-011's eight GPUs to gpu-027's GPU 5
        await pilot.pause()
        assert grid.cursor == ("gpu-027", 5)
        line = status(app)
        assert line.startswith("gpu-027 · GPU 5 · up · util ") and " · mem " in line
        assert "Xid 79 GPU_FELL_OFF_BUS: the GPU has fallen off the bus" in line
        await pilot.press(*["right"] * 11)  # the rest of gpu-027, all of gpu-030
        await pilot.pause()
        assert grid.cursor == ("gpu-005", 0) and "STARVED" in status(app)


async def test_a_node_going_unreachable_moves_to_the_top_on_the_next_tick() -> None:
    fleet = Fleet.synthetic(64)
    app = LoadmasterApp(fleet.services)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        fleet.feed(3)
        await pilot.pause()
        grid = grid_of(app)
        assert grid.node_lines()[0][0] != ATTENTION
        before = grid.node_region("gpu-050")
        assert before is not None and before.y > 1
        fleet.hub.mark_unreachable("gpu-050", "stream ended")
        fleet.feed(1, skip=("gpu-050",))
        await pilot.pause()
        assert grid.node_lines()[0] == (ATTENTION, ("gpu-050",))
        after = grid.node_region("gpu-050")
        assert after is not None and after.y == 1
        assert viewport_text(grid)[1][after.x] == "!"
        # Back on the next sample: it returns to its group.
        fleet.feed(1)
        await pilot.pause()
        assert grid.node_lines()[0][0] != ATTENTION
        assert "gpu-050" in grid.node_lines()[4][1]


async def test_enter_on_a_cell_opens_that_node() -> None:
    fleet = Fleet.synthetic(48)
    app = LoadmasterApp(fleet.services)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        fleet.feed(3)
        await pilot.pause()
        grid = grid_of(app)
        assert app.focused is grid
        await pilot.press("down", "down", "right", "right", "right", "right", "right", "right", "right", "right")
        await pilot.pause()
        rows = grid.node_lines()
        expected = rows[2][1][1]  # third row, second node (eight GPUs right of the first node's GPU 0)
        assert grid.cursor == (expected, 0)
        assert status(app).startswith(f"{expected} · GPU 0 · up · util ")
        await pilot.press("enter")
        await pilot.pause()
        detail = app.screen
        assert isinstance(detail, NodeDetailScreen) and detail.node_name == expected
        assert detail.query_one("#node-gpus").row_count == 8
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen) and app.screen.view == "heatmap"
        # A click on the cursor's cell opens it too; a click elsewhere moves the cursor there.
        region = grid.node_region(rows[0][1][3])
        assert region is not None
        await pilot.click(HeatmapGrid, offset=(region.x + 3, region.y))
        await pilot.pause()
        assert grid.cursor == (rows[0][1][3], 2)
        await pilot.click(HeatmapGrid, offset=(region.x + 3, region.y))
        await pilot.pause()
        assert isinstance(app.screen, NodeDetailScreen) and app.screen.node_name == rows[0][1][3]


async def test_v_switches_between_the_heatmap_and_the_table() -> None:
    fleet = Fleet.synthetic(40, starved=(2,))
    app = LoadmasterApp(fleet.services)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        fleet.feed(3)
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        heatmap, table = screen.query_one(FleetHeatmap), screen.query_one(FleetTable)
        assert screen.view == "heatmap" and heatmap.display and not table.display
        await pilot.press("v")
        await pilot.pause()
        assert screen.view == "table" and table.display and not heatmap.display
        assert app.focused is table and table.row_count == 40
        text = screen_text(app.export_screenshot())
        assert "Util avg/min" in text and "v View" in text
        # Ticks while the table is on screen reach the heatmap when it is shown again.
        fleet.hub.mark_unreachable("gpu-033", "connection refused")
        fleet.feed(1, skip=("gpu-033",))
        await pilot.pause()
        assert str(table.get_cell("gpu-033", "state")) == "unreachable"
        await pilot.press("v")
        await pilot.pause()
        assert screen.view == "heatmap" and heatmap.display and not table.display
        assert app.focused is heatmap.grid
        assert heatmap.grid.node_lines()[0] == (ATTENTION, ("gpu-033",))
        # The filter narrows the heatmap too; escape clears it from the heatmap.
        await pilot.press("slash", "g", "p", "u", "-", "0", "0", "enter")
        await pilot.pause()
        assert app.focused is heatmap.grid
        assert [n for _g, names in heatmap.grid.node_lines() for n in names] == [f"gpu-00{i}" for i in range(1, 10)]
        await pilot.press("escape")
        await pilot.pause()
        assert sum(len(names) for _g, names in heatmap.grid.node_lines()) == 40


async def test_small_fleets_open_on_the_table() -> None:
    fleet = Fleet.synthetic(16)
    app = LoadmasterApp(fleet.services)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        fleet.feed(2)
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, FleetScreen) and screen.view == "table"
        assert app.focused is screen.query_one(FleetTable)
        await pilot.press("v")
        await pilot.pause()
        assert screen.view == "heatmap"
        assert sum(len(names) for _g, names in grid_of(app).node_lines()) == 16


def test_group_key_site_then_tag_then_hostlist_prefix() -> None:
    assert group_key("gpu-a017", "coreweave:us-east-04", ("h100",)) == "site:coreweave:us-east-04"
    assert group_key("gpu-a017", None, ("h100", "ib")) == "tag:h100"
    assert group_key("gpu-a017", None) == "prefix:gpu-a"
    assert group_key("login", None) == "prefix:login"


async def test_nodes_are_grouped_by_site_tag_or_prefix() -> None:
    nodes = (
        [Node(name=f"gpu-{i:03d}", host="127.0.0.1", site="aws:us-east-1") for i in range(1, 7)]
        + [Node(name=f"h100-{i:02d}", host="127.0.0.1", tags=("h100", "ib")) for i in range(1, 7)]
        + [Node(name=f"dgx-a{i:02d}", host="127.0.0.1") for i in range(1, 5)]
        + [Node(name=f"dgx-b{i}", host="127.0.0.1") for i in (1, 2, 10)]
    )
    gens = [SyntheticNode(n.name, seed=i) for i, n in enumerate(nodes)]
    fleet = Fleet(nodes, gens)
    app = LoadmasterApp(fleet.services)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        fleet.feed(3)
        await pilot.pause()
        grid = grid_of(app)
        labels = [line.split(" · ")[0] for line in grid.group_lines()]
        assert labels == ["aws:us-east-1", "dgx-a[01-04]", "dgx-b[1-2,10]", "tag h100"]
        members = {}
        for group, names in grid.node_lines():
            members.setdefault(group, []).extend(names)
        assert members == {
            "site:aws:us-east-1": [f"gpu-{i:03d}" for i in range(1, 7)],
            "prefix:dgx-a": [f"dgx-a{i:02d}" for i in range(1, 5)],
            "prefix:dgx-b": ["dgx-b1", "dgx-b2", "dgx-b10"],  # in node-number order
            "tag:h100": [f"h100-{i:02d}" for i in range(1, 7)],
        }
        assert grid.group_lines()[3].startswith("tag h100 · nodes 6/6 up · util ")
        assert " · rx 120.0 Gbps" in grid.group_lines()[3]


@pytest.mark.parametrize(
    ("count", "size"),
    [(64, (80, 24)), (64, (120, 40)), (256, (80, 24)), (256, (120, 40))],
    ids=["64-nodes-80x24", "64-nodes-120x40", "256-nodes-80x24", "256-nodes-120x40"],
)
def test_heatmap_snapshot(snap_compare: Any, count: int, size: tuple[int, int]) -> None:
    """The heatmap, dark theme: a starved, an Xid and a stale node on top; at 256 x 8 on 120x40
    every node is on screen, at 80x24 the problem nodes are in the first rows."""
    fleet = Fleet.synthetic(count, starved=(9,), sites=4 if count > 64 else 1)

    async def feed(pilot: Any) -> None:
        await pilot.pause()
        fleet.feed(3)
        fleet.xid["gpu-022"] = (3, 48)
        fleet.feed(6, skip=("gpu-041",))
        await pilot.pause()

    app = LoadmasterApp(fleet.services, theme="loadmaster-dark")
    assert snap_compare(app, terminal_size=size, run_before=feed)


async def test_cells_take_their_colours_from_the_theme() -> None:
    fleet = Fleet.synthetic(24, starved=(4,))
    app = LoadmasterApp(fleet.services, theme="loadmaster-dark")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        fleet.feed(3)
        await pilot.pause()
        grid = grid_of(app)

        def colours(glyph: str) -> set[tuple[int, int, int]]:
            region = grid.node_region("gpu-020")  # not the cursor's row
            assert region is not None and grid.cursor is not None and grid.cursor[0] != "gpu-020"
            segs = [s for s in grid.render_line(region.y) if glyph in s.text and s.style is not None]
            return {tuple(s.style.color.get_truecolor()) for s in segs if s.style.color is not None}

        for theme in ("loadmaster-dark", "loadmaster-light"):
            if app.theme != theme:
                await pilot.press("ctrl+t")
                fleet.feed(1)
                await pilot.pause()
            up = Color.parse(THEMES[theme].variables["node-up"]).get_truecolor()
            assert colours("▇") == {tuple(up)}, theme
            legend = app.screen.query_one("#fleet-heatmap-legend", Static).content
            assert isinstance(legend, Text)
            high = next(span for span in legend.spans if legend.plain[span.start : span.end] == "▇")
            assert isinstance(high.style, Style) and high.style.color is not None
            assert high.style.color.get_truecolor() == up, theme
