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
* :func:`backfill`: a fleet far larger than loopback (1,024 nodes x 8 GPUs) written as OpenMetrics
  and turned into TSDB blocks with ``promtool tsdb create-blocks-from openmetrics``, then served by
  a Prometheus that answers instant queries at the current time.

How the backfill answers "now" (Prometheus 2.42, checked against the Debian build):

* an instant query at T takes, per series, the newest sample in the lookback window
  (T - 5 m, T] (``--query.lookback-delta``); ``rate(x[w])`` needs two samples in [T - w, T]. So the
  samples run from ``now - history`` to ``now + ahead`` every ``step`` (default 15 s: two samples
  in any 30 s window, four in the console's default 60 s ``prometheus_rate_window``): queries at
  "now" answer, gauges and rate() alike, until ``ahead`` has passed, gauges 5 m longer. Samples
  later than T are never used at T, so the future part is harmless;
* promtool cuts blocks at 2 h boundaries and each slice of the fleet is its own promtool run, so
  blocks overlap in time (disjoint series); 2.42 loads overlapping blocks as they are (vertical
  compaction is always on since 2.39). They are loaded before ``/-/ready`` answers;
* the head block only takes samples newer than the newest block's end, so this Prometheus cannot
  also scrape live targets before ``now + ahead``: the target shows "up" but every sample is
  dropped ("out of bounds", "too old or too far into the future" in its log). It scrapes nothing;
  run a :class:`TelemetryStack` beside it for live targets and target health.

Measured here (2 CPUs shared with other jobs, niced): 1,024 nodes x 8 GPUs with the defaults
(history 2 m, ahead 10 m, step 15 s) is 73,216 series, 3.5 M samples, 0.88 GB of OpenMetrics:
writing it 10-22 s, promtool 35-40 s of CPU (45-60 s wall for both, overlapped), Prometheus ready
on the blocks in 0.2 s (28 MB of TSDB).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
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
    CONSOLE_FIELDS,
    FIELDS_BY_NAME,
    DcgmExporterStandIn,
    DcgmNode,
    format_value,
    gpu_labels,
    gpu_values,
    label_text,
    xid_message,
)
from lab.ports import common_free_port, free_port
from lab.process import log_tail, start_logged, stop_group, wait_http_ready, write_json_config
from lab.sshd import wait_port

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


class NodeExporter:
    """The real node_exporter on ``ip:port`` (a free port if None), logs and pid under ``root``."""

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
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    @property
    def log_path(self) -> Path:
        return self.root / "node_exporter.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

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

    def start(self, timeout: float = 15.0) -> NodeExporter:
        if self.running:
            return self
        args = self.args()
        self.root.mkdir(parents=True, exist_ok=True)
        self.proc = start_logged(args, self.log_path, self.root)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if wait_port(self.ip, self.port, 0.2):
                return self
        tail = log_tail(self.log_path)
        self.stop()
        raise PrometheusError(f"node_exporter did not start on {self.address}: {tail}")

    def stop(self) -> None:
        stop_group(self.proc)
        self.proc = None


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


