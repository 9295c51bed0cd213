"""``loadmaster jobs``, ``job show|logs|cancel``, ``pull`` and the node-side ``agent run``.

Job records hold text nodes and buckets chose (labels, object keys, errors, logs): it is printed
without control characters or escape sequences. ``jobs`` names the nodes it could not read on
stderr and exits 4 (``PARTIAL_EXIT``): the list is then partial.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.errors import ConfigError, JobError, LoadmasterError
from backend.ops import Operations, PullRequest
from backend.ops.fleet import PARTIAL_EXIT, unread_line
from backend.services import Services
from backend.textfmt import align_columns, safe_block, safe_text
from backend.units import bytes_text, duration_text, gbps_text

# The job manager (and what it imports) is loaded when a command first uses it: a pull imports
# it while it waits on the network, not before it starts connecting.
if TYPE_CHECKING:
    from backend.ops.pull import Pulls
    from backend.ops.types import JobRecord

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``jobs``, ``job``, ``pull`` and ``agent``."""
    p = sub.add_parser("jobs", help="list jobs on every node (re-reads each node's job directories)")
    p.add_argument("--json", action="store_true", help="print a JSON array, one object per job")
    p.add_argument("--local", action="store_true", help="only the local records; do not contact nodes")
    p.add_argument("--limit", type=int, default=50, metavar="N", help="newest N jobs (default 50)")
    p.add_argument(
        "--wide",
        action="store_true",
        help=f"every column whole (full paths, progress, why a job is foreign); default: fit {TABLE_WIDTH} columns",
    )
    p.set_defaults(func=cmd_jobs)

    j = sub.add_parser("job", help="show, follow or cancel one job")
    jsub = j.add_subparsers(dest="job_command", metavar="ACTION", required=True)
    s = jsub.add_parser("show", help="the job's state, progress, result and origin (a launch: its jobs)")
    s.add_argument("id", metavar="ID", help="job id (or a unique prefix), or a launch id")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=cmd_show)
    lg = jsub.add_parser("logs", help="the job's log")
    lg.add_argument("id", metavar="ID")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    lg.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    lg.set_defaults(func=cmd_logs)
    c = jsub.add_parser(
        "cancel",
        help="stop the job, or every running job of a launch (SIGTERM, SIGKILL after a grace period), clean up",
    )
    c.add_argument(
        "id", metavar="ID", help="a launch id (every job of a pull to N nodes) or a job id (or a unique prefix)"
    )
    c.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    c.add_argument("--reason", help="recorded in the audit log")
    c.set_defaults(func=cmd_cancel)

    pl = sub.add_parser("pull", help="copy s3:// objects to a directory on nodes with s5cmd (durable jobs)")
    pl.add_argument(
        "src",
        metavar="SRC",
        help="s3://bucket/prefix/ (everything under it), a wildcard like 's3://b/p/*.tar', or one object",
    )
    pl.add_argument(
        "dest", metavar="DEST", help="destination directory on each node (relative: under the node's scratch dir)"
    )
    where = pl.add_mutually_exclusive_group()
    where.add_argument("--node", metavar="NAME", help="one node")
    where.add_argument("--nodes", metavar="PATTERN", help="a hostlist or glob: one job per node")
    pl.add_argument(
        "--slurm-job",
        metavar="N",
        help="tag the pull's jobs with Slurm job N (shown by 'loadmaster jobs' and Transfers); "
        "without --node/--nodes, pull to the nodes Slurm runs it on",
    )
    pl.add_argument(
        "--store",
        metavar="PROFILE",
        help="store profile for endpoint, region and credentials (default: the configured store whose URL covers SRC)",
    )
    pl.add_argument(
        "--preset",
        choices=["tuned", "large-objects", "small-objects", "gentle"],
        help="a tuned set of --numworkers/--concurrency/--part-size",
    )
    pl.add_argument("--numworkers", type=int, metavar="N", help="s5cmd --numworkers (default 256)")
    pl.add_argument("--concurrency", type=int, metavar="C", help="s5cmd cp --concurrency (default 32)")
    pl.add_argument("--part-size", type=int, metavar="MiB", help="s5cmd cp --part-size in MiB (default 64)")
    pl.add_argument(
        "--fanout",
        choices=["direct", "relay", "relay-ssh", "auto"],
        help="direct: every node from the store; relay: seeds from the store, the others from peers "
        "over the cluster network; relay-ssh: the peer hops through this command's SSH connections "
        "(an untrusted network); auto: relay where the route is priced (default: [pull] fanout)",
    )
    pl.add_argument("--seeds", type=int, metavar="K", help="relay: seed nodes per site that pull from the store (1)")
    pl.add_argument("--degree", type=int, metavar="D", help="relay: children per node, 1 = a chain (1)")
    pl.add_argument("--detach", action="store_true", help="start and return; follow with 'loadmaster jobs'")
    pl.add_argument("--yes", "-y", action="store_true", help="start without asking")
    pl.add_argument(
        "--allow-over-budget",
        metavar="REASON",
        help="start although the egress guard asks for confirmation (recorded with REASON)",
    )
    pl.add_argument("--json", action="store_true", help="print the plan and the jobs as JSON")
    # The executable exits as soon as the pull is followed to its end (no SSH close handshakes).
    pl.set_defaults(func=cmd_pull, exit_fast=True)

    a = sub.add_parser("agent", help="node side: run a job directory (started by loadmaster itself)")
    asub = a.add_subparsers(dest="agent_command", metavar="ACTION", required=True)
    ar = asub.add_parser("run", help="run the job in JOBDIR to its end")
    ar.add_argument("job_dir", metavar="JOBDIR")
    ar.set_defaults(func=cmd_agent_run)
    ac = asub.add_parser("cleanup", help="remove a dead job's partial output")
    ac.add_argument("job_dir", metavar="JOBDIR")
    ac.set_defaults(func=cmd_agent_cleanup)


