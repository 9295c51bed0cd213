"""``loadmaster watch``: page through Alertmanager with no console open (run it under systemd).

Each ``[alerts] interval`` it evaluates loadmaster's own conditions (GPU starved, a new Xid,
upload backlog, a stalled transfer, a lost job, a failed verification, the egress budget, an
interrupted retention apply, an unreachable node), records them in the state database and sends
them to ``[alerts] alertmanager_url`` (API v2) and ``webhook_url``. It prints one line per change
("firing ..." / "resolved ..."), and "alerting degraded: ..." while a sink is down (the alerts stay
queued and are sent when it is back). ``--metrics HOST:PORT`` also serves ``/metrics`` for the
site's Prometheus. SIGTERM (systemd stop) ends it after the round in progress.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from typing import Any

from backend.services import Services


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``loadmaster watch``."""
    p = sub.add_parser(
        "watch",
        help="headless watcher: raise loadmaster's alerts to Alertmanager / a webhook, serve /metrics",
        description="Evaluate loadmaster's alert conditions every [alerts] interval and send them to "
        "Alertmanager (API v2) and/or a webhook; one line per change. Run it under systemd (see README).",
    )
    p.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="also serve Prometheus metrics on http://HOST:PORT/metrics (:PORT: loopback only; "
        "0.0.0.0:PORT: every interface)",
    )
    p.add_argument(
        "--metrics-web-config",
        metavar="FILE",
        help="TLS and basic auth for /metrics: a Prometheus exporter web config file "
        "(tls_server_config, basic_auth_users with bcrypt hashes)",
    )
    p.add_argument("--once", action="store_true", help="one round (evaluate, record, send), print it, exit")
    p.add_argument("--rounds", type=int, metavar="N", help="stop after N rounds (default: until stopped)")
    # A long-lived process holds its own connections (the keeper is for short commands).
    p.set_defaults(func=run_watch, direct_ssh=True)


def _line(prefix: str, labels: dict[str, str], summary: str) -> str:
    from backend.textfmt import safe_text

    # Labels and summaries carry what nodes and stores said (job ids, errors): the one sanitiser.
    keys = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("alertname", "severity"))
    return safe_text(f"{prefix} {labels.get('alertname', '?')} [{labels.get('severity', '')}] {keys}: {summary}")


def _printer(out: Any) -> Any:
    from backend.textfmt import safe_text

    last_degraded: list[str | None] = [None]

    def on_round(r: Any) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(r.at))
        if r.changes is not None:
            for a in r.changes.fired:
                print(f"{stamp} {_line('firing', a.labels, a.annotations.get('summary', ''))}", file=out)
            for a in r.changes.resolved:
                print(f"{stamp} {_line('resolved', a.labels, a.annotations.get('summary', ''))}", file=out)
        degraded = r.degraded
        if degraded != last_degraded[0]:
            print(f"{stamp} {safe_text(degraded or 'alerting ok')}", file=out)
            last_degraded[0] = degraded
        out.flush()

    return on_round


async def run_watch(args: argparse.Namespace, services: Services) -> int:
    from backend.errors import ConfigError
    from backend.ops.types import AlertSettings
    from backend.ops.watch import Watcher, shown_url

    if args.rounds is not None and args.rounds < 1:
        raise ConfigError(f"must be at least 1, got {args.rounds}", key="--rounds")
    if args.metrics_web_config and not args.metrics:
        raise ConfigError("needs --metrics HOST:PORT (the server it secures)", key="--metrics-web-config")
    settings = services.config.section(AlertSettings)
    holder = server = None
    if args.metrics:
        from backend.ops.watch import MetricsHolder, load_web_config, parse_listen, serve_metrics

        holder = MetricsHolder()
        host, port = parse_listen(args.metrics)
        web = load_web_config(args.metrics_web_config) if args.metrics_web_config else None
        server = serve_metrics(host, port, holder, web)
        shown = f"[{host}]" if ":" in host else host
        scheme = "https" if web is not None and web.tls else "http"
        auth = f" (basic auth: {len(web.users)} user(s))" if web is not None and web.users else ""
        print(f"serving metrics on {scheme}://{shown}:{server[0].server_port}/metrics{auth}", flush=True)
    if not settings.alertmanager_url and not settings.webhook_url:
        print(
            "loadmaster: [alerts] alertmanager_url and webhook_url are unset: alerts are only printed here",
            file=sys.stderr,
        )
    sinks = [f"Alertmanager {settings.alertmanager_url}"] if settings.alertmanager_url else []
    sinks += [f"webhook {shown_url(settings.webhook_url)}"] if settings.webhook_url else []
    print(
        f"watching {len(services.config.nodes)} node(s), {len(settings.conditions)} condition(s) every "
        f"{settings.interval:g}s; alerts to {' and '.join(sinks) or 'this output only'}",
        flush=True,
    )
    watcher = Watcher(services, on_round=_printer(sys.stdout), on_metrics=holder.set if holder else None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        rounds = 1 if args.once else args.rounds
        last = await watcher.run(rounds=rounds, stop=stop)
    finally:
        if server is not None:
            from backend.ops.watch import close_metrics_server

            close_metrics_server(*server)
    if args.once and last is not None:
        for c in last.conditions:
            print(_line("holds", c.all_labels, c.summary))
        print(f"{len(last.conditions)} condition(s) hold in this round")
        # One round is not all clear: what is paging in Alertmanager, or what one round cannot see.
        from backend.ops.types import TelemetrySettings
        from tui.cli.top import oneshot_lines

        tele = services.config.section(TelemetrySettings)
        rounds = int(tele.starved_window / settings.interval) + 2
        for line in await oneshot_lines(services, tele, again=f"--rounds {rounds}"):
            print(line, flush=True)
    return 0
