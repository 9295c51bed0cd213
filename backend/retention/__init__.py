"""Retention: compute plans from fresh listings and apply them safely (journal, re-check, audit).

The pure policy and planner live in :mod:`backend.policy.retention` and
:mod:`backend.policy.retention_planner`; this package does the I/O.
"""

from backend.retention.apply import (
    ActionOutcome,
    ApplyReport,
    Journal,
    apply_plan,
    compute_plan,
    storage_price,
)
from backend.retention.marks import MilestoneStore, PinStore

__all__ = [
    "ActionOutcome",
    "ApplyReport",
    "Journal",
    "MilestoneStore",
    "PinStore",
    "apply_plan",
    "compute_plan",
    "storage_price",
]