# -- formatting -------------------------------------------------------------------------------


def fmt_when(ts: float | None) -> str:
    return "-" if not ts else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def progress_text(rec: JobRecord, line_rate_gbps: float | None = None) -> str:
    """``45% 5.4 GB/12.0 GB 3/8 obj 9.10 Gbps ETA 12s`` for one job."""
    p = rec.progress
    if p is None:
        return "-"
    parts = []
    if p.fraction is not None:
        parts.append(f"{p.fraction * 100:.0f}%")
    parts.append(f"{bytes_text(p.bytes_done)}/{bytes_text(p.bytes_total)}")
    if p.items_total is not None:
        parts.append(f"{p.items_done}/{p.items_total} obj")
    if p.gbps is not None and not rec.terminal:
        g = gbps_text(p.gbps)
        if line_rate_gbps:
            g += f" ({p.gbps / line_rate_gbps * 100:.0f}% of line)"
        parts.append(g)
        parts.append(f"ETA {duration_text(p.eta_s)}")
    return " ".join(parts)


#: Longest cell of a job table (a source URL, an error) before it is cut.
CELL_LIMIT = 300


def _t(value: Any) -> str:
    """A value from a job record as printable text (records hold what nodes wrote)."""
    return safe_text(str(value), CELL_LIMIT)


#: ``loadmaster jobs`` fits this many columns (``--wide``: every cell whole).
TABLE_WIDTH = 120
#: Before ``--wide``, the widest a column but the paths may be (cut in the middle); the team's
#: job ids (``<launch>.<n>``) are never cut. The paths get what is left, at least PATHS_MIN.
CAPS = {"ID": 24, "NODE": 16, "KIND": 8, "STATE": 12, "PROGRESS": 26, "VERIFIED": 14}
PATHS_MIN = 25
#: STARTED only with --wide: the id says when (``MMDD-HHMMSS-xxxx``, a launch's as its jobs').
HEADER = ("ID", "KIND", "NODE", "STATE", "PROGRESS", "VERIFIED", "SOURCE -> DEST")
WIDE_HEADER = ("ID", "KIND", "NODE", "STATE", "PROGRESS", "VERIFIED", "STARTED", "SOURCE -> DEST")


