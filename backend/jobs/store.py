"""The console's local record of jobs: who launched what, when and from where, and what happened.

Two tables of the state DB: ``jobs`` (one row per job, updated as its directory is re-read) and
``job_events`` (launch, adoption, state changes, cleanup notes). No remote reads here: the
:class:`~backend.jobs.manager.JobManager` merges what nodes say into these rows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from backend.errors import JobError
from backend.jobs.records import TERMINAL, JobProgress, JobRecord
from backend.state import Row, StateDB


class JobStore:
    """The ``jobs`` and ``job_events`` tables of one state DB."""

    def __init__(self, db: StateDB) -> None:
        self.db = db
        #: job id -> the Slurm job it is launched for, recorded by :meth:`insert` (see
        #: :meth:`expect_slurm_job`).
        self._slurm_of: dict[str, str] = {}

    def expect_slurm_job(self, job_ids: Iterable[str], slurm_job: str) -> None:
        """Tag the jobs about to be launched under ``job_ids`` with the Slurm job they are for:
        their rows carry it from the insert on."""
        for job_id in job_ids:
            self._slurm_of[job_id] = slurm_job

    # -- writing -------------------------------------------------------------------------------

    def insert(
        self, spec: dict[str, Any], job_dir: str | None, *, digest: str | None = None, store: str | None = None
    ) -> None:
        """Record a job this console is about to start (state ``starting``), with the digest of
        the spec text it sends and the store whose credentials the job may be given."""
        self.db.execute(
            "INSERT INTO jobs (id, node, kind, label, params, state, created, launched_by, launched_from, job_dir,"
            " updated, state_id, end_recorded, spec_digest, store, launch_id, slurm_job)"
            " VALUES (?, ?, ?, ?, ?, 'starting', ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?)",
            (
                spec["id"],
                spec["node"],
                spec["kind"],
                spec["label"],
                json.dumps(spec["params"]),
                spec["created"],
                spec["launched_by"],
                spec["launched_from"],
                job_dir,
                spec["created"],
                spec.get("state_id"),
                digest,
                store,
                spec.get("launch"),
                self._slurm_of.pop(spec["id"], None),
            ),
        )

    def authority(self, job_id: str) -> Row | None:
        """What this database recorded at the job's launch (id, node, kind, spec digest, store,
        whether an older loadmaster adopted it from a node, state); None: it never launched it."""
        rows = self.db.query(
            "SELECT id, node, kind, spec_digest, store, adopted, state, created, quarantined FROM jobs WHERE id = ?",
            (job_id,),
        )
        return rows[0] if rows else None

    def authorities(self, job_ids: Iterable[str]) -> dict[str, Row]:
        """:meth:`authority` for many jobs at once (the ids this database never launched are absent)."""
        ids = list(dict.fromkeys(job_ids))
        out: dict[str, Row] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            for row in self.db.query(
                "SELECT id, node, kind, spec_digest, store, adopted, state, created, quarantined FROM jobs"
                f" WHERE id IN ({','.join('?' * len(chunk))})",
                chunk,
            ):
                out[str(row["id"])] = row
        return out

    def quarantine(self, job_id: str, reason: str) -> None:
        """Stop trying to settle the job's row: its end is not recorded again (the reason says why)."""
        res = self.db.execute(
            "UPDATE jobs SET quarantined = ?, updated = ? WHERE id = ? AND quarantined IS NULL",
            (reason[:500], time.time(), job_id),
        )
        if res.rowcount:
            self.event(job_id, "quarantined", reason[:500])

    def active_on(self, node: str) -> list[Row]:
        """The team's own jobs on ``node`` that are starting or running by the record."""
        return self.db.query(
            "SELECT id, state, created, started, pid FROM jobs WHERE node = ? AND adopted = 0"
            " AND quarantined IS NULL AND state IN ('starting', 'running', 'cancelling')",
            (node,),
        )

    def event(self, job_id: str, event: str, detail: str = "") -> None:
        self.db.execute(
            "INSERT INTO job_events (job_id, ts, event, detail) VALUES (?, ?, ?, ?)",
            (job_id, time.time(), event, detail),
        )

    def update(self, job_id: str, **cols: Any) -> None:
        """Set columns of a job's row; a state change is also an event (with the error, if any)."""
        if not cols:
            return
        old = self.db.query("SELECT state FROM jobs WHERE id = ?", (job_id,))
        cols["updated"] = time.time()
        for k in ("result", "progress"):
            if k in cols and not isinstance(cols[k], str | None):
                cols[k] = json.dumps(cols[k], default=str)
        sets = ", ".join(f"{k} = ?" for k in cols)
        self.db.execute(f"UPDATE jobs SET {sets} WHERE id = ?", (*cols.values(), job_id))
        if "state" in cols and old and old[0]["state"] != cols["state"]:
            self.event(job_id, cols["state"], cols.get("error") or "")

    # -- reading -------------------------------------------------------------------------------

    def state_of(self, job_id: str) -> str | None:
        """The recorded state of the job with exactly this id; None when there is no such row."""
        rows = self.db.query("SELECT state FROM jobs WHERE id = ?", (job_id,))
        return str(rows[0]["state"]) if rows else None

    def origin_of(self, job_id: str) -> tuple[str | None, bool]:
        """(the state database id the job was launched against, whether this database adopted it)."""
        rows = self.db.query("SELECT state_id, adopted FROM jobs WHERE id = ?", (job_id,))
        return (rows[0]["state_id"], bool(rows[0]["adopted"])) if rows else (None, False)

    def pid_of(self, job_id: str) -> int | None:
        rows = self.db.query("SELECT pid FROM jobs WHERE id = ?", (job_id,))
        return rows[0]["pid"] if rows else None

    def nodes_of(self, job_ids: Iterable[str]) -> dict[str, list[str]]:
        """node -> the recorded ids among ``job_ids`` that run there."""
        ids = tuple(job_ids)
        by_node: dict[str, list[str]] = {}
        if ids:
            for row in self.db.query(f"SELECT id, node FROM jobs WHERE id IN ({','.join('?' * len(ids))})", ids):
                by_node.setdefault(row["node"], []).append(row["id"])
        return by_node

    @staticmethod
    def _row_record(row: Any) -> JobRecord:
        """A row as a record; a row whose stored values cannot be read (a JSON column scribbled,
        a progress point of another shape) is shown with the reason, never a crash."""
        try:
            return JobStore._decode(row)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            why = f"its stored values cannot be read ({type(exc).__name__}: {str(exc)[:200]})"
            return JobRecord(
                id=str(row["id"]),
                node=str(row["node"]),
                kind=str(row["kind"]),
                state=str(row["state"]),
                created=_float_or(row["created"], 0.0),
                launched_by=str(row["launched_by"]),
                launched_from=str(row["launched_from"]),
                note=why,
                quarantined=_col(row, "quarantined") or why,
            )

    @staticmethod
    def _decode(row: Any) -> JobRecord:
        prog = json.loads(row["progress"]) if row["progress"] else None
        params = json.loads(row["params"] or "{}")
        result = json.loads(row["result"]) if row["result"] else None
        if not isinstance(params, dict) or not isinstance(result, dict | None) or not isinstance(prog, dict | None):
            raise ValueError("params, result or progress is not a JSON object")
        return JobRecord(
            id=row["id"],
            node=row["node"],
            kind=row["kind"],
            state=row["state"],
            created=float(row["created"]),
            launched_by=row["launched_by"],
            launched_from=row["launched_from"],
            label=row["label"],
            params=params,
            job_dir=row["job_dir"],
            pid=None if row["pid"] is None else int(row["pid"]),
            started=None if row["started"] is None else float(row["started"]),
            finished=None if row["finished"] is None else float(row["finished"]),
            error=row["error"],
            result=result,
            progress=JobProgress(**prog) if prog else None,
            quarantined=_col(row, "quarantined"),
            launch=_col(row, "launch_id"),
            slurm_job=_col(row, "slurm_job"),
        )

    def launch_ids(self, launch_id: str) -> list[str]:
        """The ids of the jobs of launch ``launch_id`` (exactly that id), oldest first; [] when
        it is not a launch."""
        rows = self.db.query("SELECT id FROM jobs WHERE launch_id = ? ORDER BY created, id", (launch_id,))
        return [str(r["id"]) for r in rows]

    def resolve_id(self, job_id: str) -> str:
        """The full id of a job given its id or a unique prefix of it."""
        rows = self.db.query("SELECT id FROM jobs WHERE id = ?", (job_id,))
        if rows:
            return str(rows[0]["id"])
        rows = self.db.query(
            "SELECT id FROM jobs WHERE id LIKE ? ORDER BY created DESC LIMIT 5", (job_id.replace("%", "") + "%",)
        )
        if len(rows) == 1:
            return str(rows[0]["id"])
        if not rows:
            raise JobError(f"no job {job_id!r} (see 'loadmaster jobs')")
        raise JobError(f"job id {job_id!r} is ambiguous: {', '.join(r['id'] for r in rows)}")

    def get(self, job_id: str) -> JobRecord:
        """The job's last known record (its id or a unique prefix)."""
        jid = self.resolve_id(job_id)
        return self._row_record(self.db.query("SELECT * FROM jobs WHERE id = ?", (jid,))[0])

    def end_pending(self, *, limit: int = 200) -> list[JobRecord]:
        """Ended jobs whose kind has not recorded the end yet (the state database was down when
        a console saw them end, or that console stopped first); quarantined rows are left out."""
        rows = self.db.query(
            f"SELECT * FROM jobs WHERE end_recorded = 0 AND quarantined IS NULL AND adopted = 0"
            f" AND state IN ({','.join('?' * len(TERMINAL))}) ORDER BY created LIMIT ?",
            (*sorted(TERMINAL), limit),
        )
        return [self._row_record(r) for r in rows]

    def end_recorded(self, job_id: str) -> None:
        self.db.execute("UPDATE jobs SET end_recorded = 1 WHERE id = ?", (job_id,))

    def records(self, *, limit: int = 500) -> list[JobRecord]:
        """Every recorded job, newest first."""
        rows = self.db.query("SELECT * FROM jobs ORDER BY created DESC LIMIT ?", (limit,))
        return [self._row_record(r) for r in rows]


def _col(row: Any, key: str) -> Any:
    """A column that may be missing from ``row`` (a partial SELECT)."""
    try:
        return row[key]
    except (KeyError, IndexError):
        return None


def _float_or(v: Any, default: float) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return default
