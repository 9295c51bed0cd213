"""``loadmaster retention plan|apply|pin|unpin`` and ``loadmaster audit``."""

from __future__ import annotations

import argparse
import dataclasses
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from backend.errors import PolicyError
from backend.ops import Operations
from backend.ops.retention import RetentionPlan, RetentionPolicy, parse_pin, parse_step_list
from backend.ops.types import parse_duration
from backend.services import Services
from backend.textfmt import align_columns, safe_text
from backend.units import bytes_text, usd_text


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the retention and audit commands."""
    ret = sub.add_parser(
        "retention",
        help="plan and apply checkpoint retention (keep, strip to BF16, delete)",
        description="Plan which checkpoints of a run to keep full, strip to BF16 weights or "
        "delete; review the plan file; apply it with --yes.",
    )
    rs = ret.add_subparsers(dest="retention_command", metavar="ACTION", required=True)

    p = rs.add_parser("plan", help="compute a retention plan from a fresh listing of a run folder")
    p.add_argument(
        "url",
        metavar="URL",
        help="run folder: s3://bucket/run, STORE/run (a configured store), or a local directory (relative or absolute)",
    )
    _policy_flags(p)
    p.add_argument(
        "--in-flight",
        action="append",
        default=[],
        metavar="STEP_PATH",
        help="a step folder a running job is still writing (never touched); repeatable",
    )
    p.add_argument("--out", metavar="PLAN.json", help="write the plan file here for review and apply")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--dry-run", action="store_true", help="accepted for symmetry: planning never changes anything")
    p.set_defaults(func=cmd_plan)

    a = rs.add_parser("apply", help="apply a reviewed plan file (needs --yes; re-checks the listing first)")
    a.add_argument("plan", metavar="PLAN.json")
    a.add_argument("--yes", action="store_true", help="really delete/strip (without it nothing is changed)")
    a.add_argument("--dry-run", action="store_true", help="re-check and show what would happen, change nothing")
    a.add_argument(
        "--in-flight",
        action="append",
        default=[],
        metavar="STEP_PATH",
        help="a step folder a running job is still writing; repeatable",
    )
    a.add_argument(
        "--allow-over-budget",
        metavar="REASON",
        help="strips read their steps into this machine, priced at [egress] console_site: go on although "
        "the egress guard asks for confirmation (recorded with REASON)",
    )
    a.add_argument("--json", action="store_true", help="print the result as JSON")
    a.set_defaults(func=cmd_apply)

    pin = rs.add_parser("pin", help="pin a step so no plan touches it (recorded, audited)")
    pin.add_argument("url", metavar="URL")
    pin.add_argument("pin", metavar="STEP[:REASON]")
    pin.set_defaults(func=cmd_pin)
    unpin = rs.add_parser("unpin", help="remove a pin")
    unpin.add_argument("url", metavar="URL")
    unpin.add_argument("step", type=int, metavar="STEP")
    unpin.set_defaults(func=cmd_unpin)
    ms = rs.add_parser("milestone", help="mark a step a milestone (kept as BF16 weights at least; recorded, audited)")
    ms.add_argument("url", metavar="URL")
    ms.add_argument("step", type=int, metavar="STEP")
    ms.add_argument("--remove", action="store_true", help="remove the mark instead")
    ms.set_defaults(func=cmd_milestone)
    lk = rs.add_parser("unlock", help="remove the apply lock an apply that died left on a run (audited)")
    lk.add_argument("url", metavar="URL")
    lk.set_defaults(func=cmd_unlock)

    au = sub.add_parser("audit", help="show the audit log (every destructive or guarded action)")
    au.add_argument("--json", action="store_true", help="print entries as JSON (newest first)")
    au.add_argument("--limit", type=int, default=50, help="how many entries (default 50)")
    au.add_argument("--action", help="only this action, e.g. retention.apply")
    au.add_argument("--actor", metavar="WHO", help="only what this operator did (user or user@host, a prefix)")
    au.set_defaults(func=cmd_audit)


def _policy_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("policy (defaults from the [retention] config section)")
    g.add_argument("--keep-full", type=int, metavar="N", help="keep the latest N complete checkpoints full")
    g.add_argument("--milestone-every", type=int, metavar="N", help="every step divisible by N is a milestone")
    g.add_argument("--milestones", metavar="S1,S2", help="explicit milestone steps, e.g. 48000,96000")
    g.add_argument("--milestone-marker", metavar="NAME", help="object name that marks a milestone (MILESTONE)")
    g.add_argument("--pin", action="append", default=[], metavar="STEP[:REASON]", help="keep a step untouched")
    g.add_argument(
        "--others",
        choices=["delete", "keep-weights"],
        help="what happens to steps that are neither recent nor milestones",
    )
    g.add_argument("--min-age", metavar="DURATION", help="never touch steps younger than this, e.g. 2h")


def policy_from_args(base: RetentionPolicy, args: argparse.Namespace) -> RetentionPolicy:
    """The config's policy with the command-line flags applied on top."""
    changes: dict[str, Any] = {}
    if args.keep_full is not None:
        changes["keep_full_latest"] = args.keep_full
    if args.milestone_every is not None:
        changes["milestone_every"] = args.milestone_every
    if args.milestones is not None:
        changes["milestones"] = parse_step_list(args.milestones)
    if args.milestone_marker is not None:
        changes["milestone_marker"] = args.milestone_marker
    if args.others is not None:
        changes["others"] = args.others
    if args.min_age is not None:
        try:
            changes["min_age"] = parse_duration(args.min_age)
        except ValueError as exc:
            raise PolicyError(f"--min-age: {exc}") from None
    try:
        policy = dataclasses.replace(base, **changes)
    except ValueError as exc:
        raise PolicyError(str(exc)) from None
    # Flags override config pins of the same step.
    flag_pins = [parse_pin(x) for x in args.pin]
    kept = tuple(p for p in policy.pins if p.step not in {f.step for f in flag_pins})
    return dataclasses.replace(policy, pins=kept + tuple(flag_pins))


