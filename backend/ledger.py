"""The egress ledger (SQLite, in the state DB) and the guard every pull passes before bytes move.

The guard's steps, as the operation layer runs them (``backend.ops.pull``; front ends call the
operation, never these; ``services.egress`` is the one guard)::

    guard = services.egress
    quote = guard.quote_transfer(store, node.site, listed_bytes, objects=listed_objects)
    decision = guard.check(quote, allow_over_budget_reason=args.allow_over_budget)
    # show the quote with the verdict: backend.policy.egress.decision_lines(decision)
    if decision.action == "block":       raise PolicyError(decision.message)  # do not start
    if decision.action == "confirm":     refuse unless the operator gave a reason
    if decision.override_reason:         guard.record_override(decision, decision.override_reason)
    ... transfer runs ...
    guard.record_transfer(store, node.site, bytes_moved, job_id=job.id)   # when it finished

* ``quote_transfer`` prices the bytes at the tiers they will fall in, given the month-to-date volume
  out of the same source account already in the ledger (so the 2nd TB costs what the 2nd TB costs).
* ``check`` applies ``[egress]``: the monthly budget of the store or its account, the per-transfer
  limit, and the action (warn | confirm | block). ``confirm`` with a reason becomes ``allow`` with
  ``override_reason`` set; ``block`` cannot be overridden.
* ``record_override`` writes the override and its reason to the audit log (``egress.override``).
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
import threading
from collections import defaultdict
from contextlib import AbstractContextManager
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
    parse_site,
    price_table,
    price_transfer,
    request_cost,
    tiered_cost,
)
from backend.state import StateDB

_DDL = """
CREATE TABLE IF NOT EXISTS egress_ledger (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    month TEXT NOT NULL,
    job_id TEXT,
    store TEXT NOT NULL,
    account TEXT,
    source_site TEXT,
    dest_site TEXT,
    kind TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    usd REAL,
    priced INTEGER NOT NULL,
    month_to_date_bytes INTEGER NOT NULL DEFAULT 0,
    tiers TEXT NOT NULL DEFAULT '[]',
    note TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS egress_ledger_month ON egress_ledger(month, account);
"""


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

    def as_dict(self) -> dict[str, Any]:
        return {
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
    )


class EgressLedger:
    """Finished transfers in the state DB, queried by month, account and route."""

    def __init__(self, db: StateDB) -> None:
        self.db = db
        db.ensure(_DDL)

    def _lock(self) -> AbstractContextManager[Any]:
        # Reading the month-to-date volume and appending must not interleave with another thread's
        # append on the same connection, or two transfers would both be priced from the same start.
        lock = getattr(self.db, "_lock", None)
        return lock if lock is not None else threading.RLock()

    def internet_bytes(self, account: str | None, month: str) -> int:
        """Bytes out to the internet from ``account`` in ``month`` (what the tiers count)."""
        if account is None:
            return 0
        rows = self.db.query(
            "SELECT COALESCE(SUM(bytes), 0) AS b FROM egress_ledger WHERE month = ? AND account = ? AND kind = 'internet'",
            (month, account),
        )
        return int(rows[0]["b"])

    def spent_usd(self, month: str, *, store: str | None = None, account: str | None = None) -> float:
        """Dollars recorded in ``month`` for one store or one account."""
        col, val = ("store", store) if store is not None else ("account", account)
        rows = self.db.query(
            f"SELECT COALESCE(SUM(usd), 0) AS u FROM egress_ledger WHERE month = ? AND {col} = ?", (month, val)
        )
        return float(rows[0]["u"])

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
        price: Any,
        kind: str | None = None,
    ) -> LedgerEntry:
        """Insert one entry (``price`` is a callable(mtd_bytes) -> TransferPrice, run under the lock)."""
        month = month_key(when)
        with self._lock():
            self.db.execute("BEGIN IMMEDIATE")
            try:
                mtd = self.internet_bytes(account, month)
                p = price(mtd)
                cur = self.db.execute(
                    "INSERT INTO egress_ledger (ts, month, job_id, store, account, source_site, dest_site, kind,"
                    " bytes, usd, priced, month_to_date_bytes, tiers, note) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
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
                        p.note,
                    ),
                )
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
        return self.entry(int(cur.lastrowid or 0))

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
                    rows = self.db.query(
                        "SELECT COALESCE(SUM(usd), 0) AS u FROM egress_ledger WHERE month = ?"
                        " AND (account = ? OR account LIKE ?)",
                        (quote.month, provider, f"{provider}/%"),
                    )
                    spent = float(rows[0]["u"])
                else:
                    spent = self.ledger.spent_usd(quote.month, account=budget.key)
        return decide(
            quote, self.settings, budget=budget, spent_usd=spent, allow_over_budget_reason=allow_over_budget_reason
        )

    def record_override(self, decision: GuardDecision, reason: str) -> int:
        """Audit an over-budget transfer the operator allowed, with their reason; returns the audit id."""
        reason = (reason or "").strip()
        if not reason:
            raise PolicyError("an over-budget override needs a reason (--allow-over-budget REASON)")
        if not decision.exceeded:
            raise PolicyError("nothing to override: the transfer is within its budget and limit")
        if self.settings.action == "block":
            raise PolicyError(f'[egress] action is "block": {decision.message}')
        q = decision.quote
        return self.db.record_audit(
            "egress.override",
            q.route.label,
            "allowed-over-budget",
            reason=reason,
            detail={
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
    ) -> LedgerEntry:
        """Record a finished transfer, priced at the tier it fell in given the ledger before it."""
        if nbytes < 0:
            raise PolicyError(f"cannot record a negative byte count ({nbytes})")
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
        )

    # -- reporting -------------------------------------------------------------------------

    def report(self, month: str | None = None, *, now: datetime | float | None = None) -> EgressReport:
        """Month-to-date bytes and $ per route, budgets used, and the projection to month end."""
        at = _now(now)
        month = month or month_key(at)
        month_bounds(month)  # validates the format
        elapsed = month_elapsed(month, at)
        rows = self.db.query(
            "SELECT store, account, source_site, dest_site, kind, COUNT(*) AS n, SUM(bytes) AS b,"
            " SUM(CASE WHEN priced THEN usd END) AS u, MIN(priced) AS all_priced"
            " FROM egress_ledger WHERE month = ? GROUP BY store, account, source_site, dest_site, kind"
            " ORDER BY u DESC, b DESC",
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


__all__ = [
    "BudgetStatus",
    "EgressGuard",
    "EgressLedger",
    "EgressReport",
    "LedgerEntry",
    "RouteSpend",
    "describe_decision",
]
