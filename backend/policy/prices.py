"""What bytes cost: the shipped price table, user overrides, sites and tiered egress arithmetic.

Pure: every function computes from its inputs. The one read is the price table shipped inside the
package (``prices.toml``, each provider with its source URL and the day it was checked); the user's
``[prices]`` section (:class:`PriceOverrides`) patches it.

Units: **GB = 10^9 bytes** (decimal), the unit providers bill in; money in USD.

Internet egress is tiered over the calendar month's volume out of one source account, so a
transfer is priced from the month-to-date volume before it: the 2nd TB of a month costs what the
2nd TB costs (:func:`tiered_cost`). Never price each transfer from zero, never charge the top
tier on the whole volume.

Sites are ``provider:region`` labels (``aws:us-east-1``, ``cloudflare-r2:auto``,
``coreweave:us-east-04``). Providers have aliases (``s3`` -> ``aws``, ``r2`` ->
``cloudflare-r2``, ``gcs`` -> ``gcp``, ``b2`` -> ``backblaze-b2``). A ``local`` store or a provider
missing from the table is *unpriced*: :func:`price_transfer` says so, never a silent $0.

Sites are checked against the table, so a typo is never priced as something else: a provider
must be a priced one or a known *compute site* (``[sites.*]``: GPU clouds that host nodes but
whose storage is not priced), and where a provider lists ``known_regions`` the region must be one
of them. :meth:`PriceTable.check_site` raises for typed input (it lists the known ones);
:func:`price_transfer` turns the same finding into an unpriced quote, which the guard decides
under ``[egress] unpriced_action``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

from backend.errors import ConfigError

GB = 10**9
#: Providers that are never cloud egress: bytes from them are unpriced, by design.
LOCAL_PROVIDERS = frozenset({"local", "file", "posix"})

RouteKind = Literal["internet", "inter-region", "same-region", "unpriced"]


@dataclass(frozen=True)
class Tier:
    """One band of a monthly internet-egress price: up to ``up_to_gb`` of the month's volume."""

    up_to_gb: float | None
    usd_per_gb: float
    confirmed: bool = True


@dataclass(frozen=True)
class TierSlice:
    """The part of one transfer that fell in one tier."""

    from_gb: float
    to_gb: float
    gb: float
    usd_per_gb: float
    usd: float
    confirmed: bool = True

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ProviderPrices:
    """One provider's prices (already specialised to a region when it has region overrides)."""

    key: str
    name: str
    aliases: tuple[str, ...]
    source: str
    checked: str
    internet_tiers: tuple[Tier, ...]
    inter_region_per_gb: float
    same_region_per_gb: float
    get_per_1000: float
    put_per_1000: float
    storage_gb_month: float
    confirmed: bool = True
    unconfirmed: tuple[str, ...] = ()
    note: str = ""
    regions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: The provider's region names; empty: any region is accepted.
    known_regions: tuple[str, ...] = ()

    def for_region(self, region: str | None) -> ProviderPrices:
        """These prices with the region's overrides applied (itself when it has none)."""
        if region and region in self.regions:
            return _apply(self, self.regions[region], where=f"providers.{self.key}.regions.{region}")
        return self

    def unconfirmed_figures(self, kind: RouteKind) -> list[str]:
        """Names of unconfirmed figures a quote of this route kind relies on."""
        out = []
        if kind == "internet" and any(not t.confirmed for t in self.internet_tiers):
            out.append("internet_tiers")
        if kind == "inter-region" and "inter_region_per_gb" in self.unconfirmed:
            out.append("inter_region_per_gb")
        if kind == "same-region" and "same_region_per_gb" in self.unconfirmed:
            out.append("same_region_per_gb")
        return out


@dataclass(frozen=True)
class ComputeSite:
    """A provider that hosts nodes (a GPU cloud, a datacentre) but whose storage is not priced."""

    key: str
    name: str
    aliases: tuple[str, ...] = ()
    #: Its region names; empty: any region (an internet route's price does not depend on it).
    known_regions: tuple[str, ...] = ()


