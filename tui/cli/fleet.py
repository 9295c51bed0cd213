"""``loadmaster nodes`` (the inventory as resolved) and ``loadmaster doctor`` (is each node ready)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from backend.ops import Operations
from backend.services import Services
from backend.textfmt import align_columns, safe_text
from backend.units import bytes_text

if TYPE_CHECKING:  # the reports' module imports the SSH stack: not for `loadmaster --help`
    from backend.ops.fleet import AgentReport, NodeReport


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``nodes`` and ``doctor`` commands."""
    p = sub.add_parser("nodes", help="list the inventory as resolved (hostlists, hostfiles, ~/.ssh/config)")
    p.add_argument("--json", action="store_true", help="print a JSON array, one object per node")
    p.add_argument("--nodes", metavar="PATTERN", help="only nodes matching a hostlist or glob")
    p.set_defaults(func=cmd_nodes)
    d = sub.add_parser("doctor", help="check every node: reachable, tools, GPUs, NICs, scratch space")
    d.add_argument("--json", action="store_true", help="print a JSON array, one object per node")
    d.add_argument("--nodes", metavar="PATTERN", help="only nodes matching a hostlist or glob")
    d.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="per-node limit for the check command (default 60)",
    )
    d.add_argument(
        "--require-gpus", action="store_true", help="also exit 1 when a node has no usable GPU (a GPU fleet)"
    )
    d.set_defaults(func=cmd_doctor, direct_ssh=True)  # fresh connections: it diagnoses them


def _selected(args: argparse.Namespace, services: Services) -> list[Any]:
    return services.config.select(args.nodes) if args.nodes else list(services.config.nodes)


def cmd_nodes(args: argparse.Namespace, services: Services) -> int:
    """Print each node's effective connection settings."""
    rows = Operations(services).fleet.connection_settings(_selected(args, services))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [["NAME", "HOST", "USER", "PORT", "IDENTITY", "JUMP", "SITE", "TAGS"]]
    for r in rows:
        table.append(
            [
                r["name"],
                r["hostname"] if r["transport"] == "ssh" else f"{r['hostname']} (local)",
                r["user"] or "-",
                str(r["port"] or "-"),
                ",".join(r["identity"]) or ("agent/default keys" if r["transport"] == "ssh" else "-"),
                r["proxy_jump"] or "-",
                r["site"] or "-",
                ",".join(r["tags"]) or "-",
            ]
        )
    _print_table(table)
    print(f"{len(rows)} node(s) from {services.config.source}")
    return 0


def _print_table(rows: list[list[str]]) -> None:
    # An inventory can come from outside (a hostfile, ssh_config, Slurm): cells are cleaned.
    print("\n".join(align_columns([[safe_text(c, 256) for c in r] for r in rows])))


def _speed(mbps: int | None) -> str:
    if mbps is None:
        return "speed n/a"
    return f"{mbps // 1000} Gb/s" if mbps >= 1000 and mbps % 1000 == 0 else f"{mbps} Mb/s"


def _state(r: NodeReport) -> str:
    if not r.reachable:
        return "UNREACHABLE"
    if r.gpu_ready:
        gpus = f"{r.gpu_count} GPU(s)"
    else:
        gpus = "GPU FAULT" if r.gpu_problems else "no GPUs"
    return f"{'ready for data jobs' if r.ready else 'NOT READY for data jobs'}, {gpus}"


def _agent(a: AgentReport) -> str:
    """Which interpreter and venv run the node's agent (the problem, if any, is its own line)."""
    if a.python is None:
        return "MISSING"
    how = f"{a.python} -I" if a.isolated else f"{a.python} (not isolated: the node's PYTHONPATH applies)"
    return f"loadmaster {a.version or '?'}, {how}, venv {a.prefix or '?'}"


def format_report(r: NodeReport) -> list[str]:
    """Human-readable lines for one node's doctor report."""
    lines = [f"{r.name} ({r.host})  {_state(r)}"]
    if not r.reachable:
        lines.append(f"  why       {r.error}")
        return lines
    lat = f"{r.ssh_latency_ms:.0f} ms handshake, " if r.ssh_latency_ms is not None else ""
    lines.append(
        f"  ssh       {lat}{r.command_ms or 0:.0f} ms check"
        if r.transport == "ssh"
        else f"  local     {r.command_ms or 0:.0f} ms check"
    )
    lines.append(f"  os        {r.os or '?'}, kernel {r.kernel or '?'} {r.arch or ''}".rstrip())
    lines.append(
        f"  cpu/mem   {r.cpus or '?'} CPUs, {bytes_text(r.mem_total_bytes)} "
        f"({bytes_text(r.mem_available_bytes)} available)"
    )
    lines.append(f"  python3   {r.python3 or 'MISSING'}")
    if r.agent is not None:
        lines.append(f"  agent     {_agent(r.agent)}")
    lines.append(f"  s5cmd     {r.s5cmd or 'MISSING'}")
    if not r.nvidia_smi:
        gpu = "none (no nvidia-smi on PATH: a CPU machine)"
    elif r.gpu_count:
        gpu = f"{r.gpu_count} x {', '.join(r.gpu_models)}, driver {r.driver}"
    else:
        gpu = "nvidia-smi present, no GPU"
    lines.append(f"  gpus      {gpu}")
    nics = ", ".join(f"{n.name} {_speed(n.speed_mbps)} ({n.state})" for n in r.nics if n.name != "lo")
    lines.append(f"  nics      {nics or 'none besides lo'}")
    if r.scratch_exists:
        lines.append(
            f"  scratch   {r.scratch}: {bytes_text(r.scratch_free_bytes)} free of {bytes_text(r.scratch_total_bytes)}"
        )
    else:
        lines.append(f"  scratch   {r.scratch}: MISSING")
    for p in (*r.problems, *r.gpu_problems):
        lines.append(f"  problem   {p}")
    return lines


def doctor_exit_code(reports: list[NodeReport], *, require_gpus: bool = False) -> int:
    """0 when every node is ready for data jobs and no GPU is faulty (and, with
    ``require_gpus``, every node has one); 1 otherwise."""
    bad = any(not r.ready or r.gpu_problems or (require_gpus and not r.gpu_ready) for r in reports)
    return 1 if bad else 0


async def cmd_doctor(args: argparse.Namespace, services: Services) -> int:
    """Check every node; exit 1 when any node is not ready."""
    names = [n.name for n in _selected(args, services)]
    reports = await Operations(services).fleet.doctor(names, limit=args.timeout)
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=2))
    else:
        for r in reports:
            # The report's text was cleaned where it was parsed; each line once more, as it is printed.
            print("\n".join(safe_text(line) for line in format_report(r)))
        ready = sum(r.ready for r in reports)
        gpus = sum(r.gpu_ready for r in reports)
        print(
            f"{ready} of {len(reports)} node(s) ready for data jobs; {gpus} of {len(reports)} with GPUs",
            file=sys.stdout,
        )
    return doctor_exit_code(reports, require_gpus=args.require_gpus)
