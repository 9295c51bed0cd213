"""``loadmaster slurm nodes|jobs``, ``loadmaster drain`` and ``loadmaster resume``: Slurm from the
command line, through ``backend.ops.slurm`` like the console.

``slurm nodes [--json]`` lists Slurm's nodes with state, reason (who, how long ago), partitions,
GPUs and the jobs on each with their GPU indices; ``slurm jobs [--node N] [--json]`` the running and
pending jobs. ``drain NODES --reason TEXT [--after-job | --now]`` and ``resume NODES [--force
REASON]`` show the exact ``scontrol`` commands (and, for resume, every piece of evidence) and ask
before acting (``--yes`` skips the question); both are refused with ``--readonly`` and audited.
Errors are one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from backend.services import Services
from backend.textfmt import gpu_ranges, safe_text


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``slurm nodes``, ``slurm jobs``, ``drain`` and ``resume``."""
    p = sub.add_parser("slurm", help="Slurm's nodes and jobs ([slurm] enabled = true)")
    ss = p.add_subparsers(dest="slurm_command", metavar="SUBCOMMAND", required=True)
    n = ss.add_parser("nodes", help="nodes: state, reason (who, since when), partitions, jobs and their GPUs")
    n.add_argument("--json", action="store_true", help="one JSON object per node, one per line")
    n.set_defaults(func=run_nodes)
    j = ss.add_parser("jobs", help="running and pending jobs with their nodes, GPUs and pending reasons")
    j.add_argument("--node", help="only jobs on this node")
    j.add_argument("--user", help="only this user's jobs")
    j.add_argument("--array", metavar="JOBID", help="only this array's tasks (running and pending)")
    j.add_argument("--json", action="store_true", help="one JSON object per job, one per line")
    j.set_defaults(func=run_jobs)

    g = ss.add_parser("gpus", help="which Slurm job each process on a node's GPUs belongs to (read on the node)")
    g.add_argument("node", metavar="NODE")
    g.add_argument("--json", action="store_true", help="one JSON object per process, one per line")
    g.set_defaults(func=run_gpus)

    d = sub.add_parser("drain", help="drain Slurm nodes with a reason (after the running jobs, or now)")
    d.add_argument("nodes", metavar="NODES", help="node names or a hostlist (node-[01-04])")
    d.add_argument("--reason", required=True, help="why: what the next on-call reads in sinfo")
    d.add_argument("--prompted-by", metavar="TEXT", help="the Xid or alert that prompted it (e.g. 'Xid 79 on GPU 3')")
    when = d.add_mutually_exclusive_group()
    when.add_argument("--after-job", action="store_true", help="let running jobs finish (the default)")
    when.add_argument("--now", action="store_true", help="also requeue the nodes' running jobs now")
    d.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    d.set_defaults(func=run_drain)

    r = sub.add_parser("resume", help="return drained Slurm nodes to service, if the evidence passes")
    r.add_argument("nodes", metavar="NODES", help="node names or a hostlist (node-[01-04])")
    r.add_argument("--force", metavar="REASON", help="resume despite failing checks (audited with this reason)")
    r.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    r.set_defaults(func=run_resume)


def _names(expr: str) -> list[str]:
    from backend.config import expand_hostlist

    return expand_hostlist(expr, key="NODES")


def _show_and_confirm(commands: list[str], prompt: str, *, yes: bool) -> None:
    """Print the exact commands, then ask (``--yes`` answers for the operator)."""
    from backend.errors import ConfigError, PolicyError

    print("will run:")
    for cmd in commands:
        print(f"  {cmd}")
    if yes:
        return
    if not sys.stdin.isatty():
        raise ConfigError("not confirmed: pass --yes to proceed without a terminal")
    if input(f"{prompt} [y/N] ").strip().lower() not in ("y", "yes"):
        raise PolicyError("not confirmed; nothing was done")


def _ago(seconds: float | None) -> str:
    from backend.units import age_text

    return age_text(seconds) if seconds is not None else "?"


