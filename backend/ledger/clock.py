"""The ledger's "now": one function every recorder and reader of the month asks.

Kept apart so a test (``tests/tui/snapshot_services.frozen_clock``) freezes the ledger's month in
one place; callers reach it as ``clock.now(...)``, never a copy bound at import.
"""

from __future__ import annotations

from datetime import UTC, datetime


def now(at: datetime | float | None = None) -> datetime:
    """``at`` as an aware UTC datetime (a timestamp, a naive datetime taken as UTC); None: now."""
    if at is None:
        return datetime.now(UTC)
    if isinstance(at, int | float):
        return datetime.fromtimestamp(at, UTC)
    return at if at.tzinfo else at.replace(tzinfo=UTC)