def format_plan(plan: RetentionPlan) -> str:
    """The plan as an operator reads it: one line per step, then the totals."""
    rows = [("STEP", "KIND", "ACTION", "BEFORE", "AFTER", "FREED", "RESUMABLE", "REASON")]
    for a in plan.actions:
        est = "~" if a.estimated else ""
        proof = "" if a.resumable is None else ("verified" if a.resumable == "verified" else "FAILED")
        reason = a.reason if a.resumable in (None, "verified") else f"{a.reason}; deep check: {a.resumable}"
        rows.append(
            (
                str(a.step) if a.step is not None else a.path,
                a.kind,
                a.action,
                bytes_text(a.bytes_before),
                est + bytes_text(a.bytes_after),
                est + bytes_text(a.bytes_freed),
                proof,
                reason,
            )
        )
    lines = align_columns(rows)
    t = plan.totals
    money = (
        f", {usd_text(t.usd_month_saved)}/month saved ({plan.price_note})"
        if t.usd_month_saved is not None
        else f" ({plan.price_note})"
        if plan.price_note
        else ""
    )
    counts = ", ".join(
        f"{plan.count(x)} {x}"
        for x in ("keep-full", "strip-to-weights", "keep-weights", "delete", "skip")
        if plan.count(x)
    )
    lines += [
        "",
        f"plan {plan.hash[:12]} for {plan.url}: {counts}",
        f"before {bytes_text(t.bytes_before)} -> after {bytes_text(t.bytes_after)}: "
        + (
            f"hides {bytes_text(t.bytes_saved)}, frees nothing now"
            if plan.keeps_versions
            else f"saves {bytes_text(t.bytes_saved)} ({t.percent_saved:.1f}%){money}"
        ),
    ]
    if plan.keeps_versions:
        lines.append(f"note: {safe_text(plan.versions_note(), None)}")
    if any(a.estimated for a in plan.actions):
        lines.append("~ estimated until the BF16 export is written")
    return "\n".join(lines)


async def cmd_plan(args: argparse.Namespace, services: Services) -> int:
    """Compute and show (or save) a retention plan."""
    policy = policy_from_args(services.config.section(RetentionPolicy), args)
    plan = await Operations(services).retention.plan(args.url, policy, in_flight=args.in_flight)
    if args.out:
        try:
            Path(args.out).write_text(plan.to_json())  # noqa: ASYNC240 - one small file
        except OSError as exc:
            raise PolicyError(f"cannot write the plan file {args.out!r}: {exc.strerror}") from None
    if args.json:
        print(plan.to_json(), end="")
    else:
        print(format_plan(plan))
        if args.out:
            print(f"plan written to {args.out}; apply with: loadmaster retention apply {args.out} --yes")
    return 0


