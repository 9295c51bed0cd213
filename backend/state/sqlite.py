"""The embedded backend: one SQLite file under the data dir (the default without ``[state] url``).

A damaged file (truncated, overwritten, a bad sector) is found when it is opened, or when a damaged
page is first read, and raises :class:`StateCorrupt` with one line naming the file and the way
out: ``loadmaster state repair`` (:func:`repair_state`) moves the damaged file aside as a backup
and copies every row that can still be read into a fresh database. A full disk, a lock held too
long and an unopenable file are one-line :class:`StateError` too, never a traceback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.state.base import Result, StateCorrupt, StateDB, StateError

#: What an operator runs to get going again with a damaged state database.
REPAIR_HINT = (
    "run 'loadmaster state repair' to move it aside and start a fresh one with every row that can still be read"
)
#: SQLite primary result codes (``sqlite3.Error.sqlite_errorcode & 0xff``) loadmaster explains.
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_IOERR = 3, 5, 6, 8, 10
_SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_AUTH, _SQLITE_NOTADB = 11, 13, 14, 23, 26
#: The files SQLite keeps for one database in WAL mode.
_SIDE_FILES = ("", "-wal", "-shm")


def state_error(path: Path | str, exc: BaseException) -> StateError | None:
    """``exc`` from SQLite as a one-line StateError naming ``path``; None for a programming error."""
    if isinstance(exc, OSError):
        return StateError(f"cannot use state database {path}: {exc.strerror or exc}")
    if not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary is None and any(m in str(exc) for m in ("malformed", "not a database", "Could not decode")):
        # "Could not decode to UTF-8": loadmaster writes only UTF-8, so a scribbled page.
        primary = _SQLITE_CORRUPT
    if primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return StateCorrupt(f"state database {path} is damaged ({exc}); {REPAIR_HINT}")
    if primary == _SQLITE_FULL:
        return StateError(f"no space left on the disk of state database {path}; free some and retry")
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return StateError(f"state database {path} stayed locked by another loadmaster ({exc}); retry")
    if primary in (_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_CANTOPEN, _SQLITE_AUTH):
        return StateError(
            f"cannot use state database {path}: {exc} (check the file, its directory "
            "and free space; [state] dir moves it)"
        )
    return None


def private_state(path: Path) -> None:
    """The state dir 0700 and the database's files 0600 (ledger, audit log and job records are
    the team's business, not other local users'). SQLite gives its -wal and -shm files the
    database file's mode, so the file is made 0600 before SQLite opens it."""
    d = path.parent
    st = d.stat()
    # A shared directory (sticky, like /tmp) or the home directory itself is left as it is.
    if st.st_mode & 0o077 and st.st_uid == os.getuid() and not st.st_mode & 0o1000 and d != Path.home():
        os.chmod(d, 0o700)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
    for side in _SIDE_FILES:
        f = Path(f"{path}{side}")
        with contextlib.suppress(FileNotFoundError):
            if f.stat().st_mode & 0o077 and f.stat().st_uid == os.getuid():
                os.chmod(f, 0o600)


