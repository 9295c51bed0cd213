"""``loadmaster top``: the fleet's GPUs, NICs and disks live, like nvidia-smi for a whole fleet.

One long-lived sampling stream per node over its existing connection (see
:mod:`backend.telemetry.sampler`); ``--json`` prints one object per sample tick. When it stops
(``--once``, ``--count``), nodes it could not read (unreachable, stale, never sampled, or a
malformed sample) are named on stderr and the exit status is 4 (``PARTIAL_EXIT``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

from backend.errors import ConfigError
from backend.ops import Operations
from backend.ops.fleet import PARTIAL_EXIT, fleet_dict, fleet_table, unread_line, unread_nodes
from backend.ops.types import TelemetrySettings
from backend.services import Services
from tui.cli.argtypes import duration_arg


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``loadmaster top``."""
    p = sub.add_parser(
        "top",
        help="live GPU/NIC/disk table of the fleet (like nvidia-smi for every node)",
        description="Sample every node over one long-lived stream and print the fleet table "
        "each interval. GPU-starved nodes are flagged with an input-/request-bound hint.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per sample tick")
    p.add_argument(
        "--once", action="store_true", help="print one table (after two samples per node, so rates are known) and exit"
    )
    p.add_argument(
        "--interval",
        type=duration_arg,
        metavar="S",
        help="seconds between samples, 0.2-60 (default: [telemetry] interval, 1s)",
    )
    p.add_argument(
        "--nodes", metavar="PATTERN", help="only these nodes: hostlist (gpu-[01-04]), glob (gpu-*) or comma list"
    )
    p.add_argument("--count", type=int, metavar="N", help="stop after N ticks (default: run until interrupted)")
    p.set_defaults(func=run_top)


def _settings(services: Services, interval: float | None) -> TelemetrySettings:
    settings: TelemetrySettings = services.config.section(TelemetrySettings)
    if interval is None:
        return settings
    try:
        return dataclasses.replace(settings, interval=interval)
    except ValueError as exc:
        raise ConfigError(str(exc), key="--interval") from None


def _ready(snap: Any) -> bool:
    """Every node has two samples (rates known), or is unreachable."""
    return all(n.state == "unreachable" or n.samples >= 2 for n in snap.nodes)


async def run_top(args: argparse.Namespace, services: Services) -> int:
    """Run ``loadmaster top``."""
    if args.count is not None and args.count < 1:
        raise ConfigError(f"must be at least 1, got {args.count}", key="--count")
    nodes = services.config.select(args.nodes) if args.nodes else list(services.config.nodes)
    local = frozenset(n.name for n in nodes if n.transport == "local")
    settings = _settings(services, args.interval)
    hub = Operations(services).fleet.sampler(settings, [n.name for n in nodes])
    tty = sys.stdout.isatty() and not args.json
    ticks = 0
    last: Any = None
    await hub.start()
    try:
        updates = hub.updates()
        # --once waits for rates, but not forever for a node that neither answers nor fails.
        deadline = (
            time.monotonic() + max(15.0, 4 * settings.interval) + max((n.connect_timeout for n in nodes), default=10.0)
        )
        async for snap in updates:
            if args.once and not _ready(snap) and time.monotonic() < deadline:
                continue
            ticks += 1
            last = snap
            if args.json:
                print(json.dumps(fleet_dict(snap, wall_time=time.time())), flush=True)
            else:
                if tty and not args.once:
                    sys.stdout.write("\x1b[H\x1b[2J")  # redraw in place, like top
                print(fleet_table(snap, local=local), flush=True)
                if not args.once and not tty:
                    print(flush=True)
            if args.once or (args.count is not None and ticks >= args.count):
                break
        await updates.aclose()
    finally:
        await hub.stop()
    if args.once or args.count is not None:
        for line in await oneshot_lines(services, settings):
            print(line, file=sys.stderr if args.json else sys.stdout, flush=True)
    unread = unread_nodes(last) if last is not None else {}
    if unread:
        print(f"loadmaster: {unread_line(unread, len(last.nodes))}", file=sys.stderr)
        return PARTIAL_EXIT
    return 0


#: At most this many of Alertmanager's firing alerts are named after a one-shot table.
FIRING_SHOWN = 8


async def oneshot_lines(services: Services, settings: TelemetrySettings, *, again: str | None = None) -> list[str]:
    """What a one-shot look (``top --once``/``--count``, ``watch --once``) cannot show by itself,
    said after it.

    With ``[alerts] alertmanager_url``: the alerts firing there now, loadmaster's own (sent by a
    ``watch``) named apart from the others (the site's rules, other teams'): a page about a node is
    not "all clear" because this run was too short to see it. Without: that windowed conditions
    (starvation over ``starved_window``, transfer stalls) need more looks (``again``: how to ask
    for them, ``--count N`` by default) or a running ``watch``.
    """
    from backend.errors import LoadmasterError
    from backend.ops.types import AlertSettings
    from backend.textfmt import safe_text

    ticks = int(settings.starved_window / settings.interval) + 2
    if not services.config.section(AlertSettings).alertmanager_url:
        return [
            f"note: one look cannot see windowed conditions (GPU starvation over {settings.starved_window:g}s, "
            f"transfer stalls): run with {again or f'--count {ticks}'} or keep 'loadmaster watch' running, "
            "or set [alerts] alertmanager_url to see what is paging"
        ]
    try:
        alerts = await Operations(services).alerts.site()
    except LoadmasterError as exc:
        return [safe_text(f"Alertmanager: cannot read the alerts firing there: {exc}")]
    firing = [a for a in alerts if a.alert.state == "active" and not a.silenced and not a.alert.inhibited_by]
    # loadmaster's own first (what its conditions saw), then the others as Alertmanager sorts them.
    firing.sort(key=lambda a: a.ref is None)
    own = sum(1 for a in firing if a.ref is not None)
    quiet = sum(1 for a in alerts if a.silenced)
    head = (
        f"Alertmanager: {len(firing)} firing"
        + (f" ({own} loadmaster's, {len(firing) - own} other)" if firing else "")
        + (f", {quiet} silenced" if quiet else "")
    )
    named = [
        safe_text(
            f"  {'loadmaster' if a.ref is not None else 'other':<10} {a.name} "
            f"{a.node or a.alert.labels.get('instance', '')}".rstrip()
        )
        for a in firing[:FIRING_SHOWN]
    ]
    if len(firing) > FIRING_SHOWN:
        named.append(f"  +{len(firing) - FIRING_SHOWN} more ('loadmaster alerts' lists them)")
    return [head, *named]
