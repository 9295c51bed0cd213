"""Slurm operations: the node table (state, reason, jobs and GPUs), drain and resume on evidence.

| operation | call |
| :- | :- |
| Slurm's nodes with their jobs | ``await ops.slurm.rows()`` (:class:`SlurmNodeRow`, one per node) |
| one read of Slurm | ``await ops.slurm.snapshot(fresh=False)`` (at most once per ``[slurm] interval``) |
| drain | ``plan = await ops.slurm.plan_drain(nodes, reason, now=False)``, ``await ops.slurm.drain(plan)`` |
| resume | ``plan = await ops.slurm.plan_resume(nodes, force_reason=None)``, ``await ops.slurm.resume(plan)`` |
| repeat offenders | ``ops.slurm.drain_counts(days=30)`` (drains per node from the audit log) |

A drain writes the reason from the template ``<reason> [<prompted by>] | loadmaster:<operator> |
<UTC time>``. Without ``now`` it is Slurm's ``State=DRAIN``: running jobs finish (the node shows
*draining*, then *drained*); ``now`` also requeues every job that holds the node (``scontrol
requeue``; :data:`backend.slurm.model.HOLDING_JOB_STATES`), and is refused when one of them cannot
be requeued, when a job naming the node is in a state this code does not know, or when Slurm's
answer had job records that could not be read (one of them may be such a job: a partial view proves
no absence). ``drain`` checks the same again on a fresh read and refuses when the jobs changed.

A resume is refused unless the evidence passes, and the refusal names the failing check: the node
drained or down in Slurm; the node reachable; no compute process on its GPUs; no pending row
remap and no uncorrectable ECC error; no Xid in the node's kernel log since the drain;
``dcgmi diag -r 1`` passing where the node has ``dcgmi``. What cannot
be read is a failed check (deny by default). ``force_reason`` overrides the evidence, and the
override is audited with the failing checks.

Every plan carries the exact ``scontrol`` commands (``plan.commands``), shown before any change;
every change is refused in read-only mode, re-reads Slurm right before it acts, and is recorded
in the audit log (``slurm.drain``, ``slurm.resume``) of either state backend.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property

from backend.config import Node
from backend.errors import ConfigError, LoadmasterError, PolicyError
from backend.ops.base import Operation
from backend.slurm.client import SlurmClient, SlurmError
from backend.slurm.model import RELEASING_JOB_STATES, SlurmJob, SlurmNode, SlurmSnapshot
from backend.slurm.parse import clean, node_name
from backend.slurm.settings import SlurmSettings
from backend.state.base import actor

#: Longest reason an operator may write (Slurm keeps it; the template adds ~60 characters).
MAX_REASON = 200
#: A node drained this many times in :data:`REPEAT_DAYS` days is a repeat offender.
REPEAT_DRAINS = 3
REPEAT_DAYS = 30
_XID = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[,.]\d+)?(?:[+-]\d\d:?\d\d|Z)?)\s.*NVRM: Xid \([^)]*\): (?P<code>\d+)"
)
#: One script, one round trip: the GPU processes, remap/ECC counters and the kernel log's Xids.
_EVIDENCE = r"""
q=index,remapped_rows.pending,ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total
echo '@@apps'; out=$(nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader 2>&1); rc=$?
printf '%s\n' "$out" | head -c 65536; echo "@@apps-rc $rc"
echo '@@gpu'; out=$(nvidia-smi --query-gpu=$q --format=csv,noheader,nounits 2>&1); rc=$?
printf '%s\n' "$out" | head -c 65536; echo "@@gpu-rc $rc"
echo '@@xid'; out=$(dmesg --time-format iso 2>&1); rc=$?
printf '%s\n' "$out" | grep -E 'NVRM: Xid|^dmesg' | tail -n 200; echo "@@xid-rc $rc"
echo '@@dcgm'
if command -v dcgmi >/dev/null 2>&1; then
  out=$(dcgmi diag -r 1 2>&1); rc=$?; printf '%s\n' "$out" | grep -iE 'fail|error|warn' | head -n 5; echo "@@dcgm-rc $rc"
