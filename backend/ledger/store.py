"""The egress ledger's rows in the state DB (table ``egress_ledger``): append, settle, release and
read back by month, account, route and job. Pricing and budgets are the guard's
(:mod:`backend.ledger.guard`); this module only keeps the rows consistent under the month's lock.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from backend.errors import PolicyError
from backend.ledger.records import LedgerEntry
from backend.policy.egress import month_key
from backend.policy.prices import TierSlice, TransferPrice
from backend.state import StateDB, actor

#: The ledger rows that count against budgets and tiers: finished transfers and the reservations
#: of running ones (a released reservation, whose job moved nothing, does not).
COUNTED = "state <> 'released'"


def _row_entry(r: Any) -> LedgerEntry:
    tiers = tuple(TierSlice(**t) for t in json.loads(r["tiers"]))
    return LedgerEntry(
        r["id"],
        r["ts"],
        r["month"],
        r["job_id"],
        r["store"],
        r["account"],
        r["source_site"],
        r["dest_site"],
        r["kind"],
        r["bytes"],
        r["usd"],
        bool(r["priced"]),
        r["month_to_date_bytes"],
        tiers,
        r["note"],
        r["state"],
        None if r["quoted_bytes"] is None else int(r["quoted_bytes"]),
        r["quoted_usd"],
        r["who"],
    )


class EgressLedger:
    """Finished transfers in the state DB, queried by month, account and route."""

    def __init__(self, db: StateDB) -> None:
        self.db = db

    def internet_bytes(self, account: str | None, month: str, *, before_id: int | None = None) -> int:
        """Bytes out to the internet from ``account`` in ``month`` (what the tiers count):
        finished transfers and the reservations of running ones; with ``before_id``, only rows
        recorded before that one."""
        if account is None:
            return 0
        rows = self.db.query(
            "SELECT COALESCE(SUM(bytes), 0) AS b FROM egress_ledger WHERE month = ? AND account = ?"
            f" AND kind = 'internet' AND {COUNTED}" + (" AND id < ?" if before_id is not None else ""),
            (month, account, *(() if before_id is None else (before_id,))),
        )
        return int(rows[0]["b"])

    def spent_usd(self, month: str, *, store: str | None = None, account: str | None = None) -> float:
        """Dollars recorded or reserved in ``month`` for one store or one account."""
        col, val = ("store", store) if store is not None else ("account", account)
        rows = self.db.query(
            f"SELECT COALESCE(SUM(usd), 0) AS u FROM egress_ledger WHERE month = ? AND {col} = ? AND {COUNTED}",
            (month, val),
        )
        return float(rows[0]["u"])

    def provider_spent_usd(self, month: str, provider: str) -> float:
        """Dollars recorded or reserved in ``month`` on every account of ``provider``."""
        rows = self.db.query(
            "SELECT COALESCE(SUM(usd), 0) AS u FROM egress_ledger WHERE month = ?"
            f" AND (account = ? OR account LIKE ?) AND {COUNTED}",
            (month, provider, f"{provider}/%"),
        )
        return float(rows[0]["u"])

    def for_job(self, job_id: str) -> LedgerEntry | None:
        """The one row of ``job_id`` (a reservation, a settled transfer or a released one)."""
        rows = self.db.query("SELECT * FROM egress_ledger WHERE job_id = ?", (job_id,))
        return _row_entry(rows[0]) if rows else None

    def append(
        self,
        *,
        when: datetime,
        job_id: str | None,
        store: str,
        account: str | None,
        source_site: str | None,
        dest_site: str | None,
        nbytes: int,
        price: Callable[[int], TransferPrice],
        kind: str | None = None,
        state: str = "settled",
        note: str = "",
    ) -> LedgerEntry:
        """Insert one row priced by ``price(month-to-date bytes)``, in one transaction under the
        month's lock. A job already in the ledger is settled to ``nbytes`` instead: one row per
        job, however many consoles record it."""
        month = month_key(when)

        def body(db: StateDB) -> int:
            if job_id is not None and (row := self.for_job(job_id)) is not None:
                return self._settle_row(row, nbytes, price, note=note) if state == "settled" else row.id
            mtd = self.internet_bytes(account, month)
            p = price(mtd)
            return db.execute(
                "INSERT INTO egress_ledger (ts, month, job_id, store, account, source_site, dest_site, kind,"
                " bytes, usd, priced, month_to_date_bytes, tiers, note, state, quoted_bytes, quoted_usd, who,"
                " settled_ts) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) RETURNING id",
                (
                    when.timestamp(),
                    month,
                    job_id,
                    store,
                    account,
                    source_site,
                    dest_site,
                    kind or p.kind,
                    nbytes,
                    p.usd,
                    int(p.priced),
                    mtd,
                    json.dumps([t.as_dict() for t in p.tiers]),
                    " ".join(x for x in (p.note, note) if x),
                    state,
                    nbytes if state == "reserved" else None,
                    p.usd if state == "reserved" else None,
                    actor(),
                    time.time() if state == "settled" else None,
                ),
            ).id

        return self.entry(self.db.transact(body, lock=f"egress:{month}"))

    def _settle_row(self, row: LedgerEntry, nbytes: int, price: Callable[[int], TransferPrice], *, note: str) -> int:
        """Inside the month's transaction: a reserved (or released) row becomes the real bytes,
        priced at the tier they fell in given the rows before it; a settled row stays as it is."""
        if row.state == "settled":
            return row.id
        mtd = self.internet_bytes(row.account, row.month, before_id=row.id)
        p = price(mtd)
        usd = p.usd
        if row.quoted_usd is not None and usd is not None and usd > row.quoted_usd:
            # The rows before it changed since the quote (one was released: fewer bytes in the
            # cheaper tiers): the approved quote stays the ceiling of what this job counts.
            note = " ".join(x for x in (note, f"priced at its quote (${row.quoted_usd:.2f}, not ${usd:.2f})") if x)
            usd = row.quoted_usd
        self.db.execute(
            "UPDATE egress_ledger SET bytes = ?, usd = ?, priced = ?, month_to_date_bytes = ?, tiers = ?,"
            " state = 'settled', settled_ts = ?, note = ? WHERE id = ?",
            (
                nbytes,
                usd,
                int(p.priced),
                mtd,
                json.dumps([t.as_dict() for t in p.tiers]),
                time.time(),
                " ".join(x for x in (p.note, note) if x),
                row.id,
            ),
        )
        return row.id

    def release(self, job_id: str, note: str) -> LedgerEntry | None:
        """A reservation whose job moved no bytes (failed to start, cancelled early, lost) stops
        counting; a settled row is left as it is. None when the job has no row."""
        row = self.for_job(job_id)
        if row is None:
            return None

        def body(db: StateDB) -> None:
            db.execute(
                "UPDATE egress_ledger SET state = 'released', settled_ts = ?, note = ?"
                " WHERE job_id = ? AND state = 'reserved'",
                (time.time(), note, job_id),
            )

        self.db.transact(body, lock=f"egress:{row.month}")
        return self.for_job(job_id)

    def orphan_reservations(self, before: float) -> list[str]:
        """Job ids of reservations made before ``before`` whose job has no record at all (the
        launch died between the reservation and the job's row)."""
        rows = self.db.query(
            "SELECT e.job_id AS job_id FROM egress_ledger e LEFT JOIN jobs j ON j.id = e.job_id"
            " WHERE e.state = 'reserved' AND e.ts < ? AND e.job_id IS NOT NULL AND j.id IS NULL",
            (before,),
        )
        return [str(r["job_id"]) for r in rows]

    def entry(self, entry_id: int) -> LedgerEntry:
        rows = self.db.query("SELECT * FROM egress_ledger WHERE id = ?", (entry_id,))
        if not rows:
            raise PolicyError(f"no egress ledger entry {entry_id}")
        return _row_entry(rows[0])

    def entries(self, month: str) -> list[LedgerEntry]:
        """Entries of ``month``, oldest first."""
        return [
            _row_entry(r)
            for r in self.db.query("SELECT * FROM egress_ledger WHERE month = ? ORDER BY ts, id", (month,))
        ]
