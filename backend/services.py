"""The composition root: every service built once from the config and handed to the console.

``LoadmasterApp(services)`` and each CLI command receive a :class:`Services`; widgets never reach
for globals. Feature services are created lazily on first use so a CLI command pays only for what
it touches.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from backend.config import Config
from backend.state import StateDB, open_state

if TYPE_CHECKING:
    from backend.jobs.manager import JobManager
    from backend.ledger import EgressGuard
    from backend.nodes.keeper import KeeperClient
    from backend.nodes.pool import NodePool
    from backend.storage import StoreRegistry
    from backend.telemetry.hub import TelemetryHub


@dataclass
class Services:
    """Everything a front end needs, built once at start-up."""

    config: Config
    readonly: bool = False
    #: Reach SSH nodes through the connection keeper (the command line; see backend.nodes.keeper).
    keep_connections: bool = False

    @cached_property
    def db(self) -> StateDB:
        """The state database: ``[state] url`` (PostgreSQL, shared) or the local SQLite file."""
        return open_state(self.config)

    @cached_property
    def pool(self) -> NodePool:
        from backend.nodes.pool import NodePool

        return NodePool.from_config(self.config, keeper=self._keeper())

    def _keeper(self) -> KeeperClient | None:
        """The connection keeper client, where this front end uses one and it applies."""
        if not self.keep_connections or not any(n.transport == "ssh" for n in self.config.nodes):
            return None
        from backend.nodes.keeper import KeeperClient, KeeperUnavailable, persist_seconds

        persist = persist_seconds(self.config)
        if persist <= 0:
            return None
        try:
            return KeeperClient(self.config, persist)
        except KeeperUnavailable:
            return None

    @cached_property
    def stores(self) -> StoreRegistry:
        from backend.storage import StoreRegistry

        return StoreRegistry(self.config)

    @cached_property
    def telemetry(self) -> TelemetryHub:
        from backend.telemetry.hub import TelemetryHub
        from backend.telemetry.settings import TelemetrySettings

        return TelemetryHub(self.pool, self.config.section(TelemetrySettings))

    @cached_property
    def jobs(self) -> JobManager:
        from backend.jobs.manager import JobManager

        return JobManager(self.pool, self.db, self.config, readonly=lambda: self.readonly)

    @cached_property
    def egress(self) -> EgressGuard:
        from backend.ledger import EgressGuard

        return EgressGuard(self.config, self.db)

    async def aclose(self) -> None:
        """Stop background work and close connections."""
        if "telemetry" in self.__dict__:
            await self.telemetry.stop()
        if "pool" in self.__dict__:
            await self.pool.close()
        if "db" in self.__dict__:
            self.db.close()