@dataclass(frozen=True)
class PriceTable:
    """Every priced provider, looked up by key or alias, and the known compute sites."""

    providers: Mapping[str, ProviderPrices]
    aliases: Mapping[str, str]
    sites: Mapping[str, ComputeSite] = field(default_factory=dict)

    def canonical(self, provider: str | None) -> str | None:
        """The table key for a provider name or alias; None when not priced."""
        if not provider:
            return None
        p = provider.strip().lower()
        return self.aliases.get(p) or (p if p in self.providers else None)

    def provider(self, provider: str | None, region: str | None = None) -> ProviderPrices | None:
        """A provider's prices for a region, or None when the table does not price it."""
        key = self.canonical(provider)
        return self.providers[key].for_region(region) if key else None

    def compute_site(self, provider: str) -> ComputeSite | None:
        """The compute site a provider name or alias names, or None."""
        p = provider.strip().lower()
        return next((c for c in self.sites.values() if p == c.key or p in c.aliases), None)

    def known_providers(self) -> list[str]:
        """Every provider a site may name: priced, compute sites and local."""
        return sorted({*self.providers, *self.sites, "local"})

    def site_problem(self, label: str, *, what: str = "site") -> str | None:
        """Why ``label`` is not a site this table knows (unknown provider or region), or None."""
        site = parse_site(label, what=what)
        if site.provider in LOCAL_PROVIDERS:
            return None
        key = self.canonical(site.provider)
        compute = None if key else self.compute_site(site.provider)
        if key is None and compute is None:
            return (
                f"{what} {label!r}: unknown provider {site.provider!r} (known: "
                f"{', '.join(self.known_providers())}); add it under [prices.providers] "
                "(priced storage) or [prices.sites] (where nodes run)"
            )
        regions = self.providers[key].known_regions if key else compute.known_regions  # type: ignore[union-attr]
        if site.region is None or not regions or site.region in regions:
            return None
        owner = f"providers.{key}" if key else f"sites.{compute.key}"  # type: ignore[union-attr]
        import difflib  # only for a typo's hint: not on every command that prices bytes

        close = difflib.get_close_matches(site.region, regions, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        return (
            f"{what} {label!r}: unknown region {site.region!r} for {key or site.provider} ({hint}known: "
            f"{', '.join(regions)}); a newer region goes in [prices.{owner}] known_regions"
        )

    def check_site(self, label: str, *, what: str = "site") -> Site:
        """``label`` parsed, or ConfigError naming the unknown provider or region and the known ones."""
        problem = self.site_problem(label, what=what)
        if problem:
            raise ConfigError(problem)
        return parse_site(label, what=what)


@dataclass(frozen=True)
class PriceOverrides:
    """The user's ``[prices]`` section: patches to the shipped price table.

    ``providers`` maps a provider key or alias to the fields to replace (or a whole new provider),
    e.g. ``[prices.providers.aws] internet_tiers = [{up_to_gb = 100, usd_per_gb = 0.0},
    {usd_per_gb = 0.05}]`` for a negotiated rate; ``aliases`` adds names, e.g. ``wasabi = "aws"``.
    """

    providers: dict[str, dict[str, Any]] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    #: Compute sites to add or patch, e.g. ``[prices.sites.onprem] known_regions = ["dc1"]``.
    sites: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Validate now so a bad override is a config error at load time, naming the key.
        if self.providers or self.aliases or self.sites:
            try:
                apply_overrides(default_price_table(), self)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None


@dataclass(frozen=True)
class Site:
    """A ``provider:region`` label split into its parts (provider as written, lower-cased)."""

    provider: str
    region: str | None

    @property
    def label(self) -> str:
        return f"{self.provider}:{self.region}" if self.region else self.provider


@dataclass(frozen=True)
class TransferPrice:
    """What moving ``nbytes`` from a source site to a destination costs, and why."""

    source: str | None
    dest: str | None
    kind: RouteKind
    nbytes: int
    usd: float | None
    tiers: tuple[TierSlice, ...]
    month_to_date_gb: float
    priced: bool
    note: str
    provider: str | None = None

    @property
    def gb(self) -> float:
        return self.nbytes / GB


# -- parsing ---------------------------------------------------------------------------------

_REQUIRED = (
    "internet_tiers",
    "inter_region_per_gb",
    "same_region_per_gb",
    "get_per_1000",
    "put_per_1000",
    "storage_gb_month",
)
_OPTIONAL = ("name", "aliases", "source", "checked", "confirmed", "unconfirmed", "note", "regions", "known_regions")
_RATE_FIELDS = ("inter_region_per_gb", "same_region_per_gb", "get_per_1000", "put_per_1000", "storage_gb_month")


def parse_site(label: str, *, what: str = "site") -> Site:
    """Split ``provider:region`` (``aws:us-east-1``); a bare ``provider`` has no region."""
    text = (label or "").strip()
    provider, sep, region = text.partition(":")
    provider = provider.strip().lower()
    if not provider or (sep and not region.strip()) or " " in text:
        raise ConfigError(f"{what} {label!r} is not a site: write provider:region, e.g. aws:us-east-1")
    return Site(provider, region.strip() or None)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"expected a number, got {value!r}", key=where)
    if value < 0 or math.isnan(value):
        raise ConfigError(f"must not be negative, got {value!r}", key=where)
    return float(value)


