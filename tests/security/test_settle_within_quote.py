"""What a node reports never makes the ledger record more than the operator approved.

A hostile node controls its result and progress. Whatever it says, and in whatever order the
month's other reservations are settled or released meanwhile, each job's settled row is at most
its reservation's quoted bytes and quoted dollars, and a budget the launches fitted in stays
fitted: no spend is recorded without an approval that covered it. On each real state backend.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.agent.kinds import kind
from backend.jobs.records import JobProgress, JobRecord
from backend.ledger import EgressGuard, Reservation
from backend.state import StateDB
from tests.egress.test_reservations import DATASETS, DEST, NOV, TB, config

_ids = itertools.count()


def _record(job_id: str, state: str, said: object) -> JobRecord:
    return JobRecord(
        id=job_id,
        node="gpu-01",
        kind="shard",
        state=state,
        created=time.time(),
        launched_by="me",
        launched_from="here",
        result={"source_bytes_read": said} if state == "succeeded" else None,
        progress=JobProgress(time.time(), 0, extra={"source_bytes_read": said}),
    )


def test_a_node_that_reports_more_than_its_quote_is_recorded_at_the_quote(state_db: StateDB) -> None:
    """The launch fills the budget exactly; the node then says it read 10 % more."""
    g = EgressGuard(config(budgets={"datasets": 532.0}, action="block"), state_db)
    job_id = f"1203-{next(_ids):06d}-over"
    g.reserve(DATASETS, [Reservation(job_id, DEST, 6 * TB, 1)], now=time.time())
    quoted = g.ledger.for_job(job_id)
    assert quoted is not None and quoted.quoted_usd is not None
    kind("shard").on_ended(config(), state_db, _record(job_id, "succeeded", int(6 * TB * 1.1)))
    row = g.ledger.for_job(job_id)
    assert row is not None and row.state == "settled"
    assert row.bytes == 6 * TB  # not the 6.6 TB the node claimed
    assert row.usd is not None and row.usd <= quoted.quoted_usd + 1e-9
    assert "the node reported 6600000000000" in row.note
    assert g.ledger.spent_usd(row.month, store="datasets") <= 532.0 + 1e-9


def test_a_release_before_it_never_reprices_a_settled_row_above_its_quote(state_db: StateDB) -> None:
    """Tiers get cheaper with volume: job B was quoted in the cheaper tier because job A's
    reservation came first. A (a hostile node) then reports nothing and is released; B settling
    at its full quote must not be repriced into the dearer first tier above what was approved."""
    g = EgressGuard(config(), state_db)
    a, b = f"1203-{next(_ids):06d}-a", f"1203-{next(_ids):06d}-b"
    g.reserve(DATASETS, [Reservation(a, DEST, 10 * TB, 1)], now=NOV)
    g.reserve(DATASETS, [Reservation(b, DEST, 40 * TB, 1)], now=NOV)
    quoted_b = g.ledger.for_job(b)
    assert quoted_b is not None and quoted_b.quoted_usd is not None
    kind("shard").on_ended(config(), state_db, _record(a, "failed", 0))  # released
    kind("shard").on_ended(config(), state_db, _record(b, "succeeded", 40 * TB))
    row = g.ledger.for_job(b)
    assert row is not None and row.state == "settled" and row.bytes == 40 * TB
    assert row.usd is not None and row.usd <= quoted_b.quoted_usd + 1e-9


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    quotes=st.lists(st.integers(min_value=1, max_value=30 * TB), min_size=1, max_size=4),
    reports=st.lists(
        st.tuples(
            st.sampled_from(["succeeded", "failed", "cancelled", "lost"]),
            st.one_of(
                st.integers(min_value=-(10**20), max_value=10**20), st.floats(allow_nan=True), st.text(max_size=4)
            ),
        ),
        min_size=4,
        max_size=4,
    ),
    order=st.permutations(range(4)),
)
def test_any_reports_in_any_order_stay_within_each_quote_and_the_budget(
    state_db: StateDB, quotes: list[int], reports: list[tuple[str, Any]], order: list[int]
) -> None:
    budget = 4000.0
    cfg = config(budgets={"datasets": budget}, action="block")
    g = EgressGuard(cfg, state_db)
    ids = []
    for q in quotes:
        job_id = f"1203-{next(_ids):06d}-prop"
        try:
            g.reserve(DATASETS, [Reservation(job_id, DEST, q, 1)], now=time.time())
        except Exception:  # noqa: BLE001 - the guard refused it: never launched
            continue
        ids.append(job_id)
    quoted = {j: g.ledger.for_job(j) for j in ids}
    for i in order:
        if i < len(ids):
            state, said = reports[i]
            kind("shard").on_ended(cfg, state_db, _record(ids[i], state, said))
    month = None
    for j in ids:
        row, q = g.ledger.for_job(j), quoted[j]
        assert row is not None and q is not None and q.quoted_bytes is not None and q.quoted_usd is not None
        month = row.month
        assert 0 <= row.bytes <= q.quoted_bytes
        assert row.usd is None or row.usd <= q.quoted_usd + 1e-9
    if month is not None:
        assert g.ledger.spent_usd(month, store="datasets") <= budget + 1e-6
    for j in ids:  # leave the month to the next example
        state_db.execute("DELETE FROM egress_ledger WHERE job_id = ?", (j,))