class PrometheusServer:
    """The real Prometheus on ``127.0.0.1:port`` (free one if None), data and config under ``root``.

    ``start()`` waits for ``/-/ready``; ``set_targets()`` rewrites the config and reloads it."""

    HOST = "127.0.0.1"

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
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.HOST}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.root / "prometheus.yml"

    @property
    def log_path(self) -> Path:
        return self.root / "prometheus.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

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

    def start(self, timeout: float = 60.0) -> PrometheusServer:
        """Start Prometheus and wait for ``/-/ready`` (blocks loaded, config applied)."""
        if self.running:
            return self
        args = self.args()
        self.write_config()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.proc = start_logged(args, self.log_path, self.root)
        if wait_http_ready(self.proc, f"{self.url}/-/ready", timeout, every=0.1):
            return self
        tail = log_tail(self.log_path)
        self.stop()
        raise PrometheusError(f"Prometheus did not become ready on {self.url}: {tail}")

    def stop(self) -> None:
        stop_group(self.proc, timeout=30.0)
        self.proc = None

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
        self._patterns: dict[str, Any] = {}  # as started, for restore()
        self._stopped: set[str] = set()

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
            self.exporters[n.name] = NodeExporter(self.root / "node_exporter" / n.name, n.ip, port).start()
        gpu_nodes = []
        for n in self.nodes.values():
            if n.gpus <= 0:
                continue
            path = self.scenario(n.name)
            if n.scenario is None:
                fake_nvidia_smi.write_scenario(path, gpus=n.gpus, pattern=n.pattern)
            gpu_nodes.append(DcgmNode(n.name, str(path), ip=n.ip, profiling=n.profiling))
            self._patterns[n.name] = fake_nvidia_smi.load_scenario(str(path))["pattern"]
        if gpu_nodes:
            self.dcgm = DcgmExporterStandIn(
                self.root / "dcgm", gpu_nodes, collect_interval=self.collect_interval
            ).start()
        self.prometheus.targets_config = self.scrape_targets()
        self.prometheus.start()

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

    def restore(self) -> None:
        """Back to how :meth:`start` left it: every target up, no Xid, patterns and profiling as
        configured (what a test changed, put back)."""
        for name in sorted(self._stopped):
            self.start_target(name)
        if self.dcgm:
            for name, node in self.dcgm.nodes.items():
                self.dcgm.clear_xid(name)
                self.dcgm.set_profiling(name, self.nodes[name].profiling)
                sc = fake_nvidia_smi.load_scenario(node.scenario)
                if sc["pattern"] != self._patterns[name]:
                    self.dcgm.set_pattern(name, self._patterns[name])

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
        return self.prometheus.wait_scraped(timeout=timeout, after=time.time() if fresh else None)

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


# -- backfill: a 1,024-node fleet's series as TSDB blocks ----------------------------------------------


@dataclass
class Backfill:
    """What :func:`backfill` wrote and started (``prometheus`` is None with ``start=False``)."""

    root: Path
    data_dir: Path
    names: list[str]
    gpus: int
    start: float
    end: float
    step: float
    series: int
    samples: int
    input_bytes: int
    #: seconds: "write" (the OpenMetrics text, summed over the slices), "blocks" (writing and
    #: promtool, overlapped, until the last block is made), "start" (Prometheus ready)
    seconds: dict[str, float]
    prometheus: PrometheusServer | None = None

    def stop(self) -> None:
        if self.prometheus:
            self.prometheus.stop()


def default_pattern(index: int, name: str) -> str:
    """The backfilled fleet: every tenth node starved, every 50th idle, the rest training."""
    if index % 50 == 49:
        return "idle"
    return "starved" if index % 10 == 1 else "training"


def default_profiling(index: int, name: str) -> bool:
    """Every 16th node's GPUs have no profiling (DCP) metrics."""
    return index % 16 != 15


_NET_DEVICES = (("eth0", 3.125e9), ("ib0", 5.0e10))  # name, link speed in bytes/s (25 and 400 Gb/s)
_FILESYSTEMS = (
    ("/dev/md0", "xfs", "/scratch", 30.72e12),
    ("/dev/nvme0n1p2", "ext4", "/", 1.9e12),
)


def _node_rates(pattern: str, index: int) -> dict[str, float]:
    """Bytes/s a node moves for ``pattern`` (deterministic per node)."""
    jitter = 1.0 + 0.05 * math.sin(index * 0.37)
    busy = {"training": 1.0, "starved": 0.15, "idle": 0.0}.get(pattern, 0.0)
    return {
        "eth0_rx": (1.2e8 * busy + 2.0e4) * jitter,
        "eth0_tx": (2.0e7 * busy + 1.0e4) * jitter,
        "ib0_rx": 9.5e9 * busy * jitter,
        "ib0_tx": 9.4e9 * busy * jitter,
        "read": 1.6e9 * busy * jitter,
        "write": 2.5e8 * busy * jitter,
    }


def _fmt(v: float) -> str:
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