def _tiers(value: Any, where: str) -> tuple[Tier, ...]:
    if not isinstance(value, list | tuple) or not value:
        raise ConfigError("expected a non-empty list of {up_to_gb, usd_per_gb} tables", key=where)
    tiers: list[Tier] = []
    prev = 0.0
    for i, raw in enumerate(value):
        w = f"{where}[{i}]"
        if not isinstance(raw, Mapping):
            raise ConfigError("expected a table like {up_to_gb = 100, usd_per_gb = 0.09}", key=w)
        unknown = sorted(set(raw) - {"up_to_gb", "usd_per_gb", "confirmed"})
        if unknown:
            raise ConfigError("unknown key (allowed: up_to_gb, usd_per_gb, confirmed)", key=f"{w}.{unknown[0]}")
        if "usd_per_gb" not in raw:
            raise ConfigError("required key is missing", key=f"{w}.usd_per_gb")
        last = i == len(value) - 1
        up = raw.get("up_to_gb")
        if up is None and not last:
            raise ConfigError("only the last tier may omit up_to_gb", key=f"{w}.up_to_gb")
        if up is not None:
            up = _number(up, f"{w}.up_to_gb")
            if up <= prev:
                raise ConfigError(f"tier bounds must increase (previous bound {prev:g} GB)", key=f"{w}.up_to_gb")
            prev = up
        confirmed = raw.get("confirmed", True)
        if not isinstance(confirmed, bool):
            raise ConfigError("expected true or false", key=f"{w}.confirmed")
        tiers.append(Tier(up, _number(raw["usd_per_gb"], f"{w}.usd_per_gb"), confirmed))
    if tiers[-1].up_to_gb is not None:
        # A bounded last tier would leave volume beyond it unpriced: extend its rate.
        tiers.append(Tier(None, tiers[-1].usd_per_gb, tiers[-1].confirmed))
    return tuple(tiers)


def _fields(raw: Mapping[str, Any], where: str, *, partial: bool) -> dict[str, Any]:
    unknown = sorted(set(raw) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        allowed = ", ".join(sorted((*_REQUIRED, *_OPTIONAL)))
        raise ConfigError(f"unknown key (allowed: {allowed})", key=f"{where}.{unknown[0]}")
    if not partial:
        missing = [k for k in _REQUIRED if k not in raw]
        if missing:
            raise ConfigError("required key is missing", key=f"{where}.{missing[0]}")
    out: dict[str, Any] = {}
    for k, v in raw.items():
        w = f"{where}.{k}"
        if k == "internet_tiers":
            out[k] = _tiers(v, w)
        elif k in _RATE_FIELDS:
            out[k] = _number(v, w)
        elif k in ("aliases", "unconfirmed", "known_regions"):
            out[k] = _strings(v, w, lower=k == "aliases")
        elif k == "confirmed":
            if not isinstance(v, bool):
                raise ConfigError("expected true or false", key=w)
            out[k] = v
        elif k == "regions":
            if not isinstance(v, Mapping) or not all(isinstance(x, Mapping) for x in v.values()):
                raise ConfigError("expected tables like [providers.aws.regions.ap-south-1]", key=w)
            for region, patch in v.items():
                bad = sorted(set(patch) - set(_REQUIRED) - {"confirmed", "unconfirmed", "note", "known_regions"})
                if bad:
                    raise ConfigError("unknown key for a region", key=f"{w}.{region}.{bad[0]}")
                _fields(patch, f"{w}.{region}", partial=True)
            out[k] = {str(r): dict(p) for r, p in v.items()}
        else:
            if not isinstance(v, str):
                raise ConfigError("expected a string", key=w)
            out[k] = v
    return out


def _strings(value: Any, where: str, *, lower: bool = False) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(x, str) for x in value):
        raise ConfigError("expected a list of strings", key=where)
    return tuple(x.lower() if lower else x for x in value)


def _compute_site(key: str, raw: Any, where: str, base: ComputeSite | None = None) -> ComputeSite:
    if not isinstance(raw, Mapping):
        raise ConfigError("expected a table", key=where)
    unknown = sorted(set(raw) - {"name", "aliases", "known_regions"})
    if unknown:
        raise ConfigError("unknown key (allowed: aliases, known_regions, name)", key=f"{where}.{unknown[0]}")
    name = raw.get("name", base.name if base else key)
    if not isinstance(name, str):
        raise ConfigError("expected a string", key=f"{where}.name")
    aliases = (
        _strings(raw["aliases"], f"{where}.aliases", lower=True)
        if "aliases" in raw
        else (base.aliases if base else (key,))
    )
    regions = (
        _strings(raw["known_regions"], f"{where}.known_regions")
        if "known_regions" in raw
        else (base.known_regions if base else ())
    )
    return ComputeSite(key, name, aliases, regions)


