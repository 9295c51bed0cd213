"""Pulls: plan (listing, free space, ETA, egress quote), then start one durable job per node.

A fan-out pull is the same operation with a node pattern (``gpu-[01-16]``): every matching node
receives the whole source, each priced in the egress quote.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backend.errors import ConfigError, JobError, PolicyError
from backend.ops.base import Operation, signals_cancel_launch
from backend.ops.exports import lazy_exports

if TYPE_CHECKING:
    from backend.jobs.records import JobRecord
    from backend.ledger import Reserved
    from backend.pulls.model import PRESETS, PullPlan
    from backend.pulls.relay.ssh_hops import SshHops
    from backend.pulls.relay.view import chain_lines, relay_groups
    from backend.pulls.settings import FANOUTS, PullSettings

#: How long a plan the operator was shown stands for its listing and free space. Older, the
#: start lists the source and probes the nodes again; the egress quote is always made afresh.
PLAN_FRESH_S = 120.0

#: What the front ends import from here: the operation, its request, preview and result, and the
#: pull's presets, fan-out modes, settings and relay-chain text both front ends show.
__all__ = [
    "FANOUTS",
    "PRESETS",
    "PullPreview",
    "PullRequest",
    "PullSettings",
    "PullStarted",
    "Pulls",
    "SshHops",
    "chain_lines",
    "fanout_lines",
    "relay_groups",
]
if not TYPE_CHECKING:  # mypy reads the imports above; at run time each name loads on first use
    __getattr__ = lazy_exports(
        __name__,
        {
            "PRESETS": "backend.pulls.model",
            "SshHops": "backend.pulls.relay.ssh_hops",
            **dict.fromkeys(("chain_lines", "relay_groups"), "backend.pulls.relay.view"),
            **dict.fromkeys(("FANOUTS", "PullSettings"), "backend.pulls.settings"),
        },
    )


@dataclass(frozen=True)
class PullRequest:
    """What an operator asks for: the same fields from the CLI flags and the console's form."""

    src: str
    dest: str
    #: A node name, hostlist (``gpu-[01-04]``) or glob: one job per matching node.
    nodes: str
    store: str | None = None
    numworkers: int | None = None
    concurrency: int | None = None
    part_size_mib: int | None = None
    #: The operator's reason to start over the egress budget (audited), if any.
    reason: str | None = None
    #: ``direct``, ``relay``, ``auto`` (None: ``[pull] fanout``); a relay's seeds per site and degree.
    fanout: str | None = None
    seeds: int | None = None
    degree: int | None = None
    #: The Slurm job the pull is for (``--slurm-job N``): each job's row is tagged with it.
    slurm_job: str | None = None


@dataclass(frozen=True)
class PullPreview:
    """A plan as shown before the start, with whether it may start and, if not, why."""

    request: PullRequest
    plan: PullPlan
    planned_at: float
    #: Why it cannot start as asked (problems on nodes, the egress guard), one line each.
    blockers: tuple[str, ...]
    #: Said with the plan but not blocking (the guard's warn).
    warnings: tuple[str, ...] = ()

    @property
    def startable(self) -> bool:
        return not self.blockers

    def lines(self) -> list[str]:
        """The plan as the operator reads it, then what stops it."""
        from backend.jobs.fmt import describe_plan

        return describe_plan(self.plan) + fanout_lines(self.plan) + [f"not startable: {b}" for b in self.blockers]


@dataclass(frozen=True)
class PullStarted:
    """The jobs a start launched (one per node), under the plan they run and its audit record."""

    plan: PullPlan
    records: tuple[JobRecord, ...]
    audit_id: int
    warnings: tuple[str, ...] = field(default=())
    request: PullRequest | None = None
    #: relay-ssh: the hops this process carries through SSH (close it once the jobs have ended).
    hops: SshHops | None = None
    #: The launch the jobs are (``job cancel LAUNCH`` stops them all); each job id starts with it.
    launch: str | None = None

    def needs_retry(self, record: JobRecord) -> bool:
        """A relay node whose job died (lost) or failed: its copy is to be fetched again."""
        return record.kind == "relay" and record.state in ("lost", "failed")


