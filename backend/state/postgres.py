"""The team backend: ``[state] url = "postgresql://user@host:5432/loadmaster"`` (psycopg 3).

Every operator's console and command line that points at one database shares its ledger and
reservations, audit log, pins, milestones, journals and job records.

* The password never comes from loadmaster: libpq reads ``PGPASSWORD``, ``~/.pgpass``
  (``PGPASSFILE``) or a service file (``PGSERVICE``) itself. A URL holding a password is refused.
* The server down, unreachable or refusing the login is :class:`StateUnavailable`, one line, and
  is not retried more than once every few seconds, so a console keeps monitoring while it is gone
  (the connection is made again on the next use after that).
* A transaction whose connection is lost or that PostgreSQL aborts for serialization is run again
  from its start by :meth:`~backend.state.base.StateDB.transact` (bodies are written to be safe to
  repeat); a lone statement is never repeated unless the server said it ended the session before
  running it, so nothing is recorded twice or half.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

import psycopg
from psycopg import errors as pgerr
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from backend.errors import ConfigError
from backend.state.base import Result, StateDB, StateError, StateRetry, StateUnavailable

#: How long a failed connection attempt stands before the next one (keeps a console responsive).
RECONNECT_AFTER_S = 3.0
#: libpq's connect timeout, and the server-side limits on one statement and on one lock wait.
CONNECT_TIMEOUT_S = 5
STATEMENT_TIMEOUT_MS = 60_000
#: Key of the advisory lock that serializes schema migrations across consoles.
_SCHEMA_LOCK_KEY = 0x6C6D7374  # "lmst"


#: ``password=VALUE`` in a URL query or a key=value conninfo (``sslpassword`` too), quoted or not.
_PASSWORD_KV = re.compile(r"(?i)(\w*password\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s]*)")


def _secrets_in(text: str) -> list[str]:
    """Every password-like value ``text`` (a URL or a key=value conninfo) spells, raw and decoded."""
    found: list[str] = []
    scheme, sep, rest = text.partition("://")
    if sep and "@" in rest:
        userinfo = rest[: rest.rindex("@")]
        if ":" in userinfo:
            found.append(userinfo.split(":", 1)[1])
    found += [m.group(2).strip("'") for m in _PASSWORD_KV.finditer(text)]
    out = []
    for f in found:
        for v in (f, unquote(f)):
            if v and v not in out:
                out.append(v)
    return sorted(out, key=len, reverse=True)


def redact(message: str, url: str) -> str:
    """``message`` with every password ``url`` holds (in any spelling: URL userinfo, a query
    ``password=``, a key=value ``password=``, percent-encoded or not) replaced by ``***``."""
    for secret in _secrets_in(url):
        message = message.replace(secret, "***")
    message = _PASSWORD_KV.sub(lambda m: m.group(1) + "***", message)
    scheme, sep, rest = message.partition("://")
    if sep and "@" in rest and ":" in rest[: rest.rindex("@")]:
        user = rest[: rest.rindex("@")].split(":", 1)[0]
        message = f"{scheme}://{user}:***{rest[rest.rindex('@') :]}"
    return message


def check_url(url: str, *, file: str | None = None) -> dict[str, Any]:
    """The conninfo of ``url``; a password in it, or not a postgresql URL, is a ConfigError (the
    message never holds the password, in any spelling)."""
    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"expected a postgresql:// URL, got {redact(url, url)!r}", file=file, key="state.url")
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(
            f"not a PostgreSQL URL ({_scrubbed_line(exc, url=url)})", file=file, key="state.url"
        ) from None
    if info.get("password"):
        raise ConfigError(
            "the URL holds a password: remove it and put it in ~/.pgpass, PGPASSWORD or a "
            "PostgreSQL service file (libpq reads those; loadmaster never stores it)",
            file=file,
            key="state.url",
        )
    return info


def display_url(info: Mapping[str, Any]) -> str:
    """``postgresql://user@host:port/db`` for messages (there is never a password to hide)."""
    user = f"{info['user']}@" if info.get("user") else ""
    port = f":{info['port']}" if info.get("port") else ""
    return f"postgresql://{user}{info.get('host') or 'localhost'}{port}/{info.get('dbname') or ''}"