def _apply(base: ProviderPrices, patch: Mapping[str, Any], *, where: str) -> ProviderPrices:
    return dataclasses.replace(base, **_fields(patch, where, partial=True))


def _new_provider(key: str, raw: Mapping[str, Any], where: str) -> ProviderPrices:
    f = _fields(raw, where, partial=False)
    return ProviderPrices(
        key=key,
        name=f.get("name", key),
        aliases=f.get("aliases", (key,)),
        source=f.get("source", "user config"),
        checked=f.get("checked", ""),
        internet_tiers=f["internet_tiers"],
        inter_region_per_gb=f["inter_region_per_gb"],
        same_region_per_gb=f["same_region_per_gb"],
        get_per_1000=f["get_per_1000"],
        put_per_1000=f["put_per_1000"],
        storage_gb_month=f["storage_gb_month"],
        confirmed=f.get("confirmed", True),
        unconfirmed=f.get("unconfirmed", ()),
        note=f.get("note", ""),
        regions=f.get("regions", {}),
        known_regions=f.get("known_regions", ()),
    )


def _alias_map(providers: Mapping[str, ProviderPrices], extra: Mapping[str, str], where: str) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for key, p in providers.items():
        for a in (key, *p.aliases):
            if a in aliases and aliases[a] != key:
                raise ConfigError(f"alias {a!r} names both {aliases[a]!r} and {key!r}", key=f"{where}.{key}.aliases")
            aliases[a] = key
    for a, target in extra.items():
        t = aliases.get(str(target).lower())
        if t is None:
            raise ConfigError(f"alias target {target!r} is not a priced provider", key=f"prices.aliases.{a}")
        aliases[a.lower()] = t
    for a in LOCAL_PROVIDERS:
        aliases.pop(a, None)
    return aliases


def parse_price_table(raw: Mapping[str, Any], *, file: str = "prices.toml") -> PriceTable:
    """Validate a parsed price-table document (the shipped ``prices.toml`` layout)."""
    try:
        providers_raw = raw.get("providers")
        if not isinstance(providers_raw, Mapping) or not providers_raw:
            raise ConfigError("expected [providers.<name>] tables", key="providers")
        providers = {
            str(k).lower(): _new_provider(str(k).lower(), v, f"providers.{k}") for k, v in providers_raw.items()
        }
        sites_raw = raw.get("sites", {})
        if not isinstance(sites_raw, Mapping):
            raise ConfigError("expected [sites.<name>] tables", key="sites")
        sites = {str(k).lower(): _compute_site(str(k).lower(), v, f"sites.{k}") for k, v in sites_raw.items()}
        return PriceTable(providers, _alias_map(providers, {}, "providers"), sites)
    except ConfigError as exc:
        raise ConfigError(str(exc), file=file) from None


@functools.cache
def default_price_table() -> PriceTable:
    """The price table shipped with loadmaster (``backend/policy/prices.toml``)."""
    text = resources.files("backend.policy").joinpath("prices.toml").read_text(encoding="utf-8")
    return parse_price_table(tomllib.loads(text))


def apply_overrides(table: PriceTable, overrides: PriceOverrides | None) -> PriceTable:
    """``table`` with the user's ``[prices]`` patches applied."""
    if overrides is None or (not overrides.providers and not overrides.aliases and not overrides.sites):
        return table
    providers = dict(table.providers)
    for name, patch in overrides.providers.items():
        where = f"prices.providers.{name}"
        if not isinstance(patch, Mapping):
            raise ConfigError("expected a table", key=where)
        key = table.canonical(name)
        if key is None and name.lower() in LOCAL_PROVIDERS:
            raise ConfigError("a local store has no egress to price", key=where)
        if key is not None:
            providers[key] = _apply(providers[key], patch, where=where)
        else:
            providers[name.lower()] = _new_provider(name.lower(), patch, where)
    sites = dict(table.sites)
    for name, patch in overrides.sites.items():
        key = name.lower()
        sites[key] = _compute_site(key, patch, f"prices.sites.{name}", sites.get(key))
    return PriceTable(providers, _alias_map(providers, overrides.aliases, "prices.providers"), sites)


def price_table(overrides: PriceOverrides | None = None) -> PriceTable:
    """The shipped table with ``overrides`` applied."""
    return apply_overrides(default_price_table(), overrides)


