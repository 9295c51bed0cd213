"""What every operation shares: the read-only refusal and the audit record."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from backend.errors import ReadOnlyRefused

if TYPE_CHECKING:
    from backend.services import Services


class Operation:
    """One family of actions on the services a front end was built with."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def refuse_if_readonly(self, what: str) -> None:
        """Step 1 of every operation that changes something: read-only services refuse it."""
        if self.services.readonly:
            raise ReadOnlyRefused(f"read-only mode: cannot {what} (drop --readonly)")

    def audit(
        self,
        action: str,
        target: str,
        outcome: str,
        *,
        detail: dict[str, Any] | None = None,
        reason: str | None = None,
        plan_hash: str | None = None,
    ) -> int:
        """Append the audit record of what was done (never secrets in ``detail``); its id."""
        return self.services.db.record_audit(action, target, outcome, detail=detail, reason=reason, plan_hash=plan_hash)
