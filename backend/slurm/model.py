"""What loadmaster knows about Slurm, as immutable snapshots: node states, reasons, jobs and GPUs."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_IDX = re.compile(r"\(IDX:([0-9,\-]*)\)")
#: Base states a node can be in (Slurm's ``NODE_STATE_*`` bases), lower case as sinfo prints them.
BASE_STATES = frozenset({"idle", "allocated", "mixed", "down", "error", "future", "unknown"})
#: Base states in which a node runs work: with DRAIN it is *draining*, not yet *drained*.
BUSY_STATES = frozenset({"allocated", "mixed"})
#: Base states in which a node takes new work (given no flag outside :data:`WORKING_FLAGS`).
WORKING_BASES = frozenset({"idle", "allocated", "mixed"})
#: Flags under which a node still takes new work (``data_parser``'s ``NODE_STATES``): finishing a
#: job's epilog, in a reservation, a cloud/dynamic node, planned for a pending job, powered down by
#: power saving (Slurm powers it up for a job) or powering up, a resume/undrain request being applied.
WORKING_FLAGS = frozenset(
    {
        "COMPLETING",
        "RESERVED",
        "CLOUD",
        "DYNAMIC_NORM",
        "DYNAMIC_FUTURE",
        "PLANNED",
        "POWERED_DOWN",
        "POWERING_UP",
        "POWER_UP",
        "RESUME",
        "UNDRAIN",
        "REBOOT_CANCELED",
        "PERFCTRS",
    }
)


@dataclass(frozen=True)
class NodeState:
    """A node's base state and its flags (``DRAIN``, ``NOT_RESPONDING``, ``COMPLETING``, ...)."""

    base: str
    flags: frozenset[str] = frozenset()

    @property
    def draining(self) -> bool:
        """DRAIN set while work still runs: no new jobs, the running ones finish."""
        return "DRAIN" in self.flags and (self.base in BUSY_STATES or "COMPLETING" in self.flags)

    @property
    def drained(self) -> bool:
        """DRAIN set and nothing runs any more: the node is free for maintenance."""
        return "DRAIN" in self.flags and not self.draining and self.base != "down"

    @property
    def label(self) -> str:
        """One word as an operator reads it: ``drained``, ``draining``, ``down``, ``fail``, ``maint``,
        ``mixed``, ... (Slurm's ``node_state_string`` order: a flag that keeps work away always
        names the state, so a node is never shown ``idle`` while DRAIN, FAIL, MAINTENANCE, REBOOT_*,
        INVALID_REG or a power-down flag is set).

        ``*`` is appended when slurmctld cannot reach the node's slurmd (``NOT_RESPONDING``)."""
        f = self.flags
        if "INVALID_REG" in f:
            word = "inval"
        elif self.base == "down":
            word = "down"
        elif self.draining:
            word = "draining"
        elif self.drained:
            word = "drained"
        elif "FAIL" in f:
            word = "failing" if self.base in BUSY_STATES or "COMPLETING" in f else "fail"
        elif "MAINTENANCE" in f:
            word = "maint"
        elif "REBOOT_REQUESTED" in f or "REBOOT_ISSUED" in f:
            word = "reboot"
        elif "POWERING_DOWN" in f or "POWER_DOWN" in f:
            word = "powering_down"
        elif "COMPLETING" in f:
            word = "completing"
        else:
            word = self.base
        return word + ("*" if "NOT_RESPONDING" in f else "")

    @property
    def unavailable(self) -> bool:
        """Takes no new work: drained, draining, down, failing, not responding, in maintenance,
        rebooting, powering down, registered with an invalid config, or a base state that is not
        idle/mixed/allocated. Deny by default: a flag not in :data:`WORKING_FLAGS` (one this code
        does not know, Slurm's ``?``) counts as unavailable too."""
        return self.base not in WORKING_BASES or not self.flags <= WORKING_FLAGS

    def text(self) -> str:
        """Slurm's own spelling: ``ALLOCATED+DRAIN``."""
        return "+".join([self.base.upper(), *sorted(self.flags)])