def write_openmetrics(
    path: Path,
    names: list[str],
    *,
    gpus: int,
    start: float,
    end: float,
    step: float,
    pattern_of: Callable[[int, str], str] = default_pattern,
    profiling_of: Callable[[int, str], bool] = default_profiling,
    xids: dict[str, dict[int, int]] | None = None,
    first_index: int = 0,
) -> tuple[int, int]:
    """Write the fleet's dcgm-exporter and node_exporter series (as Prometheus would have scraped
    them: ``job``, ``instance`` = ``node`` = node name, the exporters' own labels) as OpenMetrics
    text, one family at a time, each series in time order. ``first_index``: the fleet index of
    ``names[0]`` (patterns, UUIDs). Returns (series, samples)."""
    xids = xids or {}
    times = []
    k = math.ceil(start / step)
    while k * step <= end:
        times.append(k * step)
        k += 1
    stamps = [_fmt(t) for t in times]
    parts_dir = path.with_name(path.name + ".parts")
    shutil.rmtree(parts_dir, ignore_errors=True)
    parts_dir.mkdir(parents=True)
    part_files: dict[str, Any] = {}
    order: list[tuple[str, str]] = []  # (family, type)
    series = samples = 0

    def emit(family: str, mtype: str, sample_name: str, labels: str, values: list[str]) -> None:
        nonlocal series, samples
        part = part_files.get(family)
        if part is None:
            part = part_files[family] = open(parts_dir / f"{len(order):03d}", "w")  # noqa: SIM115 - closed below
            order.append((family, mtype))
        part.write("".join(f"{sample_name}{{{labels}}} {v} {s}\n" for v, s in zip(values, stamps, strict=True)))
        series += 1
        samples += len(values)

    try:
        for idx, name in enumerate(names, start=first_index):
            pattern = pattern_of(idx, name)
            prof = profiling_of(idx, name)
            scenario = {
                **fake_nvidia_smi.DEFAULTS,
                "gpus": gpus,
                "pattern": pattern,
                "start": start,
                "uuid_prefix": f"GPU-{idx:08x}-0000-4000-8000-",
            }
            dcgm_base = f'instance="{name}",job="{DCGM_JOB}",{NODE_LABEL}="{name}"'
            node_base = f'instance="{name}",job="{NODE_JOB}",{NODE_LABEL}="{name}"'
            node = DcgmNode(name, "", profiling=prof)
            node_xids = xids.get(name, {})
            for i in range(gpus):
                labels = label_text(gpu_labels(node, scenario, i))
                per_t = [
                    gpu_values(node, scenario, i, t - start, xid=node_xids.get(i, 0), profiling=prof) for t in times
                ]
                for fname in CONSOLE_FIELDS:
                    fld = FIELDS_BY_NAME[fname]
                    if fname not in per_t[0]:
                        continue
                    extra = ""
                    if fname == "DCGM_FI_DEV_XID_ERRORS":
                        code = int(per_t[0][fname])
                        extra = f',err_code="{code}",err_msg="{xid_message(code)}"'
                    values = [format_value(fld, v[fname]) for v in per_t]
                    emit(fname, fld.prom_type, fname, f"{dcgm_base},{labels}{extra}", values)
            rates = _node_rates(pattern, idx)
            seed = 1.0e12 + idx * 7.3e9  # bytes counted since boot

            def total(family: str, labels: str, rate: float, seed: float = seed) -> None:
                values = [_fmt(round(seed + rate * (t - start))) for t in times]
                emit(family, "counter", f"{family}_total", labels, values)

            def gauge(family: str, labels: str, value: float) -> None:
                emit(family, "gauge", family, labels, [_fmt(value)] * len(times))

            for dev, speed in _NET_DEVICES:
                lab = f'{node_base},device="{dev}"'
                total("node_network_receive_bytes", lab, rates[f"{dev}_rx"])
                total("node_network_transmit_bytes", lab, rates[f"{dev}_tx"])
                gauge("node_network_speed_bytes", lab, speed)
            disk = f'{node_base},device="nvme0n1"'
            total("node_disk_read_bytes", disk, rates["read"])
            total("node_disk_written_bytes", disk, rates["write"])
            for dev, fstype, mount, size in _FILESYSTEMS:
                lab = f'{node_base},device="{dev}",fstype="{fstype}",mountpoint="{mount}"'
                gauge("node_filesystem_avail_bytes", lab, size * (0.35 + 0.3 * ((idx * 0.618) % 1.0)))
                gauge("node_filesystem_size_bytes", lab, size)
            mem_total = 2.0e12
            gauge("node_memory_MemTotal_bytes", node_base, mem_total)
            gauge("node_memory_MemAvailable_bytes", node_base, mem_total * 0.62)
            gauge("up", node_base, 1)
            gauge("up", dcgm_base, 1)
    finally:
        for part in part_files.values():
            part.close()
    with open(path, "w") as out:
        for n, (family, mtype) in enumerate(order):
            out.write(f"# TYPE {family} {mtype}\n")
            with open(parts_dir / f"{n:03d}") as part:
                shutil.copyfileobj(part, out, 1 << 20)
        out.write("# EOF\n")
    shutil.rmtree(parts_dir, ignore_errors=True)
    return series, samples