def fanout_lines(plan: PullPlan) -> list[str]:
    """How the data reaches the nodes, and what the store sends: 1x against N x, and the saving."""
    from backend.units import bytes_text, usd_text

    out = []
    if plan.fanout == "direct":
        if plan.fanout_note:
            out.append(f"  fan-out: direct ({plan.fanout_note})")
        return out
    out.append(f"  fan-out: {plan.fanout}" + (f" ({plan.fanout_note})" if plan.fanout_note else ""))
    if plan.topology is not None:
        from backend.pulls.relay.planner import seed_flags

        out += [f"    {line}" for line in plan.topology.lines()]
        flags = (plan.numworkers, plan.concurrency, plan.part_size_mib)
        seed = seed_flags(plan.total_bytes, len(plan.objects), *flags)
        if seed != flags:
            out.append(
                f"    seeds: s5cmd --numworkers {seed[0]} cp --concurrency {seed[1]} --part-size {seed[2]} "
                "(objects land one after another: peers start on each while the next downloads)"
            )
    if plan.store_cost and plan.direct_cost:
        k = len(plan.store_nodes)
        n = len(plan.nodes)
        line = (
            f"  the store sends {k}x: {bytes_text(plan.store_cost[0])} ({usd_text(plan.store_cost[1])}) "
            f"instead of {n}x: {bytes_text(plan.direct_cost[0])} ({usd_text(plan.direct_cost[1])})"
        )
        saved = plan.saved_usd
        if saved is not None:
            line += f"; saves {usd_text(saved)} this month"
        out.append(line)
    return out