def _progress_short(rec: JobRecord) -> str:
    """``50% 8.80 Gbps ETA 2m05s`` (running), ``25.9 MB`` (done), ``33% 25.9 MB`` (ended short):
    the table's cell (the byte counts whole with --wide and in ``job show``)."""
    p = rec.progress
    if p is None:
        return "-"
    if p.fraction is None:
        return bytes_text(p.bytes_done)
    if rec.terminal:
        total = bytes_text(p.bytes_total)
        return total if rec.state == "succeeded" and p.fraction >= 1 else f"{p.fraction * 100:.0f}% {total}"
    text = f"{p.fraction * 100:.0f}%"
    if p.gbps is not None:
        text += f" {gbps_text(p.gbps)} ETA {duration_text(p.eta_s)}"
    return text


def job_rows(recs: list[JobRecord], *, wide: bool = False, width: int = TABLE_WIDTH) -> list[str]:
    """The ``jobs`` table: one line per job, within ``width`` columns unless ``wide`` (paths cut
    in the middle, both ends kept; the job's id whole). Every cell is cleaned of control text."""
    from backend.ops.types import middle, verified_short

    rows: list[list[str]] = []
    for r in recs:
        if r.foreign:  # not this team's: why, in short (the whole reason with --wide and in --json)
            state = f"foreign ({safe_text(r.foreign, 60)})" if wide else "foreign"
        elif wide:
            state = r.state + (f" ({r.note.split(':', 1)[0]})" if r.note else "")
        else:
            state = r.state + (" ?" if r.note and r.recorded else "")  # notes are said once, below the table
        rows.append(
            [
                _t(r.id),
                _t(r.kind),
                _t(r.node),
                state,
                _t(progress_text(r) if wide else _progress_short(r)),
                _t(verified_short(r.result)),
                *([fmt_when(r.created)] if wide else []),
                "",
            ]
        )
    paths = [(_t(r.source), _t(r.destination)) if r.source else (_t(r.label), "") for r in recs]
    # The Slurm job a pull was launched for leads its paths: "[slurm 41] s3://...".
    paths = [(f"[slurm {_t(r.slurm_job)}] {s}" if r.slurm_job else s, d) for (s, d), r in zip(paths, recs, strict=True)]
    if wide:
        for row, (src, dest) in zip(rows, paths, strict=True):
            row[-1] = f"{src} -> {dest}" if dest else src
        return align_columns([list(WIDE_HEADER), *rows])
    for row, r in zip(rows, recs, strict=True):
        for i, name in enumerate(HEADER[:-1]):
            if name == "ID" and r.foreign is None:
                continue
            row[i] = middle(row[i], CAPS[name])
    widths = [max(len(HEADER[i]), *(len(row[i]) for row in rows)) for i in range(len(HEADER) - 1)]
    # Still too wide (long node names, a long state): the widest column but the id gives way first.
    while sum(widths) + 2 * len(widths) > width - PATHS_MIN:
        i = max(range(1, len(widths)), key=lambda k: widths[k])
        if widths[i] <= len(HEADER[i]) + 1:
            break
        widths[i] -= 1
        for row in rows:
            row[i] = middle(row[i], widths[i])
    room = max(PATHS_MIN, width - sum(widths) - 2 * len(widths))
    for row, (src, dest) in zip(rows, paths, strict=True):
        if not dest:
            row[-1] = middle(src, room)
            continue
        side = (room - 4) // 2  # " -> " between the two, each end of each path kept
        row[-1] = f"{middle(src, side + (room - 4) % 2)} -> {middle(dest, side)}"
    return align_columns([list(HEADER), *rows])


def _record_json(rec: JobRecord) -> dict[str, Any]:
    return rec.as_dict()


# -- commands ---------------------------------------------------------------------------------