async def run_nodes(args: argparse.Namespace, services: Services) -> int:
    from backend.ops import Operations
    from backend.textfmt import align_columns

    rows = await Operations(services).slurm.rows()
    if args.json:
        for r in rows:
            doc: dict[str, Any] = {
                "name": r.name,
                "state": r.state,
                "state_text": r.state_text,
                "partitions": list(r.partitions),
                "reason": r.reason,
                "reason_by": r.reason_by,
                "reason_age_s": r.reason_age_s,
                "gpus": r.gpus,
                "drains_30d": r.drains_30d,
                "jobs": [
                    {"id": j.job_id, "user": j.user, "name": j.name, "elapsed_s": j.elapsed_s, "gpus": list(j.gpus)}
                    for j in r.jobs
                ],
            }
            print(json.dumps(doc, sort_keys=True))
        return 0
    table = [["NODE", "STATE", "PARTITIONS", "GPUS", "JOBS (GPUS)", "DRAINS 30D", "REASON"]]
    for r in rows:
        jobs = " ".join(f"{j.job_id}:{j.user}({gpu_ranges(j.gpus) or '-'})" for j in r.jobs) or "-"
        reason = f"{r.reason} ({r.reason_by or '?'}, {_ago(r.reason_age_s)} ago)" if r.reason else "-"
        mark = "!" if r.repeat_offender else ""
        table.append(
            [r.name, r.state, ",".join(r.partitions) or "-", str(r.gpus), jobs, f"{r.drains_30d}{mark}", reason]
        )
    for line in align_columns(table):
        print(line)
    down = sum(1 for r in rows if r.unavailable)
    print(f"{len(rows)} node(s): {down} drained, draining or down")
    return 0


async def run_jobs(args: argparse.Namespace, services: Services) -> int:
    import time

    from backend.ops import Operations
    from backend.textfmt import align_columns
    from backend.units import duration_text

    jobs = await Operations(services).slurm.jobs(node=args.node, user=args.user, array=args.array)
    now = time.time()
    if args.json:
        for j in jobs:
            doc = {
                "id": j.job_id,
                "name": j.name,
                "user": j.user,
                "state": j.state,
                "partition": j.partition,
                "nodes": list(j.nodes),
                "elapsed_s": j.elapsed(now),
                "reason": j.reason,
                "gpus": {n: list(g) for n, g in j.gpus},
            }
            print(json.dumps(doc, sort_keys=True))
        return 0
    table = [["JOBID", "USER", "NAME", "STATE", "ELAPSED", "NODES (GPUS)", "REASON"]]
    for j in jobs:
        where = " ".join(f"{n}({gpu_ranges(j.gpus_on(n)) or '-'})" for n in j.nodes) or "-"
        reason = j.reason if j.state == "PENDING" else ""
        table.append([j.job_id, j.user, j.name, j.state, duration_text(j.elapsed(now)), where, reason or "-"])
    for line in align_columns(table):
        print(line)
    print(f"{len(jobs)} job(s)")
    return 0


async def run_gpus(args: argparse.Namespace, services: Services) -> int:
    from backend.ops import Operations
    from backend.textfmt import align_columns

    found = await Operations(services).slurm.gpu_jobs(args.node)
    if args.json:
        for g in found:
            print(json.dumps({"gpu": g.gpu, "pid": g.pid, "job": g.job_id, "via": g.via}, sort_keys=True))
        return 0
    table = [["GPU", "PID", "JOB", "FROM"]]
    table += [[str(g.gpu), str(g.pid), g.job_id or "- (not a Slurm job)", g.via or "-"] for g in found]
    for line in align_columns(table):
        print(line)
    print(f"{len(found)} process(es) on {args.node}'s GPUs")
    return 0


async def run_drain(args: argparse.Namespace, services: Services) -> int:
    from backend.ops import Operations

    ops = Operations(services).slurm
    ops.refuse_if_readonly("drain Slurm nodes")
    plan = await ops.plan_drain(_names(args.nodes), args.reason, now=args.now, prompted_by=args.prompted_by)
    _show_and_confirm(
        plan.shown(), f"drain {', '.join(plan.nodes)}{' now' if plan.now else ' after the running jobs'}?", yes=args.yes
    )
    await ops.drain(plan)
    print(f"drained {', '.join(plan.nodes)}: {plan.reason}")
    return 0


async def run_resume(args: argparse.Namespace, services: Services) -> int:
    from backend.ops import Operations

    ops = Operations(services).slurm
    ops.refuse_if_readonly("resume Slurm nodes")
    plan = await ops.plan_resume(_names(args.nodes), force_reason=args.force)
    for e in plan.evidence:
        for c in e.checks:
            print(f"{e.node}: {'ok  ' if c.passed else 'FAIL'} {c.name}: {safe_text(c.detail)}")  # the node's word
    if not plan.allowed:
        from backend.ops.slurm import ResumeRefused

        raise ResumeRefused(f"resume refused: {plan.refusal()} (--force REASON overrides, audited)")
    _show_and_confirm(plan.shown(), f"resume {', '.join(e.node for e in plan.evidence)}?", yes=args.yes)
    await ops.resume(plan)
    print(f"resumed {', '.join(e.node for e in plan.evidence)}")
    return 0
