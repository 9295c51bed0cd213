"""The state database's own actions: ``repair`` a damaged SQLite file, ``migrate`` it to PostgreSQL.

Both are refused in read-only mode and audited like every other action:

* ``state.repair`` (target: the SQLite file): where the damaged file went, the rows kept per
  table, what could not be read, and the problems the check found. The record goes into the
  fresh database, so it is the first thing in it. The outcome is ``ok``, or ``partial`` when some
  rows stay behind in the damaged file.
* ``state.migrate`` (target: the PostgreSQL database, its URL without a password): the report of
  the copy (rows per table, merge or not), written into the target after the copy, where the
  operators read the audit log from now on (the copied rows stay row for row; this one follows
  them). The local file is never written: a dry run or a failed copy (one transaction, rolled
  back) changed nothing and records nothing.

Neither opens the state database before it has done its work: the repair works on a file every
other command refuses to open.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from backend.ops.base import Operation
from backend.state import STATE_FILE, AuditEntry, StateError

if TYPE_CHECKING:
    from backend.state.copy import MigrateReport
    from backend.state.sqlite import RepairReport


@dataclass(frozen=True)
class Repaired:
    """What ``state repair`` found and did: ``report`` is None when there was nothing to repair."""

    path: Path
    problems: list[str] = field(default_factory=list)
    report: RepairReport | None = None
    audit_id: int | None = None


@dataclass(frozen=True)
class Migrated:
    """What ``state migrate`` did; ``report`` is None when the local state held nothing
    (``nothing`` says why)."""

    source: Path
    target: str
    report: MigrateReport | None = None
    nothing: str | None = None
    audit_id: int | None = None


#: What the front ends import from here: the operation, its results, and the state types shown.
__all__ = ["STATE_FILE", "AuditEntry", "Migrated", "Repaired", "ServerCheck", "State", "StateError"]


@dataclass(frozen=True)
class ServerCheck:
    """``state check`` against ``[state] url``: where (password hidden), the schema version read
    (0 when it could not be), and the one problem found, if any."""

    where: str
    schema_version: int
    problem: str | None = None


class State(Operation):
    """``state check|repair|migrate`` and where the Audit screen says the records live."""

    def where(self) -> str:
        """Where the state lives: the SQLite file, or the PostgreSQL URL without its password."""
        from backend.state import state_where

        return state_where(self.services.config)

    def audit_entries(
        self, *, limit: int = 1000, action: str | None = None, actor_like: str | None = None
    ) -> list[AuditEntry]:
        """The audit log, newest first: ``action`` exactly, ``actor_like`` a prefix of who acted.
        ``loadmaster audit`` and the Audit screen read it here."""
        return self.services.db.audit_entries(limit=limit, action=action, actor_like=actor_like)

    def check_local(self) -> tuple[Path, list[str]]:
        """The local SQLite state file and the damage a check finds in it (none: healthy)."""
        from backend.state import check_state

        path = self.local_file()
        return path, check_state(path)

    def check_server(self) -> ServerCheck:
        """Connect to ``[state] url`` and read its schema version (a fresh connection of its own)."""
        from backend.state.migrations import version
        from backend.state.postgres import PostgresState

        where = self.where()
        db: PostgresState | None = None
        try:
            db = PostgresState(self.services.config.state.url or "")
            down = db.available()
            if down is not None:
                raise down
            return ServerCheck(where, version(db))
        except StateError as exc:
            return ServerCheck(where, 0, str(exc))
        finally:
            if db is not None:
                db.close()

    def local_file(self) -> Path:
        """The local SQLite state file (what repair rebuilds and migrate copies)."""
        return self.services.config.state_dir() / STATE_FILE

    def repair(self, *, force: bool = False) -> Repaired:
        """Move a damaged SQLite state file aside and build a fresh one from every readable row
        (``force``: even when the check finds no damage). :class:`StateError` with ``[state] url``
        (PostgreSQL has its own tools)."""
        from backend.state import check_state, repair_state, state_where

        self.refuse_if_readonly("repair the state database")
        config = self.services.config
        if config.state.url:
            raise StateError(
                f"state repair is for the local SQLite file; [state] url points at "
                f"{state_where(config)}: use PostgreSQL's own tools there (pg_amcheck, a backup)"
            )
        path = self.local_file()
        problems = check_state(path)
        if not problems and not force:
            return Repaired(path)
        if "db" in self.services.__dict__:  # --force on an open database: the record goes to the new file
            self.services.__dict__.pop("db").close()
        report = repair_state(path)
        audit_id = self.audit(
            "state.repair",
            str(path),
            "partial" if report.lost else "ok",
            detail={
                "backup": str(report.backup),
                "kept": dict(report.kept),
                "lost": list(report.lost),
                "problems": problems,
                "forced": force and not problems,
            },
        )
        return Repaired(path, problems, report, audit_id)

    def migrate(self, to: str, *, merge: bool = False, dry_run: bool = False) -> Migrated:
        """Copy the local SQLite state into the PostgreSQL database ``to`` (a URL without a
        password), in one transaction; :class:`StateError` when the copy fails (nothing written)."""
        from backend.state.copy import NothingToMigrate, check_target_url, migrate_state
        from backend.state.postgres import PostgresState

        self.refuse_if_readonly("migrate the state database")
        check_target_url(to)
        path = self.local_file()
        try:
            report = migrate_state(path, to, merge=merge, dry_run=dry_run)
        except NothingToMigrate as exc:
            return Migrated(path, to, nothing=str(exc))
        if dry_run:
            return Migrated(path, to, report)
        target = PostgresState(to)
        try:
            detail = {k: v for k, v in report.as_dict().items() if k != "seconds"}
            audit_id = self.audit("state.migrate", to, "ok", detail=detail, into=target)
        finally:
            target.close()
        return Migrated(path, to, report, audit_id=audit_id)
