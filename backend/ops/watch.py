"""``loadmaster watch``: the watcher loop and the metrics endpoint it may serve.

The watcher reads through the services (telemetry, jobs, the egress ledger) and notifies; it is
a long-running command, so the command line starts it from here rather than from the alerts
package. Nothing here acts on the fleet: silences and expiries are ``ops.alerts``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backend.ops.exports import lazy_exports

if TYPE_CHECKING:
    from backend.alerts.metrics import MetricsHolder, close_metrics_server, parse_listen, serve_metrics
    from backend.alerts.notify import shown_url
    from backend.alerts.watch import Watcher
    from backend.alerts.webconfig import load_web_config

__all__ = [
    "MetricsHolder",
    "Watcher",
    "close_metrics_server",
    "load_web_config",
    "parse_listen",
    "serve_metrics",
    "shown_url",
]
if not TYPE_CHECKING:  # mypy reads the imports above; at run time each name loads on first use
    __getattr__ = lazy_exports(
        __name__,
        {
            **dict.fromkeys(
                ("MetricsHolder", "close_metrics_server", "parse_listen", "serve_metrics"), "backend.alerts.metrics"
            ),
            "shown_url": "backend.alerts.notify",
            "Watcher": "backend.alerts.watch",
            "load_web_config": "backend.alerts.webconfig",
        },
    )
