"""Loadmaster's state: job records, the egress ledger and reservations, the audit log, pins,
milestones, retention journals and locks, on SQLite (embedded, the default) or PostgreSQL
(``[state] url``, shared by a team). See :mod:`backend.state.base` for what both offer and
:mod:`backend.state.migrations` for the schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backend.state.base import (
    AuditEntry,
    Result,
    Row,
    StateCorrupt,
    StateDB,
    StateError,
    StateRetry,
    StateUnavailable,
    actor,
)
from backend.state.sqlite import REPAIR_HINT, RepairReport, SQLiteState, check_state, repair_state, state_error

if TYPE_CHECKING:
    from backend.config import Config

#: The SQLite file's name under the state dir.
STATE_FILE = "state.sqlite3"


def open_state(config: Config) -> StateDB:
    """The state database ``config`` names: ``[state] url`` (PostgreSQL), else the SQLite file."""
    if config.state.url:
        from backend.state.postgres import PostgresState

        return PostgresState(config.state.url)
    return SQLiteState(config.state_dir() / STATE_FILE)


def state_where(config: Config) -> str:
    """Where ``config`` keeps state, for messages (no password is ever in it)."""
    if config.state.url:
        from backend.state.postgres import check_url, display_url

        return display_url(check_url(config.state.url))
    return str(config.state_dir() / STATE_FILE)


__all__ = [
    "REPAIR_HINT",
    "STATE_FILE",
    "AuditEntry",
    "RepairReport",
    "Result",
    "Row",
    "SQLiteState",
    "StateCorrupt",
    "StateDB",
    "StateError",
    "StateRetry",
    "StateUnavailable",
    "actor",
    "check_state",
    "open_state",
    "repair_state",
    "state_error",
    "state_where",
]
