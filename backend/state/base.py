"""What every state backend offers: statements, transactions with a row lock, the audit log.

The state database holds what operators share: job records, the egress ledger and its
reservations, the audit log, pins and milestones, retention journals and apply locks. Two
backends speak the same SQL and one schema (:mod:`backend.state.migrations`):

* :class:`~backend.state.sqlite.SQLiteState`: one file under the data dir, the embedded default;
* :class:`~backend.state.postgres.PostgresState`: ``[state] url = "postgresql://..."``, shared by a
  team.

SQL is written once, with ``?`` placeholders, and uses only what both dialects read the same way
(``ON CONFLICT ... DO``, ``RETURNING``, ``NULLS LAST``). Rows are read by column name.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from backend.errors import LoadmasterError

T = TypeVar("T")

#: A row: read by column name (``row["state"]``).
Row = Mapping[str, Any]


class StateError(LoadmasterError):
    """The state database cannot be used now: the message names it and what to do."""


class StateCorrupt(StateError):
    """The state database is damaged; ``loadmaster state repair`` keeps what can be read."""


class StateUnavailable(StateError):
    """The state database cannot be reached now (server down, network, login refused).

    Monitoring goes on without it; every action that must be recorded (launches under the egress
    guard, retention applies, pins, audit) is refused with this message until it is back.
    """


class StateRetry(Exception):
    """Raised inside a transaction body to run it again (a lost connection, a serialization
    failure); the backend raises it, :meth:`StateDB.transact` retries."""


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


@dataclass(frozen=True)
class Result:
    """What one statement gave back: its rows (``RETURNING`` or a ``SELECT``) and rows changed."""

    rows: list[Row] = field(default_factory=list)
    rowcount: int = 0

    @property
    def id(self) -> int:
        """The ``id`` an ``INSERT ... RETURNING id`` gave back."""
        return int(self.rows[0]["id"]) if self.rows else 0


class StateDB:
    """A thread-safe handle on one state database; subclasses speak to one backend.

    ``execute``/``query`` run one statement each (in autocommit, unless inside
    :meth:`transaction` on the same thread). :meth:`transaction` is one transaction that first
    takes the named row lock (``state_locks``), so two consoles deciding on the same budget or the
    same plan run one after the other, on every backend.
    """

    #: ``sqlite`` or ``postgresql``
    dialect: str = ""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._state_id: str | None = None

    # -- what a backend provides ---------------------------------------------------------------

    def where(self) -> str:
        """Where the database is, for messages (a path, or a URL without any password)."""
        raise NotImplementedError

    def _run(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> Result:
        raise NotImplementedError

    def _run_many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def _tx(self) -> Iterator[None]:
        raise NotImplementedError
        yield  # pragma: no cover

    def schema_lock(self) -> None:
        """Inside a transaction: hold the lock that serializes schema migrations to its end."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # -- statements ----------------------------------------------------------------------------

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Result:
        """Run one statement; its rows (for ``RETURNING``) and the number of rows it changed."""
        with self._lock:
            return self._run(sql, params)

    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[Row]:
        """Every row ``sql`` selects."""
        with self._lock:
            return self._run(sql, params).rows

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement for every row, in one transaction."""
        with self._lock:
            self._run_many(sql, rows)

    @contextlib.contextmanager
    def transaction(self, lock: str | None = None) -> Iterator[StateDB]:
        """One transaction; with ``lock``, first the row lock of that name (held to the end).

        On SQLite the transaction is ``BEGIN IMMEDIATE`` (the whole database is locked for
        writing); on PostgreSQL it takes the row ``state_locks(name = lock)`` with an upsert, which
        blocks another transaction taking the same lock until this one ends. Statements of the
        body go through this handle (``execute``/``query``) on the same thread.
        """
        with self._lock, self._tx():
            if lock is not None:
                self._run(
                    "INSERT INTO state_locks (name, holder, ts) VALUES (?, ?, ?)"
                    " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, ts = excluded.ts",
                    (lock, actor(), time.time()),
                )
            yield self

    def transact(self, body: Callable[[StateDB], T], *, lock: str | None = None, attempts: int = 3) -> T:
        """Run ``body`` in :meth:`transaction`, again from the start when the backend asks for a
        retry (a lost connection before the commit, a serialization failure). ``body`` must be
        safe to run again: it sees what a committed earlier attempt wrote."""
        for attempt in range(attempts):
            try:
                with self.transaction(lock):
                    return body(self)
            except StateRetry as exc:
                if attempt == attempts - 1:
                    raise StateUnavailable(
                        f"state database {self.where()}: {exc}; nothing was recorded, retry when it is back"
                    ) from None
                time.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")

    # -- identity ------------------------------------------------------------------------------

    @property
    def state_id(self) -> str:
        """This database's id (made once, on creation): jobs carry it, so a console knows which
        ledger a job it finds on a node was launched against."""
        if self._state_id is None:
            rows = self.query("SELECT value FROM state_meta WHERE key = 'id'")
            self._state_id = str(rows[0]["value"]) if rows else ""
        return self._state_id

    # -- the audit log -------------------------------------------------------------------------

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
        res = self.execute(
            "INSERT INTO audit (ts, actor, action, target, outcome, plan_hash, reason, detail)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (
                time.time(),
                who or actor(),
                action,
                target,
                outcome,
                plan_hash,
                reason,
                json.dumps(detail or {}, sort_keys=True, default=str),
            ),
        )
        return res.id

    def audit_entries(
        self, *, limit: int = 1000, action: str | None = None, actor_like: str | None = None
    ) -> list[AuditEntry]:
        """Newest first; ``action`` exactly, ``actor_like`` a prefix of who acted (``alice@``)."""
        sql = "SELECT * FROM audit"
        where: list[str] = []
        params: list[Any] = []
        if action:
            where.append("action = ?")
            params.append(action)
        if actor_like:
            where.append("actor LIKE ?")
            params.append(actor_like.replace("%", "") + "%")
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(limit)
        return [
            AuditEntry(
                _audit_number(r, "id", int),
                _audit_number(r, "ts", float),
                r["actor"],
                r["action"],
                r["target"],
                r["outcome"],
                r["plan_hash"],
                r["reason"],
                _detail(r["detail"]),
            )
            for r in self.query(sql, params)
        ]

    def counts(self, tables: Iterable[str]) -> dict[str, int]:
        """Rows per table (``state migrate`` checks a copy with these)."""
        return {t: int(self.query(f"SELECT COUNT(*) AS n FROM {t}")[0]["n"]) for t in tables}


def _audit_number(row: Mapping[str, Any], key: str, kind: Callable[[Any], Any]) -> Any:
    """An audit row's id or time; a damaged file can hold NULL or text there, which is a state error
    naming the repair (never a TypeError from deep inside a view)."""
    try:
        return kind(row[key])
    except (TypeError, ValueError, OverflowError):
        raise StateCorrupt(
            f"the audit log holds a damaged row ({key} is {str(row[key])[:20]!r}); run 'loadmaster state repair'"
        ) from None


def _detail(raw: Any) -> Any:
    """An audit record's detail; a damaged one (a scribbled page) reads as such, never a crash."""
    try:
        return json.loads(raw) if raw else {}
    except (ValueError, TypeError, RecursionError):
        return {"unreadable_detail": True}
