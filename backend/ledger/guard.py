"""The egress guard every read of a store from a node passes before bytes move: it prices a
transfer at the tiers it will fall in, applies ``[egress]`` (budgets, the per-transfer limit, the
action), reserves a launch's cost under the month's lock and records what the transfer moved.

The steps in the order the operation layer runs them are in :mod:`backend.ledger`'s docstring.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import datetime

from backend.config import Config, StoreProfile
from backend.errors import PolicyError
from backend.ledger import clock
from backend.ledger.records import (
    MAX_TRANSFER_BYTES,
    SETTLE_SLACK,
    EgressReport,
    LedgerEntry,
    OverrideFacts,
    Reservation,
    Reserved,
)
from backend.ledger.store import EgressLedger
from backend.policy.egress import (
    EgressQuote,
    EgressSettings,
    GuardDecision,
    Route,
    account_label,
    budget_for,
    decide,
    month_key,
)
from backend.policy.prices import (
    LOCAL_PROVIDERS,
    PriceOverrides,
    PriceTable,
    parse_site,
    price_table,
    price_transfer,
    request_cost,
)
from backend.state import StateDB, actor


def _is_local(store: StoreProfile) -> bool:
    # A local directory store (with or without provider = "local") moves no cloud bytes.
    provider = (store.provider or "").lower()
    return provider in LOCAL_PROVIDERS or (not provider and not store.is_s3)


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
        when = clock.now(now)
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
        at = clock.now(when)
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
        at = clock.now(now)
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
        from backend.ledger.report import egress_report  # a report's own: not loaded by a pull's guard

        return egress_report(self.db, self.settings, self.prices, self.config.stores, month, at=clock.now(now))


def describe_decision(decision: GuardDecision) -> str:
    """One line for a CLI or a log: the action and the message."""
    return f"egress {decision.action}: {decision.message}"
