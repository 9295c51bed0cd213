"""``loadmaster watch``: the headless watcher that pages, for an on-call operator with no console open.

Every ``[alerts] interval`` one round (:meth:`Watcher.round`):

1. read what the console would show: the fleet snapshot from the telemetry hub (SSH sampler or
   the site's Prometheus, as configured), every job's state from its node (``JobManager.refresh``,
   which also records ends and settles egress), the month's egress report, unfinished retention
   applies from the journal;
2. :func:`backend.alerts.conditions.evaluate` them into conditions;
3. :meth:`backend.alerts.store.AlertStore.sync` them into the alerts table (new ones fire, gone ones
   resolve; start times kept across restarts and shared between watchers);
4. :meth:`backend.alerts.notify.Notifier.deliver` the table to Alertmanager and the webhook;
5. hand the round's numbers to the ``/metrics`` export, when one is served.

Nothing in a round raises out of it: a state database that is down, a node that is unreachable or
an Alertmanager that is down is a line in the round's result ("alerting degraded: ..."), and the
next round tries again with nothing lost (the table is the queue).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from backend.alerts.conditions import Condition, StallTracker, evaluate
from backend.alerts.notify import Delivery, Notifier
from backend.alerts.settings import AlertSettings
from backend.alerts.store import AlertStore, Changes, StoredAlert, interrupted_applies
from backend.errors import LoadmasterError

if TYPE_CHECKING:
    from backend.alerts.sources import WatchedServices

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Round:
    """What one round saw and did."""

    at: float
    conditions: tuple[Condition, ...]
    changes: Changes | None
    delivery: Delivery | None
    #: Parts that could not be read this round (state database, jobs, telemetry), one line each.
    problems: tuple[str, ...] = ()

    @property
    def degraded(self) -> str | None:
        parts = list(self.problems)
        if self.delivery is not None and self.delivery.degraded:
            parts.append(self.delivery.degraded)
        return "; ".join(parts) if parts else None


@dataclass
class Watcher:
    """One watcher over ``services`` (which it does not own: the caller closes it)."""

    services: WatchedServices
    #: Called with each round's :class:`Round` (the CLI prints changes; tests look).
    on_round: Callable[[Round], None] | None = None
    #: Called with the round's metrics snapshot when ``/metrics`` is served.
    on_metrics: Callable[[Any], None] | None = None
    settings: AlertSettings = field(init=False)
    stalls: StallTracker = field(default_factory=StallTracker)

    def __post_init__(self) -> None:
        self.settings = self.services.config.section(AlertSettings)
        self.store = AlertStore(self.services.db)
        self.notifier = Notifier(self.store, self.settings)
        self._telemetry_started = False
        self._started_at: float | None = None

    async def start(self) -> None:
        if self.services.config.nodes and not self._telemetry_started:
            await self.services.telemetry.start()
            self._telemetry_started = True
        if self._started_at is None:
            self._started_at = time.time()

    async def round(self) -> Round:
        """Evaluate, record and deliver once."""
        from backend.policy.egress import EgressSettings

        now = time.time()
        problems: list[str] = []
        fleet = self.services.telemetry.snapshot() if self._telemetry_started else None
        records: list[Any] = []
        try:
            records = await self.services.jobs.refresh()
        except LoadmasterError as exc:
            problems.append(f"jobs not read: {exc}")
        egress = interrupted = None
        try:
            egress = self.services.egress.report(now=now)
            interrupted = interrupted_applies(self.services.db)
        except LoadmasterError as exc:
            problems.append(f"state database: {exc}")
        stalled = self.stalls.observe(records, now)
        conditions = evaluate(
            self.settings,
            fleet=fleet,
            records=records,
            stalled=stalled,
            egress=egress,
            warn_at=self.services.config.section(EgressSettings).warn_at,
            interrupted=interrupted or (),
            now=now,
        )
        changes = delivery = None
        unknown = self._unknown(
            fleet, jobs_read=not any(p.startswith("jobs") for p in problems), state_read=egress is not None, now=now
        )
        try:
            changes = self.store.sync(conditions, now, unknown=unknown)
            delivery = await self.notifier.deliver(now)
        except LoadmasterError as exc:
            # Without the table there is no queue: the conditions are evaluated again next round.
            problems.append(f"alerts not recorded: {exc}")
        if self.on_metrics is not None:
            from backend.alerts.metrics import gather_metrics

            try:
                self.on_metrics(await gather_metrics(self.services, fleet, jobs=records if not problems else None))
            except Exception:  # the export must never stop paging
                log.exception("metrics snapshot failed")
        out = Round(now, tuple(conditions), changes, delivery, tuple(problems))
        if self.on_round is not None:
            self.on_round(out)
        return out

    def _unknown(self, fleet: Any, *, jobs_read: bool, state_read: bool, now: float) -> Callable[[StoredAlert], bool]:
        """Which firing rows this round cannot judge (kept firing, not resolved)."""
        from backend.telemetry.settings import TelemetrySettings

        nodes = {n.name: n for n in fleet.nodes} if fleet is not None else {}
        # The starvation detector needs its window of samples before "not starved" means anything.
        window = self.services.config.section(TelemetrySettings).starved_window + 2 * self.settings.interval
        warmed = self._started_at is not None and now - self._started_at >= window

        def unknown(row: StoredAlert) -> bool:
            name, labels = row.alertname, row.labels
            if name in ("GPUStarved", "NodeUnreachable"):
                n = nodes.get(labels.get("node", ""))
                if n is None:
                    # A node no longer in the inventory: its condition is gone for good.
                    return fleet is None
                if n.state == "connecting" or (n.state != "unreachable" and n.samples < 2):
                    return True
                return name == "GPUStarved" and not warmed and n.state == "up"
            if name == "GPUXid":
                # An Xid is an event: it stays its full hold, whoever saw it first.
                return now - row.starts_at <= self.settings.held_for
            if name == "TransferStalled":
                # A restarted watcher has not watched the job's bytes for stall_after yet: it
                # cannot tell a stall that goes on from one that ended.
                if not jobs_read:
                    return True
                still = self.stalls.watched_for(labels.get("job_id", ""), now) < self.settings.stall_after
                return still and labels.get("job_id", "") in self.stalls.seen
            if name in ("UploadBacklog", "JobLost", "VerificationFailed"):
                return not jobs_read
            if name.startswith("EgressBudget") or name == "RetentionApplyInterrupted":
                return not state_read
            return False

        return unknown

    async def run(self, *, rounds: int | None = None, stop: asyncio.Event | None = None) -> Round | None:
        """Rounds every interval until ``stop`` is set (or ``rounds`` have run)."""
        await self.start()
        last = None
        n = 0
        try:
            while True:
                t0 = time.monotonic()
                last = await self.round()
                n += 1
                if rounds is not None and n >= rounds:
                    return last
                wait = max(0.5, self.settings.interval - (time.monotonic() - t0))
                if stop is None:
                    await asyncio.sleep(wait)
                    continue
                try:
                    await asyncio.wait_for(stop.wait(), wait)
                    return last
                except TimeoutError:
                    pass
        finally:
            await self.close()

    async def close(self) -> None:
        await self.notifier.close()
