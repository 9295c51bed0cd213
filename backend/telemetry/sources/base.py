"""The telemetry source seam's two Protocols: :class:`TelemetrySource` (what a source is) and
:class:`TelemetryFeed` (what the hub offers it). Kept apart from the registry in ``__init__`` so a
source module imports only this."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from backend.config import Node
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
