"""``loadmaster restage RUN --nodes LIST``: stage the restart on the nodes that will resume."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backend.services import Services


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "restage",
        help="pull the newest proven-resumable step once and relay it to the nodes that will resume",
        description=(
            "Picks the newest step of RUN proven resumable (deny by default: no proof, no pick, and "
            "why), quotes the pull (the egress guard), pulls it from the store once and relays it "
            "between the nodes, verified; reports the time to resume-ready and the egress saved."
        ),
    )
    p.add_argument("run", metavar="RUN", help="the run folder in the store (s3://bucket/prefix)")
    p.add_argument("--nodes", metavar="LIST", required=True, help="the nodes that will resume (node-[01-04])")
    p.add_argument("--dest", metavar="DIR", help="where on each node (default: restart/<step folder>)")
    p.add_argument("--dry-run", action="store_true", help="show the pick and the plan; pull nothing")
    p.add_argument("--yes", action="store_true", help="do not ask before pulling")
    p.add_argument("--allow-over-budget", metavar="REASON", help="go over the egress budget (audited)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout (the plan on stderr)")
    p.set_defaults(func=run_restage)


async def run_restage(args: argparse.Namespace, services: Services) -> int:
    from backend.ops import Operations
    from backend.textfmt import safe_text

    ops = Operations(services).triage
    if not args.dry_run:
        ops.refuse_if_readonly("restage a run")  # before the listing: the pull would refuse anyway
    plan = await ops.restage_plan(args.run, args.nodes, dest=args.dest, reason=args.allow_over_budget)
    out = sys.stderr if args.json else sys.stdout
    for line in plan.lines():
        print(safe_text(line, 400), file=out)
    if args.dry_run:
        if args.json:
            print(json.dumps(plan.as_json(), default=str))
        return 0 if plan.startable else 1
    if plan.startable and not args.yes:
        assert plan.preview is not None
        _confirm(f"pull step {plan.checkpoint['step']} to {len(plan.preview.plan.nodes)} node(s)?")
    # Without a pick (or past the egress guard) the operation refuses, audited, with the reason.
    result = await ops.restage(plan)
    for line in result.lines():
        print(safe_text(line, 400), file=out)
    if args.json:
        print(json.dumps(result.as_json(), default=str))
    return 0 if result.ok else 1


def _confirm(prompt: str) -> None:
    from backend.errors import ConfigError

    if not sys.stdin.isatty():
        raise ConfigError("not confirmed: pass --yes to proceed without a terminal")
    if input(f"{prompt} [y/N] ").strip().lower() not in ("y", "yes"):
        raise ConfigError("not confirmed: nothing was pulled")
