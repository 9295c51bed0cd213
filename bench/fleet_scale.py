"""Fleet at scale over SSH: the console's telemetry on N real sshd nodes, and a fan-out against pdsh.

Starts N real OpenSSH sshd nodes (default 256) on 127.0.x.y (y = 2..254, x = 0, 1, ...: Linux
routes all of 127/8 to lo), each with sshd's default ``MaxStartups 10:30:100`` and ``MaxSessions
10`` and a stand-in ``nvidia-smi`` in sh + awk (:mod:`bench.nvidia_smi_sh`, one sh and one
awk per call instead of a Python start; checked at start-up to print the Python stand-in's exact
bytes). Then, in this one process, the console's real parts as the console builds them: a
``Config`` loaded from a written loadmaster.toml, ``NodePool.from_config`` and ``TelemetryHub``
(one long-lived sampler stream per node), and measures:

* connecting: sshd start-up time (bounded concurrency), time until every node's first sample,
  connections each sshd accepted (``Accepted publickey`` in its log; sshd runs at LogLevel INFO
  here so that it also logs every ``drop connection ... past MaxStartups``), connection failures
  the pool reported (its ``on_change`` hook) and the hub's errors (``mark_unreachable`` and
  ``note_error`` calls), and the nodes' states at the end;
* streaming for ``--seconds``: the console process's CPU (getrusage of this process, % of one
  core), p50/p99 of one node's block applied (``hub.ingest``) and of a whole ``hub.tick()``, wall
  and CPU (thread_time) times, samples per node per second, VmRSS at the end, and the nodes' own
  CPU (sshd sessions and samplers, from /proc);
* fan-out: ``uptime`` on every node with ``NodePool.fanout`` through the hub's open connections
  (warm) and from a fresh pool (cold: every handshake included), against ``pdsh -R ssh -w
  ^hostfile`` on the same nodes, alternating who goes first, while the hub keeps streaming.

The nodes share this machine with the console, which a real fleet does not: by default every
node process runs in one cgroup with the smallest CPU share (``--node-cpu``), so the console's
figures are its own work and not its wait for a CPU, and the nodes' login shells get their own
empty HOME (``--node-home``) instead of this machine's root ~/.bashrc (``pyenv init`` on every
login). The nodes' own CPU is reported beside the console's.

Prints a markdown table and one JSON line (also written to ``--json``). Every sshd it started,
and every process their sessions left, is stopped on exit, Ctrl-C or SIGTERM; sessions are let
end before that (see :func:`wait_quiet`). ``kill -USR1``/``-USR2`` print the threads'/tasks' stacks.

Usage: .venv/bin/python bench/fleet_scale.py [--nodes 256] [--seconds 60] [--interval 1] [--json PATH]
"""

from __future__ import annotations

import _thread
import argparse
import asyncio
import concurrent.futures
import contextlib
import cProfile
import datetime
import faulthandler
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.config import Config, load_config_file  # noqa: E402
from backend.errors import LoadmasterError  # noqa: E402
from backend.nodes.pool import NodePool  # noqa: E402
from backend.nodes.transport import Transport  # noqa: E402
from backend.telemetry.hub import TelemetryHub  # noqa: E402
from backend.telemetry.sampler import sampler_script  # noqa: E402
from backend.telemetry.settings import TelemetrySettings  # noqa: E402
from bench import nvidia_smi_sh  # noqa: E402
from lab import fake_nvidia_smi  # noqa: E402
from lab.ports import port_free  # noqa: E402
from lab.sshd import SshdNode, keygen, lab_processes  # noqa: E402

#: Addresses per 127.0.x block (y = 2..254).
PER_BLOCK = 253
TICKS = os.sysconf("SC_CLK_TCK")


class BenchError(LoadmasterError):
    """The benchmark cannot go on (one line naming what to fix)."""


