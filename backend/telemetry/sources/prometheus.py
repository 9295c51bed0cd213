"""The Prometheus telemetry source: the site's Prometheus read every ``prometheus_interval``
(:class:`backend.telemetry.prometheus.PrometheusSource`, a few queries for the whole fleet), with
SSH for what it lacks (``auto``) or for everything while it does not answer
(``prometheus_fallback_ssh``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from backend.telemetry.prometheus import PrometheusSource, PrometheusUnavailable, Reading
from backend.telemetry.settings import TelemetrySettings
from backend.textfmt import safe_text

if TYPE_CHECKING:
    from backend.telemetry.sources.base import TelemetryFeed
    from backend.telemetry.sources.ssh import SshSource

log = logging.getLogger(__name__)


def apply_reading(
    hub: TelemetryFeed,
    names: Sequence[str],
    reading: Reading,
    t: float | None = None,
    *,
    covered: Callable[[str], None] = lambda _name: None,
    missing: Callable[[str], None],
) -> None:
    """Hand one :class:`Reading` to the hub: numbers for the nodes it has, stale for those whose
    targets are down; ``missing(name)`` decides about a node it does not have at all, and
    ``covered(name)`` is told of each node it does (so SSH can let go of it)."""
    t = hub.clock() if t is None else t
    for name in names:
        if name in reading.down:
            covered(name)
            hub.mark_stale(name, reading.down[name])
        elif name in reading.nodes:
            covered(name)
            hub.ingest_observed(name, reading.nodes[name], t)
        else:
            missing(name)


class PrometheusPoller:
    """Reads the fleet from Prometheus; ``ssh`` samples what Prometheus cannot give."""

    def __init__(self, settings: TelemetrySettings, ssh: SshSource) -> None:
        self.settings = settings
        self.ssh = ssh
        #: The last refresh (queries made, seconds taken), for benches and doctor.
        self.last_reading: Reading | None = None

    def start(self, hub: TelemetryFeed, names: Sequence[str]) -> None:
        hub.spawn(self._run(hub, list(names)), "telemetry:prometheus")

    def stopped(self) -> None:
        self.ssh.stopped()

    def apply(self, hub: TelemetryFeed, names: Sequence[str], reading: Reading) -> None:
        """Apply one refresh: SSH lets go of what Prometheus has, and takes what it lacks (``auto``)."""
        s = self.settings

        def missing(name: str) -> None:
            if s.source == "auto":
                self.ssh.cover(hub, name)  # Prometheus does not have it: SSH does
            else:
                self.ssh.release(hub, name)
                hub.mark_unreachable(
                    name,
                    f"not in Prometheus: no series with {s.dcgm_node_label} or {s.node_exporter_node_label} = {name}",
                )

        apply_reading(hub, names, reading, covered=lambda name: self.ssh.release(hub, name), missing=missing)

    async def _run(self, hub: TelemetryFeed, names: list[str]) -> None:
        s = self.settings
        source = PrometheusSource(s, [hub.node(n) for n in names])
        try:
            while not hub.stopping:
                try:
                    reading = await source.read()
                except PrometheusUnavailable as exc:
                    fallback = s.prometheus_fallback_ssh
                    hub.source_note = f"{exc}; " + (
                        "sampling over SSH meanwhile" if fallback else "nodes go stale until it answers"
                    )
                    if fallback:
                        for name in names:
                            self.ssh.cover(hub, name)
                except Exception as exc:  # a bad answer must not stop telemetry
                    log.warning("telemetry: reading Prometheus failed", exc_info=True)
                    # the URL may hold a password
                    hub.source_note = safe_text(f"Prometheus {s.prometheus_url}: {type(exc).__name__}: {exc}", 500)
                else:
                    # a cap hit this refresh (GPUs, devices, series skipped) is said, not hidden
                    hub.source_note = "; ".join(reading.warnings)[:500] or None
                    self.last_reading = reading
                    self.apply(hub, names, reading)
                await asyncio.sleep(s.prometheus_interval)
        finally:
            await source.close()
