"""Retention actions: apply a plan, pin and unpin steps, mark milestones, remove a dead apply's lock.

Pins and milestones are recorded under the run's canonical URL (:func:`canonical_run`), so a pin
made from the console and one made from the CLI for the same run are the same record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backend.errors import PolicyError
from backend.ops.base import Operation
from backend.ops.exports import lazy_exports

if TYPE_CHECKING:
    from backend.checkpoints.steps import Catalog
    from backend.config import StoreProfile
    from backend.policy.retention import (
        Pin,
        PlannedAction,
        RetentionPlan,
        RetentionPolicy,
        parse_pin,
        parse_step_list,
    )
    from backend.retention.apply import ActionOutcome, ApplyReport

#: What the front ends import from here: the operation, the plan and policy types it takes and
#: returns, and the step-list parser both front ends read pins with.
__all__ = [
    "ActionOutcome",
    "ApplyReport",
    "Catalog",
    "Pin",
    "Retention",
    "RetentionPlan",
    "RetentionPolicy",
    "RunListing",
    "Unlocked",
    "parse_pin",
    "parse_step_list",
]
if not TYPE_CHECKING:  # mypy reads the imports above; at run time each name loads on first use
    __getattr__ = lazy_exports(
        __name__,
        {
            "Catalog": "backend.checkpoints.steps",
            **dict.fromkeys(
                ("Pin", "RetentionPlan", "RetentionPolicy", "parse_pin", "parse_step_list"), "backend.policy.retention"
            ),
            **dict.fromkeys(("ActionOutcome", "ApplyReport"), "backend.retention.apply"),
        },
    )


@dataclass(frozen=True)
class RunListing:
    """A fresh listing of a run and the marks recorded for it: what a plan is computed from."""

    url: str
    catalog: Catalog
    pins: tuple[Pin, ...]
    milestones: tuple[int, ...]


@dataclass(frozen=True)
class Unlocked:
    """A removed apply lock: the run and who held it (``None``: there was no lock)."""

    url: str
    held_by: str | None
    audit_id: int | None = None


class Retention(Operation):
    """``retention plan|apply|pin|unpin|milestone|unlock`` and the Retention screen's keys."""

    def opening_run(self) -> tuple[str, bool]:
        """The run folder the Checkpoints and Retention screens open on, and whether to list it
        at once (the last run listed with this config, from the operator's preferences)."""
        from backend.retention.runs import opening_run
        from backend.ui_prefs import load_ui_prefs

        return opening_run(self.services.config, load_ui_prefs())

    def remember_run(self, url: str) -> None:
        """Remember ``url`` as the run those screens open on next time (best effort)."""
        from backend.retention.runs import remember_run

        remember_run(self.services.config, url)

    async def listing(self, ref: str) -> RunListing:
        """List the run ``ref`` afresh, with the pins and milestones recorded for it."""
        from backend.retention.apply import fetch_catalog
        from backend.retention.marks import MilestoneStore, PinStore

        url, keys = self.run(ref)
        async with self.services.stores.open(url) as store:
            catalog = await fetch_catalog(store)
        pins = PinStore(self.services.db).pins(url, keys)
        return RunListing(url, catalog, pins, MilestoneStore(self.services.db).milestones(url, keys))

    async def plan(
        self,
        ref: str,
        policy: RetentionPolicy,
        *,
        in_flight: Iterable[str] = (),
        catalog: Catalog | None = None,
        now: float | None = None,
    ) -> RetentionPlan:
        """The retention plan of the run ``ref`` under ``policy`` (plus the recorded pins,
        milestones and running jobs): the steps it keeps full are deep-checked first, and one
        that fails stops every delete. ``retention plan`` and the Retention screen both show
        this plan; ``catalog`` reuses a listing just made instead of listing again."""
        from backend.retention.apply import compute_plan

        return await compute_plan(self.services, ref, policy, in_flight=in_flight, now=now, catalog=catalog)

    async def apply(
        self,
        plan: RetentionPlan,
        *,
        dry_run: bool = False,
        in_flight: Iterable[str] = (),
        progress: Callable[[ActionOutcome], object] | None = None,
        reason: str | None = None,
    ) -> ApplyReport:
        """Re-check the plan against a fresh listing and act on what still holds (or only re-check).
        ``reason``: the operator's reason to go past the egress budget (its strips' reads)."""
        from backend.retention.apply import apply_plan

        if not dry_run:
            self.refuse_if_readonly("apply a retention plan")
        strips = [a for a in plan.actions if a.action == "strip-to-weights"]
        url, profile = self.services.stores.profile_for(plan.url)
        if dry_run or not strips or not url.startswith("s3://"):
            return await apply_plan(self.services, plan, dry_run=dry_run, in_flight=in_flight, progress=progress)
        return await self._apply_reserved(plan, strips, profile, in_flight=in_flight, progress=progress, reason=reason)

    async def _apply_reserved(
        self,
        plan: RetentionPlan,
        strips: list[PlannedAction],
        profile: StoreProfile | None,
        *,
        in_flight: Iterable[str],
        progress: Callable[[ActionOutcome], object] | None,
        reason: str | None,
    ) -> ApplyReport:
        """A plan that strips reads each strip's step from the store into this machine (the
        export): quoted, reserved and settled like a pull, at [egress] console_site. The guard
        refuses before anything is read; the strips that ran count at their reservation (the
        console's reads are not metered), an apply that stripped nothing releases it, and one
        that fails midway counts at the reservation."""
        from backend.config import StoreProfile
        from backend.jobs.records import new_job_id
        from backend.ledger import Reservation
        from backend.ops.reserved import read_here_reserved
        from backend.policy.egress import EgressSettings
        from backend.retention.apply import apply_plan

        site = self.services.config.section(EgressSettings).console_site
        job_id = f"retention-{plan.hash[:12]}-{new_job_id()}"
        priced_by = profile or StoreProfile(url=plan.url, name=plan.url)

        def stripped(report: ApplyReport) -> int:
            ran = {
                o.path for o in report.outcomes if o.action == "strip-to-weights" and o.outcome in ("done", "failed")
            }
            return sum(a.bytes_before for a in strips if a.path in ran)

        return await read_here_reserved(
            self.services,
            priced_by,
            Reservation(job_id, site, sum(a.bytes_before for a in strips), sum(a.object_count for a in strips)),
            lambda: apply_plan(self.services, plan, in_flight=in_flight, progress=progress),
            stripped,
            reason=reason,
            what="retention strip",
        )

    def run(self, ref: str) -> tuple[str, tuple[str, ...]]:
        """The run's canonical URL and the other spellings its records may be under."""
        from backend.retention.marks import canonical_run

        return canonical_run(self.services.config, ref)

    def pin(self, ref: str, step: int, reason: str = "") -> str:
        """Pin ``step`` of the run ``ref`` (no plan touches it); the run's canonical URL."""
        from backend.retention.marks import PinStore, norm_url

        self.refuse_if_readonly("change pins")
        url, _ = self.run(ref)
        PinStore(self.services.db).pin(url, step, reason)
        self.audit("retention.pin", f"{norm_url(url)}#{step}", "ok", reason=reason or None)
        return url

    def unpin(self, ref: str, step: int) -> str:
        from backend.retention.marks import PinStore, norm_url

        self.refuse_if_readonly("change pins")
        url, keys = self.run(ref)
        if not PinStore(self.services.db).unpin(url, step, keys):
            raise PolicyError(f"step {step} is not pinned under {url}")
        self.audit("retention.unpin", f"{norm_url(url)}#{step}", "ok")
        return url

    def mark_milestone(self, ref: str, step: int) -> str:
        """Mark ``step`` a milestone: plans keep it as BF16 weights at least."""
        from backend.retention.marks import MilestoneStore, norm_url

        self.refuse_if_readonly("change milestones")
        url, _ = self.run(ref)
        MilestoneStore(self.services.db).mark(url, step)
        self.audit("retention.milestone", f"{norm_url(url)}#{step}", "ok")
        return url

    def unmark_milestone(self, ref: str, step: int) -> str:
        from backend.retention.marks import MilestoneStore, norm_url

        self.refuse_if_readonly("change milestones")
        url, keys = self.run(ref)
        if not MilestoneStore(self.services.db).unmark(url, step, keys):
            raise PolicyError(f"step {step} is not marked a milestone under {url}")
        self.audit("retention.unmilestone", f"{norm_url(url)}#{step}", "ok")
        return url

    async def unlock(self, ref: str) -> Unlocked:
        """Remove the apply lock an apply that died left on a run (who held it is audited)."""
        from backend.retention.runs import LOCK_KEY, read_lock

        self.refuse_if_readonly("remove an apply lock")
        url, _ = self.run(ref)
        async with self.services.stores.open(url) as store:
            held = await read_lock(store)
            if held is None and await store.stat(LOCK_KEY) is None:
                return Unlocked(url, None)
            res = await store.delete_many([LOCK_KEY])
            if not res.ok:
                raise PolicyError(f"could not remove {url}/{LOCK_KEY}: {'; '.join(res.errors.values())}")
        who = held.describe() if held else "an unreadable lock"
        return Unlocked(url, who, self.audit("retention.unlock", url, "ok", detail={"held_by": who}))