def say(msg: str) -> None:
    """Progress on stderr (the table and JSON go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def p(values: list[float], q: int) -> float:
    """The q-th percentile (inclusive method), 0 for no values."""
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def addresses(n: int) -> list[str]:
    return [f"127.0.{i // PER_BLOCK}.{2 + i % PER_BLOCK}" for i in range(n)]


def pick_port(ips: list[str]) -> int:
    for _ in range(100):
        with socket.socket() as s:
            s.bind((ips[0], 0))
            port = int(s.getsockname()[1])
        if all(port_free(ip, port) for ip in ips):
            return port
    raise BenchError("no TCP port is free on every lab address; stop other labs and retry")


# -- the stand-in nvidia-smi ---------------------------------------------------------------------
def sampler_queries() -> list[list[str]]:
    """The nvidia-smi command lines the sampler script runs (read from the script itself)."""
    script = sampler_script(interval=1.0, scratch="/tmp")
    found = [m.split() for m in re.findall(r'"\$smi" (--query-gpu=\S+ --format=\S+)', script)]
    if not found:
        raise BenchError("no nvidia-smi query found in the sampler script; update bench/fleet_scale.py")
    return found


def check_stand_ins(work: Path) -> dict[str, Any]:
    """The sh stand-in prints the Python stand-in's bytes for every query the sampler makes; costs."""
    work.mkdir(parents=True, exist_ok=True)
    scenario = work / "scenario.json"
    sh = work / "nvidia-smi"
    queries = sampler_queries()
    for t in (0.0, 12.34, 977.5, 86399.99):
        for pattern in ("training", "starved", "idle"):
            fake_nvidia_smi.write_scenario(scenario, fixed_t=t, pattern=pattern)
            nvidia_smi_sh.write(sh, fixed_t=t, pattern=pattern)
            for q in queries:
                want = subprocess.run(
                    [sys.executable, fake_nvidia_smi.__file__, "--scenario", str(scenario), *q],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                got = subprocess.run([str(sh), *q], capture_output=True, text=True, check=True).stdout
                if got != want:
                    raise BenchError(
                        f"the sh nvidia-smi stand-in differs from the Python one at t={t:g} ({pattern}, {q[0]}): "
                        f"{got.splitlines()[:1]} vs {want.splitlines()[:1]}; fix bench/nvidia_smi_sh.py"
                    )
    query = queries[0]
    # The clocked script (what the nodes get): same GPUs, same columns.
    fake_nvidia_smi.write_scenario(scenario)
    nvidia_smi_sh.write(sh)
    costs: dict[str, Any] = {"queries_checked": [" ".join(q) for q in queries]}
    for name, cmd in (
        ("sh", [str(sh), *query]),
        ("python", [sys.executable, fake_nvidia_smi.__file__, "--scenario", str(scenario), *query]),
    ):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        outs = [subprocess.run(cmd, capture_output=True, text=True, check=True).stdout for _ in range(10)]
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
        costs[f"{name}_cpu_ms_per_call"] = cpu / len(outs) * 1000
        costs[f"{name}_shape"] = [len(line.split(", ")) for line in outs[0].splitlines()]
    if costs["sh_shape"] != costs["python_shape"]:
        raise BenchError(f"stand-in columns differ: sh {costs['sh_shape']} vs python {costs['python_shape']}")
    return costs


# -- the nodes ---------------------------------------------------------------------------------------
def make_nodes(root: Path, n: int) -> tuple[list[SshdNode], int, Path]:
    keygen(root / "id_ed25519", "loadmaster-bench-user")
    authorized = root / "authorized_keys"
    authorized.write_text((root / "id_ed25519.pub").read_text())
    os.chmod(authorized, 0o600)
    ips = addresses(n)
    port = pick_port(ips)
    nodes = [
        SshdNode(
            name=f"node-{i + 1:03d}",
            ip=ip,
            port=port,
            root=root / "nodes" / f"node-{i + 1:03d}",
            authorized_keys=authorized,
        )
        for i, ip in enumerate(ips)
    ]
    return nodes, port, authorized


def start_node(node: SshdNode, own_home: bool, nice: int, cgroup: NodeCgroup | None) -> None:
    node.prepare()
    # LogLevel INFO: sshd then logs each accepted login and each connection it drops past
    # MaxStartups (the lab's ERROR level logs neither). With own_home, HOME is the node's own
    # (empty) home, as every real node has its own: the login shell then runs no rc file instead
    # of this machine's root ~/.bashrc (``pyenv init``, a rehash under a machine-wide lock: 256
    # of them at once on 2 cores starve every sshd; see --node-home).
    cfg = node.root / "sshd_config"
    text = cfg.read_text()
    if "LogLevel ERROR" not in text or "MaxStartups 10:30:100" not in text or "\nSetEnv " not in text:
        raise BenchError(f"{cfg}: the lab's sshd_config changed; update bench/fleet_scale.py")
    text = text.replace("LogLevel ERROR", "LogLevel INFO")
    if own_home:
        text = text.replace("\nSetEnv ", f"\nSetEnv HOME={node.home} ", 1)
    cfg.write_text(text)
    nvidia_smi_sh.write(node.bin_dir / "nvidia-smi")
    node.start(timeout=60)
    if node.proc is not None:
        if cgroup is not None:
            cgroup.add(node.proc.pid)  # sessions inherit it (see NodeCgroup)
        elif nice:
            os.setpriority(os.PRIO_PROCESS, node.proc.pid, nice)  # and the renicer their autogroups


def start_all(nodes: list[SshdNode], concurrency: int, own_home: bool, nice: int, cgroup: NodeCgroup | None) -> float:
    t0 = time.perf_counter()
    ex = concurrent.futures.ThreadPoolExecutor(concurrency)
    try:
        for fut in [ex.submit(start_node, nd, own_home, nice, cgroup) for nd in nodes]:
            fut.result()
    except BaseException:
        ex.shutdown(wait=True, cancel_futures=True)
        raise
    ex.shutdown(wait=True)
    return time.perf_counter() - t0


def leftovers(nodes: list[SshdNode], root: Path) -> dict[str, int]:
    """Processes on the nodes other than their sshd listeners, by command line."""
    listeners = {nd.proc.pid for nd in nodes if nd.proc is not None}
    out: Counter[str] = Counter()
    for pid in lab_processes(root):
        if pid in listeners:
            continue
        with contextlib.suppress(OSError):
            out[Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:60]] += 1
    return dict(out)


