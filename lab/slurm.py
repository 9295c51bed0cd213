"""The real Slurm 22.05 on loopback, for the tests and the lab: one slurmctld and one slurmd per node.

Debian's ``slurmctld``, ``slurmd`` and ``slurm-client``, started by our code as plain processes
(``-D``, in the foreground, each in its own session); nothing here touches their systemd units or
``/etc/slurm``. The generated ``slurm.conf`` uses ``AuthType=auth/none`` and ``CredType=cred/none``
(no munge) with a short job credential lifetime (``AuthInfo=cred_expire``: a requeued job runs
again after seconds, not two minutes), ``ProctrackType=proctrack/linuxproc`` and
``TaskPlugin=task/none`` (no cgroups), its own ports, state and spool directories under ``root``,
and the user running it as ``SlurmUser``.

Several slurmd run on one machine, one per node (``slurmd -N node-01``), each on its own ``Port=``
with ``NodeAddr=127.0.0.N``: Debian builds Slurm so that per-node ports work. Each node has
``gpus`` GPU GRES backed by ``File=`` links to ``/dev/null`` (a character device, which is all
slurmd checks), with ``AutoDetect=off``: Slurm then hands out real GPU indices (``IDX:0-1``) to
jobs without any GPU present.

``SLURM_CONF`` (:meth:`SlurmLab.env`) makes ``sinfo``, ``squeue``, ``scontrol`` and ``sbatch``
talk to this cluster, by hand or from loadmaster. :meth:`SlurmLab.down` cancels every job, stops
the daemons and sweeps up any job process still carrying this cluster's ``SLURM_CONF``.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from backend.errors import LoadmasterError
from lab.ports import free_port
from lab.process import ManagedProcess, alive, log_tail, stop_pid_groups

SLURM_INSTALL_HINT = "apt-get install slurmctld slurmd slurm-client (Debian 12: Slurm 22.05)"
PARTITION = "gpu"
#: The job credential's lifetime (``AuthInfo=cred_expire``), which is also how long slurmctld holds
#: a requeued job back before it may start again: the least Slurm accepts (its launches here take
#: milliseconds), so a test that requeues a job waits 5 s, not 10.
CRED_EXPIRE_S = 5


class SlurmNotInstalled(LoadmasterError):
    """slurmctld, slurmd or the client commands were not found."""


class SlurmLabError(LoadmasterError):
    """The lab's Slurm could not start, or a command against it failed."""


def find_slurm(name: str) -> str:
    """The path of one of Slurm's programs (daemons live in /usr/sbin)."""
    found = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None
    )
    if not found:
        raise SlurmNotInstalled(f"{name} not found: {SLURM_INSTALL_HINT}")
    return found


def _port_taken(error: str) -> bool:
    """Whether a daemon's start failure was its port being taken (slurmd: "Unable to bind listen
    port (N): Address already in use"; slurmctld: "... bind: Address already in use")."""
    return "Address already in use" in error


