"""The month's egress report (``loadmaster egress report``, the Egress screen, the alert metrics):
spend per route from the ledger, each configured budget's use, and the projection to month end
priced through the tiers (a linear $ projection would ignore that later terabytes are cheaper).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from datetime import datetime
from typing import Any

from backend.ledger.records import BudgetStatus, EgressReport, RouteSpend
from backend.ledger.store import COUNTED
from backend.policy.egress import EgressSettings, month_bounds, month_elapsed, month_key, projected_bytes
from backend.policy.prices import GB, PriceTable, parse_site, tiered_cost
from backend.state import StateDB


def egress_report(
    db: StateDB,
    settings: EgressSettings,
    prices: PriceTable,
    stores: Collection[str],
    month: str | None,
    *,
    at: datetime,
) -> EgressReport:
    """Month-to-date bytes and $ per route of ``month`` (None: the month of ``at``), budgets used
    (``stores``: the configured store names, so a budget key is known as a store's or an
    account's), and the projection to month end as of ``at``."""
    month = month or month_key(at)
    month_bounds(month)  # validates the format
    elapsed = month_elapsed(month, at)
    rows = db.query(
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
    inet_proj = {acct: _project_internet_usd(prices, acct, rows, month, at) for acct in inet_bytes}
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
    budgets = _budget_statuses(settings, stores, routes)
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


def _project_internet_usd(prices: PriceTable, account: str | None, rows: list[Any], month: str, at: datetime) -> float:
    """The account's internet egress projected to month end, priced through its tiers."""
    inet = [r for r in rows if r["account"] == account and r["kind"] == "internet" and r["u"] is not None]
    spent = sum(float(r["u"]) for r in inet)
    frac = month_elapsed(month, at)
    if frac >= 1 or frac <= 0:
        return spent
    src = next((r["source_site"] for r in inet if r["source_site"]), None)
    site = parse_site(src) if src else None
    prov = prices.provider(site.provider, site.region) if site else None
    if prov is None:
        return spent / frac
    usd, _ = tiered_cost(prov.internet_tiers, 0.0, sum(int(r["b"]) for r in inet) / frac / GB)
    return usd


def _budget_statuses(
    settings: EgressSettings, stores: Collection[str], routes: list[RouteSpend]
) -> tuple[BudgetStatus, ...]:
    s = settings
    out: list[BudgetStatus] = []
    keys: dict[tuple[str, str], float] = {}
    for k, v in s.budgets.items():
        keys[("store" if k in stores else "account", k)] = float(v)
    if s.monthly_budget_usd is not None:
        for r in routes:
            if r.account and ("account", r.account) not in keys and r.store not in s.budgets:
                keys[("account", r.account)] = s.monthly_budget_usd
    for (scope, key), usd in sorted(keys.items()):
        mine = [
            r
            for r in routes
            if (r.store == key if scope == "store" else (r.account == key or (r.account or "").split("/")[0] == key))
        ]
        spent = sum(r.usd or 0.0 for r in mine)
        proj = sum(r.projected_usd or 0.0 for r in mine)
        out.append(BudgetStatus(scope, key, usd, spent, proj))
    return tuple(out)