@dataclass(frozen=True)
class Gres:
    """One generic resource of a node: ``gpu:a100:8`` is name ``gpu``, type ``a100``, count 8."""

    name: str
    type: str | None
    count: int


@dataclass(frozen=True)
class SlurmNode:
    """A node as Slurm reports it, with the reason (who set it and when) when there is one."""

    name: str
    state: NodeState
    partitions: tuple[str, ...] = ()
    address: str | None = None
    hostname: str | None = None
    reason: str = ""
    #: Who set the reason (Slurm's ``reason_set_by_user``); None when unset.
    reason_by: str | None = None
    #: When the reason was set (epoch seconds); None when unset.
    reason_at: float | None = None
    gres: tuple[Gres, ...] = ()
    #: Slurm's ``gres_used`` as it printed it (``gpu:3`` or ``gpu:a100:3(IDX:0-2)``).
    gres_used: str = ""
    cpus: int = 0
    #: Which adapter read it (``v0.0.38``, ``v0.0.39+``, ``text``): which JSON shape Slurm spoke.
    shape: str = ""

    @property
    def gpus(self) -> int:
        """GPUs Slurm knows on the node (every ``gpu`` GRES)."""
        return sum(g.count for g in self.gres if g.name == "gpu")

    @property
    def gpus_used_idx(self) -> tuple[int, ...] | None:
        """GPU indices in use, when Slurm printed them (``IDX:0-2``); None when it did not."""
        return gres_indices(self.gres_used)


#: Job states after which a job holds nothing and will not run again by itself. ``squeue`` and
#: ``scontrol show job`` still list such a job for ``MinJobAge`` (300 s by default).
ENDED_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
#: The one definition of "this job holds its nodes", by the one word Slurm prints for a job
#: (``job_state_string``; 23.11+'s lists are reduced to it by :func:`backend.slurm.parse._job_state`).
#: From ``slurm.h``/``slurmctld.h``: a job holds its allocation while its base state is RUNNING or
#: SUSPENDED (``IS_JOB_RUNNING``, ``IS_JOB_SUSPENDED``) and while a flag says it is not done with
#: the nodes: ``JOB_CONFIGURING`` (allocated nodes booting), ``JOB_RESIZING`` (a running job
#: changing size), ``JOB_STOPPED`` (holding resources, sent SIGSTOP), ``JOB_SIGNALING`` (a signal to
#: its steps pending), ``JOB_COMPLETING`` (``IS_JOB_COMPLETING``: waiting for its epilog) and
#: ``JOB_STAGE_OUT`` (burst buffer stage-out, "Slurm has not released resources for the job yet").
HOLDING_JOB_STATES = frozenset(
    {"RUNNING", "SUSPENDED", "CONFIGURING", "RESIZING", "STOPPED", "SIGNALING", "COMPLETING", "STAGE_OUT"}
)
#: Of :data:`HOLDING_JOB_STATES`, those in which the job's work has ended and Slurm is letting the
#: nodes go (epilog, stage-out): the job holds them, but nothing should be sent to them for it.
RELEASING_JOB_STATES = frozenset({"COMPLETING", "STAGE_OUT"})
#: Job states that provably hold no node: waiting (PENDING and the requeue/hold words, which
#: ``job_state_string`` prints only once COMPLETING is over) or ended. A word in none of these sets
#: (a newer Slurm's) is unknown: it may hold the node (deny by default, :attr:`SlurmJob.state_known`).
NOT_HOLDING_JOB_STATES = (
    frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD"}) | ENDED_JOB_STATES
)