class SlurmDaemon(ManagedProcess):
    """slurmctld or one slurmd, in the foreground (``-D``), its output in ``log_path``. Launched
    without a probe of its own: :meth:`SlurmLab.wait_idle` waits for the cluster as a whole."""

    stop_grace = 10.0

    def __init__(self, root: Path, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.argv = argv
        self._log_path = log_path
        self._env = env

    @property
    def log_path(self) -> Path:
        return self._log_path

    def args(self) -> list[str]:
        return self.argv

    def env(self) -> dict[str, str] | None:
        return self._env


class SlurmLab:
    """slurmctld + one slurmd per ``(name, ip)`` node, all on loopback, under ``root``."""

    def __init__(
        self,
        root: Path,
        nodes: list[tuple[str, str]],
        *,
        gpus: int = 4,
        cpus: int = 2,
        cluster: str = "lmlab",
    ) -> None:
        if not nodes:
            raise SlurmLabError("a Slurm lab needs at least one node")
        self.root = Path(root).absolute()
        self.nodes = list(nodes)
        self.gpus = gpus
        self.cpus = cpus
        self.cluster = cluster
        self.conf = self.root / "slurm.conf"
        self.ctld_port = 0
        self.node_ports: dict[str, int] = {}
        self._ctld: SlurmDaemon | None = None
        self._slurmd: dict[str, SlurmDaemon] = {}

    # -- config ----------------------------------------------------------------------------------

    @property
    def spool(self) -> Path:
        """Where each slurmd keeps its unix sockets: under ``root``, unless that path is too long
        for a socket name (108 bytes, with slurmstepd's ``<node>_<job>.<step>`` names), as under a
        test worker's temp dir; then a short folder in /tmp named by ``root``."""
        inside = self.root / "spool"
        longest = len(str(inside)) + 2 * max(len(n) for n, _ in self.nodes) + 32
        if longest < 104:
            return inside
        return Path("/tmp") / f"lmslurm-{hashlib.sha1(str(self.root).encode()).hexdigest()[:12]}"

    def write_config(self) -> Path:
        """Write slurm.conf and gres.conf (fresh ports each time)."""
        for d in ("state", "log", "dev"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.spool.mkdir(mode=0o700, parents=True, exist_ok=True)
        for i in range(self.gpus):
            link = self.root / "dev" / f"nvidia{i}"
            if not link.is_symlink():
                link.symlink_to("/dev/null")
        user = getpass.getuser()
        self.ctld_port = free_port("127.0.0.1")
        self.node_ports = {name: free_port("127.0.0.1") for name, _ in self.nodes}
        r = self.root
        lines = [
            f"ClusterName={self.cluster}",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={next(iter(self.node_ports.values()))}",
            "AuthType=auth/none",
            "CredType=cred/none",
            # A requeued job waits out the job credential's lifetime before it may start again
            # (120 s by default; Slurm accepts 5 s at least). Launches here take milliseconds.
            f"AuthInfo=cred_expire={CRED_EXPIRE_S}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={self.spool}/%n",
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={self.spool}/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "MinJobAge=5",
            "KillWait=2",
            "PlugStackConfig=/dev/null",
        ]
        for name, ip in self.nodes:
            lines.append(
                f"NodeName={name} NodeAddr={ip} NodeHostname={name} Port={self.node_ports[name]} "
                f"CPUs={self.cpus} RealMemory=1000 Gres=gpu:{self.gpus} State=UNKNOWN"
            )
        names = ",".join(n for n, _ in self.nodes)
        lines.append(f"PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        gres = ["AutoDetect=off"]
        if self.gpus:
            gres += [f"NodeName={n} Name=gpu File={r}/dev/nvidia[0-{self.gpus - 1}]" for n, _ in self.nodes]
        (self.root / "gres.conf").write_text("\n".join(gres) + "\n")
        return self.conf

    def env(self) -> dict[str, str]:
        """What makes Slurm's commands talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def _env(self) -> dict[str, str]:
        return {**os.environ, **self.env()}

    # -- processes -------------------------------------------------------------------------------

    def up(self, timeout: float = 30.0) -> SlurmLab:
        """Start slurmctld and every slurmd; return once every node is idle (SlurmLabError if not).

        A daemon that could not bind its port (another process took it between the pick and the
        bind) is started again on fresh ports, up to three times."""
        for attempt in range(3):
            try:
                return self._up_once(timeout)
            except SlurmLabError as exc:
                if attempt == 2 or not _port_taken(str(exc)):
                    raise
        raise AssertionError("unreachable")

    def _up_once(self, timeout: float) -> SlurmLab:
        ctld, slurmd = find_slurm("slurmctld"), find_slurm("slurmd")
        find_slurm("sinfo")
        self.write_config()
        log = self.root / "log"
        self._ctld = SlurmDaemon(self.root, [ctld, "-D", "-c", "-i", "-f", str(self.conf)], log / "slurmctld.out")
        self._ctld.launch()
        for name, _ in self.nodes:
            self._slurmd[name] = SlurmDaemon(
                self.root, [slurmd, "-D", "-N", name, "-f", str(self.conf)], log / f"slurmd-{name}.out", self._env()
            )
            self._slurmd[name].launch()
        try:
            self.wait_idle(timeout)
        except SlurmLabError:
            self.down()
            raise
        return self

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until every node is registered and idle (no DRAIN, no INVALID)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for daemon, what in [(self._ctld, "slurmctld"), *((d, f"slurmd {n}") for n, d in self._slurmd.items())]:
                proc = daemon.proc if daemon else None
                if proc is not None and proc.poll() is not None:
                    name = "slurmctld" if what == "slurmctld" else f"slurmd-{what.split()[1]}"
                    raise SlurmLabError(
                        f"{what} exited {proc.returncode}: {log_tail(self.root / 'log' / f'{name}.log')}"
                    )
            res = self.command(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
            last = res.stdout.strip() or res.stderr.strip()
            states = dict(ln.split(None, 1) for ln in res.stdout.splitlines() if " " in ln)
            if res.returncode == 0 and len(states) == len(self.nodes) and set(states.values()) == {"idle"}:
                return
            time.sleep(0.2)
        raise SlurmLabError(f"Slurm nodes not idle after {timeout:g}s: {last[:300]!r}")

    def command(
        self, argv: list[str], *, check: bool = True, timeout: float = 20.0
    ) -> subprocess.CompletedProcess[str]:
        """Run one of Slurm's client commands against this cluster."""
        res = subprocess.run(
            [find_slurm(argv[0]), *argv[1:]], capture_output=True, text=True, env=self._env(), timeout=timeout
        )
        if check and res.returncode != 0:
            raise SlurmLabError(f"{' '.join(argv)} failed: {res.stderr.strip()[:300]}")
        return res

    def sbatch(self, *args: str, script: str = "sleep 600") -> str:
        """Submit a batch job (``--wrap script``); its job id."""
        out = self.command(
            ["sbatch", "--parsable", "-o", str(self.root / "log" / "job-%j.out"), *args, "--wrap", script]
        ).stdout
        return out.strip().split(";", 1)[0]

    def cancel_all(self, timeout: float = 15.0) -> None:
        """Cancel every job and wait until none is left running."""
        ids = self.command(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
        if ids:
            self.command(["scancel", *ids], check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            res = self.command(["squeue", "-h", "-t", "all", "-o", "%i %T"], check=False)
            if res.returncode != 0 or not any(
                s in res.stdout for s in ("RUNNING", "COMPLETING", "PENDING", "CONFIGURING")
            ):
                return
            time.sleep(0.2)

    def resume_all(self) -> None:
        """Every node back to service (undrained), as a test leaves it."""
        names = ",".join(n for n, _ in self.nodes)
        self.command(["scontrol", "update", f"NodeName={names}", "State=RESUME"], check=False)

    def down(self) -> None:
        """Stop the jobs, every slurmd and slurmctld; nothing of this cluster is left running."""
        if self._ctld is not None and self._ctld.running:
            with contextlib.suppress(LoadmasterError, subprocess.TimeoutExpired, OSError):
                self.cancel_all()
        for daemon in self._slurmd.values():
            daemon.stop()
        self._slurmd.clear()
        if self._ctld is not None:
            self._ctld.stop()
        self._ctld = None
        self._sweep()
        if not self.spool.is_relative_to(self.root):
            shutil.rmtree(self.spool, ignore_errors=True)

    # -- a lab that outlives the command that started it (``loadmaster lab up --slurm``) -------------

    def config_section(self, interval: str = "5s") -> str:
        """The ``[slurm]`` section a loadmaster config needs for this cluster."""
        return f'\n[slurm]\nenabled = true\nconf = "{self.conf}"\ninterval = "{interval}"\n'

    def save_state(self, path: Path) -> None:
        """Write what :meth:`stop_saved` needs to stop this cluster from another process."""
        pids = {"slurmctld": self._ctld.pid if self._ctld else None}
        pids.update({f"slurmd {n}": d.pid for n, d in self._slurmd.items()})
        doc = {"root": str(self.root), "nodes": self.nodes, "gpus": self.gpus, "pids": pids}
        path.write_text(json.dumps(doc, indent=1) + "\n")

    @classmethod
    def stop_saved(cls, path: Path) -> int:
        """Stop a cluster :meth:`save_state` recorded (jobs cancelled, daemons' groups killed, job
        processes swept up); how many daemons were running. Removes the state file."""
        if not path.exists():
            return 0
        doc = json.loads(path.read_text())
        lab = cls(Path(doc["root"]), [tuple(n) for n in doc["nodes"]], gpus=int(doc.get("gpus", 4)))
        pids = [p for p in doc.get("pids", {}).values() if isinstance(p, int)]
        running = [p for p in pids if alive(p)]
        if running and lab.conf.exists():
            with contextlib.suppress(LoadmasterError, subprocess.TimeoutExpired, OSError):
                lab.cancel_all(timeout=10)
        stop_pid_groups(running, grace=10)
        lab._sweep()
        if not lab.spool.is_relative_to(lab.root):
            shutil.rmtree(lab.spool, ignore_errors=True)
        path.unlink()
        return len(running)

    def _sweep(self) -> None:
        """Kill job processes that outlived their slurmd (slurmstepd and the scripts it ran): a
        process is this cluster's when it carries this ``SLURM_CONF`` and is a Slurm daemon or a
        job's process (``SLURM_JOB_ID`` set), or runs a script from this cluster's spool."""
        mark = f"SLURM_CONF={self.conf}".encode()
        spool = str(self.spool).encode()
        daemons = (b"slurmstepd", b"slurmd", b"slurmctld")
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
                continue
            try:
                environ = (pid_dir / "environ").read_bytes()
                cmdline = (pid_dir / "cmdline").read_bytes()
                comm = (pid_dir / "comm").read_bytes().strip()
            except OSError:
                continue
            ours = mark + b"\0" in environ + b"\0" and (b"SLURM_JOB_ID=" in environ or comm in daemons)
            if ours or spool in cmdline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid_dir.name), signal.SIGKILL)
