"""Fleet-screen render cost: the real console, headless, fed a synthetic fleet at 1 Hz.

Samples enter where real ones do (``TelemetryHub.ingest`` right after the transport), so parsing,
rates, history, starvation detection, the FleetSampled message and the table update are all the
real path. Node-side text is generated before the clock starts (it is the nodes' work, not the
console's).

Wall-clock percentiles include time the process waited for a CPU (on a shared machine that
dominates), so each is followed by the same percentile of CPU time (thread_time) in brackets.

Reports, per fleet size, the console process's CPU use (% of one core: process_time / wall time)
and the 99th-percentile time to apply one tick (the screen's FleetSampled handler: summary,
changed cells, alerts) and to take one tick end to end (parse + rates + history + alerts for every
node, then the screen update), for loadmaster and for the named peer
"rebuild-all" (the same screen redrawing every row each tick, no cell diffing), side by side; and the
heatmap view (one cell per GPU, the view above 16 nodes) on the same fleet.

    .venv/bin/python bench/telemetry_render.py            # 256 and 64 nodes x 8 GPUs, 60 s, table and heatmap
    .venv/bin/python bench/telemetry_render.py --seconds 10 --nodes 256
    .venv/bin/python bench/telemetry_render.py --nodes 256 --views table --no-peer --profile /tmp/render
    .venv/bin/python -c "import pstats; pstats.Stats('/tmp/render-256-table.prof').sort_stats('tottime').print_stats(25)"
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.config import Config  # noqa: E402
from backend.services import Services  # noqa: E402
from backend.telemetry.hub import TelemetryHub  # noqa: E402
from backend.telemetry.settings import TelemetrySettings  # noqa: E402
from backend.telemetry.synthetic import SyntheticPool, synthetic_fleet  # noqa: E402
from tui.widgets.fleet_table import FleetTable  # noqa: E402


def p99(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def rebuild_all(self: FleetTable, nodes: Any, trend: Any) -> int:
    """The peer: clear the table and add every row again on every tick, each with the same
    cells (the columns laid out for the width) and styles as loadmaster's."""
    self._trend = trend
    self.clear()
    for n in nodes:
        self.add_row(*self._style_row(n, self._cells(n)), key=n.name)
    return len(nodes) * len(self.shown_columns)


