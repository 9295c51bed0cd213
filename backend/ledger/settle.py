"""Settling a job that read a store from a node (pull, shard, strip) once it ended: what its node
says it read, and the reservation settled to it (capped) or released (nothing moved).

Console side only (``JobKind.on_ended``): the node's runner never imports the ledger.
"""

from __future__ import annotations

from typing import Any

from backend.config import Config, StoreProfile
from backend.ledger.guard import EgressGuard
from backend.ledger.records import MAX_TRANSFER_BYTES, LedgerEntry
from backend.state import StateDB


def reported_bytes(record: Any, key: str) -> int | None:
    """The bytes a job's node says it read from the store: ``key`` in its result when it
    succeeded, else in its last progress point (``bytes_done`` for key ``bytes_done``). None when
    the node said nothing usable (not a whole number from 0 to MAX_TRANSFER_BYTES)."""
    if record.state == "succeeded":
        said = (record.result or {}).get(key) if isinstance(record.result, dict) else None
    elif record.progress is None:
        return 0
    elif key == "bytes_done":
        said = record.progress.bytes_done
    else:
        said = record.progress.extra.get(key, 0)
    if isinstance(said, bool) or not isinstance(said, int) or not 0 <= said <= MAX_TRANSFER_BYTES:
        return None
    return said


def settle_job(config: Config, db: StateDB, record: Any, nbytes: int | None) -> LedgerEntry | None:
    """Console side, once a job that read a store from a node has ended (``JobKind.on_ended``):
    its reservation settles to ``nbytes``, priced on the route it was reserved for and capped at
    the reservation times SETTLE_SLACK (what a node reports is data, never a reason to spend more).

    A job with no reservation in this ledger (launched against another database, or reading no
    store) is not counted; one that ended without moving a byte releases its reservation; a byte
    count the node did not give in a usable form counts at the reservation. Safe to call again.
    """
    guard = EgressGuard(config, db)
    row = guard.ledger.for_job(record.id)
    if row is None or row.state == "settled":
        return row
    note = "" if record.state == "succeeded" else f"{record.state} after {nbytes} bytes"
    if nbytes is None:
        nbytes = row.quoted_bytes if row.quoted_bytes is not None else row.bytes
        note = "the node's byte count was unreadable: counted at its reservation"
    if nbytes == 0 and record.state != "succeeded":
        return guard.release(record.id, f"{record.state}: no bytes moved")
    profile = config.stores.get(row.store) or StoreProfile(url=row.store, name=row.store)
    return guard.record_transfer(profile, row.dest_site, nbytes, job_id=record.id, note=note)
