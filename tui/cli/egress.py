"""``loadmaster egress``: estimate a month of runs, quote a transfer against the guard, report spend.

GB = 10^9 bytes everywhere; money in USD. Prices come from the shipped table
(``backend/policy/prices.toml``) patched by the config's ``[prices]`` section.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from backend.errors import PolicyError
from backend.ops import Operations
from backend.ops.egress import (
    EgressReport,
    break_even_month,
    decision_lines,
    estimate,
    estimate_lines,
    parse_count_text,
    parse_site_text,
    parse_size_text,
)
from backend.services import Services
from backend.textfmt import align_columns
from backend.units import bytes_text, usd_text


def _arg(fn: Any, what: str, **kw: Any) -> Any:
    def convert(text: str) -> Any:
        try:
            return fn(text, what=what, **kw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = what  # argparse names the type in "invalid <name> value"
    return convert


def _month(text: str) -> str:
    try:
        datetime.strptime(text, "%Y-%m")
    except ValueError:
        raise argparse.ArgumentTypeError(f"month: expected YYYY-MM like 2026-11, got {text!r}") from None
    return text


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``egress estimate``, ``egress quote``, ``egress report`` and ``egress prices``."""
    p = sub.add_parser("egress", help="egress pricing: estimates, transfer quotes, the month's spend")
    es = p.add_subparsers(dest="egress_command", metavar="SUBCOMMAND", required=True)

    e = es.add_parser("estimate", help="monthly bytes out and $ for runs reading a dataset, with alternatives")
    e.add_argument(
        "--bytes",
        required=True,
        type=_arg(parse_size_text, "dataset size"),
        metavar="SIZE",
        help="dataset size, e.g. 40TB (GB = 10^9 bytes)",
    )
    e.add_argument(
        "--runs",
        type=_arg(parse_count_text, "runs", minimum=1),
        default=1,
        metavar="N",
        help="training runs per month reading the dataset (default 1)",
    )
    e.add_argument(
        "--source",
        required=True,
        type=_arg(parse_site_text, "source"),
        metavar="SITE",
        help="where the data lives, provider:region (aws:us-east-1, cloudflare-r2:auto)",
    )
    e.add_argument(
        "--dest",
        required=True,
        type=_arg(parse_site_text, "destination"),
        metavar="SITE",
        help="where the nodes are, provider:region (coreweave:us-east-04)",
    )
    e.add_argument("--nodes", type=_arg(parse_count_text, "nodes", minimum=1), default=1, metavar="N")
    e.add_argument(
        "--per-node",
        choices=("full", "sharded"),
        default="sharded",
        help="full: every node syncs the whole dataset (nodes x the bytes); "
        "sharded: nodes read disjoint shards (default)",
    )
    e.add_argument(
        "--objects",
        type=_arg(parse_count_text, "objects"),
        default=0,
        metavar="N",
        help="objects in the dataset (one GET each per read), e.g. 500e6",
    )
    e.add_argument(
        "--month-to-date",
        type=_arg(parse_size_text, "month-to-date"),
        default=0,
        metavar="SIZE",
        help="bytes already out of the source account this month (default: a fresh month)",
    )
    e.add_argument("--json", action="store_true", help="print JSON")
    e.set_defaults(func=cmd_estimate)

    q = es.add_parser("quote", help="price one transfer from a store and show what the guard decides")
    q.add_argument("--store", required=True, help="store name from the config")
    where = q.add_mutually_exclusive_group(required=True)
    where.add_argument("--node", help="destination node (its site)")
    where.add_argument(
        "--dest", type=_arg(parse_site_text, "destination"), metavar="SITE", help="destination site, provider:region"
    )
    q.add_argument("--bytes", required=True, type=_arg(parse_size_text, "transfer size"), metavar="SIZE")
    q.add_argument("--objects", type=_arg(parse_count_text, "objects"), default=0, metavar="N")
    q.add_argument(
        "--allow-over-budget",
        metavar="REASON",
        help="proceed over a budget/limit under action = confirm (recorded with the reason)",
    )
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(func=cmd_quote)

    r = es.add_parser("report", help="month-to-date bytes and $ per route, budgets and month-end projection")
    r.add_argument("--month", type=_month, help="YYYY-MM (default: this month, UTC)")
    r.add_argument("--json", action="store_true", help="print JSON")
    r.set_defaults(func=cmd_report)

    pr = es.add_parser("prices", help="the price table in use, with sources and unconfirmed figures")
    pr.add_argument("--json", action="store_true", help="print JSON")
    pr.set_defaults(func=cmd_prices)


def cmd_estimate(args: argparse.Namespace, services: Services) -> int:
    """Print the estimate for a month of runs and its alternatives."""
    table = Operations(services).egress.prices()
    try:
        est = estimate(
            table,
            dataset_bytes=args.bytes,
            runs=args.runs,
            source=args.source,
            dest=args.dest,
            nodes=args.nodes,
            per_node=args.per_node,
            objects=args.objects,
            month_to_date_bytes=args.month_to_date,
        )
    except ValueError as exc:
        raise PolicyError(str(exc)) from None
    if args.json:
        d = est.as_dict()
        for a in d["alternatives"]:
            a["break_even_month"] = break_even_month(a["break_even_months"])
        print(json.dumps(d, indent=2))
        return 0
    print("\n".join(estimate_lines(est, table)))
    if not args.month_to_date:
        print("assumes a fresh month for the source account (pass --month-to-date SIZE otherwise)")
    return 0