else
  echo "@@dcgm-rc absent"
fi
"""

#: On the node, without Slurm rights: each compute process on a GPU, and the Slurm job it belongs
#: to (its cgroup path ``.../job_<id>/...``, else ``SLURM_JOB_ID`` in its environment).
_GPU_JOBS = r"""
echo '@@gpus'; out=$(nvidia-smi --query-gpu=index,uuid --format=csv,noheader 2>&1); rc=$?
printf '%s\n' "$out" | head -c 65536; echo "@@gpus-rc $rc"
echo '@@apps'; out=$(nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader 2>&1); rc=$?
printf '%s\n' "$out" | head -c 262144; echo "@@apps-rc $rc"
echo '@@procs'
n=0
for pid in $(printf '%s\n' "$out" | cut -d, -f1); do
  case $pid in ''|*[!0-9]*) continue ;; esac
  n=$((n + 1)); [ $n -gt 512 ] && break
  cg=$(grep -o 'job_[0-9]*' /proc/$pid/cgroup 2>/dev/null | head -n 1)
  ev=$(tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | grep -m 1 '^SLURM_JOB_ID=')
  echo "$pid ${cg:--} ${ev:--}"
done
echo "@@procs-rc 0"
"""


@dataclass(frozen=True)
class GpuJob:
    """A compute process on one of a node's GPUs and the Slurm job it belongs to (None: not a job's)."""

    gpu: int
    pid: int
    job_id: str | None
    #: ``cgroup`` or ``environ``: where the job id was read.
    via: str | None


class SlurmNotEnabled(LoadmasterError):
    """``[slurm] enabled`` is not true."""


class ResumeRefused(PolicyError):
    """The evidence for a resume did not pass: the message names the failing check."""


@dataclass(frozen=True)
class JobOnNode:
    """A running job as one node sees it."""

    job_id: str
    user: str
    name: str
    elapsed_s: float | None
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class SlurmNodeRow:
    """One node for the Fleet screen and ``loadmaster slurm nodes``: state, reason, jobs, GPUs."""

    name: str
    #: One word: ``drained``, ``draining``, ``down``, ``mixed``, ``idle``, ... (``*``: not responding).
    state: str
    #: Slurm's own spelling, ``ALLOCATED+DRAIN``.
    state_text: str
    partitions: tuple[str, ...]
    reason: str
    reason_by: str | None
    #: Seconds since the reason was set (None: no reason or no time).
    reason_age_s: float | None
    gpus: int
    jobs: tuple[JobOnNode, ...]
    #: Drains of this node in the last 30 days (audit log); Fleet marks 3 or more.
    drains_30d: int
    #: Takes no new work (drained, draining, down, failing, not responding).
    unavailable: bool

    @property
    def repeat_offender(self) -> bool:
        return self.drains_30d >= REPEAT_DRAINS


@dataclass(frozen=True)
class DrainPlan:
    """What a drain will do: the reason as Slurm will keep it and the exact commands."""

    nodes: tuple[str, ...]
    reason: str
    now: bool
    #: Jobs requeued by a drain ``now`` (ids).
    requeue: tuple[str, ...]
    commands: tuple[tuple[str, ...], ...]

    def shown(self) -> list[str]:
        """The commands as the operator sees them before confirming."""
        return [shlex.join(c) for c in self.commands]


@dataclass(frozen=True)
class Check:
    """One piece of evidence for a resume."""

    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class NodeEvidence:
    node: str
    checks: tuple[Check, ...]

    @property
    def failing(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed)


@dataclass(frozen=True)
class ResumePlan:
    """The evidence per node, the command, and whether it may run (or is forced, with a reason)."""

    evidence: tuple[NodeEvidence, ...]
    commands: tuple[tuple[str, ...], ...]
    force_reason: str | None = None

    @property
    def allowed(self) -> bool:
        return self.force_reason is not None or not any(e.failing for e in self.evidence)

    def refusal(self) -> str | None:
        """One line naming the first failing check of each node (None: nothing fails)."""
        parts = [f"{e.node}: {e.failing[0].name}: {e.failing[0].detail}" for e in self.evidence if e.failing]
        return "; ".join(parts) or None

    def shown(self) -> list[str]:
        return [shlex.join(c) for c in self.commands]


@dataclass(frozen=True)
class SlurmActionResult:
    nodes: tuple[str, ...]
    commands: tuple[str, ...]
    audit_ids: tuple[int, ...] = field(default=())


_JOB_ID = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,9})?")


def check_job_id(job_id: str) -> str:
    """A Slurm job id (``123``, an array task ``123_4``) or ConfigError naming --slurm-job."""
    if not _JOB_ID.fullmatch(job_id):
        raise ConfigError(
            f"a Slurm job id is digits (an array task: 123_4), got {clean(job_id, 40)!r}", key="--slurm-job"
        )
    return job_id


def skipped_jobs_text(snap: SlurmSnapshot) -> str | None:
    """``3 job record(s) of Slurm's answer could not be read (first: ...)``; None when every job
    record was read."""
    lines = snap.skipped_job_lines
    if not lines:
        return None
    return f"{len(lines)} job record(s) of Slurm's answer could not be read (first: {clean(lines[0], 160)})"


def requeue_now(snap: SlurmSnapshot, names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The jobs a drain ``now`` of ``names`` requeues (every job holding one of them), or
    PolicyError naming why that cannot be proven safe: a job that cannot be requeued, a job naming
    the node in a state this code does not know, a holding job whose node list is empty, or job
    records Slurm sent that could not be read (one of them may hold the node and not be requeueable:
    "no other job" is proven only by a complete read)."""
    partial = skipped_jobs_text(snap)
    if partial is not None:
        raise PolicyError(
            f"drain now refused: {partial}; one of them may hold {', '.join(names)} and not be requeueable, "
            "so the node's jobs are not known: drain after the jobs instead (no requeue), or drain now "
            "once Slurm's answer reads whole"
        )
    for n in names:
        odd = snap.unknown_on(n)
        if odd:
            raise PolicyError(
                f"drain now refused: job {odd[0].job_id} names {n} in state {clean(odd[0].state, 32)!r}, "
                "which loadmaster does not know: it may hold the node; drain after the job instead"
            )
    unplaced = [j for j in snap.jobs if j.holds_nodes and not j.nodes]
    if unplaced:
        raise PolicyError(
            f"drain now refused: job {unplaced[0].job_id} is {unplaced[0].state.lower()} but Slurm names no node "
            "for it: it may hold the node; drain after the job instead"
        )
    jobs = {j.job_id: j for n in names for j in snap.jobs_on(n)}
    stuck = [j.job_id for j in jobs.values() if not j.requeue]
    if stuck:
        raise PolicyError(
            f"drain now refused: job {stuck[0]} cannot be requeued (--no-requeue); drain after the job instead"
        )
    return tuple(sorted(jobs, key=lambda s: (len(s), s)))


