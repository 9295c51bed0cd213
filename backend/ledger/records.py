"""What the egress ledger holds and reports, as values: a ledger row, a route's and a budget's
month, the month's report, a launch's reservations and an allowed override (no I/O here).

The limits every recorder applies (``SETTLE_SLACK``, ``MAX_TRANSFER_BYTES``) live here too, so the
guard, the settling of a job and the relay's savings read one number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backend.policy.egress import GuardDecision
from backend.policy.prices import TierSlice

#: A job's settled bytes are capped at its reservation's quoted bytes times this: what a node
#: reports is data, never a reason to record more than the operator approved in the plan (and the
#: budget the launch was checked against). 1.0: the quote is the ceiling. A node's claim above it
#: (retried parts, an object rewritten since the listing, or a lie) is kept in the row's note for
#: the operator, never counted: only a new launch, with its own quote and check, spends more.
SETTLE_SLACK = 1.0
#: More bytes than any one transfer moves: refused outright (a node's 1e30).
MAX_TRANSFER_BYTES = 1 << 60


@dataclass(frozen=True)
class LedgerEntry:
    """One finished transfer as recorded: bytes, route and $ at the tier it fell in."""

    id: int
    ts: float
    month: str
    job_id: str | None
    store: str
    account: str | None
    source_site: str | None
    dest_site: str | None
    kind: str
    bytes: int
    usd: float | None
    priced: bool
    month_to_date_bytes: int
    tiers: tuple[TierSlice, ...]
    note: str
    #: ``reserved`` (quoted, the job runs), ``settled`` (the real bytes) or ``released``
    state: str = "settled"
    #: What the reservation was for, as quoted at launch (None for rows recorded without one).
    quoted_bytes: int | None = None
    quoted_usd: float | None = None
    #: Who launched the transfer (``user@host``).
    who: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["tiers"] = [t.as_dict() for t in self.tiers]
        return d


@dataclass(frozen=True)
class RouteSpend:
    """Month-to-date bytes and $ on one route, and its share of the month-end projection."""

    store: str
    account: str | None
    source_site: str | None
    dest_site: str | None
    kind: str
    transfers: int
    bytes: int
    usd: float | None
    projected_bytes: int
    projected_usd: float | None
    #: Transfers still running (their quoted bytes and $ are in the figures above).
    in_flight: int = 0
    in_flight_usd: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.store} ({self.source_site or '?'}) -> {self.dest_site or '?'}"

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["route"] = self.label
        return d


@dataclass(frozen=True)
class BudgetStatus:
    """One configured budget and how much of it the month has used."""

    scope: str
    key: str
    budget_usd: float
    spent_usd: float
    projected_usd: float

    @property
    def fraction(self) -> float:
        return self.spent_usd / self.budget_usd if self.budget_usd else (1.0 if self.spent_usd else 0.0)

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "fraction": self.fraction}


@dataclass(frozen=True)
class EgressReport:
    """A month of egress: per-route spend, budgets and the projection to month end."""

    month: str
    as_of: float
    elapsed: float
    routes: tuple[RouteSpend, ...]
    budgets: tuple[BudgetStatus, ...]
    bytes: int
    usd: float
    projected_bytes: int
    projected_usd: float
    unpriced_bytes: int
    #: Running transfers, counted at their quote until they settle.
    in_flight: int = 0
    in_flight_usd: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "in_flight": self.in_flight,
            "in_flight_usd": self.in_flight_usd,
            "month": self.month,
            "as_of": self.as_of,
            "elapsed": self.elapsed,
            "bytes": self.bytes,
            "usd": self.usd,
            "projected_bytes": self.projected_bytes,
            "projected_usd": self.projected_usd,
            "unpriced_bytes": self.unpriced_bytes,
            "routes": [r.as_dict() for r in self.routes],
            "budgets": [b.as_dict() for b in self.budgets],
        }


@dataclass(frozen=True)
class OverrideFacts:
    """An allowed over-budget transfer as the audit log records it (``egress.override``)."""

    target: str
    reason: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class Reservation:
    """One job's share of a launch: what its node will receive from the store."""

    job_id: str
    dest_site: str | None
    nbytes: int
    objects: int = 0


@dataclass(frozen=True)
class Reserved:
    """A launch's reservations, and the guard's decision on them (None: all were made before)."""

    decision: GuardDecision | None
    entries: tuple[LedgerEntry, ...]
