"""The Prometheus telemetry source: the site's Prometheus (dcgm-exporter, node_exporter) instead of
one SSH stream per node.

Each refresh is a fixed handful of instant queries for the whole fleet, whatever its size
(:data:`QUERY_COUNT`), plus one read of ``/api/v1/targets``:

1. every dcgm-exporter gauge the console shows, in one selector on ``__name__``
   (``DCGM_FI_DEV_GPU_UTIL``, ``FB_USED``/``FB_FREE``, ``POWER_USAGE``, ``GPU_TEMP``,
   ``XID_ERRORS``, and ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` where the GPU has profiling metrics);
2. ``rate()`` of ``node_network_receive_bytes_total`` and ``..._transmit_...``, tagged and joined
   with ``or``;
3. ``rate()`` of ``node_disk_read_bytes_total`` and ``..._written_...``, the same way;
4. ``node_network_speed_bytes``, ``node_filesystem_avail_bytes`` and ``..._size_bytes``.

Series are matched to loadmaster's nodes by a label: ``dcgm_node_label`` (dcgm-exporter's
``Hostname``) and ``node_exporter_node_label`` (``instance``, its ``:port`` dropped), each compared
with the node's name and its host. Everything lands in the hub as an :class:`Observed`, so the
FleetSnapshot, the starvation detector, ``top`` and ``--json`` do not know where it came from.

What Prometheus says is data, not authority (a label is whatever a scraped machine chose):

- Each series keeps its source, the target's ``job`` and ``instance``. When two sources claim one
  node for the same exporter (a second machine whose dcgm-exporter says ``Hostname=node-01``), the
  node is shown as a conflict naming both, never merged: neither's numbers are shown.
- Only the exporters a node's numbers come from (this refresh or an earlier one) decide that it is
  down: an unrelated target that happens to carry the node's name in a label, down, blanks
  nothing. A node with no numbers at all is still marked by a down target naming it.
- At most :data:`MAX_GPUS_PER_NODE` GPU indices and :data:`MAX_DEVICES_PER_NODE` NICs, disks and
  mounts a node, and :data:`MAX_SERIES_PER_QUERY` series an answer; the rest is skipped with a
  warning in :attr:`Reading.warnings` (the hub shows it as the telemetry source's note).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from backend.config import Node
from backend.errors import LoadmasterError
from backend.http import HttpClient
from backend.telemetry.model import DiskRate, GpuSample, NicKind, NicRate, Observed
from backend.telemetry.settings import TelemetrySettings
from backend.textfmt import safe_text

log = logging.getLogger(__name__)

#: dcgm-exporter fields read, and what each becomes.
DCGM_FIELDS = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
)
#: The instant queries of one refresh (the targets read is not a query): one per DCGM field, then
#: NIC rates, disk rates and the node_exporter gauges.
QUERY_COUNT = len(DCGM_FIELDS) + 3
#: Largest answer read (the biggest, one DCGM field at 10,000 nodes x 8 GPUs, is about 6 MB).
MAX_ANSWER_BYTES = 64 << 20
#: Longest error text kept from Prometheus (it reaches the screen).
_ERROR_LIMIT = 300
#: GPU indices a node may have (``gpu`` label 0..63); series of other indices are skipped.
MAX_GPUS_PER_NODE = 64
#: NICs, disks and mounts a node may have in one refresh; further devices are skipped.
MAX_DEVICES_PER_NODE = 256
#: Series read from one answer (a fleet of 10,000 nodes x 8 GPUs is 80,000 a DCGM field).
MAX_SERIES_PER_QUERY = 131_072
#: Sources remembered per node (the exporters its numbers came from), most recent kept.
_MAX_SOURCES = 16
#: Interfaces that never count towards a node's NIC totals.
_VIRTUAL = re.compile(r"^(veth|docker|br-|virbr|cni|flannel|cali|tun|tap|vxlan|genev|kube|lxc|ib\d+\.|dummy)")
#: Whole disks that are not hardware (device-mapper, md RAID, loop, ram).
_NOT_PHYSICAL = re.compile(r"^(dm-|md|loop|ram|zram|nbd)")


#: One answer: its series' labels and their values, side by side. A ``(labels, value)`` pair a
#: series would be ~73,000 tuples a refresh at 1,024 x 8 for the garbage collector to count;
#: ``zip(*columns)`` hands them out one by one without making any.
Columns = tuple[list[dict[str, str]], list[float]]


class PrometheusUnavailable(LoadmasterError):
    """The Prometheus API did not answer (or answered with an error): one line, naming it."""


@dataclass(frozen=True)
class Reading:
    """One refresh: what each covered node showed, and the nodes whose targets are down."""

    nodes: dict[str, Observed] = field(default_factory=dict)
    #: node -> the scrape error of its down target(s), or the conflict of its sources
    down: dict[str, str] = field(default_factory=dict)
    queries: int = 0
    seconds: float = 0.0
    #: node -> the sources (job/instance) that claim it at once: shown as this, never merged
    conflicts: dict[str, str] = field(default_factory=dict)
    #: Caps that were hit this refresh (series, GPUs, devices skipped), one line each.
    warnings: tuple[str, ...] = ()


def queries(settings: TelemetrySettings) -> tuple[str, ...]:
    """The instant queries of one refresh: :data:`DCGM_FIELDS` in order, then NIC, disk, gauges."""
    w = f"{max(2, round(settings.prometheus_rate_window))}s"
    node = settings.dcgm_node_label
    # One query per field, aggregated to the node and GPU labels: UUID, model, PCI id, driver and
    # Xid message labels stay on Prometheus (at 1,024 nodes x 8 GPUs they are most of an answer's
    # bytes). Per field, not one regex over __name__ with label_replace: each is a plain selector
    # Prometheus evaluates in a tenth of the time, and the refresh runs them at once (measured in
    # bench/prometheus_fleet.py: 1.0 s for the one query against 0.5 s for the seven together).
    return (
        *(f"max by ({node}, gpu, job, instance) ({f})" for f in DCGM_FIELDS),
        f'label_replace(rate(node_network_receive_bytes_total[{w}]), "lm", "rx", "", "")'
        f' or label_replace(rate(node_network_transmit_bytes_total[{w}]), "lm", "tx", "", "")',
        f'label_replace(rate(node_disk_read_bytes_total[{w}]), "lm", "read", "", "")'
        f' or label_replace(rate(node_disk_written_bytes_total[{w}]), "lm", "write", "", "")',
        '{__name__=~"node_network_speed_bytes|node_filesystem_avail_bytes|node_filesystem_size_bytes"}',
    )


class NodeIndex:
    """Which loadmaster node a label value names: its name, its host, either with ``:port``."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self._by: dict[str, str] = {}
        for n in nodes:
            self._by.setdefault(n.host, n.name)
        for n in nodes:
            self._by[n.name] = n.name  # a name wins over another node's host

    def find(self, value: object) -> str | None:
        if not value or not isinstance(value, str):
            return None
        hit = self._by.get(value)
        if hit is None and ":" in value:
            hit = self._by.get(value.rsplit(":", 1)[0].strip("[]"))
        return hit


