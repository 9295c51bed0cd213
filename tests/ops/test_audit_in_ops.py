"""Audit records are written in one place: ``Operation.audit`` (backend/ops/base.py).

Feature code returns what it did; the operation records it (issue #30, item 5). The state
database's writer itself (``StateDB.record_audit`` in backend/state) is where the row is made;
nothing else calls it, and nothing else writes an ``audit`` row with SQL.

``NOT_YET_MOVED`` lists the calls still made outside the operation layer, file by file, each with
what keeps it there. The test fails when a new one appears and when one of these goes (so the
list only shrinks, and is kept true).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The product's code: the library, the front ends and the lab.
PACKAGES = ("backend", "tui", "lab")
#: The one writer outside the state database itself.
WRITER = "backend/ops/base.py"
#: file -> how many ``record_audit`` calls it still makes, and why it has not moved yet.
NOT_YET_MOVED: dict[str, tuple[int, str]] = {
    "backend/retention/apply.py": (
        4,
        "retention.intent/action/reconcile/apply are the apply's write-ahead journal: written mid-apply, "
        "per step, 'action' in one transaction with its journal row and 'apply' even when the apply is "
        "interrupted, so a kill never leaves a deletion unrecorded",
    ),
}
INSERT_AUDIT = re.compile(r"INSERT\s+INTO\s+audit\b", re.IGNORECASE)


def _files() -> list[Path]:
    return sorted(p for pkg in PACKAGES if (ROOT / pkg).is_dir() for p in (ROOT / pkg).rglob("*.py"))


def _audit_calls(path: Path) -> list[int]:
    """Lines of ``<anything>.record_audit(...)`` calls in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "record_audit"
    ]


def test_only_the_operation_layer_writes_audit_records() -> None:
    found: dict[str, list[int]] = {}
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("backend/state/") or rel == WRITER:
            continue
        lines = _audit_calls(path)
        if lines:
            found[rel] = lines
    unexpected = {f: lines for f, lines in found.items() if f not in NOT_YET_MOVED}
    assert not unexpected, (
        f"audit records written outside backend/ops: {unexpected}; return the facts and let the "
        "operation record them with Operation.audit"
    )
    counts = {f: len(lines) for f, lines in found.items()}
    assert counts == {f: n for f, (n, _) in NOT_YET_MOVED.items()}, (
        "NOT_YET_MOVED is out of date (a call moved into backend/ops: take it off the list)",
        counts,
    )


def test_the_writer_is_operation_audit_and_no_sql_writes_the_audit_table() -> None:
    assert _audit_calls(ROOT / WRITER), "Operation.audit no longer calls the state writer"
    sql = [
        p.relative_to(ROOT).as_posix()
        for p in _files()
        if not p.relative_to(ROOT).as_posix().startswith("backend/state/") and INSERT_AUDIT.search(p.read_text())
    ]
    assert sql == []