async def run(
    count: int, seconds: int, *, peer: bool, view: str = "table", profile: str | None = None
) -> dict[str, float]:
    """One measured run; ``profile``: write cProfile's stats of the measured seconds alone there."""
    from tui.app import LoadmasterApp
    from tui.screens.fleet import FleetScreen

    nodes, gens = synthetic_fleet(count, gpus=8, starved=tuple(range(3, count + 1, 17)))
    # Node-side work happens before the clock starts: every block for every second.
    blocks = [[(g.name, g.block(float(s))) for g in gens] for s in range(seconds + 1)]
    # The pre-generated node output is not the console's: keep it out of the garbage
    # collector's full passes, which would otherwise bill the console for scanning it.
    gc.collect()
    gc.freeze()
    hub = TelemetryHub(SyntheticPool(nodes), TelemetrySettings(), feed_only=True)
    services = Services(Config(nodes=tuple(nodes), stores={}))
    services.__dict__["telemetry"] = hub
    original = FleetTable.show
    if peer:
        FleetTable.show = rebuild_all  # type: ignore[method-assign]
    try:
        app = LoadmasterApp(services)
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, FleetScreen)
            # The row table (the peer patches its update) or the heatmap (one cell per GPU, the
            # view above 16 nodes), as asked.
            screen.show_view("heatmap" if view == "heatmap" else "table")
            # Warm-up tick (first rows, column layout), not measured.
            for name, text in blocks[0]:
                hub.ingest(name, text, 0.0)
            hub.tick(0.0)
            await pilot.pause()
            screen.apply_times.clear()
            screen.apply_cpu_times.clear()
            backend: list[float] = []
            backend_cpu: list[float] = []
            profiler = cProfile.Profile() if profile else None
            if profiler is not None:
                profiler.enable()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for s in range(1, seconds + 1):
                t_start, c_start = time.perf_counter(), time.thread_time()
                for name, text in blocks[s]:
                    hub.ingest(name, text, float(s))
                hub.tick(float(s))
                backend.append(time.perf_counter() - t_start)
                backend_cpu.append(time.thread_time() - c_start)
                await pilot.pause()  # the FleetSampled message is handled, the screen refreshed
                next_at = wall0 + s
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            cpu = time.process_time() - cpu0
            wall = time.perf_counter() - wall0
            if profiler is not None and profile:
                profiler.disable()
                profiler.dump_stats(profile)
            assert screen.last_snapshot is not None and len(screen.last_snapshot.nodes) == count
            apply = list(screen.apply_times)
            apply_cpu = list(screen.apply_cpu_times)
            # Every tick was applied (none coalesced away at 1 Hz), so they pair up.
            whole = [b + a for b, a in zip(backend, apply, strict=False)]
            whole_cpu = [b + a for b, a in zip(backend_cpu, apply_cpu, strict=False)]
    finally:
        FleetTable.show = original  # type: ignore[method-assign]
        gc.unfreeze()
    return {
        "cpu_pct": 100.0 * cpu / wall,
        "apply_p99_ms": 1000.0 * p99(apply),
        "backend_p99_ms": 1000.0 * p99(backend),
        "tick_p99_ms": 1000.0 * p99(whole),
        "apply_cpu_p99_ms": 1000.0 * p99(apply_cpu),
        "tick_cpu_p99_ms": 1000.0 * p99(whole_cpu),
        "ticks": float(len(apply)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60, help="measured seconds at 1 Hz (60)")
    parser.add_argument(
        "--nodes", type=int, nargs="+", default=[256, 64], help="fleet sizes (8 GPUs each); default 256 64"
    )
    parser.add_argument("--no-peer", action="store_true", help="skip the rebuild-all peer")
    parser.add_argument(
        "--views",
        nargs="+",
        choices=("table", "heatmap"),
        default=["table", "heatmap"],
        help="Fleet views to measure (default both; the peer is the table's rebuild-all)",
    )
    parser.add_argument(
        "--profile",
        metavar="PREFIX",
        help="write cProfile stats of each measured run (not the peer's) to PREFIX-NODES-VIEW.prof "
        "(the CPU figures then include the profiler's own cost)",
    )
    args = parser.parse_args()
    if args.seconds < 1:
        parser.error("--seconds must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        # Never read or write the operator's real config, prefs or state.
        os.environ["LOADMASTER_CONFIG_DIR"] = str(Path(tmp) / "cfg")
        os.environ["LOADMASTER_DATA_DIR"] = str(Path(tmp) / "data")
        os.environ.pop("LOADMASTER_CONFIG", None)
        print(
            "| fleet | view | ticks | loadmaster CPU (% of 1 core) | apply p99 ms wall (CPU) | "
            "whole tick p99 ms wall (CPU) | peer rebuild-all CPU % | peer apply p99 ms wall (CPU) | "
            "CPU ratio peer/loadmaster | goal (<20% CPU, apply p99 <50 ms) |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for count, view in ((c, v) for c in args.nodes for v in args.views):
            prof = f"{args.profile}-{count}-{view}.prof" if args.profile else None
            ours = asyncio.run(run(count, args.seconds, peer=False, view=view, profile=prof))
            theirs = None if args.no_peer or view != "table" else asyncio.run(run(count, args.seconds, peer=True))
            ok = ours["cpu_pct"] < 20 and ours["apply_p99_ms"] < 50
            ok_cpu = ours["cpu_pct"] < 20 and ours["apply_cpu_p99_ms"] < 50
            peer_cpu = f"{theirs['cpu_pct']:.1f}" if theirs else "-"
            peer_p99 = f"{theirs['apply_p99_ms']:.1f} ({theirs['apply_cpu_p99_ms']:.1f})" if theirs else "-"
            ratio = f"{theirs['cpu_pct'] / ours['cpu_pct']:.2f}x" if theirs else "-"
            print(
                f"| {count} nodes x 8 GPUs | {view} | {ours['ticks']:.0f} | {ours['cpu_pct']:.1f} | "
                f"{ours['apply_p99_ms']:.1f} ({ours['apply_cpu_p99_ms']:.1f}) | "
                f"{ours['tick_p99_ms']:.1f} ({ours['tick_cpu_p99_ms']:.1f}) | {peer_cpu} | "
                f"{peer_p99} | {ratio} | "
                f"{'met' if ok else ('met on CPU time' if ok_cpu else 'NOT met')} |",
                flush=True,
            )
        load = os.getloadavg()
        print(
            f"\nload average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on "
            f"{os.cpu_count()} CPUs (wall-clock percentiles include waiting for a CPU)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
