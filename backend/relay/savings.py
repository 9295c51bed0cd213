"""Console side of a relay receiver's end: what fan-out saved (the store sent it nothing).

A receiver has no egress reservation and no ledger row (the ledger holds what the store really
sent: the seeds'). When one succeeds, the bytes it got from a peer are recorded as a saving,
priced as a direct pull to its site would have been (``backend.ledger.record_fanout_saving``),
for the Egress screen's month of savings. Like a pull's settle, only the state database the job
was launched against counts it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backend.config import Config
    from backend.jobs.records import JobRecord
    from backend.state import StateDB


def record_receiver(config: Config, db: StateDB, record: JobRecord) -> None:
    from backend.jobs.pull import egress_profile
    from backend.jobs.store import JobStore
    from backend.ledger import EgressGuard, record_fanout_saving

    store = JobStore(db)
    launched_against, adopted = store.origin_of(record.id)
    if launched_against != db.state_id and (launched_against is not None or adopted):
        return
    if record.state != "succeeded":
        return
    relay = (record.result or {}).get("relay") or {}
    nbytes = int(relay.get("peer_bytes", 0))
    if nbytes <= 0:
        return
    site = next((n.site for n in config.nodes if n.name == record.node), None)
    profile = egress_profile(config, record.params.get("store"), str(record.params.get("src", "")))
    record_fanout_saving(
        EgressGuard(config, db),
        profile,
        site,
        nbytes,
        job_id=record.id,
        group=str((record.params.get("relay") or {}).get("group", "")),
        note=f"from {relay.get('upstream') or 'a peer'}",
    )
