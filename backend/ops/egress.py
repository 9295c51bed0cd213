"""Egress: quote one transfer against the month's ledger, and record an operator's override."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from backend.errors import PolicyError
from backend.ops.base import Operation
from backend.policy.prices import PriceOverrides

if TYPE_CHECKING:
    from backend.policy.egress import GuardDecision


@dataclass(frozen=True)
class Quoted:
    """The guard's decision for a transfer, and the audit id of the override when one was given."""

    decision: GuardDecision
    audit_id: int | None = None


class Egress(Operation):
    """``egress quote`` (an over-budget reason records an override) and the pull form's reason."""

    def quote(
        self,
        store: str,
        nbytes: int,
        *,
        objects: int = 0,
        node: str | None = None,
        site: str | None = None,
        reason: str | None = None,
    ) -> Quoted:
        """Price ``nbytes`` from ``store`` to ``node``'s site (or ``site``) and decide; audit an override."""
        from backend.policy.egress import parse_site_text
        from backend.policy.prices import price_table

        config = self.services.config
        profile = config.store(store)
        if site:
            try:  # a typed site the table does not know is an error, never a price
                parse_site_text(site, what="destination", table=price_table(config.section(PriceOverrides)))
            except ValueError as exc:
                raise PolicyError(str(exc)) from None
        if node:
            # A node without a site is priced as internet egress (the quote says so), never as free.
            site = config.node(node).site
        guard = self.services.egress
        decision = guard.check(
            guard.quote_transfer(profile, site, nbytes, objects=objects), allow_over_budget_reason=reason
        )
        if not decision.override_reason:
            return Quoted(decision)
        self.refuse_if_readonly("record an egress override")
        return Quoted(decision, self.audit_override(decision))
