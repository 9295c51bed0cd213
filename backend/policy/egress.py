"""Egress policy, pure: the ``[egress]`` settings, quotes, guard decisions, estimates, projections.

Nothing here reads or writes anything: the guard that consults the ledger and the audit log is
:class:`backend.ledger.EgressGuard`, which builds its decisions with :func:`decide` below.

Terms
-----
* **account**: the source of the monthly tiers and budgets, ``<provider>`` or ``<provider>/<profile>``
  (``aws``, ``aws/prod``); every store with the same provider and credentials profile shares it.
* **route**: source store -> destination site (a node's ``provider:region``).
* GB = 10^9 bytes (see :mod:`backend.policy.prices`).

Config (all optional)::

    [egress]
    monthly_budget_usd = 2000          # per source account unless `budgets` names it
    budgets = { datasets = 500, "aws/prod" = 5000 }   # by store name or account label
    per_transfer_limit_usd = 1000
    action = "confirm"                 # warn | confirm | block, when a budget or limit is exceeded
    warn_at = 0.8                      # warn once a transfer takes spend past 80% of a budget
    unpriced_action = "warn"           # allow | warn | confirm | block for unknown providers
"""

from __future__ import annotations

import calendar
import dataclasses
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from backend.policy.prices import (
    GB,
    PriceTable,
    TierSlice,
    TransferPrice,
    parse_site,
    price_transfer,
    request_cost,
)
from backend.units import bytes_text, usd_text

Action = Literal["allow", "warn", "confirm", "block"]
#: Shard size the "as shards" alternative assumes (the brief's 512 MB WebDataset shards).
SHARD_BYTES = 512 * 10**6
R2_SITE = "cloudflare-r2:auto"


@dataclass(frozen=True)
class EgressSettings:
    """The ``[egress]`` section: budgets, the per-transfer limit and what to do when exceeded."""

    monthly_budget_usd: float | None = None
    budgets: dict[str, float] = field(default_factory=dict)
    per_transfer_limit_usd: float | None = None
    action: Literal["warn", "confirm", "block"] = "confirm"
    warn_at: float = 0.8
    unpriced_action: Literal["allow", "warn", "confirm", "block"] = "warn"
    #: The site (``provider:region``) of the machine the console runs on: what the console itself
    #: reads from a store (a retention strip's export) is priced to it; unset, as internet egress.
    console_site: str | None = None

    def __post_init__(self) -> None:
        for name in ("monthly_budget_usd", "per_transfer_limit_usd"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"{name} must not be negative, got {v!r}")
        for k, v in self.budgets.items():
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise ValueError(f"budgets.{k} must be a non-negative number of USD, got {v!r}")
        if not 0 < self.warn_at <= 1:
            raise ValueError(f"warn_at must be a fraction in (0, 1], got {self.warn_at!r}")


@dataclass(frozen=True)
class Route:
    """Source store -> destination site, with the kind of transfer it is."""

    store: str
    source_site: str | None
    dest_site: str | None
    kind: str

    @property
    def label(self) -> str:
        return f"{self.store} ({self.source_site or '?'}) -> {self.dest_site or '?'}"


@dataclass(frozen=True)
class EgressQuote:
    """The price of one transfer before it runs, from the month-to-date volume before it."""

    bytes: int
    usd: float | None
    tiers: tuple[TierSlice, ...]
    month_to_date_bytes: int
    month_to_date_usd: float
    route: Route
    account: str | None
    month: str
    priced: bool
    note: str
    objects: int = 0
    requests_usd: float = 0.0

    @property
    def total_usd(self) -> float | None:
        return None if self.usd is None else self.usd + self.requests_usd

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tiers"] = [t.as_dict() for t in self.tiers]
        d["total_usd"] = self.total_usd
        return d


@dataclass(frozen=True)
class Budget:
    """Which budget applies to a quote: its scope (store/account), key and monthly USD."""

    scope: Literal["store", "account"]
    key: str
    usd: float


@dataclass(frozen=True)
class GuardDecision:
    """What the guard says about a quote: allow, warn, confirm (ask) or block, and why."""

    action: Action
    message: str
    quote: EgressQuote
    exceeded: tuple[str, ...] = ()
    budget: Budget | None = None
    spent_usd: float = 0.0
    limit_usd: float | None = None
    override_reason: str | None = None

    @property
    def may_start(self) -> bool:
        """True when the transfer may start without asking (allow or warn)."""
        return self.action in ("allow", "warn")

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "message": self.message,
            "exceeded": list(self.exceeded),
            "budget": dataclasses.asdict(self.budget) if self.budget else None,
            "spent_usd": self.spent_usd,
            "limit_usd": self.limit_usd,
            "override_reason": self.override_reason,
            "quote": self.quote.as_dict(),
        }


