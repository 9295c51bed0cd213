"""The alerts loadmaster has raised, in the state database: what fires, what resolved, what each
sink has acknowledged.

One row per condition, keyed by the fingerprint of its labels (:func:`fingerprint`). Each
evaluation is :meth:`AlertStore.sync`: a condition seen for the first time is inserted firing with
its start time, one still holding keeps its start time (a restarted or second watcher sends the
very same alert: Alertmanager deduplicates on the labels and pages once), and a firing row whose
condition is gone becomes resolved with its end time. That last rule is what resolves, after a
restart, what cleared while the watcher was down. Delivery is separate (:mod:`backend.alerts.
notify`): a row is queued for a sink while its state differs from what that sink acknowledged, so
an Alertmanager that is down loses nothing; the queue is the table. Resolved rows every sink has
acknowledged are dropped after a day.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from backend.alerts.conditions import Condition, Interrupted
from backend.state.base import StateDB

#: Resolved rows acknowledged by every sink are kept this long (for the console's history).
KEEP_RESOLVED_S = 24 * 3600.0
#: Sinks the table tracks.
SINKS = ("am", "hook")


def fingerprint(labels: Mapping[str, str]) -> str:
    """A stable id of a label set (sorted, JSON, sha256): the same condition, the same id."""
    text = json.dumps(sorted(labels.items()), separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class StoredAlert:
    """One row: an alert as loadmaster sent (or will send) it."""

    fingerprint: str
    alertname: str
    labels: dict[str, str]
    annotations: dict[str, str]
    state: str  # "firing" | "resolved"
    starts_at: float
    ends_at: float | None
    updated: float
    am_state: str
    am_sent: float | None
    hook_state: str
    last_error: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StoredAlert:
        return cls(
            fingerprint=row["fingerprint"],
            alertname=row["alertname"],
            labels=json.loads(row["labels"]),
            annotations=json.loads(row["annotations"]),
            state=row["state"],
            starts_at=float(row["starts_at"]),
            ends_at=None if row["ends_at"] is None else float(row["ends_at"]),
            updated=float(row["updated"]),
            am_state=row["am_state"],
            am_sent=None if row["am_sent"] is None else float(row["am_sent"]),
            hook_state=row["hook_state"],
            last_error=row["last_error"],
        )


@dataclass(frozen=True)
class Changes:
    """What one sync changed: conditions that began firing and rows that resolved."""

    fired: tuple[StoredAlert, ...]
    resolved: tuple[StoredAlert, ...]
    firing: int


class AlertStore:
    """The ``alerts`` table (migration 3)."""

    def __init__(self, db: StateDB) -> None:
        self.db = db

    def sync(
        self,
        conditions: Iterable[Condition],
        now: float | None = None,
        *,
        unknown: Callable[[StoredAlert], bool] | None = None,
    ) -> Changes:
        """Record this evaluation: new conditions fire, held ones are refreshed, gone ones resolve.

        ``unknown(row)`` true: this round could not tell whether that firing row's condition holds
        (its node not sampled yet after a restart, the jobs or the database not read): it stays
        firing rather than resolving and paging again later. One transaction under the ``alerts``
        lock, so two watchers interleave whole evaluations."""
        now = time.time() if now is None else now
        current = {}
        for c in conditions:
            labels = c.all_labels
            current[fingerprint(labels)] = (c, labels)

        def body(tx: StateDB) -> Changes:
            rows = {r["fingerprint"]: r for r in tx.query("SELECT * FROM alerts WHERE state = 'firing'")}
            fired: list[StoredAlert] = []
            resolved: list[StoredAlert] = []
            for fp, (c, labels) in current.items():
                ann = json.dumps(c.annotations, sort_keys=True)
                if fp in rows:
                    tx.execute("UPDATE alerts SET annotations = ?, updated = ? WHERE fingerprint = ?", (ann, now, fp))
                    continue
                starts = c.since if c.since is not None and c.since <= now else now
                # A condition that fired before and resolved comes back as a new firing row.
                tx.execute("DELETE FROM alerts WHERE fingerprint = ?", (fp,))
                tx.execute(
                    "INSERT INTO alerts (fingerprint, alertname, labels, annotations, state, starts_at, ends_at,"
                    " updated, am_state, am_sent, hook_state, last_error)"
                    " VALUES (?, ?, ?, ?, 'firing', ?, NULL, ?, '', NULL, '', NULL)",
                    (fp, c.alertname, json.dumps(labels, sort_keys=True), ann, starts, now),
                )
                fired.append(self._get(tx, fp))
            for fp in set(rows) - set(current):
                if unknown is not None and unknown(StoredAlert.from_row(rows[fp])):
                    continue
                tx.execute(
                    "UPDATE alerts SET state = 'resolved', ends_at = ?, updated = ? WHERE fingerprint = ?",
                    (now, now, fp),
                )
                resolved.append(self._get(tx, fp))
            tx.execute(
                "DELETE FROM alerts WHERE state = 'resolved' AND updated < ? AND am_state = 'resolved'"
                " AND hook_state = 'resolved'",
                (now - KEEP_RESOLVED_S,),
            )
            return Changes(tuple(fired), tuple(resolved), len(current))

        return self.db.transact(body, lock="alerts")

    @staticmethod
    def _get(tx: StateDB, fp: str) -> StoredAlert:
        return StoredAlert.from_row(tx.query("SELECT * FROM alerts WHERE fingerprint = ?", (fp,))[0])

    def all(self, *, state: str | None = None) -> list[StoredAlert]:
        sql = "SELECT * FROM alerts" + (" WHERE state = ?" if state else "") + " ORDER BY starts_at, fingerprint"
        return [StoredAlert.from_row(r) for r in self.db.query(sql, (state,) if state else ())]

    def firing(self) -> list[StoredAlert]:
        return self.all(state="firing")

    def pending(self, sink: str) -> list[StoredAlert]:
        """Rows whose state ``sink`` has not acknowledged (for Alertmanager: also every firing row,
        which is re-sent each round to keep its endsAt ahead)."""
        col = _col(sink)
        return [
            StoredAlert.from_row(r)
            for r in self.db.query(
                f"SELECT * FROM alerts WHERE {col} <> state ORDER BY starts_at, fingerprint",  # noqa: S608 - fixed names
            )
        ]

    def acknowledge(self, sink: str, alerts: Iterable[StoredAlert], now: float | None = None) -> None:
        """``sink`` took these rows in the state they had when read (a row that changed since is
        left queued)."""
        now = time.time() if now is None else now
        col = _col(sink)
        sent = ", am_sent = ?" if sink == "am" else ""
        rows = [
            ((a.state, now, a.fingerprint, a.state) if sink == "am" else (a.state, a.fingerprint, a.state))
            for a in alerts
        ]
        if rows:
            self.db.executemany(
                f"UPDATE alerts SET {col} = ?{sent}, last_error = NULL WHERE fingerprint = ? AND state = ?",  # noqa: S608
                rows,
            )

    def note_error(self, sink: str, alerts: Iterable[StoredAlert], error: str) -> None:
        rows = [(f"{sink}: {error}", a.fingerprint) for a in alerts]
        if rows:
            self.db.executemany("UPDATE alerts SET last_error = ? WHERE fingerprint = ?", rows)

    def queued(self) -> dict[str, int]:
        """Rows each sink has yet to take (what "alerting degraded" counts)."""
        return {
            s: int(self.db.query(f"SELECT COUNT(*) AS n FROM alerts WHERE {_col(s)} <> state")[0]["n"])  # noqa: S608
            for s in SINKS
        }


def _col(sink: str) -> str:
    if sink not in SINKS:
        raise ValueError(f"unknown sink {sink!r}")
    return f"{sink}_state"


def interrupted_applies(db: StateDB) -> list[Interrupted]:
    """Retention applies whose journal still holds actions as started (not done)."""
    from backend.alerts.conditions import store_of

    rows = db.query(
        "SELECT plan_hash, COUNT(*) AS n, MAX(ts) AS last, MIN(path) AS path FROM retention_journal"
        " WHERE state = 'started' GROUP BY plan_hash ORDER BY plan_hash"
    )
    return [Interrupted(r["plan_hash"], int(r["n"]), float(r["last"]), store_of({"url": r["path"]})) for r in rows]
