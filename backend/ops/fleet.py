"""The fleet's reads: the inventory as resolved, the doctor's checks, and a live sampling hub.

``loadmaster nodes``, ``doctor`` and ``top`` and the console's Fleet screen ask here; the rows
they print are rendered by the helpers re-exported below, so the CLI's table and the console's
footer name the same unread nodes for the same reasons.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backend.ops.base import Operation
from backend.ops.exports import lazy_exports

if TYPE_CHECKING:
    from backend.config import Node
    from backend.doctor import NodeReport
    from backend.nodes.agent import AgentReport
    from backend.nodes.pool import PARTIAL_EXIT, unread_line
    from backend.nodes.ssh_config import ConnectionSettings
    from backend.telemetry.cells import alert_cell, error_cell, gpus_cell, link_cell, num, rate_pct, state_cell
    from backend.telemetry.hub import TelemetryHub
    from backend.telemetry.report import fleet_dict, fleet_table, unread_nodes
    from backend.telemetry.settings import TelemetrySettings

__all__ = [
    "PARTIAL_EXIT",
    "AgentReport",
    "Fleet",
    "NodeReport",
    "alert_cell",
    "error_cell",
    "gpus_cell",
    "link_cell",
    "num",
    "rate_pct",
    "state_cell",
    "fleet_dict",
    "fleet_table",
    "unread_line",
    "unread_nodes",
]
if not TYPE_CHECKING:  # mypy reads the imports above; at run time each name loads on first use
    __getattr__ = lazy_exports(
        __name__,
        {
            "NodeReport": "backend.doctor",
            "AgentReport": "backend.nodes.agent",
            **dict.fromkeys(("PARTIAL_EXIT", "unread_line"), "backend.nodes.pool"),
            **dict.fromkeys(("fleet_dict", "fleet_table", "unread_nodes"), "backend.telemetry.report"),
            **dict.fromkeys(
                ("alert_cell", "error_cell", "gpus_cell", "link_cell", "num", "rate_pct", "state_cell"),
                "backend.telemetry.cells",
            ),
        },
    )


class Fleet(Operation):
    """``loadmaster nodes|doctor|top``: what the fleet is, whether it is ready, what it is doing."""

    def select(self, pattern: str | None) -> list[Node]:
        """The nodes ``pattern`` names (hostlist, glob or comma list), or every node."""
        config = self.services.config
        return config.select(pattern) if pattern else list(config.nodes)

    def connection_settings(self, nodes: list[Node]) -> list[ConnectionSettings]:
        """How loadmaster reaches each node: its fields over ``~/.ssh/config``'s."""
        from backend.nodes.ssh_config import effective_settings

        return [effective_settings(n) for n in nodes]

    async def doctor(self, names: list[str], *, limit: float) -> list[NodeReport]:
        """Check each node (reachable, tools, GPUs, NICs, scratch), ``limit`` seconds each."""
        from backend.doctor import run_doctor
        from backend.pulls.settings import PullSettings

        s5cmd = self.services.config.section(PullSettings).s5cmd
        return await run_doctor(self.services.pool, names, limit=limit, s5cmd=s5cmd)

    def sampler(self, settings: TelemetrySettings, names: list[str]) -> TelemetryHub:
        """A hub of its own over ``names`` at ``settings`` (``top``'s interval and node choice),
        beside the shared ``services.telemetry``; the caller starts and stops it."""
        from backend.telemetry.hub import TelemetryHub

        return TelemetryHub(self.services.pool, settings, nodes=names)