async def cmd_jobs(args: argparse.Namespace, services: Services) -> int:
    """List jobs: local records merged with a fresh read of every node's job directories."""
    from backend.ops.jobs import JobListing
    from backend.ops.types import NODE_SAID_NOTES

    # The nodes whose job directories could not be read just now: their jobs are missing or old.
    names = [n.name for n in services.config.nodes]
    if args.local:
        listing = JobListing(tuple(Operations(services).jobs.recorded(limit=args.limit)))
    else:
        listing = await Operations(services).jobs.listing(names)
    recs = list(listing.records[: args.limit])
    unread = dict(listing.unread)
    for r in recs:  # a record the refresh could not bring up to date says so itself
        if not r.recorded:
            continue  # read from its node fine; the state database being down is said once, below
        if r.note and not args.local and r.foreign is None and not r.note.startswith(NODE_SAID_NOTES):
            unread.setdefault(r.node, safe_text(r.note, CELL_LIMIT))
    if args.json:
        # json.dumps escapes every control character (ensure_ascii): safe on a terminal as is.
        print(json.dumps([_record_json(r) for r in recs], indent=2, default=str))
    elif not recs:
        print("no jobs")
    else:
        print("\n".join(job_rows(recs, wide=args.wide)))
    if listing.problems:
        # Records a node wrote that could not be read: skipped, one line each (node and job named).
        sys.stdout.flush()
        for line in listing.problems:
            print(f"loadmaster: {safe_text(line, CELL_LIMIT)}", file=sys.stderr)
    down = listing.state_down
    if down:
        # One line, however many nodes: the nodes answered; the database did not.
        sys.stdout.flush()
        print(
            f"loadmaster: {safe_text(down, 300)}; the jobs above are as their nodes report them, not recorded",
            file=sys.stderr,
        )
    if unread:
        sys.stdout.flush()
        print(
            f"loadmaster: {unread_line(unread, len(names))}; their jobs may be missing or out of date", file=sys.stderr
        )
    return PARTIAL_EXIT if unread or down else 0


async def cmd_show(args: argparse.Namespace, services: Services) -> int:
    """Print one job's full record, or a launch's jobs (one line each)."""
    if services.jobs.launch_ids(args.id):
        from backend.ops.types import states_text

        recs = await services.jobs.launch_records(args.id)
        if args.json:
            print(json.dumps([_record_json(r) for r in recs], indent=2, default=str))
        else:
            print(_t(f"launch {args.id}: {len(recs)} job(s), {states_text(recs)}"))
            print("\n".join(job_rows(recs)))
        return 0 if all(r.state != "failed" for r in recs) else 1
    rec = await services.jobs.refresh_job(args.id)
    if args.json:
        print(json.dumps(_record_json(rec), indent=2, default=str))
        return 0
    lines = [
        f"job       {rec.id}",
        f"kind      {rec.kind}",
        f"node      {rec.node}",
        f"state     {rec.state}" + (f"  ({rec.note})" if rec.note else ""),
        f"label     {rec.label or '-'}",
        *([f"slurm job {_t(rec.slurm_job)}"] if rec.slurm_job else []),
        f"launched  {fmt_when(rec.created)} by {rec.launched_by} from {rec.launched_from}",
        f"started   {fmt_when(rec.started)}",
        f"finished  {fmt_when(rec.finished)}",
        f"job dir   {rec.job_dir}",
        f"pid       {rec.pid or '-'}",
        f"progress  {progress_text(rec)}",
    ]
    if rec.source:
        lines.append(f"source    {rec.source}")
        lines.append(f"dest      {rec.destination}")
    if rec.heartbeat_age is not None and not rec.terminal:
        lines.append(f"heartbeat {rec.heartbeat_age:.1f}s ago")
    if rec.error:
        lines.append(f"error     {rec.error}")
    if rec.result:
        lines.append("result    " + json.dumps(rec.result, default=str))
    print("\n".join(safe_text(line, None) for line in lines))
    return 0 if rec.state != "failed" else 1


