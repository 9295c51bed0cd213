"""The egress ledger (SQLite, in the state DB) and the guard every pull passes before bytes move.

The guard's steps, as the operation layer runs them (``backend.ops.pull``; front ends call the
operation, never these; ``services.egress`` is the one guard)::

    guard = services.egress
    quote = guard.quote_transfer(store, node.site, listed_bytes, objects=listed_objects)
    decision = guard.check(quote, allow_over_budget_reason=args.allow_over_budget)
    # show the quote with the verdict: backend.policy.egress.decision_lines(decision)
    if decision.action == "block":       raise PolicyError(decision.message)  # do not start
    if decision.action == "confirm":     refuse unless the operator gave a reason
    if decision.override_reason:         operation.audit_override(decision)  # guard.override_facts
    ... transfer runs ...
    guard.record_transfer(store, node.site, bytes_moved, job_id=job.id)   # when it finished

* ``quote_transfer`` prices the bytes at the tiers they will fall in, given the month-to-date volume
  out of the same source account already in the ledger (so the 2nd TB costs what the 2nd TB costs).
* ``check`` applies ``[egress]``: the monthly budget of the store or its account, the per-transfer
  limit, and the action (warn | confirm | block). ``confirm`` with a reason becomes ``allow`` with
  ``override_reason`` set; ``block`` cannot be overridden.
* ``override_facts`` checks an override may be made and gives what the audit log records of it
  (``egress.override``, written by ``Operation.audit_override``).
* ``record_transfer`` appends a :class:`LedgerEntry` priced at the tier it actually fell in.
* ``dest_site`` None (a node without ``site``) is priced as internet egress and the quote says so;
  a store without provider/region, or of an unpriced provider, gives ``priced=False`` with a note
  (``[egress] unpriced_action`` decides), a local directory store gives route kind ``local``.
* Front ends do not call these steps themselves: ``backend.ops`` does (``ops.pulls.start``,
  ``ops.egress.quote``), in one order, with the audit record.

:class:`EgressLedger` reads the month back per route (``loadmaster egress report``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from backend.config import Config, StoreProfile
from backend.errors import PolicyError
from backend.policy.egress import (
    EgressQuote,
    EgressSettings,
    GuardDecision,
    Route,
    account_label,
    budget_for,
    decide,
    month_bounds,
    month_elapsed,
    month_key,
    projected_bytes,
)
from backend.policy.prices import (
    GB,
    LOCAL_PROVIDERS,
    PriceOverrides,
    PriceTable,
    TierSlice,
    TransferPrice,
    parse_site,
    price_table,
    price_transfer,
    request_cost,
    tiered_cost,
)
from backend.state import StateDB, actor

#: A job's settled bytes are capped at its reservation's quoted bytes times this: what a node
#: reports is data, never a reason to spend more than the launch reserved (retried parts and an
#: object rewritten since the listing fit in the 10 %).
SETTLE_SLACK = 1.10
#: More bytes than any one transfer moves: refused outright (a node's 1e30).
MAX_TRANSFER_BYTES = 1 << 60

#: The ledger rows that count against budgets and tiers: finished transfers and the reservations
#: of running ones (a released reservation, whose job moved nothing, does not).
COUNTED = "state <> 'released'"


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


def _now(now: datetime | float | None) -> datetime:
    if now is None:
        return datetime.now(UTC)
    if isinstance(now, int | float):
        return datetime.fromtimestamp(now, UTC)
    return now if now.tzinfo else now.replace(tzinfo=UTC)


def _is_local(store: StoreProfile) -> bool:
    # A local directory store (with or without provider = "local") moves no cloud bytes.
    provider = (store.provider or "").lower()
    return provider in LOCAL_PROVIDERS or (not provider and not store.is_s3)


def _row_entry(r: Any) -> LedgerEntry:
    tiers = tuple(TierSlice(**t) for t in json.loads(r["tiers"]))
    return LedgerEntry(
        r["id"],
        r["ts"],
        r["month"],
        r["job_id"],
        r["store"],
        r["account"],
        r["source_site"],
        r["dest_site"],
        r["kind"],
        r["bytes"],
        r["usd"],
        bool(r["priced"]),
        r["month_to_date_bytes"],
        tiers,
        r["note"],
        r["state"],
        None if r["quoted_bytes"] is None else int(r["quoted_bytes"]),
        r["quoted_usd"],
        r["who"],
    )


class EgressLedger:
    """Finished transfers in the state DB, queried by month, account and route."""

    def __init__(self, db: StateDB) -> None:
        self.db = db

    def internet_bytes(self, account: str | None, month: str, *, before_id: int | None = None) -> int:
        """Bytes out to the internet from ``account`` in ``month`` (what the tiers count):
        finished transfers and the reservations of running ones; with ``before_id``, only rows
        recorded before that one."""
        if account is None:
            return 0
        rows = self.db.query(
            "SELECT COALESCE(SUM(bytes), 0) AS b FROM egress_ledger WHERE month = ? AND account = ?"
            f" AND kind = 'internet' AND {COUNTED}" + (" AND id < ?" if before_id is not None else ""),
            (month, account, *(() if before_id is None else (before_id,))),
        )
        return int(rows[0]["b"])

    def spent_usd(self, month: str, *, store: str | None = None, account: str | None = None) -> float:
        """Dollars recorded or reserved in ``month`` for one store or one account."""
        col, val = ("store", store) if store is not None else ("account", account)
        rows = self.db.query(
            f"SELECT COALESCE(SUM(usd), 0) AS u FROM egress_ledger WHERE month = ? AND {col} = ? AND {COUNTED}",
            (month, val),
        )
        return float(rows[0]["u"])

    def provider_spent_usd(self, month: str, provider: str) -> float:
        """Dollars recorded or reserved in ``month`` on every account of ``provider``."""
        rows = self.db.query(
            "SELECT COALESCE(SUM(usd), 0) AS u FROM egress_ledger WHERE month = ?"
            f" AND (account = ? OR account LIKE ?) AND {COUNTED}",
            (month, provider, f"{provider}/%"),
        )
        return float(rows[0]["u"])

    def for_job(self, job_id: str) -> LedgerEntry | None:
        """The one row of ``job_id`` (a reservation, a settled transfer or a released one)."""
        rows = self.db.query("SELECT * FROM egress_ledger WHERE job_id = ?", (job_id,))
        return _row_entry(rows[0]) if rows else None

    def append(
        self,
        *,
        when: datetime,
        job_id: str | None,
        store: str,
        account: str | None,
        source_site: str | None,
        dest_site: str | None,
        nbytes: int,
        price: Callable[[int], TransferPrice],
        kind: str | None = None,
        state: str = "settled",
        note: str = "",
    ) -> LedgerEntry:
        """Insert one row priced by ``price(month-to-date bytes)``, in one transaction under the
        month's lock. A job already in the ledger is settled to ``nbytes`` instead: one row per
        job, however many consoles record it."""
        month = month_key(when)

        def body(db: StateDB) -> int:
            if job_id is not None and (row := self.for_job(job_id)) is not None:
                return self._settle_row(row, nbytes, price, note=note) if state == "settled" else row.id
            mtd = self.internet_bytes(account, month)
            p = price(mtd)
            return db.execute(
                "INSERT INTO egress_ledger (ts, month, job_id, store, account, source_site, dest_site, kind,"
                " bytes, usd, priced, month_to_date_bytes, tiers, note, state, quoted_bytes, quoted_usd, who,"
                " settled_ts) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) RETURNING id",
                (
                    when.timestamp(),
                    month,
                    job_id,
                    store,
                    account,
                    source_site,
                    dest_site,
                    kind or p.kind,
                    nbytes,
                    p.usd,
                    int(p.priced),
                    mtd,
                    json.dumps([t.as_dict() for t in p.tiers]),
                    " ".join(x for x in (p.note, note) if x),
                    state,
                    nbytes if state == "reserved" else None,
                    p.usd if state == "reserved" else None,
                    actor(),
                    time.time() if state == "settled" else None,
                ),
            ).id

        return self.entry(self.db.transact(body, lock=f"egress:{month}"))

    def _settle_row(self, row: LedgerEntry, nbytes: int, price: Callable[[int], TransferPrice], *, note: str) -> int:
        """Inside the month's transaction: a reserved (or released) row becomes the real bytes,
        priced at the tier they fell in given the rows before it; a settled row stays as it is."""
        if row.state == "settled":
            return row.id
        mtd = self.internet_bytes(row.account, row.month, before_id=row.id)
        p = price(mtd)
        self.db.execute(
            "UPDATE egress_ledger SET bytes = ?, usd = ?, priced = ?, month_to_date_bytes = ?, tiers = ?,"
            " state = 'settled', settled_ts = ?, note = ? WHERE id = ?",
            (
                nbytes,
                p.usd,
                int(p.priced),
                mtd,
                json.dumps([t.as_dict() for t in p.tiers]),
                time.time(),
                " ".join(x for x in (p.note, note) if x),
                row.id,
            ),
        )
        return row.id

    def release(self, job_id: str, note: str) -> LedgerEntry | None:
        """A reservation whose job moved no bytes (failed to start, cancelled early, lost) stops
        counting; a settled row is left as it is. None when the job has no row."""
        row = self.for_job(job_id)
        if row is None:
            return None

        def body(db: StateDB) -> None:
            db.execute(
                "UPDATE egress_ledger SET state = 'released', settled_ts = ?, note = ?"
                " WHERE job_id = ? AND state = 'reserved'",
                (time.time(), note, job_id),
            )

        self.db.transact(body, lock=f"egress:{row.month}")
        return self.for_job(job_id)

    def orphan_reservations(self, before: float) -> list[str]:
        """Job ids of reservations made before ``before`` whose job has no record at all (the
        launch died between the reservation and the job's row)."""
        rows = self.db.query(
            "SELECT e.job_id AS job_id FROM egress_ledger e LEFT JOIN jobs j ON j.id = e.job_id"
            " WHERE e.state = 'reserved' AND e.ts < ? AND e.job_id IS NOT NULL AND j.id IS NULL",
            (before,),
        )
        return [str(r["job_id"]) for r in rows]

    def entry(self, entry_id: int) -> LedgerEntry:
        rows = self.db.query("SELECT * FROM egress_ledger WHERE id = ?", (entry_id,))
        if not rows:
            raise PolicyError(f"no egress ledger entry {entry_id}")
        return _row_entry(rows[0])

    def entries(self, month: str) -> list[LedgerEntry]:
        """Entries of ``month``, oldest first."""
        return [
            _row_entry(r)
            for r in self.db.query("SELECT * FROM egress_ledger WHERE month = ? ORDER BY ts, id", (month,))
        ]


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


class EgressGuard:
    """Prices transfers before they run, applies ``[egress]``, records overrides and finished transfers."""

    def __init__(self, config: Config, db: StateDB, *, prices: PriceTable | None = None) -> None:
        self.config = config
        self.db = db
        self.settings: EgressSettings = config.section(EgressSettings)
        self.prices = prices or price_table(config.section(PriceOverrides))
        self.ledger = EgressLedger(db)

    # -- helpers --------------------------------------------------------------------------

    def account_of(self, store: StoreProfile) -> str | None:
        """The account label a store's transfers count against (None when unpriced)."""
        if not store.provider or store.provider.lower() in LOCAL_PROVIDERS:
            return None
        key = self.prices.canonical(store.provider) or store.provider.lower()
        return account_label(key, store.profile)

    def _source_site(self, store: StoreProfile) -> str | None:
        site = store.site
        if site:
            parse_site(site, what=f"store {store.name!r} site")
        return site

    # -- API --------------------------------------------------------------------------------

    def quote_transfer(
        self,
        store: StoreProfile,
        dest_site: str | None,
        nbytes: int,
        *,
        objects: int = 0,
        now: datetime | float | None = None,
    ) -> EgressQuote:
        """Price ``nbytes`` (``objects`` GETs) from ``store`` to a node at ``dest_site`` this month."""
        if nbytes < 0:
            raise PolicyError(f"cannot quote a negative byte count ({nbytes})")
        when = _now(now)
        month = month_key(when)
        account = self.account_of(store)
        mtd = self.ledger.internet_bytes(account, month)
        source = self._source_site(store)
        p = price_transfer(self.prices, source, dest_site, nbytes, month_to_date_bytes=mtd)
        kind: str = p.kind
        if _is_local(store):
            kind = "local"
            p = dataclasses.replace(p, note="unpriced: a local store has no provider egress charge")
        req = 0.0
        if p.priced and objects:
            site = parse_site(source or "")
            prov = self.prices.provider(site.provider, site.region)
            req = request_cost(prov, gets=objects) if prov else 0.0
        mtd_usd = self.ledger.spent_usd(month, account=account) if account else 0.0
        return EgressQuote(
            bytes=nbytes,
            usd=p.usd,
            tiers=p.tiers,
            month_to_date_bytes=mtd,
            month_to_date_usd=mtd_usd,
            route=Route(store.name, source, dest_site, kind),
            account=account,
            month=month,
            priced=p.priced,
            note=p.note,
            objects=objects,
            requests_usd=req,
        )

    def check(self, quote: EgressQuote, *, allow_over_budget_reason: str | None = None) -> GuardDecision:
        """Allow, warn, confirm or block ``quote`` against the budgets and the per-transfer limit."""
        budget = None
        spent = 0.0
        if quote.priced:
            provider = quote.account.split("/", 1)[0] if quote.account else None
            budget = budget_for(self.settings, store=quote.route.store, account=quote.account, provider=provider)
            if budget is not None:
                if budget.scope == "store":
                    spent = self.ledger.spent_usd(quote.month, store=budget.key)
                elif budget.key == provider and quote.account != provider:
                    spent = self.ledger.provider_spent_usd(quote.month, provider)
                else:
                    spent = self.ledger.spent_usd(quote.month, account=budget.key)
        return decide(
            quote, self.settings, budget=budget, spent_usd=spent, allow_over_budget_reason=allow_over_budget_reason
        )

    def override_facts(self, decision: GuardDecision, reason: str) -> OverrideFacts:
        """What the audit log records of an over-budget transfer the operator allowed, with their
        reason (PolicyError when it cannot be overridden: no reason, nothing exceeded, ``block``)."""
        reason = (reason or "").strip()
        if not reason:
            raise PolicyError("an over-budget override needs a reason (--allow-over-budget REASON)")
        if not decision.exceeded:
            raise PolicyError("nothing to override: the transfer is within its budget and limit")
        if self.settings.action == "block":
            raise PolicyError(f'[egress] action is "block": {decision.message}')
        q = decision.quote
        return OverrideFacts(
            q.route.label,
            reason,
            {
                "bytes": q.bytes,
                "usd": q.total_usd,
                "exceeded": list(decision.exceeded),
                "budget": decision.budget.key if decision.budget else None,
                "budget_usd": decision.budget.usd if decision.budget else None,
                "spent_usd": decision.spent_usd,
                "limit_usd": decision.limit_usd,
                "month": q.month,
                "message": decision.message,
            },
        )

    def record_transfer(
        self,
        store: StoreProfile,
        dest_site: str | None,
        nbytes: int,
        *,
        job_id: str | None,
        when: datetime | float | None = None,
        note: str = "",
    ) -> LedgerEntry:
        """Record a finished transfer, priced at the tier it fell in given the ledger before it.

        A job with a reservation settles it to ``nbytes``; a job already settled is left as it is
        (several consoles that see the same job end record it once).
        """
        if nbytes < 0:
            raise PolicyError(f"cannot record a negative byte count ({nbytes})")
        if nbytes > MAX_TRANSFER_BYTES:
            raise PolicyError(f"cannot record {nbytes} bytes for one transfer (more than {MAX_TRANSFER_BYTES})")
        if job_id is not None and (held := self.ledger.for_job(job_id)) is not None and held.quoted_bytes is not None:
            cap = int(held.quoted_bytes * SETTLE_SLACK)
            if nbytes > cap:
                note = " ".join(
                    x
                    for x in (
                        note,
                        f"capped at its reservation ({held.quoted_bytes} bytes x {SETTLE_SLACK:g}): "
                        f"the node reported {nbytes}",
                    )
                    if x
                )
                nbytes = cap
        at = _now(when)
        source = self._source_site(store)
        account = self.account_of(store)
        return self.ledger.append(
            when=at,
            job_id=job_id,
            store=store.name,
            account=account,
            source_site=source,
            dest_site=dest_site,
            nbytes=nbytes,
            kind="local" if _is_local(store) else None,
            price=lambda mtd: price_transfer(self.prices, source, dest_site, nbytes, month_to_date_bytes=mtd),
            note=note,
        )

    def reserve(
        self,
        store: StoreProfile,
        items: Sequence[Reservation],
        *,
        allow_over_budget_reason: str | None = None,
        now: datetime | float | None = None,
        what: str = "pull",
    ) -> Reserved:
        """Check the budget and reserve every item's quoted cost, in one transaction (``what``
        names the command in a refusal: a pull, a shard conversion, a strip).

        The month's lock is held from the first read of what is spent to the last reservation
        written (a row lock on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), so two launches against
        one budget, from one console or from two operators, decide one after the other: the
        second sees the first's reservation. A launch the guard blocks (or that needs a reason it
        was not given) raises PolicyError and reserves nothing. Items already reserved (the same
        job ids: a retry after a lost connection) are returned as they are.
        """
        for it in items:
            if it.nbytes < 0:
                raise PolicyError(f"cannot reserve a negative byte count ({it.nbytes})")
        at = _now(now)
        month = month_key(at)
        account = self.account_of(store)
        source = self._source_site(store)
        order = {"allow": 0, "warn": 1, "confirm": 2, "block": 3}

        def body(db: StateDB) -> Reserved:
            have = [e for e in (self.ledger.for_job(it.job_id) for it in items) if e is not None]
            if len(have) == len(items):
                return Reserved(None, tuple(have))
            done = {e.job_id for e in have}
            worst: GuardDecision | None = None
            entries = list(have)
            # Nodes at one site are quoted together (their tiers in sequence), as the plan was.
            by_site: dict[str | None, list[Reservation]] = {}
            for it in items:
                if it.job_id not in done:
                    by_site.setdefault(it.dest_site, []).append(it)
            for site, group in by_site.items():
                quote = self.quote_transfer(
                    store, site, sum(g.nbytes for g in group), objects=sum(g.objects for g in group), now=at
                )
                dec = self.check(quote, allow_over_budget_reason=allow_over_budget_reason)
                if dec.action == "block":
                    raise PolicyError(f"not started: the egress guard blocks this {what}: {dec.message}")
                if dec.action == "confirm" and not dec.override_reason:
                    raise PolicyError(
                        f"not started: the egress guard needs a reason to go over budget: {dec.message}"
                        " (--allow-over-budget REASON)"
                    )
                if worst is None or order.get(dec.action, 0) > order.get(worst.action, 0):
                    worst = dec
                for it in group:
                    entries.append(
                        self.ledger.entry(self._insert_reserved(db, it, store, account, source, site, month, at))
                    )
            return Reserved(worst, tuple(entries))

        return self.db.transact(body, lock=f"egress:{month}")

    def _insert_reserved(
        self,
        db: StateDB,
        it: Reservation,
        store: StoreProfile,
        account: str | None,
        source: str | None,
        site: str | None,
        month: str,
        at: datetime,
    ) -> int:
        mtd = self.ledger.internet_bytes(account, month)
        p = price_transfer(self.prices, source, site, it.nbytes, month_to_date_bytes=mtd)
        kind = "local" if _is_local(store) else p.kind
        return db.execute(
            "INSERT INTO egress_ledger (ts, month, job_id, store, account, source_site, dest_site, kind, bytes, usd,"
            " priced, month_to_date_bytes, tiers, note, state, quoted_bytes, quoted_usd, who)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,'reserved',?,?,?) RETURNING id",
            (
                at.timestamp(),
                month,
                it.job_id,
                store.name,
                account,
                source,
                site,
                kind,
                it.nbytes,
                p.usd,
                int(p.priced),
                mtd,
                json.dumps([t.as_dict() for t in p.tiers]),
                p.note,
                it.nbytes,
                p.usd,
                actor(),
            ),
        ).id

    def release(self, job_id: str, why: str) -> LedgerEntry | None:
        """The reservation of a job that moved nothing stops counting (see EgressLedger.release)."""
        return self.ledger.release(job_id, why)

    # -- reporting -------------------------------------------------------------------------

    def report(self, month: str | None = None, *, now: datetime | float | None = None) -> EgressReport:
        """Month-to-date bytes and $ per route, budgets used, and the projection to month end."""
        at = _now(now)
        month = month or month_key(at)
        month_bounds(month)  # validates the format
        elapsed = month_elapsed(month, at)
        rows = self.db.query(
            "SELECT store, account, source_site, dest_site, kind, COUNT(*) AS n, SUM(bytes) AS b,"
            " SUM(CASE WHEN priced = 1 THEN usd END) AS u, MIN(priced) AS all_priced,"
            " SUM(CASE WHEN state = 'reserved' THEN 1 ELSE 0 END) AS nr,"
            " SUM(CASE WHEN state = 'reserved' AND priced = 1 THEN usd ELSE 0 END) AS ru"
            f" FROM egress_ledger WHERE month = ? AND {COUNTED} GROUP BY store, account, source_site, dest_site, kind"
            " ORDER BY u DESC NULLS LAST, b DESC",
            (month,),
        )
        # Project per account through the tiers (a linear $ projection would ignore that later
        # terabytes are cheaper), then share each account's internet projection among its internet
        # routes by bytes; flat-rate routes (inter-region, same-region) project linearly.
        frac = elapsed
        inet_bytes: dict[str | None, int] = defaultdict(int)
        for r in rows:
            if r["kind"] == "internet" and r["u"] is not None:
                inet_bytes[r["account"]] += int(r["b"] or 0)
        inet_proj = {acct: self._project_internet_usd(acct, rows, month, at) for acct in inet_bytes}
        routes = []
        total_b = 0
        total_u = 0.0
        unpriced = 0
        for r in rows:
            b = int(r["b"] or 0)
            u = float(r["u"]) if r["u"] is not None and r["all_priced"] else None
            pu: float | None = None
            if u is not None:
                if r["kind"] == "internet" and inet_bytes[r["account"]]:
                    pu = inet_proj[r["account"]] * b / inet_bytes[r["account"]]
                else:
                    pu = u / frac if 0 < frac < 1 else u
            routes.append(
                RouteSpend(
                    r["store"],
                    r["account"],
                    r["source_site"],
                    r["dest_site"],
                    r["kind"],
                    int(r["n"]),
                    b,
                    u,
                    projected_bytes(b, month, at),
                    pu,
                    int(r["nr"] or 0),
                    float(r["ru"] or 0.0),
                )
            )
            total_b += b
            if r["u"] is not None:
                total_u += float(r["u"])
            if u is None and r["kind"] != "local":
                unpriced += b
        proj_usd = sum(r.projected_usd or 0.0 for r in routes)
        budgets = self._budget_statuses(month, routes)
        return EgressReport(
            month,
            at.timestamp(),
            elapsed,
            tuple(routes),
            budgets,
            total_b,
            total_u,
            projected_bytes(total_b, month, at),
            proj_usd,
            unpriced,
            sum(r.in_flight for r in routes),
            sum(r.in_flight_usd for r in routes),
        )

    def _project_internet_usd(self, account: str | None, rows: list[Any], month: str, at: datetime) -> float:
        """The account's internet egress projected to month end, priced through its tiers."""
        inet = [r for r in rows if r["account"] == account and r["kind"] == "internet" and r["u"] is not None]
        spent = sum(float(r["u"]) for r in inet)
        frac = month_elapsed(month, at)
        if frac >= 1 or frac <= 0:
            return spent
        src = next((r["source_site"] for r in inet if r["source_site"]), None)
        site = parse_site(src) if src else None
        prov = self.prices.provider(site.provider, site.region) if site else None
        if prov is None:
            return spent / frac
        usd, _ = tiered_cost(prov.internet_tiers, 0.0, sum(int(r["b"]) for r in inet) / frac / GB)
        return usd

    def _budget_statuses(self, month: str, routes: list[RouteSpend]) -> tuple[BudgetStatus, ...]:
        s = self.settings
        out: list[BudgetStatus] = []
        keys: dict[tuple[str, str], float] = {}
        for k, v in s.budgets.items():
            keys[("store" if k in self.config.stores else "account", k)] = float(v)
        if s.monthly_budget_usd is not None:
            for r in routes:
                if r.account and ("account", r.account) not in keys and r.store not in s.budgets:
                    keys[("account", r.account)] = s.monthly_budget_usd
        for (scope, key), usd in sorted(keys.items()):
            mine = [
                r
                for r in routes
                if (
                    r.store == key if scope == "store" else (r.account == key or (r.account or "").split("/")[0] == key)
                )
            ]
            spent = sum(r.usd or 0.0 for r in mine)
            proj = sum(r.projected_usd or 0.0 for r in mine)
            out.append(BudgetStatus(scope, key, usd, spent, proj))
        return tuple(out)


def describe_decision(decision: GuardDecision) -> str:
    """One line for a CLI or a log: the action and the message."""
    return f"egress {decision.action}: {decision.message}"


# -- jobs that read a store from a node (pull, shard, strip) ------------------------------------------


def reported_bytes(record: Any, key: str) -> int | None:
    """The bytes a job's node says it read from the store: ``key`` in its result when it
    succeeded, else in its last progress point (``bytes_done`` for key ``bytes_done``). None when
    the node said nothing usable (not a whole number from 0 to MAX_TRANSFER_BYTES)."""
    if record.state == "succeeded":
        said = (record.result or {}).get(key) if isinstance(record.result, dict) else None
    elif record.progress is None:
        return 0
    elif key == "bytes_done":
        said = record.progress.bytes_done
    else:
        said = record.progress.extra.get(key, 0)
    if isinstance(said, bool) or not isinstance(said, int) or not 0 <= said <= MAX_TRANSFER_BYTES:
        return None
    return said


def settle_job(config: Config, db: StateDB, record: Any, nbytes: int | None) -> LedgerEntry | None:
    """Console side, once a job that read a store from a node has ended (``JobKind.on_ended``):
    its reservation settles to ``nbytes``, priced on the route it was reserved for and capped at
    the reservation times SETTLE_SLACK (what a node reports is data, never a reason to spend more).

    A job with no reservation in this ledger (launched against another database, or reading no
    store) is not counted; one that ended without moving a byte releases its reservation; a byte
    count the node did not give in a usable form counts at the reservation. Safe to call again.
    """
    guard = EgressGuard(config, db)
    row = guard.ledger.for_job(record.id)
    if row is None or row.state == "settled":
        return row
    note = "" if record.state == "succeeded" else f"{record.state} after {nbytes} bytes"
    if nbytes is None:
        nbytes = row.quoted_bytes if row.quoted_bytes is not None else row.bytes
        note = "the node's byte count was unreadable: counted at its reservation"
    if nbytes == 0 and record.state != "succeeded":
        return guard.release(record.id, f"{record.state}: no bytes moved")
    profile = config.stores.get(row.store) or StoreProfile(url=row.store, name=row.store)
    return guard.record_transfer(profile, row.dest_site, nbytes, job_id=record.id, note=note)


__all__ = [
    "BudgetStatus",
    "EgressGuard",
    "EgressLedger",
    "EgressReport",
    "LedgerEntry",
    "Reservation",
    "Reserved",
    "RouteSpend",
    "describe_decision",
    "reported_bytes",
    "settle_job",
]


# -- fan-out savings (relay pulls) -------------------------------------------------------------------


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
    at = _now(when)
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
