"""Copying the local SQLite state into a PostgreSQL database: ``loadmaster state migrate``.

An operator who starts on the embedded SQLite file and then moves the team to ``[state] url``
keeps everything recorded so far: jobs and their events, the egress ledger with its open
reservations, the audit log, pins, milestones, retention journals, named locks and the database's
id (``state_meta``), so a pull launched from the SQLite state (its spec carries that id) still
settles in the shared ledger when it ends.

How the copy is made:

* The source is opened with :class:`~backend.state.sqlite.SQLiteState` (an older file is upgraded
  first, so its columns are the target's) and read inside one ``BEGIN IMMEDIATE``: a snapshot no
  console can write into while it is copied. The target is opened with
  :class:`~backend.state.postgres.PostgresState`, which creates or upgrades its schema.
* Everything is written in one PostgreSQL transaction that first locks the copied tables against
  writers (readers go on): all or nothing. Rows go in with ``executemany`` in batches of
  :data:`BATCH`; each identity sequence is then moved past the highest copied id.
* Before the commit every table's rows are counted again: the target must hold what it held
  before plus every source row, less those that were already there (``--merge``, found by their
  keys before the copy). A difference rolls everything back.
* A target already holding rows (other than its own id and locks) is refused unless ``merge`` is
  given: then rows whose key is already there are kept as they are and counted as skipped; the
  audit log, job events and ledger rows go in under new ids (their ids would collide; nothing
  refers to them), a ledger row of a job the target already records is skipped, the target keeps
  its own database id and the copied jobs launched against the local id are recorded as launched
  against the target's (their reservations are in its ledger now). The merge is noted in
  ``state_meta`` (``merged:<local id>``), and merging the same local state twice is refused.
* ``dry_run`` does all of it and rolls the transaction back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

from backend.errors import ConfigError
from backend.state.base import StateDB, StateError, StateRetry, StateUnavailable, actor
from backend.state.migrations import ID_TABLES, TABLES
from backend.state.postgres import PostgresState, check_url
from backend.state.sqlite import SQLiteState

#: Rows per ``executemany`` (and per read from the source).
BATCH = 5000
#: Rows per INSERT statement of an ``executemany`` (a multi-row VALUES: psycopg's cost is per
#: statement, not per value; 100 rows of the widest table are 1,800 parameters, far under 65,535).
ROWS_PER_STATEMENT = 100
#: Tables the target fills for itself (its id; the lock rows any transaction with a lock makes):
#: rows there do not make it "in use".
BOOKKEEPING = ("state_meta", "state_locks")
#: ``state_meta`` key prefix recording a merged local state (``merged:<its id>``).
MERGED_PREFIX = "merged:"


class NothingToMigrate(StateError):
    """There is no local state file: nothing to copy."""


@dataclass(frozen=True)
class TableCopy:
    """One table's copy: rows in the source, rows written, rows already in the target."""

    table: str
    source: int
    copied: int
    #: source rows whose key the target already held (``merge``): kept as they were there
    skipped: int = 0
    #: source rows that replaced the target's (``state_meta``'s id on a fresh target)
    replaced: int = 0
    #: rows in the target once copied
    target: int = 0

    def line(self) -> str:
        parts = [f"{self.copied} copied"]
        if self.replaced:
            parts.append(f"{self.replaced} replaced")
        if self.skipped:
            parts.append(f"{self.skipped} already there (kept)")
        line = f"{self.table}: {self.source} local row(s), {', '.join(parts)}; {self.target} in the target"
        if self.table == "state_meta" and self.replaced:
            line += " (the local database id: jobs launched from the local state count in this ledger)"
        return line


