"""The real Prometheus and node_exporter on loopback, for the tests and the lab (``lab up --prometheus``).

Debian's binaries (``prometheus``, ``promtool``, ``prometheus-node-exporter``), started by our code
as plain processes the way an operator starts them; nothing here touches their systemd services.

* :class:`NodeExporter`: the real node_exporter on one address, limited to the collectors the
  console reads (netdev, netclass for link speeds, diskstats, filesystem, meminfo:
  ``--collector.disable-defaults`` plus ``--collector.X``; ``--web.disable-exporter-metrics``).
* :class:`PrometheusServer`: the real Prometheus with a generated config (JSON, which is YAML):
  job ``node`` for node_exporters, job ``dcgm`` for dcgm-exporters (the stand-in,
  :mod:`lab.dcgm_exporter`). Every target carries the target label ``node`` (the
  loadmaster node name) and a relabel rule sets ``instance`` to it as well, so node_exporter series
  are keyed by ``instance`` = node name (the console's default ``node_exporter_node_label``);
  dcgm-exporter series also carry their own ``Hostname`` label (= node name in the lab, the
  console's default ``dcgm_node_label``). ``--web.enable-lifecycle`` (``reload()``), no admin API,
  TSDB under the server's root.
* :class:`TelemetryStack`: the lab's set: a node_exporter on every node's own IP, one dcgm
  stand-in process for the GPU nodes, a Prometheus scraping them; steered by tests
  (pattern, Xid, target down/up).

The 1,024-node backfill the benchmark reads is ``bench/prometheus_backfill.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.errors import LoadmasterError
from lab import fake_nvidia_smi
from lab.dcgm_exporter import (
    DcgmExporterStandIn,
    DcgmNode,
)
from lab.ports import common_free_port, free_port
from lab.process import ManagedProcess, http_ok, wait_port, write_json_config

PROMETHEUS_INSTALL_HINT = "apt-get install prometheus (Debian's package ships prometheus and promtool)"
NODE_EXPORTER_INSTALL_HINT = "apt-get install prometheus-node-exporter"

#: Where the binaries are looked for after PATH (Debian installs them in /usr/bin). Module
#: attributes so tests can take a machine without them into account.
BIN_DIRS: tuple[str, ...] = ("/usr/bin", "/usr/local/bin")

#: The node_exporter collectors the console reads: NIC byte counters (netdev) and link speeds
#: (netclass), disk byte counters (diskstats), scratch space (filesystem), memory (meminfo).
NODE_EXPORTER_COLLECTORS: tuple[str, ...] = ("netdev", "netclass", "diskstats", "filesystem", "meminfo")

#: Job names in the generated config.
NODE_JOB = "node"
DCGM_JOB = "dcgm"
#: The target label naming the loadmaster node on every target (``instance`` is set to it too).
NODE_LABEL = "node"


class PrometheusNotInstalled(LoadmasterError):
    """prometheus, promtool or prometheus-node-exporter was not found."""


class PrometheusError(LoadmasterError):
    """A lab Prometheus or node_exporter could not start, answer or be steered."""


def find_binary(names: Iterable[str], hint: str) -> str:
    """The first of ``names`` on PATH or in :data:`BIN_DIRS`; :class:`PrometheusNotInstalled` naming
    the install command otherwise."""
    names = list(names)
    for name in names:
        hit = shutil.which(name)
        if hit:
            return hit
        for d in BIN_DIRS:
            cand = os.path.join(d, name)
            if os.access(cand, os.X_OK):
                return cand
    raise PrometheusNotInstalled(f"{names[0]} is not installed: {hint}")


def find_prometheus() -> str:
    return find_binary(["prometheus"], PROMETHEUS_INSTALL_HINT)


def find_promtool() -> str:
    return find_binary(["promtool"], PROMETHEUS_INSTALL_HINT)


def find_node_exporter() -> str:
    return find_binary(["prometheus-node-exporter", "node_exporter"], NODE_EXPORTER_INSTALL_HINT)


def _duration(seconds: float) -> str:
    """A Prometheus duration ("1s", "500ms")."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


# -- node_exporter ------------------------------------------------------------------------------