# -- formatting ------------------------------------------------------------------------------


# -- accounts, budgets, decisions ------------------------------------------------------------


def account_label(provider_key: str | None, profile: str | None) -> str | None:
    """``aws`` or ``aws/prod``: whose monthly tiers and budget a transfer counts against."""
    if provider_key is None:
        return None
    return f"{provider_key}/{profile}" if profile else provider_key


def month_key(when: datetime) -> str:
    """``YYYY-MM`` of the UTC calendar month ``when`` falls in (billing months are UTC)."""
    return when.astimezone(UTC).strftime("%Y-%m")


def month_bounds(month: str) -> tuple[datetime, datetime]:
    """UTC start and end (exclusive) of ``YYYY-MM``."""
    try:
        start = datetime.strptime(month, "%Y-%m").replace(tzinfo=UTC)
    except ValueError:
        raise ValueError(f"month must look like 2026-11, got {month!r}") from None
    days = calendar.monthrange(start.year, start.month)[1]
    end = start.replace(day=1, month=start.month % 12 + 1, year=start.year + (start.month == 12))
    assert (end - start).days == days
    return start, end


def month_elapsed(month: str, now: datetime) -> float:
    """Fraction of ``month`` elapsed at ``now`` (0..1; 1 for past months)."""
    start, end = month_bounds(month)
    frac = (now.astimezone(UTC) - start).total_seconds() / (end - start).total_seconds()
    return min(1.0, max(0.0, frac))


def budget_for(settings: EgressSettings, *, store: str, account: str | None, provider: str | None) -> Budget | None:
    """The budget a transfer from ``store`` counts against: the store's, its account's, or the default."""
    if store in settings.budgets:
        return Budget("store", store, float(settings.budgets[store]))
    for key in (account, provider):
        if key and key in settings.budgets:
            return Budget("account", key, float(settings.budgets[key]))
    if settings.monthly_budget_usd is not None and account:
        return Budget("account", account, settings.monthly_budget_usd)
    return None


def decide(
    quote: EgressQuote,
    settings: EgressSettings,
    *,
    budget: Budget | None,
    spent_usd: float,
    allow_over_budget_reason: str | None = None,
) -> GuardDecision:
    """Apply the budget, per-transfer limit and action to a quote (``spent_usd``: budget scope MTD)."""
    cost = quote.total_usd
    where = quote.route.label
    if not quote.priced or cost is None:
        action: Action = "allow" if quote.route.kind == "local" else settings.unpriced_action
        return GuardDecision(action, f"{where}: {bytes_text(quote.bytes)} not priced ({quote.note})", quote)
    exceeded: list[str] = []
    parts: list[str] = []
    limit = settings.per_transfer_limit_usd
    if limit is not None and cost > limit:
        exceeded.append("per_transfer_limit")
        parts.append(f"this transfer {usd_text(cost)} exceeds the per-transfer limit {usd_text(limit)}")
    near = False
    if budget is not None:
        after = spent_usd + cost
        if after > budget.usd:
            exceeded.append("budget")
            parts.append(
                f"{budget.scope} {budget.key!r} monthly budget {usd_text(budget.usd)}: "
                f"{usd_text(spent_usd)} spent + {usd_text(cost)} = {usd_text(after)}, "
                f"over by {usd_text(after - budget.usd)}"
            )
        elif budget.usd > 0 and after >= settings.warn_at * budget.usd:
            # (A $0 budget is never "near": it is within or over.)
            near = True
            parts.append(
                f"{budget.scope} {budget.key!r} budget {usd_text(budget.usd)} would be "
                f"{after / budget.usd:.0%} used ({usd_text(spent_usd)} spent + {usd_text(cost)})"
            )
    head = f"{where}: {bytes_text(quote.bytes)} for {usd_text(cost)}"
    if not exceeded:
        if budget is None and not parts:
            parts.append("no budget configured")
        elif not parts and budget is not None:
            parts.append(
                f"{budget.scope} {budget.key!r} budget {usd_text(budget.usd)}: "
                f"{usd_text(spent_usd + cost)} after this transfer"
            )
        return GuardDecision(
            "warn" if near else "allow", f"{head}; {'; '.join(parts)}", quote, (), budget, spent_usd, limit
        )
    act: Action = settings.action
    reason = (allow_over_budget_reason or "").strip() or None
    msg = f"{head}; {'; '.join(parts)}"
    if act == "block":
        msg += ' -- blocked by [egress] action = "block"'
    elif act == "confirm":
        if reason:
            act = "allow"
            msg += f" -- allowed over budget: {reason}"
        else:
            msg += " -- confirm to proceed (CLI: --allow-over-budget REASON)"
    else:
        msg += ' -- proceeding ([egress] action = "warn")'
    return GuardDecision(act, msg, quote, tuple(exceeded), budget, spent_usd, limit, reason if act == "allow" else None)


