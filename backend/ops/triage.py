"""Triage: why did the run stop or slow down, and which node to exclude.

| operation | call |
| :- | :- |
| triage a Slurm job's nodes | ``await ops.triage.run(job="1234")`` |
| triage named nodes | ``await ops.triage.run(nodes=["node-01", "node-02"])`` |

Each node is read once over its transport (one script: the GPU health query, the remapped-rows
query, the kernel log's Xids), all nodes at once; with ``[slurm] enabled`` Slurm's state, reason
and GPU count join in. The result (:class:`backend.triage.analyze.TriageReport`) ranks suspects
with their evidence and carries the commands to exclude, drain and resume: shown, never run.
Nothing here changes anything, so it runs in read-only mode too.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from backend.errors import ConfigError, LoadmasterError
from backend.ops.base import Operation
from backend.slurm.model import SlurmSnapshot
from backend.slurm.parse import expand_nodes
from backend.telemetry.parse import split_sections
from backend.telemetry.settings import TelemetrySettings
from backend.textfmt import safe_text
from backend.triage.analyze import NodeHealth, TriageReport, analyze
from backend.triage.signals import SCRIPT, parse_health, parse_xids

#: How long one node may take to answer before it counts as unreachable.
NODE_TIMEOUT_S = 20.0
#: Xids older than this are history, not evidence.
XID_WINDOW_S = 24 * 3600.0
#: Nodes read at once.
PARALLEL = 64


class Triage(Operation):
    """Read nodes' health and rank the suspects (read-only)."""

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
        if run is not None:
            from backend.triage.restart import newest_resumable, restage_command

            ck = await newest_resumable(self.services, run)
            accused = {x.node for x in report.suspects}
            cmd = restage_command(
                ck, [n.node for n in report.nodes if n.node not in accused and n.reachable and n.read]
            )
            report = replace(report, checkpoint=ck, commands=report.commands + ((cmd,) if cmd else ()))
        return report

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
            elif base.expected_gpus:
                # Slurm says GPUs, Prometheus has none of their series: the telemetry collapsed.
                out.append(replace(base, gpu_status="absent", xid_error="no DCGM series in Prometheus"))
            else:
                why = "no DCGM series in Prometheus (no GPUs, or its exporter is down or not scraped): not read"
                out.append(replace(base, read=False, gpu_status=why))
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
        slurm = self.services.ops.slurm
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
        if grc == "absent" or (not gpus and "No devices were found" in gtext):
            status = "absent"  # accused only where Slurm says the node has GPUs (gpu-missing)
        elif gpus:
            status = "ok"  # a lost GPU makes nvidia-smi exit non-zero; its row says so
        else:
            first = next((ln.strip() for ln in gtext.splitlines() if ln.strip()), "")
            status = safe_text(first, 200) or f"nvidia-smi exited {safe_text(str(grc), 20)}"
        xid_error = None
        if xrc not in ("0", None) or xtext.startswith("dmesg:"):
            xid_error = safe_text(next((ln for ln in xtext.splitlines() if ln.startswith("dmesg")), ""), 200) or (
                f"dmesg exited {safe_text(str(xrc), 20)}"
            )
        xids = parse_xids(xtext, gpus, base.read_at - XID_WINDOW_S)
        return replace(base, gpus=gpus, gpu_status=status, xids=xids, xid_error=xid_error)