class PrometheusClient:
    """The few HTTP API calls the source makes (backend.http), with one-line errors."""

    def __init__(self, url: str, timeout: float) -> None:
        self.http = HttpClient(
            url.rstrip("/"), name="Prometheus", timeout=timeout, max_body=MAX_ANSWER_BYTES, error=PrometheusUnavailable
        )
        self.url = self.http.url
        #: The URL as messages show it (a password or token in it redacted).
        self.shown = self.http.shown
        self.timeout = timeout
        #: Answers cut at :data:`MAX_SERIES_PER_QUERY` since the caller last cleared it.
        self.cut: list[str] = []

    async def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        # The answers are flat and large (6 MB at 10,000 nodes): no nesting walk.
        doc = await self.http.get_json(path, params, check_depth=False)
        return api_data(doc, f"Prometheus {self.shown}", path)

    async def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """An instant query at now: (labels, value) per series; NaN and infinite values are skipped."""
        return list(zip(*await self.columns(expr), strict=True))

    async def columns(self, expr: str) -> Columns:
        """:meth:`query`'s series as :data:`Columns`."""
        path = "/api/v1/query"
        answer = await self.http.request("GET", path, params={"query": expr})
        honest = honest_vector(answer.body, expr, self.cut)
        if honest is not None:
            return honest
        # Anything else (an error, another result type, a label or value of the wrong type, not
        # JSON) is judged by the generic path, series by series, as it always was.
        doc = self.http.decode(answer, f"GET {path}", check_depth=False)
        return columns_of(vector_of(api_data(doc, f"Prometheus {self.shown}", path), expr, self.cut))

    async def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets (labels, health, lastError)."""
        return targets_of(await self._get("/api/v1/targets", {"state": "active"}))

    async def close(self) -> None:
        await self.http.close()


class ApiClient(Protocol):
    """What :class:`PrometheusSource` reads through: :class:`PrometheusClient`, or a recording."""

    cut: list[str]

    async def columns(self, expr: str) -> Columns: ...

    async def targets(self) -> list[dict[str, Any]]: ...

    async def close(self) -> None: ...


def api_data(doc: Any, who: str, path: str) -> Any:
    """The ``data`` of a Prometheus API answer; PrometheusUnavailable unless it says success."""
    if not isinstance(doc, dict) or doc.get("status") != "success":
        err = safe_text(str(doc.get("error") if isinstance(doc, dict) else doc), _ERROR_LIMIT)
        raise PrometheusUnavailable(f"{who} refused {path}: {err}")
    return doc.get("data")


def vector_of(data: Any, expr: str, cut: list[str]) -> list[tuple[dict[str, str], float]]:
    """An instant query's ``data`` as (labels, value) per series; NaN and infinities skipped, at
    most :data:`MAX_SERIES_PER_QUERY` (a cut is noted in ``cut``)."""
    out: list[tuple[dict[str, str], float]] = []
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        return out
    result = data.get("result")
    if isinstance(result, list) and len(result) > MAX_SERIES_PER_QUERY:
        cut.append(f"{len(result):,} series for {expr[:80]}")
        result = result[:MAX_SERIES_PER_QUERY]
    for item in result if isinstance(result, list) else ():
        # The JSON's own dict of labels, not a copy (tens of thousands of series a refresh):
        # a value that is not a string is refused where it is read (NodeIndex.find, _text).
        try:
            labels = item["metric"]
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if type(labels) is dict and math.isfinite(value):  # not NaN, not +-Inf
            out.append((labels, value))
    return out


class _Value(msgspec.Struct, array_like=True, gc=False):
    """A sample's ``[time, "value"]``; the value as Prometheus writes it ("NaN", "+Inf" too)."""

    at: float
    text: str