# -- estimates -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EstimateOption:
    """One way of feeding the runs for a month: its bytes out and dollars."""

    key: str
    label: str
    source: str
    dest: str
    bytes_out: int
    egress_usd: float | None
    requests_usd: float | None
    storage_usd: float | None
    total_usd: float | None
    priced: bool
    note: str = ""
    one_time_usd: float | None = None
    break_even_months: float | None = None
    tiers: tuple[TierSlice, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tiers"] = [t.as_dict() for t in self.tiers]
        return d


@dataclass(frozen=True)
class EgressEstimate:
    """A month of runs from ``source`` to ``dest`` and what the alternatives would cost."""

    dataset_bytes: int
    runs: int
    nodes: int
    per_node: Literal["full", "sharded"]
    objects: int
    source: str
    dest: str
    primary: EstimateOption
    alternatives: tuple[EstimateOption, ...]

    def as_dict(self) -> dict[str, Any]:
        p = self.primary
        return {
            "units": {"GB": GB, "currency": "USD"},
            "dataset_bytes": self.dataset_bytes,
            "runs": self.runs,
            "nodes": self.nodes,
            "per_node": self.per_node,
            "objects": self.objects,
            "source": self.source,
            "dest": self.dest,
            "bytes_out": p.bytes_out,
            "egress_usd": p.egress_usd,
            "requests_usd": p.requests_usd,
            "storage_usd": p.storage_usd,
            "total_usd": p.total_usd,
            "priced": p.priced,
            "note": p.note,
            "tiers": [t.as_dict() for t in p.tiers],
            "alternatives": [a.as_dict() for a in self.alternatives],
        }


def _option(
    table: PriceTable,
    key: str,
    label: str,
    source: str,
    dest: str,
    *,
    bytes_out: int,
    gets: int,
    dataset_bytes: int,
    mtd_bytes: int,
) -> EstimateOption:
    price: TransferPrice = price_transfer(table, source, dest, bytes_out, month_to_date_bytes=mtd_bytes)
    site = parse_site(source)
    prices = table.provider(site.provider, site.region)
    if not price.priced or prices is None:
        return EstimateOption(key, label, source, dest, bytes_out, None, None, None, None, False, price.note)
    req = request_cost(prices, gets=gets)
    storage = dataset_bytes / GB * prices.storage_gb_month
    assert price.usd is not None
    return EstimateOption(
        key,
        label,
        source,
        dest,
        bytes_out,
        price.usd,
        req,
        storage,
        price.usd + req,
        True,
        price.note,
        tiers=price.tiers,
    )


def estimate(
    table: PriceTable,
    *,
    dataset_bytes: int,
    runs: int,
    source: str,
    dest: str,
    nodes: int = 1,
    per_node: Literal["full", "sharded"] = "sharded",
    objects: int = 0,
    month_to_date_bytes: int = 0,
) -> EgressEstimate:
    """Monthly bytes out and $ for ``runs`` reads of a dataset, plus the alternatives.

    ``per_node="full"`` models every node syncing the whole dataset (``nodes`` x the bytes);
    ``"sharded"`` models the nodes reading disjoint shards (the dataset once per run). Requests
    are one GET per object read. ``total_usd`` = egress + requests for the month; ``storage_usd``
    (the dataset kept at the source for a month) is reported beside it and counted in break-even.
    """
    if dataset_bytes <= 0:
        raise ValueError("dataset size must be positive, e.g. 40TB")
    if runs < 1:
        raise ValueError(f"runs per month must be at least 1, got {runs}")
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes}")
    if objects < 0:
        raise ValueError(f"objects must not be negative, got {objects}")
    if per_node not in ("full", "sharded"):
        raise ValueError(f"per-node must be 'full' or 'sharded', got {per_node!r}")
    for label, what in ((source, "source"), (dest, "destination")):
        problem = table.site_problem(label, what=what)  # a typo is an error, never a price
        if problem:
            raise ValueError(problem)
    copies = nodes if per_node == "full" else 1
    reads = runs * copies

    def opt(key: str, label: str, src: str, *, reads_: int = reads, objects_: int = objects) -> EstimateOption:
        return _option(
            table,
            key,
            label,
            src,
            dest,
            bytes_out=dataset_bytes * reads_,
            gets=objects_ * reads_,
            dataset_bytes=dataset_bytes,
            mtd_bytes=month_to_date_bytes,
        )

    primary = opt("primary", f"{runs} run(s) from {source}", source)
    alts: list[EstimateOption] = []
    if per_node == "full" and nodes > 1:
        alts.append(
            opt("sharded", f"nodes read disjoint shards ({runs} x the dataset, not {reads})", source, reads_=runs)
        )
    shards = max(1, math.ceil(dataset_bytes / SHARD_BYTES))
    if objects > shards:
        alts.append(opt("shards", f"same data as {shards:,} x 512 MB WebDataset shards", source, objects_=shards))
    src_key = table.canonical(parse_site(source).provider)
    if primary.priced and src_key != "cloudflare-r2" and table.canonical("cloudflare-r2"):
        r2 = opt("r2-read", "the same data read from Cloudflare R2", R2_SITE)
        alts.append(r2)
        alts.append(
            _replication(
                table,
                primary,
                r2,
                source=source,
                dataset_bytes=dataset_bytes,
                objects=objects,
                mtd_bytes=month_to_date_bytes,
            )
        )
    return EgressEstimate(dataset_bytes, runs, nodes, per_node, objects, source, dest, primary, tuple(alts))


