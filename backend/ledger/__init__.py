"""The egress ledger (SQLite, in the state DB) and the guard every pull passes before bytes move.

The guard's steps, as the operation layer runs them (``backend.ops.pull``; front ends call the
operation, never these; ``services.egress`` is the one guard)::

    guard = services.egress
    quote = guard.quote_transfer(store, node.site, listed_bytes, objects=listed_objects)
    decision = guard.check(quote, allow_over_budget_reason=args.allow_over_budget)
    # show the quote with the verdict: backend.policy.egress.decision_lines(decision)
    if decision.action == "block":       raise PolicyError(decision.message)  # do not start
    if decision.action == "confirm":     refuse unless the operator gave a reason
    if decision.override_reason:         operation.audit_override(decision)  # guard.override_facts
    ... transfer runs ...
    guard.record_transfer(store, node.site, bytes_moved, job_id=job.id)   # when it finished

* ``quote_transfer`` prices the bytes at the tiers they will fall in, given the month-to-date volume
  out of the same source account already in the ledger (so the 2nd TB costs what the 2nd TB costs).
* ``check`` applies ``[egress]``: the monthly budget of the store or its account, the per-transfer
  limit, and the action (warn | confirm | block). ``confirm`` with a reason becomes ``allow`` with
  ``override_reason`` set; ``block`` cannot be overridden.
* ``override_facts`` checks an override may be made and gives what the audit log records of it
  (``egress.override``, written by ``Operation.audit_override``).
* ``record_transfer`` appends a :class:`LedgerEntry` priced at the tier it actually fell in.
* ``dest_site`` None (a node without ``site``) is priced as internet egress and the quote says so;
  a store without provider/region, or of an unpriced provider, gives ``priced=False`` with a note
  (``[egress] unpriced_action`` decides), a local directory store gives route kind ``local``.
* Front ends do not call these steps themselves: ``backend.ops`` does (``ops.pulls.start``,
  ``ops.egress.quote``), in one order, with the audit record.

:class:`EgressLedger` reads the month back per route (``loadmaster egress report``).

The package, one module a thing: :mod:`~backend.ledger.records` (the values), ``store`` (the rows
in the state DB, :class:`EgressLedger`), ``guard`` (:class:`EgressGuard`), ``report`` (the month's
report), ``settle`` (a job's reservation once it ended), ``fanout`` (relay savings) and ``clock``.
"""

from __future__ import annotations

from backend.ledger.fanout import FanoutSavings, fanout_savings, record_fanout_saving
from backend.ledger.guard import EgressGuard, describe_decision
from backend.ledger.records import (
    MAX_TRANSFER_BYTES,
    SETTLE_SLACK,
    BudgetStatus,
    EgressReport,
    LedgerEntry,
    OverrideFacts,
    Reservation,
    Reserved,
    RouteSpend,
)
from backend.ledger.settle import reported_bytes, settle_job
from backend.ledger.store import EgressLedger

__all__ = [
    "MAX_TRANSFER_BYTES",
    "SETTLE_SLACK",
    "BudgetStatus",
    "EgressGuard",
    "EgressLedger",
    "EgressReport",
    "FanoutSavings",
    "LedgerEntry",
    "OverrideFacts",
    "Reservation",
    "Reserved",
    "RouteSpend",
    "describe_decision",
    "fanout_savings",
    "record_fanout_saving",
    "reported_bytes",
    "settle_job",
]