def wait_quiet(nodes: list[SshdNode], root: Path, timeout: float) -> dict[str, int]:
    """Wait until nothing but the listeners runs on the nodes (what is left after ``timeout``).

    Stopping a node SIGKILLs its sessions' processes: one killed inside a login shell's ``pyenv
    rehash`` (root's ~/.bashrc here runs ``pyenv init``) leaves pyenv's lock file behind, and every
    later login shell on the machine then waits 60 s for it. So sessions are let end first.
    """
    deadline = time.monotonic() + timeout
    left = leftovers(nodes, root)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = leftovers(nodes, root)
    return left


def stale_pyenv_lock() -> Path | None:
    """pyenv's rehash lock when it exists with no rehash running (every login would wait 60 s)."""
    lock = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "shims" / ".pyenv-shim"
    if not lock.exists():
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if b"pyenv-rehash" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return None
    return lock


def stop_all(nodes: list[SshdNode], root: Path) -> dict[str, int]:
    """Stop every sshd (and its sessions); then kill what their sessions left (returned, by command)."""

    def stop(node: SshdNode) -> None:
        with contextlib.suppress(Exception):  # keep stopping the rest
            node.stop()

    with concurrent.futures.ThreadPoolExecutor(32) as ex:
        list(ex.map(stop, nodes))
    strays: Counter[str] = Counter()
    for pid in lab_processes(root):
        with contextlib.suppress(OSError):
            strays[Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:60]] += 1
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return dict(strays)


#: A separate process (its CPU is not the console's) that lowers the CPU share of every session
#: on the nodes. Linux's autogroup scheduling gives each session (setsid: sshd makes one per
#: connection and per command) an equal share whatever its processes' nice values, so 250 node
#: sessions would each weigh as much as the console; writing a nice value to
#: /proc/PID/autogroup of the session leader lowers the whole session's share.
RENICE = r"""
import os, sys, time
nice, mark, listeners = sys.argv[1], sys.argv[2].encode(), set(sys.argv[3:])
seen = set()
while True:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
            if st[3] != pid or (pid, st[19]) in seen:  # only session leaders, once each
                continue
            seen.add((pid, st[19]))
            ours = pid in listeners or st[1] in listeners
            if not ours:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    ours = mark in f.read()
            if ours:
                with open(f"/proc/{pid}/autogroup", "w") as f:
                    f.write(nice)
        except OSError:
            pass
    if len(seen) > 200000:
        seen.clear()
    time.sleep(0.2)
"""


CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")


class NodeCgroup:
    """A cgroup (v1 ``cpu`` controller) holding every node process, with the smallest CPU share.

    On a real fleet the nodes' work runs on the nodes' CPUs; here hundreds of node sessions share
    the console's two. In one cgroup with ``cpu.shares = 2`` they get what the console (and
    everything else on the machine) leaves, as one group: the console's figures are its own work,
    not its wait for a CPU. Sessions inherit the group from the listener sshds (and are then
    outside Linux's per-session autogroups). Removed at the end.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls) -> NodeCgroup | None:
        if not (CGROUP_V1_CPU / "cpu.shares").exists():
            return None
        path = CGROUP_V1_CPU / f"loadmaster-fleet-bench-{os.getpid()}"
        try:
            path.mkdir()
            (path / "cpu.shares").write_text("2")
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return cls(path)

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Remove the group once its processes are gone (they are killed by then)."""
        deadline = time.monotonic() + 10
        while True:
            try:
                self.path.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    say(f"warning: cannot remove {self.path}: processes left in it")
                    return
                time.sleep(0.1)


def start_renicer(nodes: list[SshdNode], root: Path, nice: int) -> subprocess.Popen[bytes] | None:
    """Start the helper that lowers the nodes' sessions' CPU share (None where autogroups are off)."""
    try:
        enabled = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        enabled = False
    if not nice or not enabled:
        return None
    listeners = [str(nd.proc.pid) for nd in nodes if nd.proc is not None]
    return subprocess.Popen(
        [sys.executable, "-c", RENICE, str(nice), f"LOADMASTER_HOME={root}/", *listeners],
        stdin=subprocess.DEVNULL,
    )


