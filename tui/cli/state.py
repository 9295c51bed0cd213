"""``loadmaster state check|repair|migrate``: the state database's health, and moving it.

``check`` runs SQLite's integrity check on the state file (with ``[state] url``: connects to the
PostgreSQL database and reads its schema version); ``repair`` moves a damaged SQLite file aside
(kept as ``state.sqlite3.damaged-<time>``, with its -wal/-shm) and builds a fresh database from
every row that can still be read. Neither opens the SQLite file the usual way, so both work when
every other command stops with "state database ... is damaged". ``migrate --to URL`` copies the
local SQLite state into a PostgreSQL database (:mod:`backend.state.copy`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from backend.config import config_dir
from backend.ops import Operations
from backend.ops.state import StateError
from backend.services import Services


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``loadmaster state``."""
    p = sub.add_parser("state", help="check, repair or migrate the state database (jobs, ledger, audit) to PostgreSQL")
    ssub = p.add_subparsers(dest="state_command", metavar="ACTION", required=True)
    c = ssub.add_parser(
        "check",
        help="run SQLite's integrity check on the state database ([state] url: connect and read its schema version)",
    )
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=cmd_check)
    r = ssub.add_parser(
        "repair",
        help="move a damaged state database aside and start a fresh one "
        "with every row that can still be read (stop the console first)",
    )
    r.add_argument("--force", action="store_true", help="rebuild even when the check finds no damage")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=cmd_repair)
    m = ssub.add_parser(
        "migrate",
        help="copy the local SQLite state (jobs, egress ledger and reservations, audit, pins, milestones, "
        "retention journals, locks, the database id) into a PostgreSQL database, in one transaction",
        description="Copy the local SQLite state into PostgreSQL, check every table's row count, and say "
        "what to put in the config. The password is never in the URL: libpq reads ~/.pgpass (PGPASSFILE), "
        "PGPASSWORD or a service file.",
    )
    m.add_argument("--to", required=True, metavar="URL", help="postgresql://user@host:5432/dbname (no password)")
    m.add_argument(
        "--merge",
        action="store_true",
        help="the target already holds rows: add the local ones to them; rows whose key is already there are "
        "kept as they are (counted as skipped), audit, job events and ledger rows get new ids (theirs would "
        "collide), the target keeps its database id and the local jobs count in its ledger",
    )
    m.add_argument(
        "--dry-run",
        action="store_true",
        help="copy and check inside a transaction that is rolled back (the target's schema is still created)",
    )
    m.add_argument("--json", action="store_true", help="print one JSON object")
    m.set_defaults(func=cmd_migrate)


def cmd_check(args: argparse.Namespace, services: Services) -> int:
    """Print whether the state database is healthy; exit 1 when it is damaged."""
    if services.config.state.url:
        return _check_postgres(args, services)
    path, problems = Operations(services).state.check_local()
    if args.json:
        print(json.dumps({"path": str(path), "exists": path.exists(), "ok": not problems, "problems": problems}))
    elif not path.exists():
        print(f"{path}: no state database yet (it is created on first use)")
    elif problems:
        print(f"{path}: damaged: {'; '.join(problems[:3])}; run 'loadmaster state repair'")
    else:
        print(f"{path}: ok")
    return 1 if problems else 0


def cmd_repair(args: argparse.Namespace, services: Services) -> int:
    """Rebuild a damaged state database, keeping what can be read (``ops.state.repair``)."""
    try:
        done = Operations(services).state.repair(force=args.force)
    except StateError as exc:
        print(f"loadmaster: error: {exc}", file=sys.stderr)
        return 1
    path, report = done.path, done.report
    if report is None:
        msg = (
            f"{path}: ok, nothing to repair (--force rebuilds it anyway)"
            if path.exists()
            else f"{path}: no state database yet; nothing to repair"
        )
        print(json.dumps({"path": str(path), "repaired": False}) if args.json else msg)
        return 0
    if args.json:
        print(
            json.dumps(
                {
                    "path": str(report.path),
                    "repaired": True,
                    "backup": str(report.backup),
                    "kept": report.kept,
                    "lost": list(report.lost),
                    "problems": done.problems,
                }
            )
        )
    else:
        print(report.summary())
    if report.lost:
        print("loadmaster: some rows could not be read; they stay in the damaged file", file=sys.stderr)
    return 0


def _check_postgres(args: argparse.Namespace, services: Services) -> int:
    """``state check`` with ``[state] url``: connect, read the schema version."""
    checked = Operations(services).state.check_server()
    where, schema, problem = checked.where, checked.schema_version, checked.problem
    if args.json:
        print(
            json.dumps(
                {
                    "where": where,
                    "ok": problem is None,
                    "schema_version": schema,
                    "problems": [problem] if problem else [],
                }
            )
        )
    elif problem:
        print(problem)
    else:
        print(f"{where}: ok (schema version {schema})")
    return 1 if problem else 0


def config_file(services: Services) -> tuple[Path, bool]:
    """The config file this loadmaster reads, and whether it exists (the default config: the
    platform config file to create)."""
    source = services.config.source
    if source == "<embedded default>":
        return config_dir() / "loadmaster.toml", False
    return Path(source).absolute(), True


def cmd_migrate(args: argparse.Namespace, services: Services) -> int:
    """Copy the local SQLite state into the PostgreSQL database ``--to`` (``ops.state.migrate``)."""
    try:
        done = Operations(services).state.migrate(args.to, merge=args.merge, dry_run=args.dry_run)
    except StateError as exc:
        print(f"loadmaster: error: {exc}", file=sys.stderr)
        return 1
    report = done.report
    if report is None:
        reason = done.nothing or ""
        print(json.dumps({"source": str(done.source), "migrated": False, "reason": reason}) if args.json else reason)
        return 0
    cfg, exists = config_file(services)
    setting = f'[state] url = "{args.to}"'
    if args.json:
        print(json.dumps({**report.as_dict(), "migrated": not report.dry_run, "config": str(cfg), "set": setting}))
        return 0
    for t in report.tables:
        print(t.line())
    if report.jobs_relabelled:
        print(
            f"{report.jobs_relabelled} job record(s) launched against the local state ({report.source_id}) now "
            f"count in the ledger of {report.target} ({report.state_id})"
        )
    took = f"{report.seconds:.2f} s"
    if report.dry_run:
        print(
            f"dry run: {report.copied} row(s) from {report.source} would go to {report.target} ({took}); "
            "nothing was written"
        )
        return 0
    where = f"in {cfg}" if exists else f"in {cfg} (create it)"
    print(
        f"copied {report.copied} row(s) from {report.source} to {report.target} in {took}; now set "
        f"{setting} {where} (the local file stays where it is; nothing reads it once the url is set)"
    )
    return 0
