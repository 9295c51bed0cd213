"""Egress: quote one transfer against the month's ledger, and record an operator's override."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from backend.errors import PolicyError
from backend.ops.base import Operation
from backend.ops.exports import lazy_exports
from backend.policy.prices import PriceOverrides

if TYPE_CHECKING:
    from backend.ledger import EgressReport, FanoutSavings
    from backend.policy.egress import (
        EgressEstimate,
        EgressSettings,
        GuardDecision,
        break_even_month,
        decision_lines,
        estimate,
        estimate_lines,
        parse_count_text,
        parse_site_text,
        parse_size_text,
        quote_lines,
    )
    from backend.policy.prices import PriceTable

#: What the front ends import from here: the operation, the month's report and savings, and the
#: estimate arithmetic and text both front ends show (``egress estimate`` and the Egress screen).
__all__ = [
    "Egress",
    "EgressEstimate",
    "EgressReport",
    "EgressSettings",
    "FanoutSavings",
    "PriceTable",
    "Quoted",
    "break_even_month",
    "decision_lines",
    "estimate",
    "estimate_lines",
    "parse_count_text",
    "parse_site_text",
    "parse_size_text",
    "quote_lines",
]
#: The names not from backend.policy.egress, and where they are from ("": defined here).
_ELSEWHERE = {
    "Egress": "",
    "Quoted": "",
    "EgressReport": "backend.ledger",
    "FanoutSavings": "backend.ledger",
    "PriceTable": "backend.policy.prices",
}
if not TYPE_CHECKING:  # mypy reads the imports above; at run time each name loads on first use
    __getattr__ = lazy_exports(
        __name__,
        {
            **dict.fromkeys((n for n in __all__ if n not in _ELSEWHERE), "backend.policy.egress"),
            **{n: where for n, where in _ELSEWHERE.items() if where},
        },
    )


@dataclass(frozen=True)
class Quoted:
    """The guard's decision for a transfer, and the audit id of the override when one was given."""

    decision: GuardDecision
    audit_id: int | None = None


class Egress(Operation):
    """``egress quote`` (an over-budget reason records an override) and the pull form's reason."""

    def prices(self) -> PriceTable:
        """The price table in use: the shipped one patched by the config's ``[prices]``."""
        from backend.policy.prices import price_table

        return price_table(self.services.config.section(PriceOverrides))

    def report(self, month: str | None = None) -> EgressReport:
        """Month-to-date bytes and $ per route, the budgets used and the projection to month end
        (this month by default), from the services' one guard: ``egress report`` and the Egress
        screen show this report."""
        return self.services.egress.report(month)

    def fanout_savings(self, month: str) -> FanoutSavings:
        """What relay pulls saved in ``month`` (bytes peers sent instead of the store)."""
        from backend.ledger import fanout_savings

        return fanout_savings(self.services.db, month)

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