@dataclass(frozen=True)
class MigrateReport:
    """What :func:`migrate_state` did (or, with ``dry_run``, would do)."""

    source: Path
    target: str
    source_id: str
    #: the target's database id now: the source's, or (merge) its own
    state_id: str
    merge: bool
    dry_run: bool
    seconds: float
    tables: tuple[TableCopy, ...] = ()
    #: merge: job records launched against the source id, now recorded against the target's
    jobs_relabelled: int = 0

    @property
    def copied(self) -> int:
        return sum(t.copied + t.replaced for t in self.tables)

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": str(self.source),
            "target": self.target,
            "source_id": self.source_id,
            "state_id": self.state_id,
            "merge": self.merge,
            "dry_run": self.dry_run,
            "seconds": round(self.seconds, 3),
            "copied": self.copied,
            "jobs_relabelled": self.jobs_relabelled,
            "tables": {
                t.table: {
                    "source": t.source,
                    "copied": t.copied,
                    "skipped": t.skipped,
                    "replaced": t.replaced,
                    "target": t.target,
                }
                for t in self.tables
            },
        }


class _RolledBack(Exception):
    """Raised inside the transaction of a dry run to roll it back, carrying the report."""

    def __init__(self, report: MigrateReport) -> None:
        super().__init__("dry run")
        self.report = report


def check_target_url(url: str) -> None:
    """A ``--to`` URL: postgresql://, parseable, without a password (ConfigError otherwise; the
    URL itself is never echoed, it could hold one)."""
    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError("expected a postgresql://user@host:5432/dbname URL", key="--to")
    try:
        has_password = urlsplit(url).password is not None
    except ValueError:
        has_password = False
    try:
        check_url(url)
    except ConfigError as exc:
        if "password" not in str(exc):
            raise ConfigError(
                "not a valid PostgreSQL URL: write postgresql://user@host:5432/dbname", key="--to"
            ) from None
        has_password = True
    if has_password:
        raise ConfigError(
            "the URL holds a password: remove it and put it in ~/.pgpass (or PGPASSFILE), PGPASSWORD "
            "or a PostgreSQL service file (libpq reads those; loadmaster never stores it)",
            key="--to",
        )


def migrate_state(
    source_path: Path, url: str, *, merge: bool = False, dry_run: bool = False, batch: int = BATCH
) -> MigrateReport:
    """Copy the SQLite state at ``source_path`` into the PostgreSQL database at ``url``.

    Raises :class:`NothingToMigrate` when there is no file, ConfigError for a URL with a password,
    :class:`StateUnavailable` (one line, nothing written) when the target cannot be reached or
    refuses the login, and StateError when the target is in use (without ``merge``) or the copy
    fails (rolled back).
    """
    check_target_url(url)
    source_path = Path(source_path)
    if not source_path.is_file():
        raise NothingToMigrate(f"no local state at {source_path}: nothing to migrate")
    target = PostgresState(url)
    try:
        down = target.available()
        if down is not None:
            raise down
        source = SQLiteState(source_path)
        try:
            return _copy(source, target, merge=merge, dry_run=dry_run, batch=max(1, batch))
        finally:
            source.close()
    finally:
        target.close()


