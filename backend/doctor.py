"""``loadmaster doctor``: is every node ready for training-data work, and if not, why.

One POSIX sh script per node gathers everything in a single remote command (sections delimited
by ``@@lm:<name>`` lines); the pool fans it out to every node at once. Two questions, answered
apart: a node is *ready for data jobs* (pulls, uploads, shards) when it is reachable and has
python3, loadmaster's agent (its own venv's interpreter, which says which venv it runs from; see
:mod:`backend.nodes.agent`), the s5cmd jobs run (``[pull] s5cmd``) and a writable scratch
directory; it *has GPUs* when nvidia-smi answers with at least one. A machine without nvidia-smi is a CPU machine, not a
fault; nvidia-smi that fails or hangs is one.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field
from typing import Any

from backend.config import Node
from backend.errors import CommandTimeout, LoadmasterError
from backend.nodes.agent import AgentReport, parse_probe, probe_command
from backend.nodes.pool import NodePool
from backend.nodes.ssh import SshTransport
from backend.nodes.transport import Transport
from backend.textfmt import safe_text

MARK = "@@lm:"

#: Gathers every fact in one round trip; each section prints its own lines after a marker.
_SCRIPT = r"""
LC_ALL=C; export LC_ALL
echo "@@lm:uname"; uname -s; uname -r; uname -m
echo "@@lm:os"; ( . /etc/os-release 2>/dev/null && echo "$PRETTY_NAME" )
echo "@@lm:cpus"; nproc 2>/dev/null || getconf _NPROCESSORS_ONLN
echo "@@lm:mem"; grep -E '^(MemTotal|MemAvailable):' /proc/meminfo 2>/dev/null
echo "@@lm:python3"; python3 -c 'import platform; print(platform.python_version())' 2>&1
echo "@@lm:s5cmd"; if command -v "$LM_S5CMD" >/dev/null 2>&1; then "$LM_S5CMD" version 2>&1 | head -n 1; else echo "@@missing"; fi
echo "@@lm:nvidia"
if command -v nvidia-smi >/dev/null 2>&1; then
  T=""; if command -v timeout >/dev/null 2>&1; then T="timeout 20"; fi
  $T nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader,nounits 2>&1
  echo "@@rc $?"
else echo "@@missing"; fi
echo "@@lm:nics"
for d in /sys/class/net/*; do
  [ -e "$d" ] || continue
  n=${d##*/}; s=$(cat "$d/speed" 2>/dev/null) || s=""; st=$(cat "$d/operstate" 2>/dev/null)
  echo "$n ${s:--} ${st:-unknown}"
done
echo "@@lm:scratch"
if [ -d "$LM_SCRATCH" ]; then
  df -Pk "$LM_SCRATCH" 2>&1 | tail -n 1
  if [ -w "$LM_SCRATCH" ]; then echo "@@writable"; fi
else echo "@@missing"; fi
"""

#: The last sections: the node's agent (its probe is per node, see backend.nodes.agent), the end.
_AGENT_SECTION = """echo "@@lm:agent"
@PROBE@
echo "@@lm:end"
"""


@dataclass(frozen=True)
class Nic:
    """A network interface and its line rate (None when the kernel does not report one)."""

    name: str
    speed_mbps: int | None
    state: str


@dataclass(frozen=True)
class NodeReport:
    """Everything doctor learned about one node: ready for data jobs, and whether it has GPUs."""

    name: str
    host: str
    transport: str
    reachable: bool
    #: Ready for data jobs: reachable, python3, the agent, s5cmd and a writable scratch directory.
    ready: bool
    error: str | None = None
    #: What keeps the node from data jobs.
    problems: tuple[str, ...] = ()
    #: At least one GPU answered nvidia-smi.
    gpu_ready: bool = False
    #: nvidia-smi present but failing or hung (a fault); empty on a machine without nvidia-smi.
    gpu_problems: tuple[str, ...] = ()
    ssh_latency_ms: float | None = None
    command_ms: float | None = None
    os: str | None = None
    kernel: str | None = None
    arch: str | None = None
    cpus: int | None = None
    mem_total_bytes: int | None = None
    mem_available_bytes: int | None = None
    python3: str | None = None
    s5cmd: str | None = None
    nvidia_smi: bool = False
    gpu_count: int = 0
    gpu_models: tuple[str, ...] = ()
    driver: str | None = None
    nics: tuple[Nic, ...] = ()
    scratch: str = ""
    scratch_exists: bool = False
    scratch_writable: bool = False
    scratch_free_bytes: int | None = None
    scratch_total_bytes: int | None = None
    #: Which interpreter and venv run loadmaster's agent there (None: not asked, or unreachable).
    agent: AgentReport | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view (``loadmaster doctor --json``)."""
        d = dataclasses.asdict(self)
        d["agent"] = self.agent.as_dict() if self.agent else None
        d["problems"] = list(self.problems)
        d["gpu_problems"] = list(self.gpu_problems)
        d["gpu_models"] = list(self.gpu_models)
        d["nics"] = [dataclasses.asdict(n) for n in self.nics]
        return d