def _load_plan(path: str) -> RetentionPlan:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PolicyError(f"cannot read the plan file {path!r}: {exc.strerror}") from None
    return RetentionPlan.from_json(text, source=path)


async def cmd_apply(args: argparse.Namespace, services: Services) -> int:
    """Apply a plan file (only with --yes), or show what it would do (--dry-run)."""
    plan = _load_plan(args.plan)
    if not args.yes and not args.dry_run:
        print(format_plan(plan))
        raise PolicyError(
            f"nothing changed: add --yes to apply plan {plan.hash[:12]} "
            f"({len(plan.destructive_actions)} destructive actions), or --dry-run to re-check it"
        )
    finished = 0

    def show(o: Any) -> None:
        nonlocal finished
        if not args.json and o.outcome != "running":
            finished += 1  # actions of different steps finish in any order
            print(
                f"[{finished}/{o.total}] {o.path}: {o.action} -> {o.outcome}" + (f" ({o.detail})" if o.detail else "")
            )

    report = await Operations(services).retention.apply(
        plan, dry_run=args.dry_run, in_flight=args.in_flight, progress=show, reason=args.allow_over_budget
    )
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    else:
        for c in report.changes:
            print(f"changed since the plan: {safe_text(c)}")  # names object keys
        print(
            f"{'dry run of' if report.dry_run else 'applied'} plan {plan.hash[:12]}: {report.outcome}; "
            f"{report.count('done')} done, {report.count('already-done')} already done, "
            f"{report.count('stopped')} stopped, {report.count('failed')} failed; "
            f"freed {bytes_text(report.bytes_freed)}"
            + (f"; audit record #{report.audit_id}" if report.audit_id else "")
        )
        if report.hidden_note():
            print(f"note: {report.hidden_note()}")
        if report.count("stopped"):
            print("stopped actions were left untouched: compute a new plan to act on the current listing")
    return 0 if report.ok else 1


def cmd_pin(args: argparse.Namespace, services: Services) -> int:
    """Record a pin for a step."""
    p = parse_pin(args.pin)
    url = Operations(services).retention.pin(args.url, p.step, p.reason)
    print(f"pinned step {p.step} under {url}" + (f" ({p.reason})" if p.reason else ""))
    return 0


def cmd_unpin(args: argparse.Namespace, services: Services) -> int:
    """Remove a pin."""
    url = Operations(services).retention.unpin(args.url, args.step)
    print(f"unpinned step {args.step} under {url}")
    return 0


def cmd_milestone(args: argparse.Namespace, services: Services) -> int:
    """Mark (or with --remove unmark) a step as a milestone."""
    if args.remove:
        url = Operations(services).retention.unmark_milestone(args.url, args.step)
        print(f"step {args.step} under {url} is no longer a milestone")
    else:
        url = Operations(services).retention.mark_milestone(args.url, args.step)
        print(f"step {args.step} under {url} is a milestone: plans keep it as BF16 weights at least")
    return 0


async def cmd_unlock(args: argparse.Namespace, services: Services) -> int:
    """Remove a run's apply lock (after checking who held it)."""
    done = await Operations(services).retention.unlock(args.url)
    if done.held_by is None:
        print(f"{done.url} has no apply lock")
    else:
        print(f"removed the apply lock on {done.url} (held by {done.held_by})")
    return 0


def cmd_audit(args: argparse.Namespace, services: Services) -> int:
    """Show the audit log."""
    entries = Operations(services).state.audit_entries(limit=args.limit, action=args.action, actor_like=args.actor)
    if args.json:
        print(json.dumps([e.as_dict() for e in entries], indent=2, sort_keys=True, default=str))
        return 0
    if not entries:
        print("no audit entries")
        return 0
    for e in entries:
        when = datetime.fromtimestamp(e.ts).strftime("%Y-%m-%d %H:%M:%S")
        extra = f" plan={e.plan_hash[:12]}" if e.plan_hash else ""
        extra += f" reason={e.reason!r}" if e.reason else ""
        n = len(e.detail.get("actions", [])) if isinstance(e.detail, dict) else 0
        extra += f" actions={n}" if n else ""
        print(safe_text(f"#{e.id} {when} {e.actor} {e.action} {e.target} -> {e.outcome}{extra}", None))
    return 0
