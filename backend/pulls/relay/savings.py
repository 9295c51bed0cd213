"""Console side of a relay receiver's end: what fan-out saved (the store sent it nothing).

A receiver has no egress reservation and no ledger row (the ledger holds what the store really
sent: the seeds'). When one succeeds, the bytes it got from a peer are recorded as a saving,
priced as a direct pull to its site would have been (``backend.ledger.record_fanout_saving``),
for the Egress screen's month of savings. Like a pull's settle, only the state database the job
was launched against counts it.

What the receiver reports is data: a saving is never more than the plan could save, the bytes of
the objects its spec (from the state database) told it to receive, so a group's savings are at
most those bytes times its receivers. A count the node did not give as a whole number in range is
not recorded at all (no saving is claimed without it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backend.config import Config
    from backend.jobs.records import JobRecord
    from backend.state import StateDB


def record_receiver(config: Config, db: StateDB, record: JobRecord) -> None:
    from backend.jobs.store import JobStore
    from backend.ledger import MAX_TRANSFER_BYTES, EgressGuard, record_fanout_saving
    from backend.storage import egress_profile

    store = JobStore(db)
    launched_against, adopted = store.origin_of(record.id)
    if launched_against != db.state_id and (launched_against is not None or adopted):
        return
    if record.state != "succeeded":
        return
    relay = (record.result or {}).get("relay") if isinstance(record.result, dict) else None
    if not isinstance(relay, dict):
        return
    said = relay.get("peer_bytes", 0)
    if isinstance(said, bool) or not isinstance(said, int) or not 0 < said <= MAX_TRANSFER_BYTES:
        return
    planned = planned_bytes(record.params.get("expected"))
    nbytes = min(said, planned)
    if nbytes <= 0:
        return
    note = f"from {relay.get('upstream') if isinstance(relay.get('upstream'), str) else 'a peer'}"
    if said > planned:
        note += f"; capped at the plan's {planned} bytes: the receiver reported {said}"
    site = next((n.site for n in config.nodes if n.name == record.node), None)
    profile = egress_profile(config, record.params.get("store"), str(record.params.get("src", "")))
    record_fanout_saving(
        EgressGuard(config, db),
        profile,
        site,
        nbytes,
        job_id=record.id,
        group=str((record.params.get("relay") or {}).get("group", "")),
        note=note[:300],
    )


def planned_bytes(expected: object) -> int:
    """The bytes a relay job's spec lists ([rel, size] or [rel, size, etag] each): all a receiver
    can have got from its peers. 0 for a spec that lists nothing readable."""
    total = 0
    for item in expected if isinstance(expected, list) else ():
        if isinstance(item, list | tuple) and len(item) >= 2:
            size = item[1]
            if isinstance(size, int) and not isinstance(size, bool) and size > 0:
                total += size
    return total
