"""The row models, value types and settings both front ends render: the public types of ``ops``.

``tui/`` (the console and the command line) imports ``backend.ops`` and not the feature packages
(an import-linter contract in ``pyproject.toml`` keeps it so). The types the front ends show, and
the settings sections they read, are re-exported here from where they are defined, so one table
has one row model whichever front end draws it. Types of one area (checkpoints, shards, egress,
retention, state, triage, the fleet) are re-exported by that area's ops module instead. Each
name is imported on first use (:mod:`backend.ops.exports`), so a command loads only what it shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backend.ops.exports import lazy_exports

if TYPE_CHECKING:
    from backend.alerts.settings import AlertSettings
    from backend.jobs.fmt import middle, nodes_text, proof_text, verified_short
    from backend.jobs.records import (
        NODE_SAID_NOTES,
        JobProgress,
        JobRecord,
        LaunchCancel,
        fleet_rollup,
        states_text,
    )
    from backend.jobs.settings import JobSettings
    from backend.schema import parse_duration, parse_size
    from backend.slurm.model import HOLDING_JOB_STATES, SlurmJob
    from backend.slurm.settings import SlurmSettings
    from backend.telemetry.model import NO_GPU, Alert, FleetSnapshot, GpuSample, NodeSnapshot, XidEvent
    from backend.telemetry.settings import TelemetrySettings
    from backend.telemetry.xid import describe as describe_xid

if not TYPE_CHECKING:  # mypy reads the imports above; at run time each name loads on first use
    __getattr__ = lazy_exports(
        __name__,
        {
            "AlertSettings": "backend.alerts.settings",
            **dict.fromkeys(("middle", "nodes_text", "proof_text", "verified_short"), "backend.jobs.fmt"),
            **dict.fromkeys(
                ("NODE_SAID_NOTES", "JobProgress", "JobRecord", "LaunchCancel", "fleet_rollup", "states_text"),
                "backend.jobs.records",
            ),
            "JobSettings": "backend.jobs.settings",
            **dict.fromkeys(("parse_duration", "parse_size"), "backend.schema"),
            "HOLDING_JOB_STATES": "backend.slurm.model",
            "SlurmJob": "backend.slurm.model",
            "SlurmSettings": "backend.slurm.settings",
            **dict.fromkeys(
                ("NO_GPU", "Alert", "FleetSnapshot", "GpuSample", "NodeSnapshot", "XidEvent"), "backend.telemetry.model"
            ),
            "TelemetrySettings": "backend.telemetry.settings",
            "describe_xid": "backend.telemetry.xid:describe",
        },
    )

__all__ = [
    "NODE_SAID_NOTES",
    "NO_GPU",
    "Alert",
    "AlertSettings",
    "FleetSnapshot",
    "GpuSample",
    "JobProgress",
    "JobRecord",
    "JobSettings",
    "LaunchCancel",
    "NodeSnapshot",
    "HOLDING_JOB_STATES",
    "SlurmJob",
    "SlurmSettings",
    "TelemetrySettings",
    "XidEvent",
    "describe_xid",
    "fleet_rollup",
    "middle",
    "nodes_text",
    "parse_duration",
    "parse_size",
    "proof_text",
    "states_text",
    "verified_short",
]