@dataclass(frozen=True)
class SlurmJob:
    """A job (or one array task), with the GPU indices it holds on each of its nodes."""

    job_id: str
    name: str
    user: str
    state: str
    partition: str = ""
    nodes: tuple[str, ...] = ()
    #: Epoch seconds it started (None: not yet).
    start_time: float | None = None
    #: Why it waits (Slurm's ``state_reason``: ``Resources``, ``Priority``, ...) or ``None``.
    reason: str = ""
    #: node -> GPU indices on that node (from ``gres_detail`` / ``scontrol show job -d`` IDX).
    gpus: tuple[tuple[str, tuple[int, ...]], ...] = ()
    #: Array parent id and task id (None: not an array task).
    array_job_id: str | None = None
    array_task_id: str | None = None
    requeue: bool = False

    @property
    def ended(self) -> bool:
        """Whether it has ended (Slurm still lists an ended job for a while)."""
        return self.state in ENDED_JOB_STATES

    @property
    def holds_nodes(self) -> bool:
        """Whether Slurm has its nodes allocated to it now (:data:`HOLDING_JOB_STATES`)."""
        return self.state in HOLDING_JOB_STATES

    @property
    def state_known(self) -> bool:
        """Whether its state word is one this code knows to hold nodes or not to."""
        return self.state in HOLDING_JOB_STATES or self.state in NOT_HOLDING_JOB_STATES

    def elapsed(self, now: float) -> float | None:
        """Seconds it has run at ``now`` (None: not started, or not holding its nodes)."""
        if self.start_time is None or not self.holds_nodes:
            return None
        return max(0.0, now - self.start_time)

    def gpus_on(self, node: str) -> tuple[int, ...]:
        """The GPU indices this job holds on ``node`` (empty: none known)."""
        return dict(self.gpus).get(node, ())


@dataclass(frozen=True)
class SlurmSnapshot:
    """One read of Slurm: every node and every job, when it was read, and what was skipped."""

    nodes: tuple[SlurmNode, ...]
    jobs: tuple[SlurmJob, ...]
    taken_at: float
    #: One line per record that could not be read (the rest is still shown).
    skipped: tuple[str, ...] = field(default=())
    #: How many of :attr:`skipped` are job records (the rest are node records); None: not counted
    #: (a snapshot built by hand), every skipped line is then taken to be either.
    skipped_jobs: int | None = None

    @property
    def skipped_job_lines(self) -> tuple[str, ...]:
        """The skipped lines of job records (every skipped line when not counted)."""
        if self.skipped_jobs is None:
            return self.skipped
        return self.skipped[len(self.skipped) - self.skipped_jobs :] if self.skipped_jobs else ()

    @property
    def skipped_node_lines(self) -> tuple[str, ...]:
        """The skipped lines of node records (every skipped line when not counted)."""
        if self.skipped_jobs is None:
            return self.skipped
        return self.skipped[: len(self.skipped) - self.skipped_jobs]

    @property
    def jobs_complete(self) -> bool:
        """Every job record was read: only then does "no (other) job holds this node" hold."""
        return not self.skipped_job_lines

    @property
    def nodes_complete(self) -> bool:
        """Every node record was read: only then does "Slurm has no such node" hold."""
        return not self.skipped_node_lines

    def node(self, name: str) -> SlurmNode | None:
        return next((n for n in self.nodes if n.name == name), None)

    def jobs_on(self, node: str) -> tuple[SlurmJob, ...]:
        """Jobs that hold ``node`` (:data:`HOLDING_JOB_STATES`): running, configuring, suspended,
        completing, ... Only those read: see :attr:`jobs_complete`."""
        return tuple(j for j in self.jobs if node in j.nodes and j.holds_nodes)

    def unknown_on(self, node: str) -> tuple[SlurmJob, ...]:
        """Jobs naming ``node`` whose state word this code does not know: they may hold it."""
        return tuple(j for j in self.jobs if node in j.nodes and not j.state_known)


def gres_indices(text: Any) -> tuple[int, ...] | None:
    """GPU indices from ``gpu:2(IDX:0-1)`` / ``gpu:a100:1(IDX:0),gpu:v100:2(IDX:3,5)``; None
    when no IDX is printed; ``IDX:N/A`` (none) is ()."""
    if not isinstance(text, str):
        return None
    found = _IDX.findall(text)
    if not found:
        return () if "IDX:N/A" in text else None
    out: set[int] = set()
    for spec in found:
        for part in spec.split(","):
            if not part:
                continue
            lo, _, hi = part.partition("-")
            a, b = int(lo), int(hi or lo)
            if b < a or b - a > 4096:
                raise ValueError(f"bad GPU index range {part!r}")
            out.update(range(a, b + 1))
    return tuple(sorted(out))