def reason_text(reason: str, *, prompted_by: str | None = None, who: str | None = None, t: float | None = None) -> str:
    """``<reason> [<prompted by>] | loadmaster:<operator> | <UTC time>``; ConfigError on bad text."""
    r = reason.strip()
    if not r:
        raise ConfigError("a drain needs a reason: what the next on-call reads (--reason)", key="--reason")
    if len(r) > MAX_REASON or clean(r) != r:
        raise ConfigError(
            f"the reason must be one line of at most {MAX_REASON} characters, no control characters", key="--reason"
        )
    if prompted_by:
        p = clean(prompted_by, 80)
        r = f"{r} [{p}]"
    stamp = datetime.fromtimestamp(time.time() if t is None else t, UTC).strftime("%Y-%m-%dT%H:%MZ")
    return f"{r} | loadmaster:{who or actor()} | {stamp}"


def xids_since(log: str, since: float) -> list[tuple[float, int]]:
    """Xids (time, code) from ``dmesg --time-format iso`` lines at or after ``since``."""
    out = []
    for line in log.splitlines():
        m = _XID.match(line.strip())
        if not m:
            continue
        try:
            ts = datetime.fromisoformat(m.group("ts").replace(",", ".")).timestamp()
        except ValueError:
            continue
        if ts >= since:
            out.append((ts, int(m.group("code"))))
    return out