def catch_signals() -> None:
    """From now on SIGINT/SIGTERM are taken by one thread, which names the sender and interrupts
    the run (main's clean-up then stops every node). Called once the sshds run: processes started
    later (pdsh and its ssh) inherit the blocked signals, the nodes do not."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

    def wait() -> None:
        info = signal.sigwaitinfo({signal.SIGINT, signal.SIGTERM})
        sender = "?"
        with contextlib.suppress(OSError):
            sender = Path(f"/proc/{info.si_pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        say(f"{signal.Signals(info.si_signo).name} from pid {info.si_pid} ({sender}); stopping")
        _thread.interrupt_main()

    threading.Thread(target=wait, name="signals", daemon=True).start()


def write_config(root: Path, nodes: list[SshdNode], port: int, interval: float) -> Config:
    lines = [
        "[defaults]",
        'user = "root"',
        f"port = {port}",
        f'identity = ["{root / "id_ed25519"}"]',
        f'known_hosts = "{root / "known_hosts"}"',
        "connect_timeout = 5.0",
        "",
    ]
    for nd in nodes:
        lines += ["[[nodes]]", f'name = "{nd.name}"', f'host = "{nd.ip}"', f'scratch = "{nd.scratch}"', ""]
    lines += ["[telemetry]", f"interval = {interval:g}", "", "[state]", f'dir = "{root / "state"}"', ""]
    (root / "known_hosts").write_text("".join(f"[{nd.ip}]:{port} ssh-ed25519 {nd.public_host_key()}\n" for nd in nodes))
    path = root / "loadmaster.toml"
    path.write_text("\n".join(lines))
    return load_config_file(path)


def sshd_log_counts(nodes: list[SshdNode]) -> dict[str, Any]:
    """Per-node counts of what each sshd logged: logins accepted, connections dropped, errors."""
    accepted: dict[str, int] = {}
    dropped = 0
    other: Counter[str] = Counter()
    for nd in nodes:
        try:
            text = (nd.root / "sshd.log").read_text(errors="replace")
        except OSError:
            text = ""
        accepted[nd.name] = text.count("Accepted publickey")
        dropped += text.count("past MaxStartups")
        for line in text.splitlines():
            if line.startswith("error:") or line.startswith("fatal:") or "exceeded" in line:
                other[line.split(" from ")[0][:80]] += 1
    return {"accepted": accepted, "dropped": dropped, "errors": dict(other)}


def node_side_cpu(nodes: list[SshdNode], root: Path) -> dict[tuple[int, int], int]:
    """(pid, start time) -> CPU ticks (own + reaped children) of every process of the nodes: the
    listeners, their per-connection sshds, and what the sessions run."""
    listeners = {nd.proc.pid for nd in nodes if nd.proc is not None}
    ours = set(lab_processes(root)) | listeners
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is field 3 (state): ppid=4, utime=14, stime=15, cutime=16, cstime=17, starttime=22.
        if int(entry) in ours or int(fields[1]) in listeners:
            out[(int(entry), int(fields[19]))] = sum(int(fields[i]) for i in (11, 12, 13, 14))
    return out


def machine_busy() -> tuple[int, int]:
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


def vm_status() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


# -- the console side --------------------------------------------------------------------------------
@dataclass
class Meter:
    """Times of the hub's own calls, recorded by wrapping its methods on this one instance."""

    on: bool = False
    ingest_wall: list[float] = field(default_factory=list)
    ingest_cpu: list[float] = field(default_factory=list)
    tick_wall: list[float] = field(default_factory=list)
    tick_cpu: list[float] = field(default_factory=list)
    samples: Counter[str] = field(default_factory=Counter)
    first_sample: dict[str, float] = field(default_factory=dict)
    unreachable: list[tuple[str, str]] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    pool_changes: list[tuple[str, str, str | None]] = field(default_factory=list)
    t0: float = 0.0
    nodes: int = 0
    all_sampled: asyncio.Event = field(default_factory=asyncio.Event)


def instrument(hub: TelemetryHub, pool: NodePool, meter: Meter) -> None:
    ingest, tick, unreachable, note = hub.ingest, hub.tick, hub.mark_unreachable, hub.note_error

    def timed_ingest(node: str, block: str, t: float | None = None) -> Any:
        w0, c0 = time.perf_counter(), time.thread_time()
        snap = ingest(node, block, t)
        w1, c1 = time.perf_counter(), time.thread_time()
        if node not in meter.first_sample:
            meter.first_sample[node] = w1 - meter.t0
            if len(meter.first_sample) == meter.nodes:
                meter.all_sampled.set()
        if meter.on:
            meter.ingest_wall.append(w1 - w0)
            meter.ingest_cpu.append(c1 - c0)
            meter.samples[node] += 1
        return snap

    def timed_tick(t: float | None = None) -> Any:
        w0, c0 = time.perf_counter(), time.thread_time()
        snap = tick(t)
        if meter.on:
            meter.tick_wall.append(time.perf_counter() - w0)
            meter.tick_cpu.append(time.thread_time() - c0)
        return snap

    def counted_unreachable(node: str, error: str, t: float | None = None) -> None:
        meter.unreachable.append((node, error))
        unreachable(node, error, t)

    def counted_note(node: str, error: str) -> None:
        meter.errors.append((node, error))
        note(node, error)

    hub.ingest = timed_ingest  # type: ignore[method-assign]
    hub.tick = timed_tick  # type: ignore[method-assign]
    hub.mark_unreachable = counted_unreachable  # type: ignore[method-assign]
    hub.note_error = counted_note  # type: ignore[method-assign]
    pool.on_change = lambda node, state, error: meter.pool_changes.append((node, state, error))