def _replication(
    table: PriceTable,
    primary: EstimateOption,
    r2: EstimateOption,
    *,
    source: str,
    dataset_bytes: int,
    objects: int,
    mtd_bytes: int,
) -> EstimateOption:
    """One-time copy of the dataset to R2, then the runs read from R2; break-even in months."""
    copy = price_transfer(table, source, R2_SITE, dataset_bytes, month_to_date_bytes=mtd_bytes)
    src = parse_site(source)
    sp = table.provider(src.provider, src.region)
    r2p = table.provider("cloudflare-r2")
    if not copy.priced or sp is None or r2p is None or r2.total_usd is None or primary.total_usd is None:
        return EstimateOption(
            "r2-replicate",
            "replicate once to R2",
            R2_SITE,
            r2.dest,
            r2.bytes_out,
            None,
            None,
            None,
            None,
            False,
            copy.note,
        )
    assert copy.usd is not None and primary.storage_usd is not None and r2.storage_usd is not None
    one_time = copy.usd + request_cost(sp, gets=objects) + request_cost(r2p, puts=objects)
    now_monthly = primary.total_usd + primary.storage_usd
    after_monthly = r2.total_usd + r2.storage_usd
    saving = now_monthly - after_monthly
    be = one_time / saving if saving > 0 else None
    note = (
        f"one-time copy {bytes_text(dataset_bytes)} out of {source} = {usd_text(one_time)}; "
        f"then {usd_text(after_monthly)}/month vs {usd_text(now_monthly)}/month now "
        f"(storage included; assumes the source copy is deleted, keeping it adds "
        f"{usd_text(primary.storage_usd)}/month)"
    )
    note += f"; pays for itself in {be:.2f} month(s)" if be is not None else "; never pays for itself"
    return dataclasses.replace(
        r2,
        key="r2-replicate",
        label="replicate once to R2, then read from R2",
        one_time_usd=one_time,
        break_even_months=be,
        note=note,
    )


def break_even_month(months: float | None) -> int | None:
    """The first whole month by whose end the replication has paid for itself."""
    return None if months is None else max(1, math.ceil(months))


def projected_bytes(mtd_bytes: int, month: str, now: datetime) -> int:
    """Month-to-date bytes projected linearly to the month's end."""
    frac = month_elapsed(month, now)
    if frac <= 0:
        return mtd_bytes
    return int(mtd_bytes / frac)


# -- operator input and text -----------------------------------------------------------------


def parse_size_text(text: str, *, what: str = "dataset size") -> int:
    """``40TB`` / ``512 GB`` / ``1.5TiB`` -> bytes; ValueError ``size like 40TB`` otherwise."""
    from backend.schema import parse_size

    try:
        n = parse_size(text.strip())
    except ValueError:
        raise ValueError(f"{what}: expected a size like 40TB or 512GB, got {text!r}") from None
    if n <= 0:
        raise ValueError(f"{what}: must be more than 0 bytes, got {text!r}")
    return n


def parse_count_text(text: str, *, what: str, minimum: int = 0) -> int:
    """``16`` / ``500e6`` / ``500,000,000`` -> a whole count of at least ``minimum``."""
    raw = text.strip().replace(",", "").replace("_", "")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{what}: expected a whole number like 16 or 500e6, got {text!r}") from None
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"{what}: expected a whole number, got {text!r}")
    if value < minimum:
        raise ValueError(f"{what}: must be at least {minimum}, got {text!r}")
    return int(value)