def _sections(text: str) -> dict[str, tuple[str, str | None]]:
    out: dict[str, tuple[str, str | None]] = {}
    current = None
    body: list[str] = []
    for line in text.splitlines():
        if line.startswith("@@") and " " not in line:
            current, body = line[2:], []
        elif line.startswith("@@") and "-rc " in line and current is not None:
            out[current] = ("\n".join(body).strip(), line.split(" ", 1)[1].strip())
            current = None
        elif current is not None:
            body.append(line)
    return out


class Slurm(Operation):
    """Slurm's nodes and jobs, drain and resume, for both front ends."""

    _cache: SlurmSnapshot | None = None

    @property
    def settings(self) -> SlurmSettings:
        return self.services.config.section(SlurmSettings)

    @cached_property
    def client(self) -> SlurmClient:
        return SlurmClient(self.settings)

    def _require(self) -> None:
        if not self.settings.enabled:
            raise SlurmNotEnabled("Slurm is not enabled: add [slurm] enabled = true to the config")

    async def snapshot(self, *, fresh: bool = False) -> SlurmSnapshot:
        """Slurm's nodes and jobs; read at most once per ``[slurm] interval`` unless ``fresh``."""
        self._require()
        cached = self._cache
        if not fresh and cached is not None and time.time() - cached.taken_at < self.settings.interval:
            return cached
        snap = await self.client.snapshot()
        self._cache = snap
        return snap

    def drain_counts(self, days: int = REPEAT_DAYS) -> dict[str, int]:
        """Drains per node over the last ``days`` days, from the audit log."""
        since = time.time() - days * 86400
        counts: dict[str, int] = {}
        for e in self.services.db.audit_entries(limit=100000, action="slurm.drain"):
            if e.ts >= since and e.outcome == "ok":
                counts[e.target] = counts.get(e.target, 0) + 1
        return counts

    async def rows(self, *, fresh: bool = False) -> list[SlurmNodeRow]:
        """One row per Slurm node: state, reason (who, how long ago), GPUs and the jobs on it."""
        snap = await self.snapshot(fresh=fresh)
        counts = self.drain_counts()
        now = time.time()
        out = []
        for n in snap.nodes:
            jobs = tuple(
                JobOnNode(j.job_id, j.user, j.name, j.elapsed(now), j.gpus_on(n.name)) for j in snap.jobs_on(n.name)
            )
            out.append(
                SlurmNodeRow(
                    name=n.name,
                    state=n.state.label,
                    state_text=n.state.text(),
                    partitions=n.partitions,
                    reason=n.reason,
                    reason_by=n.reason_by,
                    reason_age_s=(now - n.reason_at) if n.reason_at else None,
                    gpus=n.gpus,
                    jobs=jobs,
                    drains_30d=counts.get(n.name, 0),
                    unavailable=n.state.unavailable,
                )
            )
        return out

    async def jobs(
        self,
        *,
        fresh: bool = False,
        node: str | None = None,
        user: str | None = None,
        array: str | None = None,
    ) -> list[SlurmJob]:
        """Running and pending jobs, optionally of one node, user or array (its tasks, filtered
        here: ``squeue --json`` collapses an array's pending tasks into one record). Jobs that
        have ended are left out: Slurm lists them for ``MinJobAge`` after their end."""
        snap = await self.snapshot(fresh=fresh)
        return [
            j
            for j in snap.jobs
            if not j.ended
            and (node is None or node in j.nodes)
            and (user is None or j.user == user)
            and (array is None or j.array_job_id == array or j.job_id == array)
        ]

    async def job_nodes(self, job_id: str) -> list[str]:
        """The nodes Slurm runs ``job_id`` on (read now): ConfigError naming the job when Slurm
        has no such job or it holds no node yet."""
        check_job_id(job_id)
        snap = await self.snapshot(fresh=True)
        job = next((j for j in snap.jobs if j.job_id == job_id), None)
        if job is None:
            partial = skipped_jobs_text(snap)
            if partial is not None:
                raise ConfigError(
                    f"Slurm job {job_id} is not among the jobs read: {partial}, it may be one of them",
                    key="--slurm-job",
                )
            raise ConfigError(f"Slurm has no running or pending job {job_id} (squeue)", key="--slurm-job")
        if job.ended:
            raise ConfigError(
                f"Slurm job {job_id} has ended ({job.state.lower()}): its nodes are no longer its own",
                key="--slurm-job",
            )
        if not job.nodes:
            why = f": {job.reason}" if job.reason else ""
            raise ConfigError(f"Slurm job {job_id} holds no node yet ({job.state.lower()}{why})", key="--slurm-job")
        if not job.holds_nodes or job.state in RELEASING_JOB_STATES:
            raise ConfigError(
                f"Slurm job {job_id} is {job.state.lower()}: it holds its nodes only while it runs", key="--slurm-job"
            )
        return list(job.nodes)

    async def inventory(self, *, fresh: bool = False) -> list[Node]:
        """Slurm's nodes as loadmaster nodes (connection details from the config's defaults and
        per-node overrides): see :mod:`backend.slurm.inventory`."""
        from backend.slurm.inventory import nodes_from_slurm

        snap = await self.snapshot(fresh=fresh)
        return nodes_from_slurm(snap.nodes, self.services.config)

    def _nodes(self, snap: SlurmSnapshot, names: list[str]) -> list[SlurmNode]:
        if not names:
            raise ConfigError("name at least one node", key="NODES")
        out = []
        for name in dict.fromkeys(names):
            try:
                node_name(name)
            except ValueError as exc:
                raise ConfigError(str(exc), key="NODES") from None
            n = snap.node(name)
            lost = snap.skipped_node_lines
            if n is None and lost:
                raise ConfigError(
                    f"node {name!r} is not among the nodes read: {len(lost)} node record(s) of Slurm's answer could "
                    f"not be read (first: {clean(lost[0], 160)}), it may be one of them",
                    key="NODES",
                )
            if n is None:
                known = ", ".join(x.name for x in snap.nodes[:10])
                raise ConfigError(f"Slurm has no node {name!r} (known: {known})", key="NODES")
            out.append(n)
        return out

    # -- drain -----------------------------------------------------------------------------------

    async def plan_drain(
        self, nodes: list[str], reason: str, *, now: bool = False, prompted_by: str | None = None
    ) -> DrainPlan:
        """The drain's reason and commands (nothing changes yet)."""
        snap = await self.snapshot(fresh=True)
        found = self._nodes(snap, nodes)
        text = reason_text(reason, prompted_by=prompted_by)
        names = tuple(n.name for n in found)
        cmds: list[tuple[str, ...]] = [
            tuple(
                self.client.argv("scontrol", "update", f"NodeName={','.join(names)}", "State=DRAIN", f"Reason={text}")
            )
        ]
        requeue: tuple[str, ...] = ()
        if now:
            requeue = requeue_now(snap, names)
            if requeue:
                cmds.append(tuple(self.client.argv("scontrol", "requeue", ",".join(requeue))))
        return DrainPlan(names, text, now, requeue, tuple(cmds))

    async def drain(self, plan: DrainPlan) -> SlurmActionResult:
        """Drain as planned: refused in read-only mode, nodes re-read, commands run, audited per node."""
        self.refuse_if_readonly("drain Slurm nodes")
        snap = await self.snapshot(fresh=True)
        self._nodes(snap, list(plan.nodes))
        if plan.now:
            # The plan's requeue list was proven on an earlier read: prove it again on this one.
            try:
                again = requeue_now(snap, plan.nodes)
                if set(again) != set(plan.requeue):
                    new = sorted(set(again) - set(plan.requeue)) or sorted(set(plan.requeue) - set(again))
                    raise PolicyError(
                        f"drain now refused: the nodes' jobs changed since the plan (job {new[0]}): plan again"
                    )
            except PolicyError as exc:
                for n in plan.nodes:
                    self.audit("slurm.drain", n, "refused", detail={"why": str(exc)}, reason=plan.reason)
                raise
        ran: list[str] = []
        ids = []
        try:
            for cmd in plan.commands:
                await self.client.run(list(cmd))
                ran.append(shlex.join(cmd))
        except SlurmError as exc:
            for n in plan.nodes:
                self.audit("slurm.drain", n, "failed", detail={"commands": ran, "error": str(exc)}, reason=plan.reason)
            raise
        baselines = await asyncio.gather(*(self._ecc_counts(n) for n in plan.nodes))
        for n, ecc in zip(plan.nodes, baselines, strict=True):
            detail: dict[str, object] = {"commands": ran, "now": plan.now, "requeued": list(plan.requeue)}
            # What resume compares against: uncorrectable ECC errors since the drain.
            detail["ecc_aggregate"] = {str(k): v for k, v in ecc.items()} if ecc is not None else None
            ids.append(self.audit("slurm.drain", n, "ok", detail=detail, reason=plan.reason))
        self._cache = None
        return SlurmActionResult(plan.nodes, tuple(ran), tuple(ids))

    async def _ecc_counts(self, node: str) -> dict[int, int] | None:
        """Each GPU's lifetime uncorrectable ECC count on ``node`` (None: not in the inventory, not
        reachable in a few seconds, or not reported). A drain never waits long for a sick node."""
        if node not in self.services.pool.names:
            return None
        try:
            res = await self.services.pool.transport(node).run(_EVIDENCE, timeout=15)
        except (LoadmasterError, OSError):
            return None
        section = _sections(res.stdout).get("gpu")
        if _unread(section) is not None or section is None:
            return None
        try:
            rows = _gpu_rows(section[0])
        except ValueError:
            return None
        return {int(idx): agg for idx, _p, _v, agg in rows if agg is not None and _digits(idx)} or None

    def _ecc_baseline(self, node: SlurmNode) -> dict[int, int] | None:
        """The ECC counts the drain that set ``node``'s current reason recorded (None: none)."""
        if node.reason_at is None:
            return None
        for e in self.services.db.audit_entries(limit=200, action="slurm.drain"):
            if e.target != node.name or e.outcome != "ok" or e.ts < node.reason_at - 120:
                continue
            got = e.detail.get("ecc_aggregate") if isinstance(e.detail, dict) else None
            if isinstance(got, dict):
                try:
                    return {int(k): int(v) for k, v in got.items()}
                except (TypeError, ValueError):
                    return None
            return None
        return None

    async def gpu_jobs(self, node: str) -> tuple[GpuJob, ...]:
        """Which job each compute process on ``node``'s GPUs belongs to, read on the node (no Slurm
        rights needed): nvidia-smi's processes, each mapped by its cgroup (``job_<id>``) or its
        ``SLURM_JOB_ID``. Raises when the node cannot be read."""
        self._require()
        res = await self.services.pool.transport(node).run(_GPU_JOBS, timeout=30)
        sec = _sections(res.stdout)
        for part in ("gpus", "apps"):
            why = _unread(sec.get(part))
            if why is not None:
                raise LoadmasterError(f"{node}: cannot read the GPUs' processes (nvidia-smi: {why})")
        return parse_gpu_jobs(sec["gpus"][0], sec["apps"][0], sec.get("procs", ("", None))[0])

    # -- resume ----------------------------------------------------------------------------------

    async def evidence(self, node: SlurmNode) -> NodeEvidence:
        """Whether ``node`` is healthy enough to resume; every check named, what cannot be read fails."""
        checks: list[Check] = []
        st = node.state
        in_slurm = st.drained or st.draining or st.base == "down" or "DRAIN" in st.flags
        checks.append(
            Check("slurm state", in_slurm, f"{st.label} ({st.text()})" + ("" if in_slurm else ": not drained or down"))
        )
        pool = self.services.pool
        if node.name not in pool.names:
            checks.append(Check("reachable", False, "not in loadmaster's inventory: cannot reach it to check"))
            return NodeEvidence(node.name, tuple(checks))
        try:
            res = await pool.transport(node.name).run(_EVIDENCE, timeout=30)
        except (LoadmasterError, OSError) as exc:
            checks.append(Check("reachable", False, clean(str(exc), 200)))
            return NodeEvidence(node.name, tuple(checks))
        checks.append(Check("reachable", True, "answered"))
        sec = _sections(res.stdout)
        if node.gpus == 0:
            checks.append(Check("gpu processes", True, "no GPUs in Slurm's GRES"))
        else:
            checks.append(_apps_check(sec.get("apps")))
            checks.append(_gpu_health_check(sec.get("gpu"), self._ecc_baseline(node)))
        checks.append(_xid_check(sec.get("xid"), node.reason_at))
        dcgm = sec.get("dcgm")
        if dcgm is not None and dcgm[1] != "absent" and node.gpus:
            why = _unread(dcgm)
            detail = (
                "dcgmi diag -r 1 passed"
                if why is None
                else f"dcgmi diag -r 1 failed: {dcgm[0].splitlines()[0] if dcgm[0] else why}"
            )
            checks.append(Check("dcgm diag", why is None, clean(detail, 200)))
        return NodeEvidence(node.name, tuple(checks))

    async def plan_resume(self, nodes: list[str], *, force_reason: str | None = None) -> ResumePlan:
        """The evidence for each node and the resume command (nothing changes yet)."""
        snap = await self.snapshot(fresh=True)
        found = self._nodes(snap, nodes)
        if force_reason is not None and not force_reason.strip():
            raise ConfigError("--force needs a reason: why the evidence is overridden", key="--force")
        evidence = tuple([await self.evidence(n) for n in found])
        names = ",".join(n.name for n in found)
        cmd = tuple(self.client.argv("scontrol", "update", f"NodeName={names}", "State=RESUME"))
        return ResumePlan(evidence, (cmd,), force_reason.strip() if force_reason else None)

    async def resume(self, plan: ResumePlan) -> SlurmActionResult:
        """Resume as planned: refused in read-only mode and unless the evidence, gathered again now,
        passes (or is forced with a reason); audited per node either way."""
        self.refuse_if_readonly("resume Slurm nodes")
        fresh = await self.plan_resume([e.node for e in plan.evidence], force_reason=plan.force_reason)
        detail = {
            e.node: [f"{c.name}: {'ok' if c.passed else 'FAIL'}: {c.detail}" for c in e.checks] for e in fresh.evidence
        }
        if not fresh.allowed:
            for e in fresh.evidence:
                self.audit("slurm.resume", e.node, "refused", detail={"checks": detail[e.node]})
            raise ResumeRefused(f"resume refused: {fresh.refusal()} (--force REASON overrides, audited)")
        try:
            for cmd in fresh.commands:
                await self.client.run(list(cmd))
        except SlurmError as exc:
            for e in fresh.evidence:
                self.audit("slurm.resume", e.node, "failed", detail={"error": str(exc), "checks": detail[e.node]})
            raise
        outcome = "forced" if fresh.force_reason is not None and any(e.failing for e in fresh.evidence) else "ok"
        ids = tuple(
            self.audit(
                "slurm.resume",
                e.node,
                outcome,
                detail={"commands": fresh.shown(), "checks": detail[e.node]},
                reason=fresh.force_reason,
            )
            for e in fresh.evidence
        )
        self._cache = None
        return SlurmActionResult(tuple(e.node for e in fresh.evidence), tuple(fresh.shown()), ids)


