"""Whatever a node reports, a job that read a store settles within its reservation (#28).

A property over what a hostile node can write in its result or progress (any JSON value: whole
numbers of every size and sign, floats, text, booleans, nested values), for each kind that reads a
store from a node: the ledger row of a reserved job ends settled or released, never above its
quote x SETTLE_SLACK, never below zero, and settling never raises. On each real state backend.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.agent.kinds import kind
from backend.jobs.records import JobProgress, JobRecord
from backend.ledger import SETTLE_SLACK, EgressGuard, Reservation
from backend.state import StateDB
from tests.egress.test_reservations import DATASETS, DEST, config

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_ids = itertools.count()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    job_kind=st.sampled_from(["shard", "strip"]),
    state=st.sampled_from(["succeeded", "failed", "cancelled", "lost"]),
    quoted=st.integers(min_value=1, max_value=10**13),
    said=json_values,
    in_progress=st.booleans(),
)
def test_a_reported_byte_count_never_settles_above_the_reservation(
    state_db: StateDB, job_kind: str, state: str, quoted: int, said: Any, in_progress: bool
) -> None:
    cfg = config()
    job_id = f"1202-{next(_ids):06d}-prop"
    EgressGuard(cfg, state_db).reserve(DATASETS, [Reservation(job_id, DEST, quoted, 1)])
    progress = JobProgress(time.time(), 0, extra={"source_bytes_read": said}) if in_progress else None
    record = JobRecord(
        id=job_id,
        node="gpu-01",
        kind=job_kind,
        state=state,
        created=time.time(),
        launched_by="me",
        launched_from="here",
        result={"source_bytes_read": said} if state == "succeeded" else None,
        progress=progress,
    )
    kind(job_kind).on_ended(cfg, state_db, record)
    kind(job_kind).on_ended(cfg, state_db, record)  # again (a second console): the same row
    row = EgressGuard(cfg, state_db).ledger.for_job(job_id)
    assert row is not None and row.quoted_bytes == quoted
    assert row.state in ("settled", "released")
    assert 0 <= row.bytes <= int(quoted * SETTLE_SLACK)
    if row.state == "released":
        assert state != "succeeded"
    if isinstance(said, int) and not isinstance(said, bool) and 0 <= said <= quoted and row.state == "settled":
        if state == "succeeded" or in_progress:
            assert row.bytes == said  # an honest count is taken as it is


def test_a_job_this_ledger_never_reserved_is_not_counted(state_db: StateDB) -> None:
    record = JobRecord(
        id="1202-999999-none",
        node="gpu-01",
        kind="shard",
        state="succeeded",
        created=time.time(),
        launched_by="me",
        launched_from="here",
        result={"source_bytes_read": 10**12},
    )
    kind("shard").on_ended(config(), state_db, record)
    assert EgressGuard(config(), state_db).ledger.for_job(record.id) is None