class _Series(msgspec.Struct, gc=False):
    """One series of an instant vector: every label a string."""

    metric: dict[str, str]
    value: _Value


class _Vector(msgspec.Struct, gc=False):
    result_type: str = msgspec.field(name="resultType")
    result: list[_Series] = msgspec.field(default_factory=list)


class _VectorAnswer(msgspec.Struct, gc=False):
    """A successful instant query as Prometheus writes it; other keys (warnings) are skipped."""

    status: str
    data: _Vector


#: The typed decoder of :func:`honest_vector`. The structs are not tracked by the garbage
#: collector (they hold only strings and floats): tens of thousands of series a refresh no longer
#: set off collections of the console's whole heap, which json.loads' dicts and lists did.
_DECODE_VECTOR = msgspec.json.Decoder(_VectorAnswer)


def columns_of(series: list[tuple[dict[str, str], float]]) -> Columns:
    """(labels, value) pairs as :data:`Columns`."""
    return [labels for labels, _ in series], [v for _, v in series]


def honest_vector(body: bytes, expr: str, cut: list[str]) -> Columns | None:
    """:func:`vector_of` of an answer that is exactly what Prometheus sends for an instant vector
    (every label a string, every value ``[time, "text"]``), decoded in one typed pass without the
    intermediate dicts and lists; None for anything else, which the caller hands to the generic
    path. The same caps: NaN and infinities skipped, at most :data:`MAX_SERIES_PER_QUERY`."""
    try:
        doc = _DECODE_VECTOR.decode(body)
    except msgspec.DecodeError:  # ValidationError too: not the honest shape
        return None
    if doc.status != "success" or doc.data.result_type != "vector":
        return None
    result = doc.data.result
    if len(result) > MAX_SERIES_PER_QUERY:
        cut.append(f"{len(result):,} series for {expr[:80]}")
        result = result[:MAX_SERIES_PER_QUERY]
    labels = [series.metric for series in result]
    try:
        values = [float(series.value.text) for series in result]
    except ValueError:  # a value that is not a number: that series is skipped, as NaN is
        values = [_number(series.value.text) for series in result]
    if not all(map(math.isfinite, values)):  # not NaN, not +-Inf
        kept = [i for i, v in enumerate(values) if math.isfinite(v)]
        labels, values = [labels[i] for i in kept], [values[i] for i in kept]
    return labels, values


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def targets_of(data: Any) -> list[dict[str, Any]]:
    """The active targets of a ``/api/v1/targets`` answer's ``data``."""
    got = data.get("activeTargets") if isinstance(data, dict) else None
    return [t for t in got or () if isinstance(t, dict)]


