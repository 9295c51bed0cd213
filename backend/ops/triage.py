"""Triage: why did the run stop or slow down, and which node to exclude.

| operation | call |
| :- | :- |
| triage a Slurm job's nodes | ``await ops.triage.run(job="1234")`` |
| triage named nodes | ``await ops.triage.run(nodes=["node-01", "node-02"])`` |
| stage a restart: the pick and the pull | ``plan = await ops.triage.restage_plan(run, "node-[01-02]")`` |
| pull it (relayed, verified, audited) | ``await ops.triage.restage(plan)`` |

Each node is read once over its transport (one script: the GPU health query, the remapped-rows
query, the kernel log's Xids), all nodes at once; with ``[slurm] enabled`` Slurm's state, reason
and GPU count join in. The result (:class:`backend.triage.analyze.TriageReport`) ranks suspects
with their evidence and carries the commands to exclude, drain and resume: shown, never run.
Triage changes nothing, so it runs in read-only mode too; ``restage`` launches a pull and is
refused there (and audited everywhere).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from backend.errors import ConfigError, LoadmasterError, PolicyError
from backend.ops.base import Operation
from backend.slurm.model import SlurmSnapshot
from backend.slurm.parse import expand_nodes
from backend.telemetry.parse import split_sections
from backend.telemetry.settings import TelemetrySettings
from backend.textfmt import safe_text
from backend.triage.analyze import NO_TELEMETRY, NodeHealth, TriageReport, analyze
from backend.triage.goodput import lines as goodput_lines
from backend.triage.restart import restart_lines
from backend.triage.signals import SCRIPT, parse_health, parse_xids

#: How long one node may take to answer before it counts as unreachable.
NODE_TIMEOUT_S = 20.0
#: Xids older than this are history, not evidence.
XID_WINDOW_S = 24 * 3600.0
#: Nodes read at once.
PARALLEL = 64
#: How long ``restage`` waits for the nodes to hold the step before reporting them not ready.
RESTAGE_WAIT_S = 3600.0

if TYPE_CHECKING:
    from backend.jobs.records import JobRecord
    from backend.ops.pull import Pulls
    from backend.ops.restage import RestagePlan, RestageResult
    from backend.ops.slurm import Slurm
    from backend.services import Services


#: What the front ends import from here: the operation, its report, and the report's restart and
#: goodput sections as lines (``loadmaster triage`` and the Triage screen print the same lines).
__all__ = ["Triage", "TriageReport", "goodput_lines", "restart_lines"]


class Triage(Operation):
    """Read nodes' health and rank the suspects (read-only)."""

    def __init__(self, services: Services, *, slurm: Slurm, pulls: Pulls) -> None:
        """``slurm`` and ``pulls``: the same container's (``Operations``), so triage reads the Slurm
        snapshot the Fleet screen cached and a restage pulls as ``ops.pulls`` does."""
        super().__init__(services)
        self.slurm = slurm
        self.pulls = pulls

    async def run(
        self,
        *,
        job: str | None = None,
        nodes: list[str] | None = None,
        source: str | None = None,
        run: str | None = None,
    ) -> TriageReport:
        """Triage one Slurm job's nodes (``job``) or the nodes named, through ``source`` (``ssh``
        or ``prometheus``; default: the ``[telemetry]`` source, ``auto`` meaning Prometheus when
        a URL is set). With ``run`` (a run folder), the newest step proven resumable."""
        if (job is None) == (nodes is None):
            raise ConfigError("name a job (--job ID) or nodes (--nodes LIST), not both", key="triage")
        snap = await self._slurm(required=job is not None)
        names: list[str]
        if job is not None:
            assert snap is not None
            found = [j for j in snap.jobs if j.job_id == job.strip()]
            if not found and snap.skipped_job_lines:
                raise ConfigError(
                    f"Slurm job {job.strip()!r} is not among the jobs read: {len(snap.skipped_job_lines)} job "
                    f"record(s) could not be read (first: {safe_text(snap.skipped_job_lines[0], 160)}), "
                    "it may be one of them",
                    key="--job",
                )
            if not found:
                raise ConfigError(f"Slurm has no running or pending job {job.strip()!r}", key="--job")
            names = list(dict.fromkeys(n for j in found for n in j.nodes))
            if not names:
                raise ConfigError(f"job {job.strip()} has no nodes yet (pending)", key="--job")
        else:
            try:
                names = list(dict.fromkeys(n for expr in nodes or [] for n in expand_nodes(expr)))
            except ValueError as exc:
                raise ConfigError(str(exc), key="--nodes") from None
            if not names:
                raise ConfigError("name at least one node", key="--nodes")
        unknown = [n for n in names if n not in self.services.pool.names]
        sem = asyncio.Semaphore(PARALLEL)
        if self._source(source) == "prometheus":
            healths = await self._read_prometheus(names, snap)
        else:
            healths = list(await asyncio.gather(*(self._read(n, snap, sem, unknown) for n in names)))
        report = analyze(healths, job=job)
        from backend.triage import goodput

        failures, failures_from, why_no = await self._restarts(job, snap)
        if run is not None:
            from backend.triage.restart import restage_command, resumable_and_history

            ck, history = await resumable_and_history(
                self.services.config, self.services.stores, self.services.jobs, run
            )
            accused = {x.node for x in report.suspects}
            cmd = restage_command(
                ck, [n.node for n in report.nodes if n.node not in accused and n.reachable and n.read]
            )
            good = goodput.compute(
                history,
                proven_step=ck.get("step"),
                newest_step=(ck["step"] + ck["steps_lost_at_least"]) if ck.get("steps_lost_at_least") else None,
                failures=failures,
                failures_from=failures_from,
                why_no_failures=why_no,
            )
            report = replace(report, checkpoint=ck, commands=report.commands + ((cmd,) if cmd else ()))
        else:
            good = goodput.compute(
                [],
                proven_step=None,
                failures=failures,
                failures_from=failures_from,
                why_no_failures=why_no,
                why_no_steps="no run given (--run URL, or the run mapped to the job)",
            )
        return replace(report, goodput=good)

    async def _restarts(self, job: str | None, snap: SlurmSnapshot | None) -> tuple[int | None, str | None, str]:
        """How often Slurm restarted or requeued ``job`` (``scontrol show job``'s ``Restarts``), where
        that came from, and why it is unknown when it is."""
        if job is None:
            return None, None, "no Slurm job given (--job): restarts and requeues unknown"
        from backend.slurm.parse import key_values

        slurm = self.slurm
        try:
            res = await slurm.client.run(slurm.client.argv("scontrol", "show", "job", "-o", job.strip()))
        except LoadmasterError as exc:
            return None, None, f"scontrol show job {job.strip()} failed: {safe_text(str(exc), 120)}"
        line = next((ln for ln in res.stdout.decode(errors="replace").splitlines() if "JobId=" in ln), "")
        restarts = key_values(line).get("Restarts", "")
        if not restarts.isdigit():
            return None, None, f"Slurm's record of job {job.strip()} has no restart count"
        return int(restarts), f"Slurm's restart/requeue count of job {job.strip()}", ""

    async def restage_plan(
        self, run: str, nodes: str, *, dest: str | None = None, reason: str | None = None
    ) -> RestagePlan:
        """The newest step proven resumable in ``run`` and the pull (relay fan-out) that brings it
        to ``nodes``, quoted; no proof, no pick (``refused`` says why). Read-only services may plan."""
        from backend.ops.pull import PullRequest
        from backend.ops.restage import RestagePlan
        from backend.triage.restart import newest_resumable

        if not nodes.strip():
            raise ConfigError("name the nodes that will resume (--nodes LIST)", key="--nodes")
        ck = await newest_resumable(self.services.config, self.services.stores, self.services.jobs, run)
        url = str(ck.get("url") or "")
        if ck.get("step") is None:
            return RestagePlan(run, nodes, ck, None, str(ck.get("why") or "no step proves resumable"))
        if not url.startswith("s3://"):
            why = f"the run is not in an object store ({safe_text(url, 120)}): restage pulls from s3:// runs"
            return RestagePlan(run, nodes, ck, None, why)
        path = str(ck["path"]).strip("/")
        src = f"{url.rstrip('/')}/{path}/"
        req = PullRequest(src, dest or f"restart/{path.rsplit('/', 1)[-1]}", nodes, fanout="relay", reason=reason)
        return RestagePlan(run, nodes, ck, await self.pulls.plan(req))

    async def restage(self, plan: RestagePlan, *, wait_s: float = RESTAGE_WAIT_S) -> RestageResult:
        """Pull the picked step once and relay it to the plan's nodes; wait until every node holds
        it verified (or ``wait_s`` passes). Refused in read-only mode and without a pick; audited."""
        from backend.ops.restage import RestageResult

        self.refuse_if_readonly("restage a run")
        if plan.preview is None or plan.refused:
            self.audit("triage.restage", plan.run, "refused", detail={"nodes": plan.nodes, "why": plan.refused})
            raise PolicyError(f"not restaged: {plan.refused or 'no plan'}")
        step = plan.checkpoint.get("step")
        t0 = time.monotonic()
        started = await self.pulls.start(
            plan.preview.request, shown=plan.preview, label=f"restage {plan.run} step {step}"
        )
        try:
            records = await self._follow(list(started.records), t0 + wait_s)
        finally:
            if started.hops is not None:
                await started.hops.close()
        elapsed = time.monotonic() - t0
        ok = all(r.state == "succeeded" for r in records)
        p = started.plan
        store = p.store_cost[0] if p.store_cost else p.total_bytes * len(p.store_nodes)
        direct = p.direct_cost[0] if p.direct_cost else p.total_bytes * len(p.nodes)
        audit_id = self.audit(
            "triage.restage",
            plan.run,
            "staged" if ok else "not-ready",
            reason=plan.preview.request.reason,
            detail={
                "step": step,
                "path": plan.checkpoint.get("path"),
                "nodes": [r.node for r in records],
                "jobs": [r.id for r in records],
                "ready_s": round(elapsed, 3) if ok else None,
                "store_bytes": store,
                "direct_bytes": direct,
                "pull_audit": started.audit_id,
            },
        )
        return RestageResult(
            plan, tuple(records), elapsed if ok else None, elapsed, store, direct, p.saved_usd, audit_id
        )

    async def _follow(self, records: list[JobRecord], deadline: float) -> list[JobRecord]:
        """Wait on the nodes (up to 2 s a round) until every job has ended or ``deadline`` passes."""
        jobs = self.services.jobs
        current = records
        while True:
            current = list(await asyncio.gather(*(jobs.refresh_job(r.id, max_wait=2.0) for r in records)))
            if all(r.terminal for r in current) or time.monotonic() > deadline:
                return current
            if any(r.note for r in current):
                await asyncio.sleep(jobs.settings.poll_interval)  # a node does not answer: do not spin

    def _source(self, source: str | None) -> str:
        tel = self.services.config.section(TelemetrySettings)
        want = source or tel.source
        if want not in ("ssh", "prometheus", "auto"):
            raise ConfigError(f"source must be ssh or prometheus, got {safe_text(want, 40)!r}", key="--source")
        if want == "auto":
            return "prometheus" if tel.prometheus_url else "ssh"
        if want == "prometheus" and not tel.prometheus_url:
            raise ConfigError("prometheus needs [telemetry] prometheus_url", key="--source")
        return want

    async def _read_prometheus(self, names: list[str], snap: SlurmSnapshot | None) -> list[NodeHealth]:
        from backend.triage.prometheus import merge_slurm, read_health

        tel = self.services.config.section(TelemetrySettings)
        got = await read_health(tel, self.services.config.nodes, names)
        out = []
        for name in names:
            base = self._base(name, snap)
            if name in got:
                out.append(merge_slurm(got[name], base))
                continue
            # No series at all for the node: that proves the telemetry is missing (its exporter down
            # or not scraped, or a node without GPUs), never that its GPUs are.
            why = "Prometheus has no DCGM series for it: its exporter is down or not scraped" + (
                f" (Slurm lists {base.expected_gpus} GPUs)" if base.expected_gpus else ", or it has no GPUs"
            )
            out.append(
                replace(
                    base,
                    read=False,
                    gpu_status=NO_TELEMETRY,
                    telemetry=why,
                    xid_error="no DCGM series in Prometheus",
                )
            )
        return out

    def _base(self, name: str, snap: SlurmSnapshot | None) -> NodeHealth:
        sn = snap.node(name) if snap is not None else None
        return NodeHealth(
            name,
            reachable=True,
            read_at=time.time(),
            expected_gpus=sn.gpus if sn is not None and sn.gpus else None,
            slurm_state=sn.state.label if sn is not None else None,
            slurm_reason=(sn.reason or None) if sn is not None else None,
            slurm_reason_at=sn.reason_at if sn is not None else None,
        )

    async def _slurm(self, *, required: bool) -> SlurmSnapshot | None:
        slurm = self.slurm
        if not slurm.settings.enabled:
            if required:
                raise ConfigError("needs Slurm: add [slurm] enabled = true to the config", key="--job")
            return None
        return await slurm.snapshot(fresh=True)

    async def _read(
        self, name: str, snap: SlurmSnapshot | None, sem: asyncio.Semaphore, unknown: list[str]
    ) -> NodeHealth:
        base = self._base(name, snap)
        if name in unknown:
            return replace(base, read=False, gpu_status="not in the inventory (no connection details): not read")
        async with sem:
            try:
                res = await self.services.pool.transport(name).run(SCRIPT, timeout=NODE_TIMEOUT_S)
            except (LoadmasterError, OSError, TimeoutError) as exc:
                why = safe_text(str(exc) or type(exc).__name__, 200)
                return replace(base, reachable=False, error=why)
        sec = split_sections(res.stdout)
        gtext, grc = sec.get("gpu", ("", None))
        rtext, _ = sec.get("remap", ("", None))
        xtext, xrc = sec.get("xid", ("", None))
        gpus = parse_health(gtext, rtext)
        telemetry = None
        if "gpu" not in sec or (grc is None and not gtext.strip()):
            status, telemetry = NO_TELEMETRY, "its answer has no GPU part (cut short?)"
        elif grc == "absent" and base.expected_gpus:
            # No nvidia-smi to ask: the GPUs were not read, which proves nothing about them.
            status = NO_TELEMETRY
            telemetry = f"nvidia-smi is not installed on it (Slurm lists {base.expected_gpus} GPUs)"
        elif grc == "absent" or (not gpus and "No devices were found" in gtext):
            status = "absent"  # the driver found no GPU: accused where Slurm says it has some (gpu-missing)
        elif gpus:
            status = "ok"  # a lost GPU makes nvidia-smi exit non-zero; its row says so
        else:
            first = next((ln.strip() for ln in gtext.splitlines() if ln.strip()), "")
            status = safe_text(first, 200) or f"nvidia-smi exited {safe_text(str(grc), 20)}"
        xid_error = None
        if xrc is None:
            xid_error = "its answer has no whole kernel log part (cut short?)"
        elif xrc != "0" or xtext.startswith("dmesg:"):
            xid_error = safe_text(next((ln for ln in xtext.splitlines() if ln.startswith("dmesg")), ""), 200) or (
                f"dmesg exited {safe_text(str(xrc), 20)}"
            )
        xids = parse_xids(xtext, gpus, base.read_at - XID_WINDOW_S)
        if status == NO_TELEMETRY:
            return replace(base, read=False, gpu_status=status, telemetry=telemetry, xids=xids, xid_error=xid_error)
        return replace(base, gpus=gpus, gpu_status=status, xids=xids, xid_error=xid_error)
