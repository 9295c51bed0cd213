"""Fan-out savings of relay pulls: the bytes a relay receiver got from a peer instead of the store,
priced as the store would have charged for them (table ``fanout_savings``, one row per job).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from backend.config import StoreProfile
from backend.errors import PolicyError
from backend.ledger import clock
from backend.ledger.guard import EgressGuard
from backend.policy.egress import month_key
from backend.state import StateDB


@dataclass(frozen=True)
class FanoutSavings:
    """What relay pulls saved in a month: bytes peers sent instead of the store, and their price."""

    month: str
    bytes: int
    usd: float
    jobs: int
    #: Bytes whose route has no price (counted in ``bytes``, not in ``usd``).
    unpriced_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def record_fanout_saving(
    guard: EgressGuard,
    store: StoreProfile,
    dest_site: str | None,
    nbytes: int,
    *,
    job_id: str,
    group: str = "",
    when: datetime | float | None = None,
    note: str = "",
) -> None:
    """Record that a relay receiver got ``nbytes`` from a peer: priced as the store would have
    charged for it at this month's tier (one row per job, however many consoles see it end)."""
    if nbytes < 0:
        raise PolicyError(f"cannot record a negative byte count ({nbytes})")
    at = clock.now(when)
    q = guard.quote_transfer(store, dest_site, nbytes, now=at)
    usd = q.total_usd if q.priced else None
    guard.db.execute(
        "INSERT INTO fanout_savings (job_id, ts, month, relay_group, store, account, dest_site, bytes, usd, note)"
        " VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT (job_id) DO NOTHING",
        (job_id, at.timestamp(), month_key(at), group, store.name, q.account, dest_site, nbytes, usd, note),
    )


def fanout_savings(db: StateDB, month: str) -> FanoutSavings:
    """The month's savings from fan-out (relay receivers' bytes at the price they did not pay)."""
    rows = db.query(
        "SELECT COALESCE(SUM(bytes), 0) AS b, COALESCE(SUM(usd), 0) AS u, COUNT(*) AS n,"
        " COALESCE(SUM(CASE WHEN usd IS NULL THEN bytes ELSE 0 END), 0) AS ub"
        " FROM fanout_savings WHERE month = ?",
        (month,),
    )
    r = rows[0]
    return FanoutSavings(month, int(r["b"]), float(r["u"]), int(r["n"]), int(r["ub"]))
