"""Telemetry sources: where the hub's numbers come from.

A source is anything that satisfies :class:`TelemetrySource`: started with the hub (as a
:class:`TelemetryFeed`) and the names of the nodes to cover, it feeds them through the hub's doors
(``ingest`` for a raw sampler block, ``ingest_observed`` for numbers already per node) and says
what it cannot read (``mark_stale``, ``mark_unreachable``, ``note_error``, ``source_note``). The
hub never knows which source it runs: :func:`build_sources` picks them from ``[telemetry] source``.
Adding one is a module here and one entry in :data:`SOURCES`; ``hub.py`` does not change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from backend.config import Node
    from backend.nodes.pool import NodePool
    from backend.telemetry.model import NodeSnapshot, Observed
    from backend.telemetry.settings import TelemetrySettings


class TelemetryFeed(Protocol):
    """What the hub offers a source: its doors for samples and the tasks it owns."""

    settings: TelemetrySettings
    #: The hub's (monotonic) clock: the time of a sample.
    clock: Callable[[], float]
    #: Why the configured source is not working now (shown on the Fleet screen), or None.
    source_note: str | None

    @property
    def stopping(self) -> bool: ...

    def node(self, name: str) -> Node: ...

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]: ...

    def discard(self, task: asyncio.Task[None]) -> None: ...

    def ingest(self, node: str, block: str, t: float | None = None) -> NodeSnapshot: ...

    def ingest_observed(
        self, node: str, obs: Observed, t: float | None = None, *, error: str | None = None
    ) -> NodeSnapshot: ...

    def mark_unreachable(self, node: str, error: str, t: float | None = None) -> None: ...

    def mark_stale(self, node: str, error: str) -> None: ...

    def note_error(self, node: str, error: str) -> None: ...

    def set_latency(self, node: str, latency_ms: float) -> None: ...


class TelemetrySource(Protocol):
    """A place the fleet's numbers come from (SSH streams, Prometheus, a recording, ...).

    ``start`` begins feeding ``hub`` for ``names`` and returns at once: its loops run as tasks made
    with ``hub.spawn`` (the hub cancels them all on stop). ``stopped`` is called after that
    cancellation, so a later ``start`` begins afresh. A source never raises out of its loops:
    what fails is shown on the node (``note_error``, ``mark_unreachable``) or as ``source_note``.
    """

    def start(self, hub: TelemetryFeed, names: Sequence[str]) -> None: ...

    def stopped(self) -> None: ...


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