def cmd_quote(args: argparse.Namespace, services: Services) -> int:
    """Quote one transfer and show the guard's decision; exit 3 when it would not start."""
    q = Operations(services).egress.quote(
        args.store, args.bytes, objects=args.objects, node=args.node, site=args.dest, reason=args.allow_over_budget
    )
    decision = q.decision
    if args.json:
        print(json.dumps({**decision.as_dict(), "audit_id": q.audit_id}, indent=2, default=str))
    else:
        print("\n".join(decision_lines(decision)))
        if q.audit_id:
            print(f"override recorded in the audit log (#{q.audit_id})")
    return 0 if decision.may_start else 3


def _report_lines(rep: EgressReport) -> list[str]:
    as_of = datetime.fromtimestamp(rep.as_of, UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"Egress {rep.month} (as of {as_of}, {rep.elapsed:.0%} of the month)  [GB = 10^9 bytes]"]
    if not rep.routes:
        lines.append("no transfers recorded this month")
    else:
        rows = [["ROUTE", "KIND", "TRANSFERS", "BYTES", "USD", "PROJECTED"]]
        for r in rep.routes:
            rows.append(
                [r.label, r.kind, str(r.transfers), bytes_text(r.bytes), usd_text(r.usd), usd_text(r.projected_usd)]
            )
        lines += align_columns(rows)
    lines.append(
        f"total: {bytes_text(rep.bytes)}, {usd_text(rep.usd)}; projected to month end: "
        f"{bytes_text(rep.projected_bytes)}, {usd_text(rep.projected_usd)}"
    )
    if rep.in_flight:
        lines.append(
            f"in flight: {rep.in_flight} running transfer(s) counted at their quote, {usd_text(rep.in_flight_usd)},"
            " until they settle"
        )
    if rep.unpriced_bytes:
        lines.append(f"unpriced: {bytes_text(rep.unpriced_bytes)} from stores without prices")
    for b in rep.budgets:
        lines.append(
            f"budget {b.scope} {b.key!r}: {usd_text(b.spent_usd)} of {usd_text(b.budget_usd)} "
            f"({b.fraction:.0%}), projected {usd_text(b.projected_usd)}"
        )
    return lines


def cmd_report(args: argparse.Namespace, services: Services) -> int:
    """Print the month's egress per route from the ledger."""
    rep = Operations(services).egress.report(args.month)
    if args.json:
        print(json.dumps(rep.as_dict(), indent=2))
    else:
        print("\n".join(_report_lines(rep)))
    return 0


def cmd_prices(args: argparse.Namespace, services: Services) -> int:
    """Print the price table in use."""
    table = Operations(services).egress.prices()
    if args.json:
        out = {}
        for k, p in table.providers.items():
            d = {
                f: getattr(p, f)
                for f in (
                    "name",
                    "aliases",
                    "source",
                    "checked",
                    "confirmed",
                    "unconfirmed",
                    "note",
                    "storage_gb_month",
                    "get_per_1000",
                    "put_per_1000",
                    "inter_region_per_gb",
                    "same_region_per_gb",
                )
            }
            d["internet_tiers"] = [t.__dict__ for t in p.internet_tiers]
            d["aliases"] = list(p.aliases)
            d["unconfirmed"] = list(p.unconfirmed)
            d["known_regions"] = list(p.known_regions)
            out[k] = d
        sites = {
            k: {"name": c.name, "aliases": list(c.aliases), "known_regions": list(c.known_regions)}
            for k, c in table.sites.items()
        }
        print(json.dumps({"units": {"GB": 10**9, "currency": "USD"}, "providers": out, "sites": sites}, indent=2))
        return 0
    print("GB = 10^9 bytes; tiers are cumulative over the month's volume from one account")
    for k, p in table.providers.items():
        flag = "" if p.confirmed else "  [some figures unconfirmed]"
        print(f"{k} ({', '.join(p.aliases)}): {p.name}{flag}")
        print(f"  source {p.source}, checked {p.checked}")
        bounds = []
        lower = 0.0
        for t in p.internet_tiers:
            upper = "..." if t.up_to_gb is None else f"{t.up_to_gb:,.0f}"
            bounds.append(f"{lower:,.0f}-{upper} GB ${t.usd_per_gb:g}{'' if t.confirmed else '?'}")
            lower = t.up_to_gb or lower
        print(f"  internet egress: {'; '.join(bounds)}")
        print(
            f"  inter-region ${p.inter_region_per_gb:g}/GB, same region ${p.same_region_per_gb:g}/GB, "
            f"GET ${p.get_per_1000:g}/1000, PUT/LIST ${p.put_per_1000:g}/1000, "
            f"storage ${p.storage_gb_month:g}/GB-month"
        )
        if p.unconfirmed:
            print(f"  unconfirmed: {', '.join(p.unconfirmed)}")
        print(f"  regions: {', '.join(p.known_regions) if p.known_regions else 'any'}")
    names = ", ".join(
        f"{k} ({c.name}{': ' + ' '.join(c.known_regions) if c.known_regions else ''})" for k, c in table.sites.items()
    )
    print(f"where nodes run (storage not priced; any region unless listed): {names}")
    return 0