def innermost(coro: Any) -> str:
    """Where a task's coroutine chain waits now (file:line function)."""
    where = "?"
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None:
            where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}"
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
    return where


def dump_tasks() -> None:
    """kill -USR2 PID: where the asyncio tasks wait, counted."""
    where = Counter(f"{t.get_name().split(':')[0]} @ {innermost(t.get_coro())}" for t in asyncio.all_tasks())
    say("tasks:\n" + "\n".join(f"  {n:4d} {w}" for w, n in where.most_common(25)))


async def uptime_on(t: Transport) -> str:
    return (await t.run("uptime", check=True, timeout=120)).stdout


def failed_nodes(results: dict[str, Any]) -> dict[str, str]:
    """Nodes whose ``uptime`` did not answer, with why."""
    return {k: str(v)[:160] for k, v in results.items() if not isinstance(v, str) or "load average" not in v}


async def console_fanout(pool: NodePool, failures: list[str]) -> float:
    """Seconds for ``pool.fanout`` of ``uptime`` to every node; failed nodes go to ``failures``."""
    t0 = time.perf_counter()
    results = await pool.fanout(uptime_on)
    elapsed = time.perf_counter() - t0
    failures.extend(f"{k}: {v}" for k, v in failed_nodes(results).items())
    return elapsed


async def pdsh_round(pdsh: str, root: Path, port: int, n: int, fanout: int, failures: list[str]) -> float:
    env = {
        **os.environ,
        "PDSH_SSH_ARGS_APPEND": (
            f"-i {root / 'id_ed25519'} -o UserKnownHostsFile={root / 'known_hosts'} -o StrictHostKeyChecking=yes "
            f"-o BatchMode=yes -o IdentitiesOnly=yes -p {port}"
        ),
    }
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        pdsh,
        "-S",
        "-R",
        "ssh",
        "-f",
        str(fanout),
        "-l",
        "root",
        "-w",
        f"^{root / 'hosts'}",
        "uptime",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    elapsed = time.perf_counter() - t0
    answered = sum("load average" in line for line in out.decode(errors="replace").splitlines())
    if proc.returncode != 0 or answered != n:
        failures.append(f"exit {proc.returncode}, {answered} of {n} answered: {err.decode(errors='replace')[-300:]}")
    return elapsed