@functools.lru_cache(maxsize=512)
def _pg_sql(sql: str) -> str:
    """Portable ``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _scrubbed_line(exc: BaseException, *, url: str) -> str:
    return redact(_first_line(exc), url)


class PostgresState(StateDB):
    """A thread-safe handle on a shared PostgreSQL state database (one connection, autocommit
    outside :meth:`transaction`)."""

    dialect = "postgresql"

    def __init__(self, url: str, *, connect: bool = True) -> None:
        super().__init__()
        self.url = url
        self.info = check_url(url)
        self._where = display_url(self.info)
        self._conn: psycopg.Connection[Any] | None = None
        self._down_until = 0.0
        self._down: StateUnavailable | None = None
        self._in_tx = False
        self._reset_after_tx = False
        self._migrated = False
        if connect:
            # Unreachable now is not fatal: the handle is kept, every use says why it cannot
            # record, and the next use after RECONNECT_AFTER_S tries again. Anything else (the
            # login refused, a schema newer than this loadmaster) is raised at once.
            with self._lock, contextlib.suppress(StateUnavailable):
                self._connection()

    def where(self) -> str:
        return self._where

    # -- the connection ------------------------------------------------------------------------

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        if self._in_tx:
            raise StateRetry("connection lost inside the transaction")
        now = time.monotonic()
        if self._down is not None and now < self._down_until:
            raise self._down
        try:
            conn = psycopg.connect(
                self.url,
                autocommit=True,
                row_factory=dict_row,
                connect_timeout=CONNECT_TIMEOUT_S,
                application_name="loadmaster",
                options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c lock_timeout={STATEMENT_TIMEOUT_MS}",
            )
        except psycopg.Error as exc:
            self._down = self._unavailable(exc)
            self._down_until = now + RECONNECT_AFTER_S
            raise self._down from None
        self._conn, self._down = conn, None
        if self._migrated:
            # Every new connection (after an outage too): a schema another operator's newer
            # loadmaster moved on meanwhile is refused before anything is written.
            self._check_schema(conn)
        if not self._migrated:
            from backend.state.migrations import upgrade

            self._migrated = True  # first: upgrade() runs its statements on this connection
            try:
                upgrade(self)
            except BaseException:
                self._migrated = False
                raise
        return conn

    def _check_schema(self, conn: psycopg.Connection[Any]) -> None:
        from backend.state.migrations import LATEST, newer_schema_error

        try:
            row = conn.execute("SELECT COALESCE(MAX(version), 0) AS v FROM schema_migrations").fetchone()
        except psycopg.Error as exc:
            self._mark_broken()
            raise self._unavailable(exc) from None
        have = int(row["v"]) if row else 0
        if have > LATEST:
            self._mark_broken()
            raise newer_schema_error(self, have)

    def available(self) -> StateUnavailable | None:
        """None when the database answers now, else why not (one line)."""
        try:
            self.query("SELECT 1 AS ok")
        except StateUnavailable as exc:
            return exc
        return None

    def _unavailable(self, exc: BaseException) -> StateUnavailable:
        msg = redact(_first_line(exc), self.url)
        where = self._where
        if "password authentication failed" in msg or "no password supplied" in msg:
            return StateUnavailable(
                f"state database {where} refused the login of {self.info.get('user') or 'this user'}: "
                "set the password in ~/.pgpass (or PGPASSFILE), PGPASSWORD or a service file"
            )
        if "does not exist" in msg and "database" in msg:
            return StateUnavailable(
                f"state database {where} does not exist: create it (createdb -O "
                f"{self.info.get('user') or 'USER'} {self.info.get('dbname') or 'loadmaster'}) or fix [state] url"
            )
        return StateUnavailable(
            f"state database {where} is unreachable ({msg}); monitoring goes on, actions that must be "
            "recorded are refused until it is back"
        )

    def _mark_broken(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    # -- statements ----------------------------------------------------------------------------

    def _translate(self, exc: psycopg.Error) -> BaseException:
        """What the caller sees for ``exc``: a retry inside a transaction, a one-line StateError,
        or the error itself (a programming error)."""
        first = functools.partial(_scrubbed_line, url=self.url)
        if isinstance(exc, pgerr.SerializationFailure | pgerr.DeadlockDetected):
            return (
                StateRetry(first(exc))
                if self._in_tx
                else StateError(f"state database {self._where}: {first(exc)}; retry")
            )
        if isinstance(exc, pgerr.DiskFull):
            return StateError(f"no space left on the disk of state database {self._where}; free some and retry")
        if isinstance(exc, pgerr.QueryCanceled | pgerr.LockNotAvailable):
            return StateError(f"state database {self._where} did not answer in time ({first(exc)}); retry")
        if isinstance(exc, psycopg.OperationalError) or (self._conn is not None and self._conn.broken):
            if self._in_tx:
                self._reset_after_tx = True  # closed when the transaction block has unwound
                return StateRetry(f"connection lost ({first(exc)})")
            self._mark_broken()
            return StateUnavailable(
                f"state database {self._where}: connection lost ({first(exc)}); the action was not recorded, retry"
            )
        if isinstance(exc, pgerr.InsufficientPrivilege):
            return StateError(f"state database {self._where}: {first(exc)} (grant {self.info.get('user')} the tables)")
        return exc

    def _run(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> Result:
        for attempt in (0, 1):
            conn = self._connection()
            try:
                cur = conn.execute(_pg_sql(sql), params or None)
                rows = cur.fetchall() if cur.description else []
                return Result(list(rows), cur.rowcount)
            except pgerr.AdminShutdown as exc:
                # The server ended this session (a restart) before reading the statement: nothing
                # ran, so one more try on a fresh connection cannot record anything twice.
                if self._in_tx or attempt:
                    raise self._translate(exc) from None
                self._mark_broken()
            except psycopg.Error as exc:
                raise self._translate(exc) from None
        raise AssertionError("unreachable")

    def _run_many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self._tx():
            conn = self._connection()
            try:
                with conn.cursor() as cur:
                    cur.executemany(_pg_sql(sql), list(rows))
            except psycopg.Error as exc:
                raise self._translate(exc) from None

    @contextlib.contextmanager
    def _tx(self) -> Iterator[None]:
        if self._in_tx:  # a nested body joins the transaction it is in
            yield
            return
        conn = self._connection()
        self._in_tx = True
        try:
            with conn.transaction():
                yield
        except psycopg.Error as exc:  # raised by BEGIN, COMMIT or the ROLLBACK on a dead connection
            raise self._translate(exc) from None
        finally:
            self._in_tx = False
            if self._reset_after_tx:
                self._reset_after_tx = False
                self._mark_broken()

    def schema_lock(self) -> None:
        self.execute("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK_KEY,))

    def close(self) -> None:
        with self._lock:
            self._mark_broken()


__all__ = ["PostgresState", "check_url", "display_url", "redact"]
