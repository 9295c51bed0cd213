"""Telemetry sources: where the hub's numbers come from.

A source is anything that satisfies :class:`TelemetrySource`: started with the hub (as a
:class:`TelemetryFeed`) and the names of the nodes to cover, it feeds them through the hub's doors
(``ingest`` for a raw sampler block, ``ingest_observed`` for numbers already per node) and says
what it cannot read (``mark_stale``, ``mark_unreachable``, ``note_error``, ``source_note``). The
hub never knows which source it runs: :func:`build_sources` picks them from ``[telemetry] source``.
Adding one is a module here and one entry in :data:`SOURCES`; ``hub.py`` does not change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from backend.telemetry.sources.base import TelemetryFeed, TelemetrySource

if TYPE_CHECKING:
    from backend.nodes.pool import NodePool
    from backend.telemetry.settings import TelemetrySettings

__all__ = ["SOURCES", "TelemetryFeed", "TelemetrySource", "build_sources"]


def _ssh(settings: TelemetrySettings, pool: NodePool) -> list[TelemetrySource]:
    from backend.telemetry.sources.ssh import SshSource

    return [SshSource(pool, settings)]


def _prometheus(settings: TelemetrySettings, pool: NodePool) -> list[TelemetrySource]:
    from backend.telemetry.sources.prometheus import PrometheusPoller
    from backend.telemetry.sources.ssh import SshSource

    return [PrometheusPoller(settings, SshSource(pool, settings))]


def _replay(settings: TelemetrySettings, pool: NodePool) -> list[TelemetrySource]:
    from backend.telemetry.sources.replay import ReplaySource

    return [ReplaySource(settings)]


#: ``[telemetry] source`` -> the sources it runs.
SOURCES: dict[str, Callable[[TelemetrySettings, NodePool], list[TelemetrySource]]] = {
    "ssh": _ssh,
    "prometheus": _prometheus,
    "auto": _prometheus,
    "replay": _replay,
}


def build_sources(settings: TelemetrySettings, pool: NodePool) -> list[TelemetrySource]:
    """The sources ``[telemetry] source`` names, for the nodes of ``pool``."""
    return SOURCES[settings.source](settings, pool)