def parse_gpu_jobs(gpus: str, apps: str, procs: str) -> tuple[GpuJob, ...]:
    """The node's answers -> one GpuJob per process and GPU, sorted by GPU (untrusted text: lines
    that do not parse are left out)."""
    index: dict[str, int] = {}
    for line in gpus.splitlines():
        idx, _, uuid = (c.strip() for c in line.partition(","))
        if _digits(idx) and uuid:
            index[uuid] = int(idx)
    owner: dict[int, tuple[str, str]] = {}
    for line in procs.splitlines():
        parts = line.split()
        if len(parts) != 3 or not _digits(parts[0]):
            continue
        cg, ev = parts[1], parts[2]
        if cg.startswith("job_") and _digits(cg[4:]):
            owner[int(parts[0])] = (cg[4:], "cgroup")
        elif ev.startswith("SLURM_JOB_ID=") and _digits(ev[13:]):
            owner[int(parts[0])] = (ev[13:], "environ")
    out = []
    for line in apps.splitlines():
        pid, _, uuid = (c.strip() for c in line.partition(","))
        if not _digits(pid) or uuid not in index:
            continue
        job, via = owner.get(int(pid), (None, None))
        out.append(GpuJob(index[uuid], int(pid), job, via))
    return tuple(sorted(out, key=lambda g: (g.gpu, g.pid)))