def _copy(source: SQLiteState, target: PostgresState, *, merge: bool, dry_run: bool, batch: int) -> MigrateReport:
    where = target.where()
    started = time.monotonic()
    table = ""
    try:
        with source.transaction(), target.transaction():
            target.execute(f"LOCK TABLE {', '.join(TABLES)} IN EXCLUSIVE MODE")
            source_id = _meta_id(source)
            target_id = _meta_id(target)
            before = target.counts(TABLES)
            _refuse_unless_fresh(target, before, source_id, target_id, merge=merge)
            tables: list[TableCopy] = []
            src_counts = source.counts(TABLES)
            for table in TABLES:
                tables.append(_copy_table(source, target, table, src_counts[table], before[table], merge, batch))
            table = ""
            relabelled = 0
            if merge:
                # The local ledger is part of the target's now: its jobs settle there.
                relabelled = target.execute(
                    "UPDATE jobs SET state_id = ? WHERE state_id = ?", (target_id, source_id)
                ).rowcount
                target.execute(
                    "INSERT INTO state_meta (key, value) VALUES (?, ?)",
                    (
                        MERGED_PREFIX + source_id,
                        json.dumps({"ts": time.time(), "by": actor(), "from": source.where()}, sort_keys=True),
                    ),
                )
            for t in ID_TABLES:
                # Identity columns have a sequence pg_get_serial_sequence finds: next id = max + 1.
                target.query(
                    f"SELECT setval(pg_get_serial_sequence('{t}', 'id'), COALESCE((SELECT MAX(id) FROM {t}), 0) + 1,"
                    " false) AS v"
                )
            after = target.counts(TABLES)
            tables = [_checked(t, after[t.table], merge) for t in tables]
            report = MigrateReport(
                source=source.path,
                target=where,
                source_id=source_id,
                state_id=target_id if merge else source_id,
                merge=merge,
                dry_run=dry_run,
                seconds=time.monotonic() - started,
                tables=tuple(tables),
                jobs_relabelled=relabelled,
            )
            if dry_run:
                raise _RolledBack(report)
    except _RolledBack as rolled:
        return rolled.report
    except StateRetry as exc:
        raise StateUnavailable(
            f"state database {where}: {exc} during the copy; nothing was written, run it again"
        ) from None
    except psycopg.Error as exc:
        what = f"copying {table} into {where}" if table else f"copying into {where}"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise StateError(f"{what} failed ({first}); nothing was written") from None
    return report


def _meta_id(db: StateDB) -> str:
    rows = db.query("SELECT value FROM state_meta WHERE key = 'id'")
    return str(rows[0]["value"]) if rows else ""


def _refuse_unless_fresh(
    target: PostgresState, before: dict[str, int], source_id: str, target_id: str, *, merge: bool
) -> None:
    where = target.where()
    in_use = [(t, n) for t, n in before.items() if n and t not in BOOKKEEPING]
    if not merge:
        if in_use:
            held = ", ".join(f"{t} ({n})" for t, n in in_use)
            raise StateError(
                f"state database {where} already holds rows in {held}: migrate into an empty database, "
                "or pass --merge to add the local rows to it"
            )
        return
    if source_id and source_id == target_id:
        raise StateError(
            f"state database {where} already has this local state's id ({source_id}): it was migrated "
            "there before; nothing to merge"
        )
    done = target.query("SELECT value FROM state_meta WHERE key = ?", (MERGED_PREFIX + source_id,))
    if done:
        when = json.loads(done[0]["value"]).get("ts")
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(when))) if when else "an earlier run"
        raise StateError(f"this local state ({source_id}) was already merged into {where} at {at}; nothing to merge")


def _columns(source: SQLiteState, target: PostgresState, table: str) -> list[str]:
    """The columns of ``table`` (the source's order); StateError when the two schemas differ."""
    cols = [str(r["name"]) for r in source.query(f"PRAGMA table_info({table})")]
    theirs = {
        str(r["column_name"])
        for r in target.query(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
            " AND table_name = ?",
            (table,),
        )
    }
    if set(cols) != theirs:
        raise StateError(
            f"table {table} has columns {sorted(cols)} in {source.where()} but {sorted(theirs)} in "
            f"{target.where()}: run the same loadmaster version on both"
        )
    return cols


def _unique_keys(target: PostgresState, table: str) -> list[tuple[str, ...]]:
    """Every unique key of ``table`` in the target (the primary key and unique indexes)."""
    rows = target.query(
        "SELECT array_agg(a.attname::text ORDER BY k.ord) AS cols FROM pg_index i"
        " CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)"
        " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
        " WHERE i.indrelid = to_regclass(?) AND i.indisunique GROUP BY i.indexrelid",
        (table,),
    )
    return [tuple(r["cols"]) for r in rows]


