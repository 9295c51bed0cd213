"""Local SQLite state: job records, egress ledger, audit log (one file under the data dir).

Each feature module owns its tables and calls :meth:`StateDB.ensure` with its DDL (``CREATE ...
IF NOT EXISTS``); the audit log lives here because every destructive action in every feature
writes to it.
"""

from __future__ import annotations

import getpass
import json
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_AUDIT_DDL = """
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    outcome TEXT NOT NULL,
    plan_hash TEXT,
    reason TEXT,
    detail TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS audit_ts ON audit(ts);
"""


def actor() -> str:
    """Who is acting: ``user@host`` of the console (recorded on jobs and audit entries)."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class AuditEntry:
    id: int
    ts: float
    actor: str
    action: str
    target: str
    outcome: str
    plan_hash: str | None
    reason: str | None
    detail: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class StateDB:
    """A thread-safe handle on the state database (WAL mode, short transactions)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA busy_timeout=30000")
        self.ensure(_AUDIT_DDL)

    def ensure(self, ddl: str) -> None:
        """Create a feature's tables if they do not exist yet."""
        with self._lock:
            self._conn.executescript(ddl)

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        with self._lock:
            return self._conn.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                self._conn.executemany(sql, rows)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def record_audit(
        self,
        action: str,
        target: str,
        outcome: str,
        *,
        detail: dict[str, Any] | None = None,
        plan_hash: str | None = None,
        reason: str | None = None,
        who: str | None = None,
    ) -> int:
        """Append one audit record; returns its id. Never pass secrets in ``detail``."""
        cur = self.execute(
            "INSERT INTO audit (ts, actor, action, target, outcome, plan_hash, reason, detail)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (time.time(), who or actor(), action, target, outcome, plan_hash, reason,
             json.dumps(detail or {}, sort_keys=True, default=str)),
        )
        return int(cur.lastrowid or 0)

    def audit_entries(self, *, limit: int = 1000, action: str | None = None) -> list[AuditEntry]:
        """Newest first."""
        sql = "SELECT * FROM audit"
        params: list[Any] = []
        if action:
            sql += " WHERE action = ?"
            params.append(action)
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(limit)
        return [
            AuditEntry(r["id"], r["ts"], r["actor"], r["action"], r["target"], r["outcome"],
                       r["plan_hash"], r["reason"], json.loads(r["detail"]))
            for r in self.query(sql, params)
        ]

    def close(self) -> None:
        with self._lock:
            self._conn.close()