async def cmd_logs(args: argparse.Namespace, services: Services) -> int:
    """Print (or follow) a job's log."""
    jobs = services.jobs
    if ids := jobs.launch_ids(args.id):
        raise JobError(
            f"{args.id} is a launch of {len(ids)} job(s): name one ({', '.join(ids[:4])}{', ...' * (len(ids) > 4)})"
        )
    if args.follow:
        try:
            async for chunk in jobs.follow_log(args.id):
                sys.stdout.write(safe_block(chunk, None))
                sys.stdout.flush()
        except (KeyboardInterrupt, asyncio.CancelledError):
            return 130
        rec = jobs.get(args.id)
        print(_t(f"-- job {rec.id} {rec.state}" + (f": {rec.error}" if rec.error else "")), file=sys.stderr)
        return 0
    text, _ = await jobs.read_log(args.id, tail_lines=args.tail)
    sys.stdout.write(safe_block(text, None))
    return 0


def _confirm(prompt: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise ConfigError("not confirmed: pass --yes to proceed without a terminal")
    answer = input(f"{prompt} [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise JobError("not confirmed; nothing was done")


async def cmd_cancel(args: argparse.Namespace, services: Services) -> int:
    """Cancel a running job, or every running job of a launch, after showing what will happen
    (one confirmation, one audit record)."""
    ops = Operations(services).jobs
    ops.refuse_if_readonly("cancel a job")
    target = await ops.target(args.id)
    grace = services.jobs.settings.cancel_grace
    groups = "its process group" if target.launch is None else "each job's process group"
    print(_t(f"cancel {target.what}:"), file=sys.stderr)
    if target.launch is not None:
        for r in target.active:
            print(_t(f"  {r.id} on {r.node} ({progress_text(r)})"), file=sys.stderr)
    else:
        print(_t(f"  {progress_text(target.active[0])}"), file=sys.stderr)
    print(f"  SIGTERM to {groups}, SIGKILL after {grace:g}s, then remove the partial output", file=sys.stderr)
    _confirm("cancel the launch?" if target.launch is not None else "cancel it?", args.yes)
    if target.launch is None:
        final = await ops.cancel(target.active[0].id, reason=args.reason)
        print(_t(f"job {final.id}: {final.state}" + (f" ({final.error})" if final.error else "")))
        return 0 if final.state == "cancelled" else 1
    done = await ops.cancel_launch(target.launch, reason=args.reason)
    for f in done.finals:
        print(_t(f"job {f.id} on {f.node}: {f.state}" + (f" ({f.error})" if f.error else "")))
    for job_id, why in done.errors.items():
        print(_t(f"job {job_id}: not cancelled: {why}"))
    cancelled = sum(f.state == "cancelled" for f in done.finals)
    print(_t(f"launch {done.launch}: {cancelled} of {len(target.active)} running job(s) cancelled"))
    return 0 if done.ok else 1


def _pull_request(args: argparse.Namespace) -> PullRequest:
    from backend.ops.pull import PRESETS

    nw, cc, ps = PRESETS[args.preset] if args.preset else (None, None, None)

    def knob(given: int | None, preset: int | None) -> int | None:
        return preset if given is None else given  # 0 is the operator's (refused), never the preset's

    return PullRequest(
        src=args.src,
        dest=args.dest,
        nodes=args.node or args.nodes,
        store=args.store,
        numworkers=knob(args.numworkers, nw),
        concurrency=knob(args.concurrency, cc),
        part_size_mib=knob(args.part_size, ps),
        reason=args.allow_over_budget,
        fanout=args.fanout,
        seeds=args.seeds,
        degree=args.degree,
        slurm_job=args.slurm_job,
    )


async def cmd_pull(args: argparse.Namespace, services: Services) -> int:
    """Plan a pull (listing, free space, ETA, egress), confirm, launch one job per node, follow."""
    log.debug("pull: start")
    ops = Operations(services)
    if not (args.node or args.nodes):
        if not args.slurm_job:
            raise ConfigError("choose the destination node(s): --node, --nodes or --slurm-job")
        args.nodes = ",".join(await ops.slurm.job_nodes(args.slurm_job))
        print(f"Slurm job {args.slurm_job} runs on {args.nodes}", file=sys.stderr if args.json else sys.stdout)
    req = _pull_request(args)
    pulls = ops.pulls
    pulls.refuse_if_readonly("launch a pull")  # before the listing: the start would refuse anyway
    preview = await pulls.plan(req)
    out = sys.stderr if args.json else sys.stdout
    for line in preview.lines():
        print(safe_text(line, None), file=out)  # quotes object keys and what nodes answered
    if not preview.startable:
        raise JobError(
            "not started: "
            + "; ".join(preview.blockers)
            + ("" if req.reason or preview.plan.problems else "; re-run with --allow-over-budget REASON")
        )
    for w in preview.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if preview.plan.fanout == "relay-ssh" and args.detach:
        raise ConfigError("--fanout relay-ssh carries the hops through this command's SSH connections: drop --detach")
    _confirm(f"start {len(preview.plan.nodes)} pull job(s)?", args.yes)
    log.debug("pull: launching")
    started = await pulls.start(req, shown=preview)
    log.debug("pull: launched")
    plan, recs = started.plan, list(started.records)
    for r in recs:
        print(_t(f"started job {r.id} on {r.node}"), file=out)
    if started.launch and len(recs) > 1:
        print(f"launch {started.launch}: stop every job of it with 'loadmaster job cancel {started.launch}'", file=out)
    if args.detach:
        if args.json:
            print(json.dumps({"plan": plan.as_dict(), "jobs": [_record_json(r) for r in recs]}, indent=2, default=str))
        return 0
    # What the jobs' end runs here is imported in a thread while they copy (the follow waits on the
    # nodes meanwhile), not after the last one ends.
    endings = asyncio.ensure_future(asyncio.to_thread(pulls.load_endings, started))
    try:
        return await _follow_pull(services, pulls, plan, recs, as_json=args.json, started_pull=started)
    finally:
        await endings
        if started.hops is not None:
            await started.hops.close()


async def _follow_pull(
    services: Services, pulls: Pulls, plan: Any, recs: list[JobRecord], *, as_json: bool, started_pull: Any = None
) -> int:
    from backend.errors import NodeUnreachable
    from backend.ops.types import fleet_rollup

    jobs = services.jobs
    recs = list(recs)
    ids = {r.node for r in recs}
    rate = max((n.line_rate_gbps or 0) for n in plan.nodes) or None
    # A relay node that died is fetched again from the store (priced) once it answers: original
    # job id -> its retry (None: not retried, and why was said).
    retried: dict[str, JobRecord | None] = {}
    waiting: set[str] = set()
    give_up_at: float | None = None
    # Each round waits on the nodes (up to 2 s) for the jobs to end, then reads them: the runner
    # wakes the waiting read as it writes its result, and the nodes are not busied with polling
    # during the copy. Only the followed jobs' directories are read (one job per node), not every
    # job a node has ever run.
    last_print = 0.0
    current = recs
    started = time.monotonic()
    try:
        while True:
            current = list(await asyncio.gather(*(jobs.refresh_job(r.id, max_wait=2.0) for r in recs)))
            log.debug("pull: refreshed")
            pending = [
                r for r in current if started_pull is not None and started_pull.needs_retry(r) and r.id not in retried
            ]
            launched = len(recs)
            for r in pending:
                try:
                    again = await pulls.retry_from_store(started_pull, r)
                except NodeUnreachable:
                    if r.id not in waiting:
                        waiting.add(r.id)
                        print(
                            _t(f"{r.node}: {r.state}; its copy is fetched from the store when it answers"),
                            file=sys.stderr,
                        )
                    continue
                except LoadmasterError as exc:
                    retried[r.id] = None
                    print(_t(f"{r.node}: {r.state}; not retried: {exc}"), file=sys.stderr)
                    continue
                retried[r.id] = again
                recs.append(again)
                print(
                    _t(
                        f"{r.node}: {r.state} ({r.error or 'no result'}); fetching its copy from the store as job {again.id}"
                    ),
                    file=sys.stderr,
                )
            roll = fleet_rollup(current)
            waiting_now = [r for r in current if r.id in waiting and r.id not in retried]
            done = all(r.terminal for r in current) and all(r.id in retried for r in pending) and len(recs) == launched
            if all(r.terminal for r in current) and waiting_now:
                give_up_at = give_up_at or time.monotonic() + pulls.settings.relay_reattach
                if time.monotonic() < give_up_at:
                    done = False
                else:
                    for r in waiting_now:
                        retried[r.id] = None
                        print(_t(f"{r.node} did not answer: pull to it again when it is back"), file=sys.stderr)
            now = time.monotonic()
            if now - last_print >= 2.0 or done:
                last_print = now
                pct = f"{roll.fraction * 100:.0f}%" if roll.fraction is not None else "?"
                # At the end nothing is running: show the whole pull's average instead of 0.
                g = roll.bytes_done * 8 / 1e9 / max(now - started, 1e-3) if done else roll.rate_bps * 8 / 1e9
                line_pct = f" ({g / (rate * len(ids)) * 100:.0f}% of line)" if rate else ""
                when = "average" if done else f"ETA {duration_text(roll.eta_s)}"
                print(
                    f"{pct} {bytes_text(roll.bytes_done)}/{bytes_text(roll.bytes_total)} "
                    f"{roll.items_done}/{roll.items_total} obj {gbps_text(g)}{line_pct} "
                    f"{when}  [{roll.running} running, {roll.succeeded} ok, "
                    f"{roll.failed} failed]",
                    file=sys.stderr,
                )
            if done:
                break
            if any(r.note for r in current) or waiting_now:
                await asyncio.sleep(jobs.settings.poll_interval)  # a node is unreachable: do not spin
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("detached: the jobs keep running; follow them with 'loadmaster jobs'", file=sys.stderr)
        return 130
    ok = True
    by_id = {r.id: r for r in current}
    for r in current:
        if r.id in {x.id for x in retried.values() if x is not None}:
            continue  # shown with the job it retried
        final = by_id.get(retried[r.id].id) if retried.get(r.id) is not None else None  # type: ignore[union-attr]
        end = final or r
        ok = ok and end.state == "succeeded"
        msg = f"{r.node}: {end.state}"
        if final is not None:
            msg = f"{r.node}: {r.state}, retried from the store: {final.state}"
        if end.state == "succeeded" and end.result:
            # How the bytes were proven, as the runner says it ("verified: size-only ..." when they were not).
            proof = end.result.get("verified_text") or "verified"
            msg += (
                f" ({end.result.get('objects')} objects, {bytes_text(end.result.get('bytes'))}, "
                f"{gbps_text(end.result.get('gbps'))}; {proof})"
            )
            relay = end.result.get("relay")
            if relay and relay.get("upstream"):
                msg += f" from {relay['upstream']}"
        if end.error:
            msg += f": {end.error}"
        print(_t(msg), file=sys.stderr if as_json else sys.stdout)
    if as_json:
        print(json.dumps({"plan": plan.as_dict(), "jobs": [_record_json(r) for r in current]}, indent=2, default=str))
    log.debug("pull: done")
    return 0 if ok else 1


def cmd_agent_run(args: argparse.Namespace, services: Services) -> int:
    """Node side: run one job directory to its end (started detached by ``JobManager.launch``)."""
    from backend.agent.runner import run_job

    try:
        return run_job(Path(args.job_dir))
    except LoadmasterError:
        raise
    except OSError as exc:
        raise JobError(f"{args.job_dir}: {exc}") from None


def cmd_agent_cleanup(args: argparse.Namespace, services: Services) -> int:
    """Node side: remove a dead job's partial output with its kind's cleanup rule."""
    from backend.agent.runner import cleanup_job

    cleanup_job(Path(args.job_dir))
    return 0
