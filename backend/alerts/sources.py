"""What the alerting code reads, named as Protocols (``backend.services.Services`` is each): the
``/metrics`` export reads :class:`MetricsSources`, the watcher :class:`WatchedServices`. They are
properties, so a part that is down (the state database) fails when read, as one part's note, never
up front; and the alerting code takes just these, not the whole services bag."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from backend.config import Config
    from backend.jobs.manager import JobManager
    from backend.ledger import EgressGuard
    from backend.state import StateDB
    from backend.telemetry.hub import TelemetryHub


class MetricsSources(Protocol):
    """What a ``/metrics`` cycle's figures are read from: the config, the state database and the
    month's egress."""

    @property
    def config(self) -> Config: ...

    @property
    def db(self) -> StateDB: ...

    @property
    def egress(self) -> EgressGuard: ...


class WatchedServices(MetricsSources, Protocol):
    """What a watcher's round reads besides: the fleet and the jobs."""

    @property
    def telemetry(self) -> TelemetryHub: ...

    @property
    def jobs(self) -> JobManager: ...