async def console(
    args: argparse.Namespace, config: Config, nodes: list[SshdNode], root: Path, port: int
) -> dict[str, Any]:
    n = len(nodes)
    res: dict[str, Any] = {}
    pool = NodePool.from_config(config)
    hub = TelemetryHub(pool, config.section(TelemetrySettings))
    meter = Meter(nodes=n)
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, dump_tasks)
    instrument(hub, pool, meter)
    try:
        # 1. connect: the hub starts every node's stream (and latency probe) at once.
        say(f"hub: starting {n} sampler streams")
        meter.t0 = time.perf_counter()
        await hub.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(meter.all_sampled.wait(), max(120.0, n * 0.5))
        res["all_first_sample_s"] = time.perf_counter() - meter.t0 if len(meter.first_sample) == n else None
        firsts = sorted(meter.first_sample.values())
        res["first_sample_p50_s"], res["first_sample_p99_s"] = p(firsts, 50), p(firsts, 99)
        res["nodes_with_sample"] = len(firsts)
        handshakes = [
            float(h) for h in (getattr(pool.transport(nd.name), "handshake_seconds", None) for nd in nodes) if h
        ]
        res["handshake_p50_ms"], res["handshake_p99_ms"] = p(handshakes, 50) * 1000, p(handshakes, 99) * 1000
        logs = sshd_log_counts(nodes)
        res["connect_accepted"] = sum(logs["accepted"].values())
        res["connect_dropped"] = logs["dropped"]
        say(f"hub: {len(firsts)} of {n} nodes sampled; measuring for {args.seconds} s")
        await asyncio.sleep(1.0)  # let the first ticks settle before measuring

        # 2. stream for --seconds.
        node_cpu0, busy0 = node_side_cpu(nodes, root), machine_busy()
        profiler = cProfile.Profile() if args.profile else None
        r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        meter.on = True
        if profiler is not None:
            profiler.enable()  # the console's loop runs in this thread: every callback is seen
        await asyncio.sleep(args.seconds)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        meter.on = False
        r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        node_cpu1, busy1 = node_side_cpu(nodes, root), machine_busy()
        window = w1 - w0
        cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
        res["window_s"] = window
        res["console_cpu_pct"] = cpu / window * 100
        res["console_cpu_pct_per_node"] = res["console_cpu_pct"] / n
        res["console_cpu_ms_per_sample"] = cpu / max(1, sum(meter.samples.values())) * 1000
        both = node_cpu0.keys() & node_cpu1.keys()
        res["nodes_cpu_pct"] = sum(node_cpu1[k] - node_cpu0[k] for k in both) / TICKS / window * 100
        res["machine_busy_pct"] = (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]) * 100 * (os.cpu_count() or 1)
        res["ingest_p50_ms"], res["ingest_p99_ms"] = p(meter.ingest_wall, 50) * 1000, p(meter.ingest_wall, 99) * 1000
        res["ingest_cpu_p99_ms"] = p(meter.ingest_cpu, 99) * 1000
        res["tick_p50_ms"], res["tick_p99_ms"] = p(meter.tick_wall, 50) * 1000, p(meter.tick_wall, 99) * 1000
        res["tick_cpu_p99_ms"] = p(meter.tick_cpu, 99) * 1000
        res["ticks"] = len(meter.tick_wall)
        rates = sorted(meter.samples.get(nd.name, 0) / window for nd in nodes)
        res["samples_per_node_s"] = {"min": rates[0], "median": statistics.median(rates), "max": rates[-1]}
        res["samples_expected_per_s"] = 1 / args.interval
        res.update({k: v for k, v in vm_status().items()})
        snap = hub.snapshot()
        res["states"] = dict(Counter(nd.state for nd in snap.nodes))
        res["gpus_per_node"] = sorted({len(nd.gpus) for nd in snap.nodes})
        res["node_errors_at_end"] = dict(Counter(nd.error for nd in snap.nodes if nd.error))
        logs = sshd_log_counts(nodes)
        res["stream_accepted"] = sum(logs["accepted"].values()) - res["connect_accepted"]
        res["stream_dropped"] = logs["dropped"] - res["connect_dropped"]

        # 3. fan-out rounds, the hub still streaming: warm (its pool), cold (a fresh pool), pdsh.
        pdsh = shutil.which("pdsh")
        (root / "hosts").write_text("".join(f"{nd.ip}\n" for nd in nodes))
        rounds: list[dict[str, float]] = []
        fails: dict[str, list[str]] = {"warm": [], "cold": [], "pdsh": []}
        cold_changes: list[tuple[str, str, str | None]] = []
        before = sshd_log_counts(nodes)
        for i in range(args.rounds):
            row: dict[str, float] = {}
            order = ["warm", "cold", "pdsh"] if i % 2 == 0 else ["pdsh", "cold", "warm"]
            for step in order:
                say(f"fan-out round {i + 1}: {step}")
                if step == "warm":
                    row["warm"] = await console_fanout(pool, fails["warm"])
                elif step == "cold":
                    fresh = NodePool.from_config(config)
                    fresh.on_change = lambda node, state, error: cold_changes.append((node, state, error))
                    try:
                        row["cold"] = await console_fanout(fresh, fails["cold"])
                    finally:
                        await fresh.close()
                elif pdsh:
                    row["pdsh"] = await pdsh_round(pdsh, root, port, n, args.pdsh_fanout, fails["pdsh"])
            rounds.append(row)
        res["fanout_failures"] = {k: len(v) for k, v in fails.items()}
        res["fanout_failure_samples"] = {k: v[:3] for k, v in fails.items() if v}
        after = sshd_log_counts(nodes)
        res["fanout_rounds"] = rounds
        res["fanout_accepted"] = sum(after["accepted"].values()) - sum(before["accepted"].values())
        res["fanout_dropped"] = after["dropped"] - before["dropped"]
        res["cold_pool_unreachable"] = sum(1 for _n, s, _e in cold_changes if s == "unreachable")
        res["pdsh"] = bool(pdsh)
        res["sshd_errors"] = after["errors"]
        res["hub_unreachable_events"] = len(meter.unreachable)
        res["hub_error_events"] = dict(Counter(e for _n, e in meter.errors))
        res["hub_unreachable_samples"] = meter.unreachable[:5]
        res["pool_unreachable_events"] = sum(1 for _n, s, _e in meter.pool_changes if s == "unreachable")
        res["pool_errors"] = dict(Counter(e for _n, s, e in meter.pool_changes if e))
        res["connections_per_node"] = dict(Counter(logs["accepted"].values()))
    finally:
        say("hub: stopping")
        t0 = time.perf_counter()
        await hub.stop()
        await pool.close()
        res["stop_s"] = time.perf_counter() - t0
    return res


