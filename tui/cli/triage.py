"""``loadmaster triage``: which node made the run stop or slow down, and the commands to act on it."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backend.ops.triage import TriageReport
    from backend.services import Services


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "triage",
        help="rank the suspect nodes and GPUs of a Slurm job (or of named nodes), with the evidence",
        description=(
            "Reads every node once (GPU health, row remapping, ECC, clock event reasons, SM clock "
            "against the peers' median, lost or missing GPUs, Xids) and prints the suspects with "
            "their evidence and the commands to exclude, drain and resume. Nothing is run."
        ),
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--job", metavar="ID", help="a Slurm job: its nodes ([slurm] enabled)")
    which.add_argument("--nodes", metavar="LIST", help="node names or a hostlist (node-[01-04])")
    p.add_argument(
        "--source",
        choices=("ssh", "prometheus"),
        help="where the GPU health comes from (default: the [telemetry] source; auto means Prometheus when set)",
    )
    p.add_argument("--run", metavar="URL", help="a run folder: the newest step proven resumable, steps lost since")
    p.add_argument(
        "--json", action="store_true", help="one JSON document: suspects, commands, nodes, checkpoint, goodput"
    )
    p.set_defaults(func=run_triage)


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%SZ") if t is not None else "?"


async def run_triage(args: argparse.Namespace, services: Services) -> int:
    from backend.ops import Operations

    nodes = [args.nodes] if args.nodes is not None else None
    report = await Operations(services).triage.run(job=args.job, nodes=nodes, source=args.source, run=args.run)
    if args.json:
        print(json.dumps(report.as_json(), sort_keys=True))
        return 0
    for line in render(report):
        print(line)
    return 0


def render(report: TriageReport) -> list[str]:
    """The report as lines: the nodes, the suspects with their evidence, the commands."""
    from backend.textfmt import align_columns, gpu_ranges, safe_text

    out = []
    what = f"job {report.job}" if report.job else f"{len(report.nodes)} node(s)"
    table = [["NODE", "ANSWERS", "GPUS", "SLURM", "REASON"]]
    for n in report.nodes:
        answers = "not read" if not n.read else "yes" if n.reachable else "NO"
        gpus = str(len(n.gpus)) + (f"/{n.expected_gpus}" if n.expected_gpus is not None else "")
        if n.gpu_status == "no-telemetry":  # backend.triage.analyze.NO_TELEMETRY: nothing said of its GPUs
            answers, gpus = "no telemetry", "-"
        elif not n.read or not n.reachable:
            gpus = "-"
        elif n.gpu_status not in ("ok", "absent"):
            gpus += f" ({safe_text(n.gpu_status, 60)})"
        table.append([n.node, answers, gpus, n.slurm_state or "-", safe_text(n.slurm_reason or "-", 60)])
    out.append(f"triage of {what}")
    out.extend(align_columns(table))
    out.append("")
    if not report.suspects:
        out.append("no suspects: every node answered and no GPU shows evidence")
    for rank, s in enumerate(report.suspects, 1):
        gpus = gpu_ranges(s.gpus) or "-"
        out.append(f"{rank}. {s.node} (GPUs {gpus}) since {_when(s.since)}")
        for e in s.evidence:
            out.append(f"   - {e.kind}: {safe_text(e.detail, 160)} (since {_when(e.since)})")
    slow = [r for r in report.slowest if r.sm_ratio < 0.995][:5]
    if slow:
        out.append("slowest GPUs against the medians (SM clock, utilisation, power):")
        for r in slow:
            util = f"{r.util_ratio:.0%}" if r.util_ratio is not None else "?"
            power = f"{r.power_ratio:.0%}" if r.power_ratio is not None else "?"
            why = f" [{', '.join(r.reasons)}]" if r.reasons else ""
            out.append(f"   {r.node} GPU {r.gpu}: clock {r.sm_ratio:.1%}, util {util}, power {power}{why}")
    for note in report.notes:
        out.append(f"note: {safe_text(note, 200)}")
    if report.checkpoint is not None:
        from backend.ops.triage import restart_lines

        out.append("")
        out.extend(restart_lines(report.checkpoint))
    if report.goodput is not None:
        from backend.ops.triage import goodput_lines

        out.append("")
        out.extend(goodput_lines(report.goodput))
    if report.commands:
        out.append("")
        out.append("commands (shown, not run):")
        out.extend(f"  {c}" for c in report.commands)
    return out