@dataclass
class _Facts:
    sections: dict[str, list[str]] = field(default_factory=dict)

    def lines(self, name: str) -> list[str]:
        return self.sections.get(name, [])

    def first(self, name: str) -> str | None:
        lines = [ln for ln in self.lines(name) if ln.strip()]
        return lines[0].strip() if lines else None


#: Longest line of a node's answer kept (an os-release name, a GPU model, the agent's JSON): the rest is cut.
LINE_LIMIT = 4096


def parse_sections(text: str) -> dict[str, list[str]]:
    """Split the script's output into ``{section: lines}``. The node wrote it (its os-release, its
    tools' versions): each line passes the one sanitiser here, so no escape sequence or control
    character of it reaches a report, the terminal or ``--json``."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for raw in text.splitlines():
        line = safe_text(raw, LINE_LIMIT)
        if line.startswith(MARK):
            current = sections.setdefault(line[len(MARK) :].strip(), [])
        elif current is not None:
            current.append(line)
    return sections


def doctor_command(scratch: str, s5cmd: str = "s5cmd", agent_probe: str = "true") -> str:
    """The one remote command doctor runs on a node (``s5cmd``: the one jobs run; ``agent_probe``:
    the node's :func:`~backend.nodes.agent.probe_command`)."""
    script = _SCRIPT + _AGENT_SECTION.replace("@PROBE@", agent_probe)
    return f"LM_SCRATCH={shlex.quote(scratch)} LM_S5CMD={shlex.quote(s5cmd)} exec /bin/sh -c {shlex.quote(script)}"


def _s5cmd_missing(s5cmd: str) -> str:
    if "/" in s5cmd:
        return f"s5cmd not found at {s5cmd} (fix [pull] s5cmd)"
    return "s5cmd not found on PATH (install it: https://github.com/peak/s5cmd, or set [pull] s5cmd to its path)"


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def parse_report(
    node_name: str,
    host: str,
    transport: str,
    scratch: str,
    text: str,
    s5cmd_path: str = "s5cmd",
    node: Node | None = None,
) -> NodeReport:
    """Turn the script's output into a :class:`NodeReport` (ready or with its problems); with the
    ``node``, its agent section too (which interpreter and venv run the agent, or why none can)."""
    f = _Facts(parse_sections(text))
    problems: list[str] = []
    gpu_problems: list[str] = []
    if "end" not in f.sections:
        problems.append("the check script did not finish (output cut short)")
    uname = f.lines("uname") + [None, None, None]  # type: ignore[list-item]
    mem: dict[str, int] = {}
    for ln in f.lines("mem"):
        key, _, rest = ln.partition(":")
        kb = _int(rest.strip().split(" ")[0] if rest.strip() else None)
        if kb is not None:
            mem[key.strip()] = kb * 1024
    py = f.first("python3")
    python3 = py if py and py[0].isdigit() else None
    if python3 is None:
        problems.append("python3 not found on PATH" + (f" ({py})" if py else ""))
    s5 = f.first("s5cmd")
    s5cmd = None if s5 in (None, "@@missing") else s5
    if s5cmd is None:
        problems.append(_s5cmd_missing(s5cmd_path))
    elif "/" in s5cmd_path:
        s5cmd = f"{s5cmd} ({s5cmd_path})"
    nv = f.lines("nvidia")
    nvidia_smi = bool(nv) and nv[0] != "@@missing"
    gpus: list[tuple[str, str]] = []
    if nvidia_smi:
        rc = next((ln for ln in nv if ln.startswith("@@rc ")), "@@rc 0")
        rows = [ln for ln in nv if ln.strip() and not ln.startswith("@@")]
        for ln in rows:
            parts = [p.strip() for p in ln.split(",")]
            if len(parts) >= 3 and parts[0].isdigit():
                gpus.append((parts[1], parts[2]))
        if rc == "@@rc 124":
            gpu_problems.append("nvidia-smi did not answer within 20s (wedged driver or GPU?)")
        elif rc != "@@rc 0" or not gpus:
            detail = rows[0].strip() if rows else "no output"
            gpu_problems.append(f"nvidia-smi found no usable GPU: {detail}")
    nics: list[Nic] = []
    for ln in f.lines("nics"):
        parts = ln.split()
        if len(parts) >= 3:
            speed = _int(parts[1])
            nics.append(Nic(parts[0], speed if speed is not None and speed > 0 else None, parts[2]))
    sc = f.lines("scratch")
    scratch_exists = bool(sc) and sc[0] != "@@missing"
    free = total = None
    if scratch_exists:
        cols = sc[0].split()
        if len(cols) >= 4:
            total = _int(cols[1])
            free = _int(cols[3])
            total = total * 1024 if total is not None else None
            free = free * 1024 if free is not None else None
    else:
        problems.append(
            f"scratch directory {scratch} does not exist: create it on the node "
            f"(mkdir -p {shlex.quote(scratch)}) or set 'scratch' for this node"
        )
    writable = "@@writable" in sc
    if scratch_exists and not writable:
        problems.append(f"scratch directory {scratch} is not writable")
    agent = parse_probe(node, f.lines("agent")) if node is not None else None
    if agent is not None and agent.problem:
        problems.append(agent.problem)
    models = tuple(dict.fromkeys(m for m, _ in gpus))
    return NodeReport(
        name=node_name,
        host=host,
        transport=transport,
        reachable=True,
        ready=not problems,
        problems=tuple(problems),
        gpu_ready=bool(gpus) and not gpu_problems,
        gpu_problems=tuple(gpu_problems),
        os=f.first("os") or uname[0],
        kernel=uname[1],
        arch=uname[2],
        cpus=_int(f.first("cpus")),
        mem_total_bytes=mem.get("MemTotal"),
        mem_available_bytes=mem.get("MemAvailable"),
        python3=python3,
        s5cmd=s5cmd,
        nvidia_smi=nvidia_smi,
        gpu_count=len(gpus),
        gpu_models=models,
        driver=gpus[0][1] if gpus else None,
        nics=tuple(nics),
        scratch=scratch,
        scratch_exists=scratch_exists,
        scratch_writable=writable,
        scratch_free_bytes=free,
        scratch_total_bytes=total,
        agent=agent,
    )


async def check_node(transport: Transport, *, limit: float = 60.0, s5cmd: str = "s5cmd") -> NodeReport:
    """Run the check script on one node; an unreachable node becomes a not-ready report."""
    node = transport.node
    try:
        res = await transport.run(doctor_command(node.scratch, s5cmd, probe_command(node)), timeout=limit)
    except CommandTimeout:
        problem = f"the check did not finish within {limit:g}s (hung mount or tool?)"
        return NodeReport(
            node.name,
            node.host,
            node.transport,
            reachable=True,
            ready=False,
            error=problem,
            problems=(problem,),
            scratch=node.scratch,
        )
    except LoadmasterError as exc:
        detail = safe_text(getattr(exc, "detail", None) or str(exc), LINE_LIMIT)
        return NodeReport(
            node.name,
            node.host,
            node.transport,
            reachable=False,
            ready=False,
            error=detail,
            problems=(detail,),
            scratch=node.scratch,
        )
    report = parse_report(node.name, node.host, node.transport, node.scratch, res.stdout, s5cmd, node)
    latency = None
    if isinstance(transport, SshTransport) and transport.handshake_seconds is not None:
        latency = round(transport.handshake_seconds * 1000, 1)
    return dataclasses.replace(report, ssh_latency_ms=latency, command_ms=round(res.elapsed * 1000, 1))


async def run_doctor(
    pool: NodePool, nodes: list[str] | None = None, *, limit: float = 60.0, s5cmd: str = "s5cmd"
) -> list[NodeReport]:
    """Check every node (or ``nodes``) concurrently; one report per node, in inventory order.

    ``s5cmd`` is the one jobs run (``[pull] s5cmd``).
    """
    names = nodes or pool.names
    results = await pool.fanout(lambda t: check_node(t, limit=limit, s5cmd=s5cmd), nodes=names, timeout=limit + 30)
    reports: list[NodeReport] = []
    for name in names:
        r = results[name]
        if isinstance(r, NodeReport):
            reports.append(r)
        else:
            node = pool.node(name)
            detail = safe_text(getattr(r, "detail", None) or str(r) or type(r).__name__, LINE_LIMIT)
            reports.append(
                NodeReport(
                    name,
                    node.host,
                    node.transport,
                    reachable=False,
                    ready=False,
                    error=detail,
                    problems=(detail,),
                    scratch=node.scratch,
                )
            )
    return reports