# -- report ---------------------------------------------------------------------------------------------
def report(args: argparse.Namespace, r: dict[str, Any]) -> None:
    n = args.nodes
    rounds = r.get("fanout_rounds", [])

    def med(key: str) -> float | None:
        vals = [row[key] for row in rounds if key in row]
        return statistics.median(vals) if vals else None

    warm, cold, pd = med("warm"), med("cold"), med("pdsh")
    r["fanout_median_s"] = {"warm": warm, "cold": cold, "pdsh": pd}
    r["ratio_warm_pdsh"] = warm / pd if warm and pd else None
    r["ratio_cold_pdsh"] = cold / pd if cold and pd else None
    dropped = r["connect_dropped"] + r["stream_dropped"] + r["fanout_dropped"]
    r["dropped_total"] = dropped
    print(f"## Fleet at scale over SSH: {n} real sshd nodes, interval {args.interval:g} s, {args.seconds} s\n")
    print(
        f"{r['date']}; {os.cpu_count()} CPUs; load {r['load_before'][0]:.2f} -> {r['load_after'][0]:.2f}; "
        f"NodePool max_handshakes=10; pdsh -f {args.pdsh_fanout}; node login HOME: {args.node_home}; "
        f"node CPU: {r.get('node_cpu')}. "
        "sh stand-in nvidia-smi "
        f"{r['smi']['sh_cpu_ms_per_call']:.1f} ms CPU/call "
        f"(Python stand-in {r['smi']['python_cpu_ms_per_call']:.0f} ms).\n"
    )
    ups = r["samples_per_node_s"]
    rows = [
        (f"sshd start (concurrency {args.start_concurrency})", f"{r['sshd_start_s']:.1f} s for {n} nodes"),
        (
            "hub start -> every node's first sample",
            f"{r['all_first_sample_s'] or float('nan'):.1f} s "
            f"(p50 {r['first_sample_p50_s']:.1f} s, p99 {r['first_sample_p99_s']:.1f} s); handshake p50/p99 "
            f"{r['handshake_p50_ms']:.0f}/{r['handshake_p99_ms']:.0f} ms",
        ),
        (
            "connections accepted by the sshds (hub)",
            f"{r['connect_accepted']} at connect, +{r['stream_accepted']} while streaming",
        ),
        (
            "dropped past MaxStartups (sshd logs)",
            f"**{dropped}** (connect {r['connect_dropped']}, stream "
            f"{r['stream_dropped']}, fan-out {r['fanout_dropped']})",
        ),
        (
            "unreachable events (pool / hub / cold pool)",
            f"{r['pool_unreachable_events']} / {r['hub_unreachable_events']} / {r['cold_pool_unreachable']}",
        ),
        ("node states at the end", ", ".join(f"{k} {v}" for k, v in sorted(r["states"].items()))),
        (
            "console CPU (% of one core)",
            f"**{r['console_cpu_pct']:.1f}%** ({r['console_cpu_pct_per_node']:.3f}% per node; "
            f"{r['console_cpu_ms_per_sample']:.2f} ms per sample received)",
        ),
        (
            "nodes' CPU (sshd sessions + samplers)",
            f"{r['nodes_cpu_pct']:.0f}% of one core; machine busy {r['machine_busy_pct']:.0f}% of one core (all users)",
        ),
        (
            "apply one block (hub.ingest) p50 / p99",
            f"{r['ingest_p50_ms']:.2f} / **{r['ingest_p99_ms']:.2f} ms** (CPU p99 {r['ingest_cpu_p99_ms']:.2f})",
        ),
        (
            "whole tick() p50 / p99",
            f"{r['tick_p50_ms']:.2f} / **{r['tick_p99_ms']:.2f} ms** (CPU p99 "
            f"{r['tick_cpu_p99_ms']:.2f}; {r['ticks']} ticks)",
        ),
        (
            "samples per node per second",
            f"min {ups['min']:.2f}, median {ups['median']:.2f}, max {ups['max']:.2f} "
            f"(interval: {r['samples_expected_per_s']:.2f})",
        ),
        ("resident memory at the end", f"VmRSS {r['VmRSS']:.0f} MiB (peak {r['VmHWM']:.0f} MiB)"),
    ]
    print("| measure | value |")
    print("|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    print(
        f"\n| fan-out `uptime` to {n} nodes | "
        + " | ".join(f"round {i + 1}" for i in range(len(rounds)))
        + " | median |"
    )
    print("|---|" + "---|" * (len(rounds) + 1))
    for key, label in (("warm", "console, open connections"), ("cold", "console, fresh pool"), ("pdsh", "pdsh -R ssh")):
        cells = [f"{row[key] * 1000:.0f} ms" if key in row else "-" for row in rounds]
        m = med(key)
        total = f"**{m * 1000:.0f} ms**" if m is not None else "-"
        print(f"| {label} | " + " | ".join(cells) + f" | {total} |")
    fails = r.get("fanout_failures", {})
    print(
        "| node failures (all rounds) | "
        + " | ".join("" for _ in rounds)
        + f" | console warm {fails.get('warm', 0)}, cold {fails.get('cold', 0)}, "
        f"pdsh runs failed {fails.get('pdsh', 0)} |"
    )
    if r["ratio_warm_pdsh"] is not None:
        print(
            f"\nratio console / pdsh (lower is better): warm **{r['ratio_warm_pdsh']:.3f}**, "
            f"cold **{r['ratio_cold_pdsh']:.2f}** (goal <= 2)"
        )
    print()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="fan-out rounds (order alternates); 0: the telemetry alone, no pdsh needed",
    )
    ap.add_argument("--start-concurrency", type=int, default=16, help="sshds started at once")
    ap.add_argument("--pdsh-fanout", type=int, default=32, help="pdsh -f (its default: 32)")
    ap.add_argument(
        "--node-home",
        choices=("own", "machine"),
        default="own",
        help="HOME of the nodes' login shells: each node's own empty home (default), or this machine's "
        "root home and its ~/.bashrc (pyenv init on every login)",
    )
    ap.add_argument(
        "--node-cpu",
        choices=("cgroup", "nice", "shared"),
        default="cgroup",
        help="how the nodes' processes share this machine's CPUs with the console: one cgroup with the "
        "smallest share (default; falls back to nice where no cgroup can be made), nice values on "
        "their sessions (--node-nice), or shared as any other process",
    )
    ap.add_argument(
        "--node-nice",
        type=int,
        default=19,
        help="niceness of the nodes' sshds and of every session on them (their autogroups; default 19): "
        "on a real fleet the nodes do not share the console's CPUs; here hundreds of node sessions "
        "would each get as large a CPU share as the console's one thread (0: no change)",
    )
    ap.add_argument("--json", type=Path, help="also write the JSON result here")
    ap.add_argument("--keep", action="store_true", help="keep the lab directory (logs) after the run")
    ap.add_argument(
        "--profile",
        type=Path,
        metavar="PATH",
        help="write cProfile stats of the console during the streaming window here (its CPU figures "
        "then include the profiler's own cost)",
    )
    args = ap.parse_args()
    if not 1 <= args.nodes <= PER_BLOCK * 255:
        print(f"--nodes must be between 1 and {PER_BLOCK * 255}", file=sys.stderr)
        return 2
    if args.rounds > 0 and not shutil.which("pdsh"):
        print(
            "pdsh is not installed (the fan-out rounds compare with it); install it with: "
            "apt-get install -y pdsh, or measure the telemetry alone with --rounds 0",
            file=sys.stderr,
        )
        return 2

    def on_term(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 PID: the threads' stacks (-USR2: the tasks')
    # 256 nodes x (listener + 2 session sshds + shells) and the console's sockets.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    root = Path(tempfile.mkdtemp(prefix="lm-bench-fleet-")).resolve()
    r: dict[str, Any] = {
        "bench": "fleet_scale",
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "nodes": args.nodes,
        "seconds": args.seconds,
        "interval": args.interval,
        "node_home": args.node_home,
        "node_nice": args.node_nice,
        "load_before": os.getloadavg(),
    }
    nodes: list[SshdNode] = []
    renicer: subprocess.Popen[bytes] | None = None
    cgroup: NodeCgroup | None = None
    try:
        say("checking the sh nvidia-smi stand-in against the Python one")
        r["smi"] = check_stand_ins(root / "smi-check")
        say(f"starting {args.nodes} sshd nodes ({args.start_concurrency} at a time)")
        nodes, port, _ = make_nodes(root, args.nodes)
        cgroup = NodeCgroup.create() if args.node_cpu == "cgroup" else None
        nice = args.node_nice if args.node_cpu != "shared" else 0
        r["node_cpu"] = "cgroup" if cgroup else ("nice" if nice else "shared")
        r["sshd_start_s"] = start_all(nodes, args.start_concurrency, args.node_home == "own", nice, cgroup)
        config = write_config(root, nodes, port, args.interval)
        if cgroup is None and nice:
            renicer = start_renicer(nodes, root, nice)
        catch_signals()
        r.update(asyncio.run(console(args, config, nodes, root, port)))
        # The console has closed every connection: after two intervals no sampler should be left.
        time.sleep(max(3.0, 2 * args.interval + 1))
        r["node_processes_after_close"] = leftovers(nodes, root)
        r["node_processes_after_close_s"] = max(3.0, 2 * args.interval + 1)
    except LoadmasterError as exc:
        print(f"fleet_scale: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fleet_scale: interrupted; stopping the nodes", file=sys.stderr)
        return 130
    finally:
        say("waiting for the nodes' sessions to end, then stopping the nodes")
        t0 = time.perf_counter()
        if nodes:
            wait_quiet(nodes, root, 30.0)
        r["strays_killed"] = stop_all(nodes, root)
        if renicer is not None:
            renicer.kill()  # SIGTERM is blocked in it (see catch_signals)
            renicer.wait(timeout=10)
        if cgroup is not None:
            cgroup.remove()
        r["teardown_s"] = time.perf_counter() - t0
        lock = stale_pyenv_lock()
        if lock is not None:
            print(
                f"fleet_scale: warning: {lock} is left without a pyenv rehash running; every login shell "
                "waits 60 s for it: remove it if no rehash is in progress",
                file=sys.stderr,
            )
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    r["load_after"] = os.getloadavg()
    report(args, r)
    line = json.dumps(r, default=str)
    print(line)
    if args.json:
        args.json.write_text(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