class NodeExporter(ManagedProcess):
    """The real node_exporter on ``ip:port`` (a free port if None), logs and pid under ``root``;
    ready when its port accepts connections."""

    error = PrometheusError
    start_timeout = 15.0
    poll_every = 0.0  # the probe waits 0.2 s itself

    def __init__(
        self,
        root: Path,
        ip: str,
        port: int | None = None,
        *,
        collectors: Iterable[str] = NODE_EXPORTER_COLLECTORS,
        extra_args: Iterable[str] = (),
    ) -> None:
        self.root = Path(root).absolute()
        self.ip = ip
        self.port = port or free_port(ip)
        self.collectors = tuple(collectors)
        self.extra_args = tuple(extra_args)

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    @property
    def log_path(self) -> Path:
        return self.root / "node_exporter.log"

    def args(self) -> list[str]:
        return [
            find_node_exporter(),
            f"--web.listen-address={self.address}",
            "--collector.disable-defaults",
            *[f"--collector.{c}" for c in self.collectors],
            "--web.disable-exporter-metrics",
            "--log.level=warn",
            *self.extra_args,
        ]

    def ready(self) -> bool:
        return wait_port(self.ip, self.port, 0.2)

    def start_failure(self) -> str:
        return f"node_exporter did not start on {self.address}"


# -- Prometheus ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScrapeTarget:
    """One static target: its job, address, loadmaster node and metrics path."""

    job: str
    address: str
    node: str
    metrics_path: str = "/metrics"


@dataclass(frozen=True)
class TargetHealth:
    """One active target as ``/api/v1/targets`` reports it."""

    job: str
    node: str
    instance: str
    scrape_url: str
    health: str  # up | down | unknown
    last_error: str
    last_scrape: float | None  # epoch seconds of the last scrape's start, None before the first
    labels: dict[str, str] = field(default_factory=dict)


def _parse_rfc3339(value: str) -> float | None:
    if not value or value.startswith("0001-01-01"):
        return None
    from datetime import datetime

    v = value.replace("Z", "+00:00")
    # Go writes up to 9 fractional digits; Python takes 6.
    if "." in v:
        head, rest = v.split(".", 1)
        digits = "".join(ch for ch in rest if ch.isdigit())
        tz = rest[len(digits) :]
        v = f"{head}.{digits[:6].ljust(6, '0')}{tz}"
    return datetime.fromisoformat(v).timestamp()


