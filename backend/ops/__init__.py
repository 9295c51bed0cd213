"""The operation layer: every action an operator takes is one call here, and both front ends use it.

The command line (``tui/cli``) and the console (``tui/app.py``, ``tui/screens``) only collect
input, call an operation, and render its progress and result. The safety promises live here, in
one order, whichever front end asked:

1. **read-only refusal** (:class:`backend.errors.ReadOnlyRefused`) for anything that changes state;
2. **validation** of the request (one clear line naming what to fix);
3. **a fresh plan or quote**: a pull lists again unless the plan the operator saw is a minute or
   two old, and prices the egress afresh either way; a retention apply re-lists every step;
4. **the egress gate** (block, or confirm without a reason, stops it here);
5. **the action**;
6. **the audit record** (the same record from either front end);
7. **the result object** the front end renders.

``Operations(services)`` holds them for one :class:`backend.services.Services`; each front end
builds its own (the console one for the app, the command line one per command), never a feature module.

| operation | call |
| :- | :- |
| pull, fan-out pull (a node pattern) | ``ops.pulls.plan(req)``, ``ops.pulls.start(req, shown=preview)`` |
| upload, strip | ``ops.checkpoints.upload(req)``, ``ops.checkpoints.strip(req)`` |
| shard | ``ops.shards.preview(req)``, ``ops.shards.convert_here(req)``, ``ops.shards.start_on_node(node, req)`` |
| cancel | ``ops.jobs.cancel(job_id, reason=)`` |
| retention apply, pin, unpin, milestone, unlock | ``ops.retention.apply(plan)``, ``.pin``, ``.unpin``, ``.mark_milestone``, ``.unmark_milestone``, ``.unlock`` |
| egress override | ``ops.egress.quote(store, nbytes, node=, reason=)`` |
| site alerts, silence, expire | ``ops.alerts.site()``, ``ops.alerts.silence(req)``, ``ops.alerts.expire(id)``, ``ops.alerts.status()`` |
| triage (suspects, evidence, commands) | ``await ops.triage.run(job=)`` or ``run(nodes=)`` |
| reads both front ends render | ``ops.jobs.listing()``, ``ops.state.audit_entries()``, ``ops.egress.report()``, ``ops.checkpoints.listing(ref)``, ``ops.retention.plan(ref, policy)`` (and ARCHITECTURE.md's table) |
| nodes, doctor, a sampling hub for ``top`` | ``ops.fleet.connection_settings(nodes)``, ``await ops.fleet.doctor(names, limit=)``, ``ops.fleet.sampler(settings, names)`` |
| Slurm nodes, drain, resume | ``ops.slurm.rows()``, ``ops.slurm.plan_drain(...)``/``drain(plan)``, ``ops.slurm.plan_resume(...)``/``resume(plan)`` |
| state repair, state migrate | ``ops.state.repair(force=)``, ``ops.state.migrate(url, merge=, dry_run=)`` |
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from backend.ops.exports import lazy_exports
from backend.ops.pull import PullPreview, PullRequest, Pulls, PullStarted

# Each operation's module is imported when a front end first uses it: a pull (one command, one
# process) does not load the checkpoint, retention, shard, job or egress report operations.
if TYPE_CHECKING:
    from backend.ops.alerts import Alerts
    from backend.ops.checkpoints import Checkpoints, StripRequest, UploadRequest
    from backend.ops.egress import Egress
    from backend.ops.fleet import Fleet
    from backend.ops.jobs import Jobs
    from backend.ops.retention import Retention
    from backend.ops.shards import Shards
    from backend.ops.slurm import Slurm
    from backend.ops.state import State
    from backend.ops.triage import Triage
    from backend.services import Services
else:  # mypy reads the imports above; at run time each name loads on first use
    __getattr__ = lazy_exports(__name__, dict.fromkeys(("StripRequest", "UploadRequest"), "backend.ops.checkpoints"))


class Operations:
    """Every operation, on one set of services."""

    def __init__(self, services: Services) -> None:
        self.services = services

    @cached_property
    def pulls(self) -> Pulls:
        return Pulls(self.services)

    @cached_property
    def checkpoints(self) -> Checkpoints:
        from backend.ops.checkpoints import Checkpoints

        return Checkpoints(self.services)

    @cached_property
    def shards(self) -> Shards:
        from backend.ops.shards import Shards

        return Shards(self.services)

    @cached_property
    def jobs(self) -> Jobs:
        from backend.ops.jobs import Jobs

        return Jobs(self.services)

    @cached_property
    def retention(self) -> Retention:
        from backend.ops.retention import Retention

        return Retention(self.services)

    @cached_property
    def egress(self) -> Egress:
        from backend.ops.egress import Egress

        return Egress(self.services)

    @cached_property
    def alerts(self) -> Alerts:
        from backend.ops.alerts import Alerts

        return Alerts(self.services)

    @cached_property
    def fleet(self) -> Fleet:
        from backend.ops.fleet import Fleet

        return Fleet(self.services)

    @cached_property
    def slurm(self) -> Slurm:
        from backend.ops.slurm import Slurm

        return Slurm(self.services)

    @cached_property
    def triage(self) -> Triage:
        from backend.ops.triage import Triage

        return Triage(self.services, slurm=self.slurm, pulls=self.pulls)

    @cached_property
    def state(self) -> State:
        from backend.ops.state import State

        return State(self.services)


__all__ = ["Operations", "PullPreview", "PullRequest", "PullStarted", "StripRequest", "UploadRequest"]