def backfill(
    root: Path,
    nodes: int = 1024,
    gpus: int = 8,
    *,
    history: float = 120.0,
    ahead: float = 600.0,
    step: float = 15.0,
    names: list[str] | None = None,
    pattern_of: Callable[[int, str], str] = default_pattern,
    profiling_of: Callable[[int, str], bool] = default_profiling,
    xids: dict[str, dict[int, int]] | None = None,
    start: bool = True,
    port: int | None = None,
    parallel: int | None = None,
    keep_input: bool = False,
) -> Backfill:
    """Write ``nodes`` synthetic nodes' series from ``now - history`` to ``now + ahead`` every
    ``step`` seconds, make TSDB blocks of them with promtool and (``start``) serve them with a
    Prometheus on ``root`` (no scrape targets). Names default to ``node-0001`` ...; patterns,
    profiling and Xids per node as given (:func:`default_pattern`, :func:`default_profiling`).

    The fleet is cut into ``parallel`` slices (default: one per CPU), each written and handed to
    its own promtool while the next is written; their blocks cover the same time range with
    disjoint series (Prometheus 2.42 takes overlapping blocks as they are)."""
    promtool = find_promtool()
    if start:
        find_prometheus()
    root = Path(root).absolute()
    names = names or [f"node-{i:04d}" for i in range(1, nodes + 1)]
    root.mkdir(parents=True, exist_ok=True)
    data_dir = root / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    for old in root.glob("backfill-*.om*"):  # an earlier run's slices
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
    now = time.time()
    t0, t1 = now - history, now + ahead
    jobs = max(1, min(parallel or os.cpu_count() or 1, len(names)))
    per = math.ceil(len(names) / jobs)
    seconds = {"write": 0.0}
    series = samples = size = 0
    running: list[tuple[Path, subprocess.Popen[bytes]]] = []
    clock = time.monotonic()
    try:
        for first in range(0, len(names), per):
            path = root / f"backfill-{first // per:03d}.om"
            written = time.monotonic()
            n_series, n_samples = write_openmetrics(
                path,
                names[first : first + per],
                gpus=gpus,
                start=t0,
                end=t1,
                step=step,
                pattern_of=pattern_of,
                profiling_of=profiling_of,
                xids=xids,
                first_index=first,
            )
            seconds["write"] += time.monotonic() - written
            series, samples, size = series + n_series, samples + n_samples, size + path.stat().st_size
            log = open(path.with_suffix(".log"), "wb")  # noqa: SIM115 - owned by the child
            cmd = [promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(path), str(data_dir)]
            running.append((path, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
            log.close()
        failed = []
        for path, proc in running:
            if proc.wait() != 0:
                failed.append(f"{path.name}: {log_tail(path.with_suffix('.log'))}")
    finally:
        for path, proc in running:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if not keep_input:
                path.unlink(missing_ok=True)
    seconds["blocks"] = time.monotonic() - clock
    if failed:
        raise PrometheusError(f"promtool could not make blocks in {data_dir}: {failed[0]}")
    result = Backfill(root, data_dir, names, gpus, t0, t1, step, series, samples, size, seconds)
    if start:
        clock = time.monotonic()
        result.prometheus = PrometheusServer(root, port, data_dir=data_dir).start()
        seconds["start"] = time.monotonic() - clock
    return result