class PrometheusServer(ManagedProcess):
    """The real Prometheus on ``127.0.0.1:port`` (free one if None), data and config under ``root``.

    ``start()`` waits for ``/-/ready`` (blocks loaded, config applied); ``set_targets()`` rewrites
    the config and reloads it; ``stop()`` gives it 30 s to write its TSDB."""

    HOST = "127.0.0.1"
    error = PrometheusError
    start_timeout = 60.0
    poll_every = 0.1
    stop_grace = 30.0

    def __init__(
        self,
        root: Path,
        port: int | None = None,
        *,
        scrape_interval: float = 5.0,
        targets: Iterable[ScrapeTarget] = (),
        data_dir: Path | None = None,
        extra_args: Iterable[str] = (),
    ) -> None:
        self.root = Path(root).absolute()
        self.port = port or free_port(self.HOST)
        self.scrape_interval = float(scrape_interval)
        self.targets_config: list[ScrapeTarget] = list(targets)
        self.data_dir = Path(data_dir).absolute() if data_dir else self.root / "data"
        self.extra_args = tuple(extra_args)

    @property
    def url(self) -> str:
        return f"http://{self.HOST}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.root / "prometheus.yml"

    @property
    def log_path(self) -> Path:
        return self.root / "prometheus.log"

    # -- config -----------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The scrape config: one job per kind of target, static targets labelled ``node``, and
        ``instance`` relabelled to the node name."""
        interval = _duration(self.scrape_interval)
        jobs: dict[str, list[dict[str, Any]]] = {}
        for t in self.targets_config:
            labels = {NODE_LABEL: t.node}
            if t.metrics_path != "/metrics":
                labels["__metrics_path__"] = t.metrics_path
            jobs.setdefault(t.job, []).append({"targets": [t.address], "labels": labels})
        return {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": _duration(min(self.scrape_interval, 10.0)),
                "evaluation_interval": interval,
            },
            "scrape_configs": [
                {
                    "job_name": job,
                    "static_configs": statics,
                    "relabel_configs": [
                        {"source_labels": [NODE_LABEL], "regex": "(.+)", "target_label": "instance"},
                    ],
                }
                for job, statics in jobs.items()
            ],
        }

    def write_config(self) -> Path:
        return write_json_config(self.config_path, self.config())

    # -- lifecycle --------------------------------------------------------------------------
    def args(self) -> list[str]:
        return [
            find_prometheus(),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address={self.HOST}:{self.port}",
            "--web.enable-lifecycle",
            *self.extra_args,
        ]

    def before_start(self) -> None:
        self.write_config()
        self.data_dir.mkdir(parents=True, exist_ok=True)

    def ready(self) -> bool:
        return http_ok(f"{self.url}/-/ready")

    def start_failure(self) -> str:
        return f"Prometheus did not become ready on {self.url}"

    def reload(self) -> None:
        """``POST /-/reload``: re-read the config file."""
        req = urllib.request.Request(f"{self.url}/-/reload", method="POST", data=b"")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                resp.read()
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace").strip()
            raise PrometheusError(f"Prometheus {self.url} refused the reload: {body or exc.reason}") from None
        except OSError as exc:
            raise PrometheusError(f"Prometheus {self.url} unreachable for the reload: {exc}") from None

    def set_targets(self, targets: Iterable[ScrapeTarget]) -> None:
        """Replace the scrape targets (config rewritten, reloaded when running)."""
        self.targets_config = list(targets)
        self.write_config()
        if self.running:
            self.reload()

    # -- API ----------------------------------------------------------------------------------
    def api(self, path: str, params: dict[str, str] | None = None, timeout: float = 10.0) -> Any:
        """GET an ``/api/v1`` path; its ``data`` (a :class:`PrometheusError` on an error answer)."""
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                doc = json.loads(exc.read())
            except ValueError:
                raise PrometheusError(f"Prometheus {url}: HTTP {exc.code}") from None
        except OSError as exc:
            raise PrometheusError(f"Prometheus {self.url} unreachable: {exc}") from None
        if doc.get("status") != "success":
            raise PrometheusError(f"Prometheus {path}: {doc.get('errorType')}: {doc.get('error')}")
        return doc.get("data")

    def query(self, expr: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """An instant query (at now, or ``at``): (labels, value) per series of the vector."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("/api/v1/query", params)
        if data.get("resultType") == "scalar":
            return [({}, float(data["result"][1]))]
        return [(dict(r["metric"]), float(r["value"][1])) for r in data.get("result", [])]

    def targets(self) -> list[TargetHealth]:
        """The active targets (``GET /api/v1/targets?state=active``)."""
        data = self.api("/api/v1/targets", {"state": "active"})
        out = []
        for t in data.get("activeTargets", []):
            labels = dict(t.get("labels", {}))
            out.append(
                TargetHealth(
                    job=labels.get("job", t.get("scrapePool", "")),
                    node=labels.get(NODE_LABEL, ""),
                    instance=labels.get("instance", ""),
                    scrape_url=t.get("scrapeUrl", ""),
                    health=t.get("health", "unknown"),
                    last_error=t.get("lastError", ""),
                    last_scrape=_parse_rfc3339(t.get("lastScrape", "")),
                    labels=labels,
                )
            )
        return out

    def wait_targets(
        self, ok: Callable[[list[TargetHealth]], bool], timeout: float = 30.0, what: str = "targets"
    ) -> list[TargetHealth]:
        """Poll ``targets()`` until ``ok(targets)``; a :class:`PrometheusError` naming the
        targets' state when ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        targets: list[TargetHealth] = []
        while True:
            targets = self.targets()
            if ok(targets):
                return targets
            if time.monotonic() >= deadline:
                break
            time.sleep(min(0.2, self.scrape_interval / 4))
        state = ", ".join(f"{t.job}/{t.node or t.instance} {t.health} {t.last_error}".strip() for t in targets)
        raise PrometheusError(f"Prometheus {self.url}: {what} not reached in {timeout:.0f} s ({state or 'no targets'})")

    def wait_scraped(
        self, min_targets: int | None = None, timeout: float = 30.0, *, after: float | None = None
    ) -> list[TargetHealth]:
        """Wait until at least ``min_targets`` (default: every configured target) are up, each
        scraped at or after ``after`` (epoch seconds; None: any scrape)."""
        want = len(self.targets_config) if min_targets is None else min_targets

        def ok(ts: list[TargetHealth]) -> bool:
            fresh = [
                t
                for t in ts
                if t.health == "up" and t.last_scrape is not None and (after is None or t.last_scrape >= after)
            ]
            return len(fresh) >= want

        return self.wait_targets(ok, timeout, f"{want} scraped target(s)")


# -- the lab's telemetry stack ------------------------------------------------------------------------


def _other_free_port(ips: list[str], taken: int) -> int:
    """A port free on every one of ``ips`` other than ``taken`` (picked, not yet listening)."""
    for _ in range(100):
        port = common_free_port(ips)
        if port != taken:
            return port
    raise PrometheusError(f"no second port free on every lab address (besides {taken})")


@dataclass
class StackNode:
    """One lab node for :class:`TelemetryStack`: where its exporters listen and its GPUs.

    ``scenario``: the node's stand-in nvidia-smi scenario (the lab's ``gpu-scenario.json``, so
    both telemetry paths see the same GPUs); None with ``gpus`` > 0 writes one of the stack's own."""

    name: str
    ip: str
    gpus: int = 8
    pattern: str = "training"
    scenario: Path | None = None
    profiling: bool = True


