"""``loadmaster state check|repair``: find and get past a damaged state database.

``check`` runs SQLite's integrity check on the state file; ``repair`` moves a damaged file aside
(kept as ``state.sqlite3.damaged-<time>``, with its -wal/-shm) and builds a fresh database from
every row that can still be read. Neither opens the database the usual way, so both work when
every other command stops with "state database ... is damaged".
"""

from __future__ import annotations

import argparse
import json
import sys

from backend.errors import LoadmasterError
from backend.services import Services
from backend.state import check_state, repair_state

#: The file name under the state dir (as Services opens it).
STATE_FILE = "state.sqlite3"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``loadmaster state``."""
    p = sub.add_parser("state", help="check or repair the local state database (jobs, ledger, audit)")
    ssub = p.add_subparsers(dest="state_command", metavar="ACTION", required=True)
    c = ssub.add_parser("check", help="run SQLite's integrity check on the state database")
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


def cmd_check(args: argparse.Namespace, services: Services) -> int:
    """Print whether the state database is healthy; exit 1 when it is damaged."""
    path = services.config.state_dir() / STATE_FILE
    problems = check_state(path)
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
    """Rebuild a damaged state database, keeping what can be read."""
    if services.readonly:
        raise LoadmasterError("read-only mode: cannot repair the state database")
    path = services.config.state_dir() / STATE_FILE
    problems = check_state(path)
    if not problems and not args.force:
        msg = (
            f"{path}: ok, nothing to repair (--force rebuilds it anyway)"
            if path.exists()
            else f"{path}: no state database yet; nothing to repair"
        )
        print(json.dumps({"path": str(path), "repaired": False}) if args.json else msg)
        return 0
    report = repair_state(path)
    if args.json:
        print(
            json.dumps(
                {
                    "path": str(report.path),
                    "repaired": True,
                    "backup": str(report.backup),
                    "kept": report.kept,
                    "lost": list(report.lost),
                    "problems": problems,
                }
            )
        )
    else:
        print(report.summary())
    if report.lost:
        print("loadmaster: some rows could not be read; they stay in the damaged file", file=sys.stderr)
    return 0