# -- arithmetic ------------------------------------------------------------------------------


def tiered_cost(tiers: tuple[Tier, ...], start_gb: float, gb: float) -> tuple[float, tuple[TierSlice, ...]]:
    """Cost of ``gb`` more GB when ``start_gb`` already left this month, tier by tier."""
    if gb < 0 or start_gb < 0:
        raise ValueError("volumes must not be negative")
    end = start_gb + gb
    lower = 0.0
    slices: list[TierSlice] = []
    total = 0.0
    for t in tiers:
        upper = math.inf if t.up_to_gb is None else t.up_to_gb
        lo, hi = max(lower, start_gb), min(upper, end)
        if hi > lo:
            usd = (hi - lo) * t.usd_per_gb
            slices.append(TierSlice(lo, hi, hi - lo, t.usd_per_gb, usd, t.confirmed))
            total += usd
        lower = upper
        if lower >= end:
            break
    return total, tuple(slices)


def route_kind(source: Site, dest: Site | None, table: PriceTable) -> RouteKind:
    """Internet, inter-region or same-region, from the canonical providers and regions."""
    src = table.canonical(source.provider)
    if src is None:
        return "unpriced"
    if dest is None:
        return "internet"
    if table.canonical(dest.provider) != src:
        return "internet"
    # An unknown region on either side is charged as inter-region: never assume the free case.
    if source.region == dest.region:
        return "same-region"
    return "inter-region"


def price_transfer(
    table: PriceTable,
    source: str | None,
    dest: str | None,
    nbytes: int,
    *,
    month_to_date_bytes: int = 0,
) -> TransferPrice:
    """Price moving ``nbytes`` from site ``source`` to site ``dest`` given the month so far."""
    if nbytes < 0:
        raise ValueError("byte count must not be negative")
    mtd_gb = month_to_date_bytes / GB
    if not source:
        return TransferPrice(
            source,
            dest,
            "unpriced",
            nbytes,
            None,
            (),
            mtd_gb,
            False,
            "unpriced: the store has no provider/region, so its site is unknown; set provider and region on the store",
        )
    src = parse_site(source, what="source")
    dst = parse_site(dest, what="destination") if dest else None
    if src.provider in LOCAL_PROVIDERS:
        return TransferPrice(
            source,
            dest,
            "unpriced",
            nbytes,
            None,
            (),
            mtd_gb,
            False,
            "unpriced: a local store has no provider egress charge",
        )
    # A typo in a site (aws:us-east1, mars:olympus-1) is never priced as something else.
    for label, what in ((source, "source"), (dest, "destination")):
        problem = table.site_problem(label, what=what) if label else None
        if problem:
            return TransferPrice(source, dest, "unpriced", nbytes, None, (), mtd_gb, False, f"unpriced: {problem}")
    prices = table.provider(src.provider, src.region)
    if prices is None:
        known = ", ".join(sorted(table.providers))
        return TransferPrice(
            source,
            dest,
            "unpriced",
            nbytes,
            None,
            (),
            mtd_gb,
            False,
            f"unpriced: no prices for provider {src.provider!r} (priced: {known}); add them under [prices.providers]",
        )
    kind = route_kind(src, dst, table)
    gb = nbytes / GB
    notes: list[str] = []
    if kind == "internet":
        usd, slices = tiered_cost(prices.internet_tiers, mtd_gb, gb)
        if dst is None:
            notes.append("destination site unknown: priced as internet egress")
    elif kind == "inter-region":
        usd = gb * prices.inter_region_per_gb
        slices = (
            TierSlice(0.0, gb, gb, prices.inter_region_per_gb, usd, "inter_region_per_gb" not in prices.unconfirmed),
        )
    else:
        usd = gb * prices.same_region_per_gb
        slices = (
            TierSlice(0.0, gb, gb, prices.same_region_per_gb, usd, "same_region_per_gb" not in prices.unconfirmed),
        )
    unconf = prices.unconfirmed_figures(kind)
    if kind == "internet" and any(not s.confirmed for s in slices):
        notes.append(f"uses unconfirmed {prices.name} egress tier(s); see {prices.source}")
    elif unconf:
        notes.append(f"uses unconfirmed {prices.name} figure(s): {', '.join(unconf)}")
    return TransferPrice(source, dest, kind, nbytes, usd, slices, mtd_gb, True, "; ".join(notes), provider=prices.key)


def request_cost(prices: ProviderPrices, *, gets: int = 0, puts: int = 0) -> float:
    """Request charges for ``gets`` reads and ``puts`` writes/listings."""
    return gets / 1000 * prices.get_per_1000 + puts / 1000 * prices.put_per_1000