class TelemetryStack:
    """A node_exporter on every node's IP, the dcgm-exporter stand-in for the nodes with GPUs, and
    a Prometheus scraping them all every ``scrape_interval``."""

    def __init__(
        self,
        root: Path,
        nodes: Iterable[StackNode],
        *,
        scrape_interval: float = 5.0,
        prometheus_port: int | None = None,
        collect_interval: float | None = None,
    ) -> None:
        self.root = Path(root).absolute()
        self.nodes = {n.name: n for n in nodes}
        self.scrape_interval = scrape_interval
        self.collect_interval = collect_interval if collect_interval is not None else min(1.0, scrape_interval)
        self.prometheus = PrometheusServer(self.root / "prometheus", prometheus_port, scrape_interval=scrape_interval)
        self.exporters: dict[str, NodeExporter] = {}
        self.dcgm: DcgmExporterStandIn | None = None
        self._scenarios: dict[str, bytes] = {}  # the GPU nodes' scenario files as started, for restore()
        self._stopped: set[str] = set()
        #: Targets stopped or started so far (with the stand-in's generation: what was changed).
        self._target_changes = 0
        #: What had been changed when Prometheus last scraped everything after it (None: not yet).
        self._settled: tuple[int, int] | None = None

    @property
    def url(self) -> str:
        return self.prometheus.url

    def scenario(self, name: str) -> Path:
        n = self.nodes[name]
        return n.scenario if n.scenario is not None else self.root / "dcgm" / f"{name}.scenario.json"

    def start(self) -> TelemetryStack:
        """Start everything; on a failure stop what was started and re-raise."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        find_prometheus()
        find_node_exporter()
        self.root.mkdir(parents=True, exist_ok=True)
        ips = [n.ip for n in self.nodes.values()]
        port = common_free_port(ips) if ips else 0
        for n in self.nodes.values():
            self.exporters[n.name] = NodeExporter(self.root / "node_exporter" / n.name, n.ip, port)
        gpu_nodes = []
        for n in self.nodes.values():
            if n.gpus <= 0:
                continue
            path = self.scenario(n.name)
            if n.scenario is None:
                fake_nvidia_smi.write_scenario(path, gpus=n.gpus, pattern=n.pattern)
            gpu_nodes.append(DcgmNode(n.name, str(path), ip=n.ip, profiling=n.profiling))
            self._scenarios[n.name] = path.read_bytes()
        if gpu_nodes:
            # Ports chosen here, so Prometheus's config names every target before they listen.
            dcgm_port = _other_free_port([g.ip for g in gpu_nodes if g.ip], port) if ips else 0
            for g in gpu_nodes:
                g.port = dcgm_port
            self.dcgm = DcgmExporterStandIn(self.root / "dcgm", gpu_nodes, collect_interval=self.collect_interval)
        # Every process is launched before any is waited for: the stand-in's Python start,
        # Prometheus's and the exporters' go side by side (Prometheus's first scrapes come 5 s
        # after it starts, whatever the interval).
        parts: list[ManagedProcess] = [*self.exporters.values(), *([self.dcgm] if self.dcgm else [])]
        for part in parts:
            part.launch()
        self.prometheus.targets_config = self.scrape_targets()
        self.prometheus.start()
        for part in parts:
            part.wait_ready()
        self._settled = self._changes()  # what its first scrapes will see

    def _changes(self) -> tuple[int, int]:
        return (self.dcgm.generation if self.dcgm else 0, self._target_changes)

    def scrape_targets(self) -> list[ScrapeTarget]:
        out = [ScrapeTarget(NODE_JOB, e.address, name) for name, e in self.exporters.items()]
        if self.dcgm:
            for name in self.dcgm.nodes:
                addr, path = self.dcgm.target(name)
                out.append(ScrapeTarget(DCGM_JOB, addr, name, path))
        return out

    def stop(self) -> None:
        self.prometheus.stop()
        if self.dcgm:
            self.dcgm.stop()
        for e in self.exporters.values():
            e.stop()

    # -- steering -------------------------------------------------------------------------------
    def _dcgm(self, name: str) -> DcgmExporterStandIn:
        if self.dcgm is None or name not in self.dcgm.nodes:
            raise PrometheusError(f"{name} has no GPUs in the lab: no dcgm-exporter target")
        return self.dcgm

    def set_pattern(self, name: str, pattern: str | list[str]) -> None:
        """What the node's GPUs do ("training", "starved", "idle"); written to its scenario, so the
        stand-in nvidia-smi shows it too when the scenario is the lab node's."""
        self._dcgm(name).set_pattern(name, pattern)

    def inject_xid(self, name: str, gpu: int, code: int) -> None:
        self._dcgm(name).inject_xid(name, gpu, code)

    def clear_xid(self, name: str, gpu: int | None = None) -> None:
        self._dcgm(name).clear_xid(name, gpu)

    def set_profiling(self, name: str, enabled: bool) -> None:
        self._dcgm(name).set_profiling(name, enabled)

    def stop_target(self, name: str) -> None:
        """Take the node's exporters down (node_exporter stopped, dcgm socket closed): Prometheus's
        next scrapes of them fail with "connection refused"."""
        if name not in self.nodes:
            raise PrometheusError(f"no lab node {name!r}")
        self._stopped.add(name)
        self._target_changes += 1
        self.exporters[name].stop()
        if self.dcgm and name in self.dcgm.nodes:
            self.dcgm.stop_node(name)

    def start_target(self, name: str) -> None:
        if name not in self.nodes:
            raise PrometheusError(f"no lab node {name!r}")
        self.exporters[name].start()
        if self.dcgm and name in self.dcgm.nodes:
            self.dcgm.start_node(name)
        self._stopped.discard(name)
        self._target_changes += 1

    def restore(self) -> bool:
        """Back to how :meth:`start` left it: every target up, no Xid, scenarios (patterns, faults)
        and profiling as configured (what a test changed, put back; nothing sent where nothing
        changed). Whether anything was changed since Prometheus last scraped every target after
        it (:meth:`wait_scraped`): then wait for a fresh scrape before relying on what it holds."""
        for name in sorted(self._stopped):
            self.start_target(name)
        if self.dcgm:
            rewritten = False
            for name, text in self._scenarios.items():
                path = self.scenario(name)
                if path.read_bytes() != text:
                    path.write_bytes(text)
                    rewritten = True
            self.dcgm.reset({n: self.nodes[n].profiling for n in self.dcgm.nodes}, reread=rewritten)
        return self._changes() != self._settled

    def telemetry_toml(self, source: str = "auto") -> str:
        """A ``[telemetry]`` table pointing the console at this Prometheus (the lab's labels)."""
        return "\n".join(["[telemetry]", *self.telemetry_keys(source)]) + "\n"

    def telemetry_keys(self, source: str = "auto") -> list[str]:
        """The ``[telemetry]`` keys: ``source``, ``prometheus_url`` and the node labels (the
        stand-in's ``Hostname`` and the relabelled ``instance`` both carry the node name)."""
        return [
            f'source = "{source}"',
            f'prometheus_url = "{self.url}"',
            'dcgm_node_label = "Hostname"',
            'node_exporter_node_label = "instance"',
        ]

    def wait_scraped(self, timeout: float = 30.0, *, fresh: bool = True) -> list[TargetHealth]:
        """Wait until every target is up; ``fresh``: each scraped after this call (so what was
        changed before it is in Prometheus)."""
        changes = self._changes()
        got = self.prometheus.wait_scraped(timeout=timeout, after=time.time() if fresh else None)
        if fresh:
            self._settled = changes
        return got

    def wait_down(self, name: str, timeout: float = 30.0) -> list[TargetHealth]:
        """Wait until Prometheus reports every target of ``name`` down."""

        def ok(ts: list[TargetHealth]) -> bool:
            mine = [t for t in ts if t.node == name]
            return bool(mine) and all(t.health == "down" for t in mine)

        return self.prometheus.wait_targets(ok, timeout, f"{name}'s targets down")

    def state(self) -> dict[str, Any]:
        """What ``lab.json`` records (pids for ``lab down``, addresses for ``lab status``)."""
        return {
            "url": self.url,
            "pid": self.prometheus.pid,
            "root": str(self.root),
            "scrape_interval": self.scrape_interval,
            "node_exporters": [{"node": n, "address": e.address, "pid": e.pid} for n, e in self.exporters.items()],
            "dcgm": {"pid": self.dcgm.pid, "addresses": dict(self.dcgm.addresses)} if self.dcgm else None,
        }