class SQLiteState(StateDB):
    """A thread-safe handle on one SQLite state file (WAL mode, short transactions)."""

    dialect = "sqlite"

    def __init__(self, path: Path | str) -> None:
        super().__init__()
        self.path = Path(path)
        with self._guard():
            if str(path) != ":memory:":
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                if self.path.exists() and not self.path.is_file():
                    raise StateError(f"state database {path} is not a regular file; move it away")
                private_state(self.path)
            self._conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30, isolation_level=None)
            self._conn.row_factory = sqlite3.Row
            with self._lock:
                # Reading the header and the schema finds a truncated or overwritten file now,
                # before any command acts on half a database.
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute("PRAGMA synchronous=NORMAL")
                self._conn.execute("PRAGMA busy_timeout=30000")
                self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        from backend.state.migrations import upgrade

        upgrade(self)

    def where(self) -> str:
        return str(self.path)

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """SQLite's and the file system's failures as one-line StateErrors (damage, full disk)."""
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            err = state_error(self.path, exc)
            if err is None:
                raise
            raise err from None

    def _run(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> Result:
        with self._guard():
            cur = self._conn.execute(sql, params)
            rows = cur.fetchall() if cur.description else []
            return Result(rows, cur.rowcount)

    def _run_many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self._tx(), self._guard():
            self._conn.executemany(sql, rows)

    @contextlib.contextmanager
    def _tx(self) -> Iterator[None]:
        # IMMEDIATE takes the write lock at BEGIN: a budget read and the reservation after it see
        # no other writer in between.
        with self._guard():
            self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")
            raise
        try:
            with self._guard():
                self._conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")
            raise

    def schema_lock(self) -> None:
        """Nothing more to take: BEGIN IMMEDIATE already holds the database's write lock."""

    def close(self) -> None:
        """Close the connection."""
        if not hasattr(self, "_conn"):
            return  # opening failed
        with self._lock, contextlib.suppress(sqlite3.Error):
            self._conn.close()


# -- checking and repairing ------------------------------------------------------------------------


def check_state(path: Path | str) -> list[str]:
    """SQLite's ``quick_check`` of the database at ``path``: [] when healthy, else what is wrong."""
    p = Path(path)
    if not p.exists():
        return []
    try:
        conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as exc:
        return [str(exc)]
    try:
        rows = [str(r[0]) for r in conn.execute("PRAGMA quick_check(20)").fetchall()]
        return [] if rows == ["ok"] else rows
    except sqlite3.Error as exc:
        return [str(exc)]
    finally:
        conn.close()


@dataclass(frozen=True)
class RepairReport:
    """What :func:`repair_state` did: where the damaged file went and what was kept."""

    path: Path
    backup: Path
    #: table -> rows copied into the fresh database
    kept: dict[str, int] = field(default_factory=dict)
    #: what could not be read or recreated (tables, ranges of rows, indexes)
    lost: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line: what was kept and where the damaged file is."""
        rows = sum(self.kept.values())
        per = ", ".join(f"{t} {n}" for t, n in sorted(self.kept.items())) or "none"
        tail = f"; could not read: {'; '.join(self.lost)}" if self.lost else ""
        return (
            f"fresh state database at {self.path}: kept {rows} row(s) ({per}); the damaged "
            f"file is kept at {self.backup}{tail}"
        )


def repair_state(path: Path | str, *, stamp: str | None = None) -> RepairReport:
    """Move the database at ``path`` aside (with its -wal/-shm) and build a fresh one from every
    row still readable in it. Stop the console and other commands first."""
    p = Path(path)
    if not p.exists():
        raise StateError(f"no state database at {p}; nothing to repair")
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    backup = p.with_name(f"{p.name}.damaged-{stamp}")
    try:
        for side in _SIDE_FILES:
            src = Path(f"{p}{side}")
            if src.exists():
                os.replace(src, f"{backup}{side}")
    except OSError as exc:
        raise StateError(f"cannot move {p} aside to {backup}: {exc.strerror or exc}") from None
    work = Path(tempfile.mkdtemp(prefix="lm-state-repair-", dir=p.parent))
    fresh = p.with_name(f".{p.name}.repair-{os.getpid()}")
    try:
        # Salvage from a copy: the backup stays exactly as it was found.
        copy = work / "damaged.sqlite3"
        for side in ("", "-wal"):
            if Path(f"{backup}{side}").exists():
                shutil.copyfile(f"{backup}{side}", f"{copy}{side}")
        kept, lost = _salvage(copy, fresh)
        os.replace(fresh, p)
    except (OSError, sqlite3.Error) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise StateError(
            f"cannot write a fresh state database at {p}: {why} (the damaged file is kept at {backup})"
        ) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for side in _SIDE_FILES:
            with contextlib.suppress(OSError):
                Path(f"{fresh}{side}").unlink()
    return RepairReport(p, backup, kept, tuple(lost))


def _salvage(damaged: Path, fresh: Path) -> tuple[dict[str, int], list[str]]:
    """A new database at ``fresh`` with the current schema (every migration applied), holding
    every readable row of every table of ``damaged``: by column name, so a table the damage took
    (or an older file's table) comes back whole, in today's shape."""
    kept: dict[str, int] = {}
    lost: list[str] = []
    SQLiteState(fresh).close()
    src = sqlite3.connect(str(damaged), isolation_level=None)
    dst = sqlite3.connect(str(fresh), isolation_level=None)
    try:
        # writable_schema lets SQLite read a truncated file (header longer than the file) as far
        # as it goes instead of refusing it whole.
        with contextlib.suppress(sqlite3.Error):
            src.execute("PRAGMA writable_schema=ON")
        try:
            schema = src.execute(
                "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'"
            ).fetchall()
        except sqlite3.Error as exc:
            return kept, [f"the schema ({exc}): nothing could be kept"]
        have = {r[0] for r in dst.execute("SELECT name FROM sqlite_master")}
        dst.execute("BEGIN")
        for kind, name, sql in schema:
            # The fresh file's own migration record says what its schema is; keep it.
            if kind != "table" or name == "schema_migrations":
                continue
            if name not in have:  # a table loadmaster does not know: kept as it was
                try:
                    dst.execute(sql)
                except sqlite3.Error as exc:
                    lost.append(f"table {name} ({exc})")
                    continue
            cols = _common_columns(src, dst, name)
            if not cols:
                lost.append(f"table {name} (its columns could not be read)")
                continue
            # The damaged file's database id wins over the fresh one's: jobs carry it.
            n, why = _copy_rows(src, dst, name, cols, replace=name == "state_meta")
            kept[name] = n
            if why:
                lost.append(f"part of table {name} ({why})")
        for kind, name, sql in schema:
            if kind == "table" or name in have:
                continue
            try:
                dst.execute(sql)
            except sqlite3.Error as exc:
                lost.append(f"{kind} {name} ({exc})")
        dst.execute("COMMIT")
    finally:
        src.close()
        dst.close()
    return kept, lost


def _common_columns(src: sqlite3.Connection, dst: sqlite3.Connection, table: str) -> list[str]:
    q = '"' + table.replace('"', '""') + '"'
    try:
        theirs = [r[1] for r in src.execute(f"PRAGMA table_info({q})")]
    except sqlite3.Error:
        return []
    ours = {r[1] for r in dst.execute(f"PRAGMA table_info({q})")}
    return [c for c in theirs if c in ours]


def _copy_rows(
    src: sqlite3.Connection, dst: sqlite3.Connection, table: str, cols: list[str], *, replace: bool = False
) -> tuple[int, str | None]:
    """Rows of ``table`` readable from ``src``, from both ends of the rowid order (a damaged page
    in the middle loses only the rows it held); (rows copied, why some were lost or None)."""
    q = '"' + table.replace('"', '""') + '"'
    names = ", ".join('"' + c.replace('"', '""') + '"' for c in cols)
    verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
    copied = 0
    why: str | None = None
    seen: set[int] = set()

    def rows(sql: str) -> Iterator[sqlite3.Row | tuple[Any, ...]]:
        """Rows of ``sql`` from the damaged file until the first one it cannot read."""
        nonlocal why
        try:
            cur = src.execute(sql)
            while (row := cur.fetchone()) is not None:
                yield row
        except sqlite3.Error as exc:  # only reading the damaged copy may fail here
            why = str(exc)

    def insert(values: Sequence[Any]) -> None:
        nonlocal copied
        dst.execute(f"{verb} INTO {q} ({names}) VALUES ({', '.join('?' * len(values))})", tuple(values))
        copied += 1

    def take(sql: str) -> None:
        for row in rows(sql):
            if row[0] in seen:
                return  # the descending pass met the ascending one
            seen.add(row[0])
            insert(row[1:])

    try:
        src.execute(f"SELECT rowid FROM {q} LIMIT 0")
    except sqlite3.Error:
        # WITHOUT ROWID (or unreadable): one pass, as far as it goes.
        for row in rows(f"SELECT {names} FROM {q}"):
            insert(row)
        return copied, why
    take(f"SELECT rowid, {names} FROM {q} ORDER BY rowid")
    if why is not None:
        take(f"SELECT rowid, {names} FROM {q} ORDER BY rowid DESC")
    return copied, why