class PrometheusSource:
    """Reads the whole fleet from Prometheus in :data:`QUERY_COUNT` queries per refresh."""

    def __init__(self, settings: TelemetrySettings, nodes: Iterable[Node], client: ApiClient | None = None) -> None:
        if client is None:
            if not settings.prometheus_url:
                raise LoadmasterError("[telemetry] prometheus_url is not set")
            client = PrometheusClient(settings.prometheus_url, settings.prometheus_timeout)
        self.settings = settings
        self.nodes = {n.name: n for n in nodes}
        self.index = NodeIndex(self.nodes.values())
        self.client: ApiClient = client
        self.queries = queries(settings)
        #: node -> the sources (job/instance) its numbers came from, in this refresh or before
        self.sources: dict[str, dict[str, None]] = {}
        #: node -> what its last :class:`Observed` was made of, and that Observed
        self._last: dict[str, tuple[tuple[Any, ...], Observed]] = {}

    async def read(self) -> Reading:
        """One refresh of every node Prometheus has (raises PrometheusUnavailable)."""
        t0 = time.perf_counter()
        self.client.cut = []
        s = self.settings
        find = self.index.find
        caps = _Caps()
        source_of = _SourceNames()
        #: node -> the sources of its GPU numbers, and of its node_exporter numbers
        gpu_src: dict[str, set[str]] = {}
        host_src: dict[str, set[str]] = {}
        gpus = _GpuFields(find, s.dcgm_node_label, caps, source_of, gpu_src)

        async def dcgm_field(name: str, expr: str) -> None:
            # Each field is read into the GPUs as soon as it is answered, while Prometheus still
            # works on the others (the order of the fields changes nothing: each has its own key).
            gpus.add(name, await self.client.columns(expr))

        nf = len(DCGM_FIELDS)
        got: list[Any] = await asyncio.gather(
            *(dcgm_field(f, q) for f, q in zip(DCGM_FIELDS, self.queries[:nf], strict=True)),
            *(self.client.columns(q) for q in self.queries[nf:]),
            self.client.targets(),
        )
        net: Columns
        disk: Columns
        gauges: Columns
        net, disk, gauges = got[nf:-1]
        targets: list[dict[str, Any]] = got[-1]
        nic: dict[str, dict[str, dict[str, float]]] = {}
        dsk: dict[str, dict[str, dict[str, float]]] = {}
        for answer, into in ((net, nic), (disk, dsk)):
            for labels, v in zip(*answer, strict=True):
                node = find(labels.get(s.node_exporter_node_label))
                dev = _text(labels.get("device"))
                if node and dev:
                    devs = into.setdefault(node, {})
                    if dev not in devs and len(devs) >= MAX_DEVICES_PER_NODE:
                        caps.skip(node, "device", f"more than {MAX_DEVICES_PER_NODE} devices")
                        continue
                    host_src.setdefault(node, set()).add(source_of(labels))
                    devs.setdefault(dev, {})[_text(labels.get("lm")) or ""] = v
        speed: dict[str, dict[str, float]] = {}
        fs: dict[str, dict[str, dict[str, float]]] = {}
        for labels, v in zip(*gauges, strict=True):
            node = find(labels.get(s.node_exporter_node_label))
            if node is None:
                continue
            name = _text(labels.get("__name__")) or ""
            dev, mount = _text(labels.get("device")), _text(labels.get("mountpoint"))
            if name == "node_network_speed_bytes" and dev:
                speeds = speed.setdefault(node, {})
                if dev not in speeds and len(speeds) >= MAX_DEVICES_PER_NODE:
                    caps.skip(node, "device", f"more than {MAX_DEVICES_PER_NODE} devices")
                    continue
                speeds[dev] = v
            elif name.startswith("node_filesystem_") and mount:
                mounts = fs.setdefault(node, {})
                if mount not in mounts and len(mounts) >= MAX_DEVICES_PER_NODE:
                    caps.skip(node, "mount", f"more than {MAX_DEVICES_PER_NODE} mounts")
                    continue
                key = "avail" if name.endswith("avail_bytes") else "size"
                mounts.setdefault(mount, {})[key] = v
            else:
                continue
            host_src.setdefault(node, set()).add(source_of(labels))
        conflicts: dict[str, str] = {}
        for what, claims in (("dcgm-exporter", gpu_src), ("node_exporter", host_src)):
            for node, srcs in claims.items():
                if len(srcs) > 1:
                    named = ", ".join(safe_text(x, 80) for x in sorted(srcs)[:3])
                    more = f" and {len(srcs) - 3} more" if len(srcs) > 3 else ""
                    said = f"{len(srcs)} {what} sources claim this node ({named}{more}): not shown until one goes"
                    conflicts[node] = "; ".join(x for x in (conflicts.get(node), f"conflict: {said}") if x)
        covered = (set(gpus.nodes) | set(nic) | set(dsk) | set(fs)) - set(conflicts)
        observed = {
            node: self._observed_of(
                node,
                (gpus.nodes.get(node, {}), nic.get(node, {}), speed.get(node, {}), dsk.get(node, {}), fs.get(node, {})),
            )
            for node in covered
        }
        for node in set(gpu_src) | set(host_src):
            known = self.sources.setdefault(node, {})
            for src in gpu_src.get(node, set()) | host_src.get(node, set()):
                known.pop(src, None)
                known[src] = None  # most recent last
            while len(known) > _MAX_SOURCES:
                known.pop(next(iter(known)))
        down = dict(conflicts)
        for t in targets:
            if t.get("health") != "down":
                continue
            labels = {str(k): str(v) for k, v in (t.get("labels") or {}).items()}
            err = safe_text(str(t.get("lastError") or "scrape failed"), _ERROR_LIMIT)
            job = safe_text(labels.get("job", "target"), 80)
            for node in self._down_nodes(labels, covered):
                if node not in conflicts:
                    down[node] = "; ".join(x for x in (down.get(node), f"{job} target down: {err}") if x)
        warnings = tuple(
            caps.lines() + [f"Prometheus answer cut at {MAX_SERIES_PER_QUERY:,} series: {c}" for c in self.client.cut]
        )
        for w in warnings:
            log.warning("telemetry: %s", w)
        return Reading(observed, down, QUERY_COUNT, time.perf_counter() - t0, conflicts, warnings)

    def _down_nodes(self, labels: dict[str, str], covered: set[str]) -> list[str]:
        """The nodes a down target's numbers are for: those whose numbers came from this target
        (its job and instance; a federating target serves many), or, for a node with no numbers
        at all, the one its labels name."""
        src = _source(labels)
        fed = [node for node, known in self.sources.items() if src in known]
        if fed:
            return fed
        s = self.settings
        named = (
            self.index.find(labels.get("node"))
            or self.index.find(labels.get(s.node_exporter_node_label))
            or self.index.find(labels.get(s.dcgm_node_label))
            or self.index.find(labels.get("instance"))
        )
        if named is None or named in covered or self.sources.get(named):
            return []  # its numbers come from elsewhere: an unrelated target is down
        return [named]

    def _observed_of(self, node: str, made_of: tuple[Any, ...]) -> Observed:
        """The node's :class:`Observed`: the last refresh's own object when the numbers it was made
        of are the same. Prometheus scrapes every 15-30 s and the console reads every few
        seconds, so most refreshes of most nodes change nothing; building their thousands of
        samples again cost CPU and, kept until the next refresh, full garbage collections."""
        last = self._last.get(node)
        if last is not None and last[0] == made_of:
            return last[1]
        obs = self._observed(node, *made_of)
        self._last[node] = (made_of, obs)
        return obs

    def _observed(
        self,
        node: str,
        gpus: dict[int, dict[str, Any]],
        nics: dict[str, dict[str, float]],
        speeds: dict[str, float],
        disks: dict[str, dict[str, float]],
        fs: dict[str, dict[str, float]],
    ) -> Observed:
        samples = []
        for idx in sorted(gpus):
            g = gpus[idx]
            used, free = g.get("DCGM_FI_DEV_FB_USED"), g.get("DCGM_FI_DEV_FB_FREE")
            xid = g.get("DCGM_FI_DEV_XID_ERRORS")
            samples.append(
                GpuSample(
                    index=idx,
                    util_pct=g.get("DCGM_FI_DEV_GPU_UTIL"),
                    mem_used_mib=used,
                    mem_total_mib=(used + free) if used is not None and free is not None else None,
                    temp_c=g.get("DCGM_FI_DEV_GPU_TEMP"),
                    power_w=g.get("DCGM_FI_DEV_POWER_USAGE"),
                    xid=int(xid) if xid else None,
                    gr_engine_active=g.get("DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
                )
            )
        rates = []
        for dev in sorted(nics):
            r = nics[dev]
            sp = speeds.get(dev)
            rates.append(
                NicRate(
                    name=dev,
                    kind=_nic_kind(dev),
                    rx_gbps=r["rx"] * 8 / 1e9 if "rx" in r else None,
                    tx_gbps=r["tx"] * 8 / 1e9 if "tx" in r else None,
                    speed_mbps=int(sp * 8 / 1e6) if sp and sp > 0 else None,
                )
            )
        drates = [
            DiskRate(
                name=dev,
                read_mbps=d["read"] / 1e6 if "read" in d else None,
                write_mbps=d["write"] / 1e6 if "write" in d else None,
                physical=not _NOT_PHYSICAL.match(dev),
            )
            for dev, d in sorted(disks.items())
        ]
        scratch = self.nodes[node].scratch
        free = total = None
        scratch_error = None
        mount = _mount_of(scratch, fs) if scratch else None
        if mount is not None:
            free = int(fs[mount]["avail"]) if "avail" in fs[mount] else None
            total = int(fs[mount]["size"]) if "size" in fs[mount] else None
        elif scratch and fs:
            scratch_error = f"no node_filesystem series for a mount holding {scratch}"
        return Observed(
            gpus=tuple(samples),
            gpu_status="ok" if samples else "no dcgm-exporter series (no NVIDIA GPU, or not exported)",
            nics=tuple(rates),
            disks=tuple(drates),
            scratch_free_bytes=free,
            scratch_total_bytes=total,
            scratch_error=scratch_error,
        )

    async def close(self) -> None:
        await self.client.close()


def _source(labels: Mapping[str, Any]) -> str:
    """Which exporter a series (or a target) is: its ``job`` and ``instance`` labels."""
    return f"{_text(labels.get('job')) or '?'}/{_text(labels.get('instance')) or '?'}"


class _SourceNames:
    """:func:`_source` of each series of one refresh, worked out once per exporter: every series
    carries its ``job`` and ``instance`` (70,000 a refresh at 1,024 x 8), from a few thousand
    exporters."""

    def __init__(self) -> None:
        self.known: dict[tuple[Any, Any], str] = {}

    def __call__(self, labels: Mapping[str, Any]) -> str:
        key = (labels.get("job"), labels.get("instance"))
        try:
            return self.known[key]
        except KeyError:
            name = self.known[key] = _source(labels)
            return name
        except TypeError:  # a label value that is not text (a hostile answer): not kept
            return _source(labels)


#: What one series' labels (node label, gpu, job, instance) came to: the GPU's fields to fill, a
#: cap that skips it (node, kind, why: :meth:`_Caps.skip`), or None (not ours, or no GPU index).
_Slot = dict[str, float] | tuple[str, str, str] | None


class _GpuFields:
    """node -> GPU index -> dcgm field -> value, from the DCGM answers of one refresh.

    Each GPU's series carry the same labels in every field's answer (7 answers, 8 series a node),
    so what a set of labels comes to (which node, which index, which source, or a cap) is worked
    out once per refresh and looked up for the other six fields."""

    def __init__(
        self,
        find: Callable[[object], str | None],
        node_label: str,
        caps: _Caps,
        source_of: Callable[[Mapping[str, Any]], str],
        sources: dict[str, set[str]],
    ) -> None:
        self.find, self.node_label, self.caps, self.source_of, self.sources = find, node_label, caps, source_of, sources
        self.nodes: dict[str, dict[int, dict[str, float]]] = {}
        self._slots: dict[tuple[object, ...], _Slot] = {}

    def add(self, field_name: str, answer: Columns) -> None:
        """One field's answer: each series' value lands on its GPU, or is skipped (counted at a cap)."""
        slots, label = self._slots, self.node_label
        for labels, v in zip(*answer, strict=True):
            get = labels.get
            key = (get(label), get("gpu"), get("job"), get("instance"))
            try:
                slot = slots[key]
            except KeyError:
                slot = slots[key] = self._slot(labels)
            except TypeError:  # a label value that cannot be a key (a hostile answer): judged alone
                slot = self._slot(labels)
            if isinstance(slot, dict):
                slot[field_name] = v
            elif slot is not None:
                self.caps.skip(*slot)

    def _slot(self, labels: Mapping[str, Any]) -> _Slot:
        node = self.find(labels.get(self.node_label))
        if node is None:
            return None
        try:
            idx = int(labels.get("gpu", ""))
        except (TypeError, ValueError):
            return None
        if not 0 <= idx < MAX_GPUS_PER_NODE:
            return (node, "GPU", f"gpu label {str(idx)[:20]} outside 0-{MAX_GPUS_PER_NODE - 1}")
        self.sources.setdefault(node, set()).add(self.source_of(labels))
        return self.nodes.setdefault(node, {}).setdefault(idx, {})


class _Caps:
    """What a refresh skipped at a cap, per node and kind: one warning line each."""

    def __init__(self) -> None:
        self.hits: dict[tuple[str, str], tuple[int, str]] = {}

    def skip(self, node: str, kind: str, why: str) -> None:
        n, first = self.hits.get((node, kind), (0, why))
        self.hits[(node, kind)] = (n + 1, first)

    def lines(self) -> list[str]:
        return [f"{node}: {n:,} {kind} series skipped ({why})" for (node, kind), (n, why) in sorted(self.hits.items())]


def _text(value: object) -> str | None:
    """A label value as text, or None when the answer put something else there."""
    return value if isinstance(value, str) and value else None


def _nic_kind(dev: str) -> NicKind:
    if dev == "lo":
        return "loopback"
    if dev.startswith("bond"):
        return "bond"
    if _VIRTUAL.match(dev):
        return "virtual"
    return "physical"


def _mount_of(path: str, fs: Mapping[str, Any]) -> str | None:
    """The longest mountpoint holding ``path``."""
    best = None
    for mp in fs:
        root = mp.rstrip("/") + "/"
        if (path == mp or path.startswith(root) or mp == "/") and (best is None or len(mp) > len(best)):
            best = mp
    return best