def _source_rows(source: SQLiteState, table: str, cols: Sequence[str], batch: int) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``table`` in rowid order, ``batch`` at a time, as tuples of ``cols``."""
    listed = ", ".join(cols)
    last = -(2**63)
    while True:
        rows = source.query(
            f"SELECT rowid AS lm_rowid, {listed} FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT ?", (last, batch)
        )
        if not rows:
            return
        last = int(rows[-1]["lm_rowid"])
        yield [tuple(r)[1:] for r in rows]


def _copy_table(
    source: SQLiteState, target: PostgresState, table: str, n_source: int, n_before: int, merge: bool, batch: int
) -> TableCopy:
    cols = _columns(source, target, table)
    # Merging, an id would collide with the target's own: those rows take new ids.
    drop_id = merge and table in ID_TABLES
    written = [c for c in cols if not (drop_id and c == "id")]
    keys = [k for k in _unique_keys(target, table) if set(k) <= set(written)]
    # What the target holds under each key before the copy: a source row with one of these is
    # already there (counted, and left as the target has it, or replaced for the database id).
    held: list[set[tuple[Any, ...]]] = []
    if n_before:
        for k in keys:
            held.append({tuple(r[c] for c in k) for r in target.query(f"SELECT {', '.join(k)} FROM {table}")})
    replace = table == "state_meta" and not merge
    conflict = " ON CONFLICT (key) DO UPDATE SET value = excluded.value" if replace else " ON CONFLICT DO NOTHING"
    one = f"({', '.join('?' * len(written))})"

    def insert(n: int) -> str:
        return f"INSERT INTO {table} ({', '.join(written)}) VALUES {', '.join([one] * n)}{conflict}"

    full = insert(ROWS_PER_STATEMENT)
    index = [cols.index(c) for c in written]
    key_index = [[cols.index(c) for c in k] for k in keys]
    present = 0
    for rows in _source_rows(source, table, cols, batch):
        if held:
            for row in rows:
                for ki, have in zip(key_index, held, strict=True):
                    value = tuple(row[i] for i in ki)
                    if None not in value and value in have:
                        present += 1
                        break
        if drop_id:
            rows = [tuple(row[i] for i in index) for row in rows]
        # ROWS_PER_STATEMENT rows per statement: one round of executemany per batch, each
        # statement's parameters the rows one after the other.
        whole = len(rows) - len(rows) % ROWS_PER_STATEMENT
        if whole:
            target.executemany(
                full,
                [
                    tuple(chain.from_iterable(rows[i : i + ROWS_PER_STATEMENT]))
                    for i in range(0, whole, ROWS_PER_STATEMENT)
                ],
            )
        if whole < len(rows):
            target.execute(insert(len(rows) - whole), tuple(chain.from_iterable(rows[whole:])))
    copied = n_source - present
    return TableCopy(
        table,
        n_source,
        copied,
        skipped=0 if replace else present,
        replaced=present if replace else 0,
        target=n_before,  # the count before; _checked puts the count after in its place
    )


def _checked(t: TableCopy, n_after: int, merge: bool) -> TableCopy:
    """``t`` with the target's count after the copy, which must be what it held before plus every
    copied row (and the merge's own note in state_meta); StateError (rolling back) otherwise."""
    extra = 1 if merge and t.table == "state_meta" else 0
    expected = t.target + t.copied + extra
    if n_after != expected:
        raise StateError(
            f"table {t.table}: {t.source} local row(s), {t.skipped + t.replaced} already there, but the target "
            f"went from {t.target} to {n_after} row(s) (expected {expected}); nothing was written"
        )
    return TableCopy(t.table, t.source, t.copied, t.skipped, t.replaced, n_after)


__all__ = [
    "BATCH",
    "MERGED_PREFIX",
    "MigrateReport",
    "NothingToMigrate",
    "TableCopy",
    "check_target_url",
    "migrate_state",
]