def parse_site_text(text: str, *, what: str, table: PriceTable | None = None) -> str:
    """A ``provider:region`` label, validated (against ``table`` too: a provider or region it
    does not know); ValueError naming the expected form, or the known ones, otherwise."""
    from backend.errors import ConfigError

    try:
        site = table.check_site(text, what=what) if table is not None else parse_site(text, what=what)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return site.label


def _tier_gb(gb: float) -> str:
    """Whole GB at tier scale (9,900), three significant digits below 100 GB (3.6, not 4)."""
    return f"{gb:,.0f}" if gb >= 100 else f"{gb:.3g}"


def tier_lines(tiers: tuple[TierSlice, ...]) -> list[str]:
    """``9,900 GB x $0.0900 = $891.00`` per tier touched."""
    return [
        f"{_tier_gb(s.gb)} GB x ${s.usd_per_gb:.4f} = {usd_text(s.usd)}"
        + ("" if s.confirmed else " (unconfirmed rate)")
        for s in tiers
    ]


def estimate_lines(est: EgressEstimate, table: PriceTable | None = None) -> list[str]:
    """The estimate as text lines (CLI and console share them)."""
    p = est.primary
    lines = [
        f"{bytes_text(est.dataset_bytes)} x {est.runs} run(s), {est.nodes} node(s) "
        f"({'every node syncs all of it' if est.per_node == 'full' else 'nodes read disjoint shards'}), "
        f"{est.source} -> {est.dest}   [GB = 10^9 bytes]",
    ]
    if table is not None:
        site = parse_site(est.source)
        prov = table.provider(site.provider, site.region)
        if prov is not None:
            flag = "" if prov.confirmed else ", some figures unconfirmed"
            lines.append(f"prices: {prov.name}, {prov.source} (checked {prov.checked}{flag})")
    lines.append(f"bytes out / month: {bytes_text(p.bytes_out)}")
    if not p.priced:
        lines.append(f"UNPRICED: {p.note}")
        return lines
    lines.append(f"egress:   {usd_text(p.egress_usd)}")
    lines.extend(f"    {t}" for t in tier_lines(p.tiers) if t)
    gets = est.objects * est.runs * (est.nodes if est.per_node == "full" else 1)
    lines.append(
        f"requests: {usd_text(p.requests_usd)}"
        + (f" ({gets:,} GETs)" if est.objects else " (pass objects for request $)")
    )
    lines.append(f"total:    {usd_text(p.total_usd)} / month (+ storage at source {usd_text(p.storage_usd)}/month)")
    if p.note:
        lines.append(f"note: {p.note}")
    if est.alternatives:
        lines.append("alternatives:")
    for a in est.alternatives:
        if not a.priced:
            lines.append(f"  {a.label}: unpriced ({a.note})")
        elif a.key == "r2-replicate":
            be = break_even_month(a.break_even_months)
            when = f"break-even in month {be} ({a.break_even_months:.2f} months)" if be else "never breaks even"
            lines.append(
                f"  {a.label}: {usd_text(a.one_time_usd)} once, then {usd_text(a.total_usd)}/month"
                f" + storage {usd_text(a.storage_usd)}/month; {when}"
            )
        else:
            lines.append(
                f"  {a.label}: {usd_text(a.total_usd)}/month (egress {usd_text(a.egress_usd)}, "
                f"requests {usd_text(a.requests_usd)}, storage {usd_text(a.storage_usd)}/month)"
            )
    return lines


def quote_lines(quote: EgressQuote) -> list[str]:
    """A quote as text lines (shown with the guard's decision before a transfer starts)."""
    lines = [f"{quote.route.label}: {bytes_text(quote.bytes)} ({quote.route.kind})  [GB = 10^9 bytes]"]
    if quote.priced:
        lines.append(
            f"month to date from {quote.account}: {bytes_text(quote.month_to_date_bytes)}, "
            f"{usd_text(quote.month_to_date_usd)}"
        )
        lines.extend(f"    {t}" for t in tier_lines(quote.tiers))
        lines.append(
            f"egress {usd_text(quote.usd)} + requests {usd_text(quote.requests_usd)} = {usd_text(quote.total_usd)}"
        )
    if quote.note:
        lines.append(f"note: {quote.note}")
    return lines


def decision_lines(decision: GuardDecision) -> list[str]:
    """The quote followed by the guard's verdict (``BLOCK: ...``)."""
    return [*quote_lines(decision.quote), f"{decision.action.upper()}: {decision.message}"]