class Pulls(Operation):
    """``pull`` from the CLI and the Transfers screen's form."""

    @property
    def settings(self) -> PullSettings:
        """The ``[pull]`` section: what a front end shows or waits by (the assumed line rate, how
        long a follow waits for a relay receiver to re-attach)."""
        from backend.pulls.settings import PullSettings

        return self.services.config.section(PullSettings)

    def validate(self, req: PullRequest) -> list[str]:
        """Step 2: the request's own faults, and the node names it selects."""
        if not req.src.startswith("s3://"):
            raise ConfigError(f"the source must be an s3:// URL, got {req.src!r}")
        if not req.dest.strip():
            raise ConfigError("choose a destination directory")
        if not req.nodes.strip():
            raise ConfigError("choose the destination node(s): a name, a hostlist or a glob")
        if req.slurm_job is not None:
            from backend.ops.slurm import check_job_id

            check_job_id(req.slurm_job)
        for name, v in (
            ("numworkers", req.numworkers),
            ("concurrency", req.concurrency),
            ("part size", req.part_size_mib),
            ("--seeds", req.seeds),
            ("--degree", req.degree),
        ):
            if v is not None and v < 1:
                raise ConfigError(f"{name} must be at least 1, got {v}")
        pattern = req.nodes.strip()
        if not any(c in pattern for c in "*?[],"):
            return [self.services.config.node(pattern).name]  # one name: "unknown node" names the known ones
        return [n.name for n in self.services.config.select(pattern)]

    async def plan(self, req: PullRequest) -> PullPreview:
        """List the source, probe each node and quote the egress (read-only services may plan)."""
        from backend.pulls.plan import plan_pull

        nodes = self.validate(req)
        plan = await plan_pull(
            self.services.config,
            self.services.pool,
            lambda: self.services.egress,
            req.src,
            req.dest,
            nodes,
            store=req.store,
            numworkers=req.numworkers,
            concurrency=req.concurrency,
            part_size_mib=req.part_size_mib,
            allow_over_budget=req.reason,
            fanout=req.fanout,
            seeds=req.seeds,
            degree=req.degree,
            prepare=lambda: self.services.jobs,
        )
        return self._preview(req, plan, time.time())

    def _preview(self, req: PullRequest, plan: PullPlan, at: float) -> PullPreview:
        blockers = list(plan.problems)
        warnings: list[str] = []
        dec = plan.egress
        if dec is not None and dec.action == "block":
            blockers.append(f"the egress guard blocks this pull: {dec.message}")
        elif dec is not None and dec.action == "confirm" and not dec.override_reason:
            blockers.append(f"the egress guard needs a reason to go over budget: {dec.message}")
        elif dec is not None and dec.action == "warn":
            warnings.append(dec.message)
        return PullPreview(req, plan, at, tuple(blockers), tuple(warnings))

    async def _fresh(self, req: PullRequest, shown: PullPreview | None) -> PullPreview:
        """Step 3: the plan to act on. The listing of a plan just shown stands; the quote never does."""
        if shown is None or shown.request != req or time.time() - shown.planned_at > PLAN_FRESH_S:
            return await self.plan(req)
        from backend.pulls.fanout import egress_check
        from backend.pulls.plan import resolve_store

        self.validate(req)
        plan = shown.plan
        profile = resolve_store(self.services.config, plan.src, plan.store)
        nodes = [self.services.config.node(n) for n in plan.store_nodes]
        decision, note = egress_check(
            self.services.egress, profile, nodes, plan.total_bytes, len(plan.objects), req.reason, src=plan.src
        )
        plan = dataclasses.replace(plan, egress=decision, egress_note=note or plan.egress_note)
        return self._preview(req, plan, shown.planned_at)

    async def start(self, req: PullRequest, *, shown: PullPreview | None = None, label: str = "") -> PullStarted:
        """Start the pull: refuse in read-only mode, re-check, gate on egress, launch, audit."""
        from backend.jobs.records import launch_job_ids, new_launch_id
        from backend.pulls.launch import launch_pull

        self.refuse_if_readonly("launch a pull")
        preview = await self._fresh(req, shown)
        plan = preview.plan
        if plan.problems:
            raise JobError("not started: " + "; ".join(plan.problems))
        if not preview.startable:
            raise PolicyError(
                "not started: "
                + "; ".join(preview.blockers)
                + ("" if req.reason else "; give a reason to go over budget (--allow-over-budget)")
            )
        # One launch: every node's job id is <launch>.<n>, and the launch is recorded with each.
        launch = new_launch_id()
        job_ids = launch_job_ids(launch, [n.node for n in plan.nodes])
        self.services.jobs.expect_launch(launch, job_ids.values())
        if req.slurm_job:
            self.services.jobs.store.expect_slurm_job(job_ids.values(), req.slurm_job)
        with signals_cancel_launch():
            reserved = self._reserve(req, plan, job_ids)
            hops = None
            try:
                dec = reserved.decision or plan.egress
                if dec is not None and dec.override_reason:
                    self.audit_override(dec)
                upstreams = None
                if plan.fanout == "relay-ssh":
                    from backend.pulls.relay.ssh_hops import SshHops

                    hops = SshHops(self.services.config, [n.node for n in plan.nodes])
                    upstreams = await hops.open(plan)
                records = tuple(
                    await launch_pull(
                        self.services.jobs,
                        self.services.config,
                        self.services.egress,
                        plan,
                        label=label,
                        job_ids=job_ids,
                        upstreams=upstreams,
                    )
                )
            except BaseException as exc:
                self._release_unstarted(job_ids, exc)
                if hops is not None:
                    await hops.close()
                raise
        audit_id = self.audit(
            "pull.launch",
            plan.src,
            "started",
            reason=req.reason,
            detail={
                "launch": launch,
                "dest": plan.dest,
                "nodes": [r.node for r in records],
                "jobs": [r.id for r in records],
                "bytes": plan.total_bytes,
                "objects": len(plan.objects),
                "fanout": plan.fanout,
                "store_bytes": plan.store_cost[0] if plan.store_cost else None,
                "seeds": plan.store_nodes if plan.topology is not None else None,
            },
        )
        return PullStarted(plan, records, audit_id, preview.warnings, req, hops, launch)

    def load_endings(self, started: PullStarted) -> None:
        """Import what this console runs when the started jobs end (each kind's ``on_ended``: the
        egress settle), so a one-shot command loads it while the copy runs instead of after it
        (the kind's module is the node's runner too: ~30 ms of imports). Only a head start: a
        kind that fails to load here is loaded again at the end, which reports what fails."""
        from backend.agent.kinds import kind

        for name in sorted({r.kind for r in started.records}):
            with contextlib.suppress(Exception):
                kind(name)

    async def retry_from_store(self, started: PullStarted, record: JobRecord, *, label: str = "") -> JobRecord:
        """Fetch a dead relay node's copy from the store: a direct pull to that node alone, priced
        and reserved like any pull (the store sends it the data again), and audited.

        Raises NodeUnreachable while the node is down (its reservation is released); call again
        when it returns.
        """
        from backend.jobs.records import retry_job_id
        from backend.pulls.launch import launch_pull

        self.refuse_if_readonly("retry a pull")
        plan = started.plan
        est = next((n for n in plan.nodes if n.node == record.node), None)
        if est is None:
            raise JobError(f"{record.node} is not a node of this pull")
        if not est.s5cmd:
            raise JobError(
                f"{record.node} has no s5cmd to fetch its copy from the store; install it and pull to it again"
            )
        one = dataclasses.replace(
            plan,
            nodes=(dataclasses.replace(est, needs_s5cmd=True),),
            fanout="direct",
            topology=None,
            relay_listen={},
            plan_problems=(),
        )
        # The retry is one more job of the same launch (cancelled with it).
        launch = started.launch or record.launch
        job_ids = {record.node: retry_job_id(launch)}
        if launch:
            self.services.jobs.expect_launch(launch, job_ids.values())
        if record.slurm_job:
            self.services.jobs.store.expect_slurm_job(job_ids.values(), record.slurm_job)
        reason = started.request.reason if started.request else None
        req = started.request or PullRequest(plan.src, plan.dest, record.node, store=plan.store)
        with signals_cancel_launch():
            self._reserve(dataclasses.replace(req, reason=reason), one, job_ids)
            try:
                [rec] = await launch_pull(
                    self.services.jobs,
                    self.services.config,
                    self.services.egress,
                    one,
                    label=label or f"pull {plan.src} -> {est.dest} (retry of {record.id})",
                    job_ids=job_ids,
                )
            except BaseException as exc:
                self._release_unstarted(job_ids, exc)
                raise
        self.audit(
            "pull.retry",
            plan.src,
            "started",
            reason=reason,
            detail={"node": record.node, "job": rec.id, "retry_of": record.id, "was": record.state},
        )
        return rec

    def _release_unstarted(self, job_ids: dict[str, str], exc: BaseException) -> None:
        """After a launch that failed or was interrupted (SIGTERM, SIGHUP): see
        ``backend.ops.reserved.release_unstarted`` (shared with shard and strip launches)."""
        from backend.ops.reserved import release_unstarted

        release_unstarted(self.services, job_ids.values(), exc)

    def _reserve(self, req: PullRequest, plan: PullPlan, job_ids: dict[str, str]) -> Reserved:
        """Step 4: the budget check and every node's reservation, in one transaction, before any
        job starts (each node's job is reserved what the store will send it: the whole pull; in a
        relay only the seeds take it from the store, so only they are reserved)."""
        from backend.ledger import Reservation
        from backend.pulls.plan import resolve_store
        from backend.storage import egress_profile

        profile = resolve_store(self.services.config, plan.src, plan.store) or egress_profile(
            self.services.config, None, plan.src
        )
        items = [
            Reservation(job_ids[n.node], self.services.config.node(n.node).site, plan.total_bytes, len(plan.objects))
            for n in plan.nodes
            if n.node in plan.store_nodes
        ]
        return self.services.egress.reserve(profile, items, allow_over_budget_reason=req.reason)