def _digits(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` also takes ``²``, which ``int`` refuses)."""
    return text.isascii() and text.isdigit()


def _unread(section: tuple[str, str | None] | None) -> str | None:
    """Why a section of the evidence script cannot be trusted (None: it ran and exited 0)."""
    if section is not None and section[1] == "0":
        return None
    first = (section[0].splitlines() or ["no output"])[0] if section else "no answer"
    return clean(first, 120) or "no output"


def _apps_check(section: tuple[str, str | None] | None) -> Check:
    why = _unread(section)
    if why is not None or section is None:
        return Check("gpu processes", False, f"cannot list compute processes (nvidia-smi: {why})")
    rows = [ln for ln in section[0].splitlines() if ln.strip() and "No running" not in ln]
    if rows:
        pids = ", ".join(r.split(",", 1)[0].strip() for r in rows[:5])
        return Check("gpu processes", False, f"{len(rows)} compute process(es) on the GPUs (pid {clean(pids, 80)})")
    return Check("gpu processes", True, "none")


def _gpu_rows(text: str) -> list[tuple[str, str, str, int | None]]:
    """``index, remap pending, volatile uncorrected, aggregate uncorrected`` lines; ValueError on
    a line that is not four cells."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 4:
            raise ValueError(f"unreadable nvidia-smi line {clean(line, 80)!r}")
        agg = int(cells[3]) if _digits(cells[3]) else None
        rows.append((cells[0], cells[1], cells[2], agg))
    return rows


def _gpu_health_check(section: tuple[str, str | None] | None, baseline: dict[int, int] | None = None) -> Check:
    """No pending row remap; no uncorrectable ECC error since the drain (the aggregate count against
    the one the drain recorded), or, with no count from the drain, none in the volatile counter."""
    why = _unread(section)
    if why is not None or section is None:
        return Check("row remap / ECC", False, f"cannot read remap and ECC counters (nvidia-smi: {why})")
    try:
        rows = _gpu_rows(section[0])
    except ValueError as exc:
        return Check("row remap / ECC", False, str(exc))
    bad = []
    for idx, pending, volatile, agg in rows:
        if pending.lower() not in ("no", "0", "[n/a]", "n/a"):
            bad.append(f"GPU {idx} has a pending row remap")
        before = baseline.get(int(idx)) if baseline is not None and _digits(idx) else None
        if before is not None and agg is not None:
            if agg > before:
                bad.append(f"GPU {idx} has {agg - before} uncorrectable ECC error(s) since the drain")
        elif volatile not in ("0", "[N/A]", "N/A"):
            bad.append(
                f"GPU {idx} has {clean(volatile, 20)} uncorrectable ECC error(s) (volatile; no count from the drain)"
            )
    return Check("row remap / ECC", not bad, "; ".join(bad) or "no pending remap, no uncorrectable ECC since the drain")


def _xid_check(section: tuple[str, str | None] | None, since: float | None) -> Check:
    why = _unread(section)
    if why is not None or section is None:
        return Check("xid", False, f"cannot read the kernel log ({why})")
    if since is None:
        return Check("xid", False, "Slurm has no time for the drain: cannot prove no Xid since")
    found = xids_since(section[0], since)
    if found:
        ts, code = found[-1]
        when = datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%SZ")
        return Check("xid", False, f"{len(found)} Xid(s) since the drain (last: Xid {code} at {when})")
    return Check("xid", True, "none since the drain")
