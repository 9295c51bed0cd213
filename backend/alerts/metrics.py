"""The ``/metrics`` export: what loadmaster knows, for the site's Prometheus (and its Grafana).

Three pieces, used by ``loadmaster watch --metrics HOST:PORT``::

    holder = MetricsHolder()
    server, thread = serve_metrics(*parse_listen(args.metrics), holder)   # MetricsError: one line
    try:
        while True:
            jobs = await services.jobs.refresh()            # optional: what the cycle already read
            holder.set(await gather_metrics(services, services.telemetry.snapshot(), jobs=jobs))
            await asyncio.sleep(interval)
    finally:
        close_metrics_server(server, thread)

* :func:`gather_metrics` runs in the event loop once per cycle and returns a frozen
  :class:`MetricsSnapshot`. Its state-database reads (a few ``GROUP BY`` queries, the month's
  egress report, new ``retention.apply`` audit records) run in one worker thread; it never opens
  an SSH channel. It never raises for a missing piece: the state database down makes the parts
  that need it absent (``loadmaster_up{part="state"} 0``, with the reason in
  :attr:`MetricsSnapshot.notes`); ``fleet=None`` makes the telemetry part absent.
* :class:`MetricsHolder` keeps the last snapshot; ``set`` from the loop, ``snapshot`` from anywhere.
* :func:`serve_metrics` starts prometheus_client's HTTP server (a daemon thread) on its own
  :class:`~prometheus_client.registry.CollectorRegistry`, with one :class:`SnapshotCollector` that
  turns the holder's last snapshot into metric families. A scrape runs in that thread and only
  reads the snapshot: it never touches the state database or the event loop, so a scrape costs
  the same however slow the database is, and a scrape during a state outage serves the last
  good figures with ``loadmaster_up`` saying which parts are missing now.

The metrics (every name starts with ``loadmaster_``; labels are bounded by the inventory, the
configured stores and budgets, and the job kinds and states, except ``job_id``, which appears only
for running jobs):

=============================================  ===========================================  ==========
metric                                         labels                                       type
=============================================  ===========================================  ==========
loadmaster_info                                version                                      gauge (1)
loadmaster_up                                  part: state|jobs|egress|retention|telemetry  gauge
loadmaster_snapshot_timestamp_seconds                                                       gauge
loadmaster_transfer_bytes_per_second           job_id, node, kind                           gauge
loadmaster_transfer_bytes_total                job_id, node, kind                           counter
loadmaster_transfer_size_bytes                 job_id, node, kind                           gauge
loadmaster_jobs                                state, kind                                  gauge
loadmaster_upload_backlog_seconds              node                                         gauge
loadmaster_egress_dollars                      account, store, route, kind                  gauge
loadmaster_egress_projected_dollars            account, store, route, kind                  gauge
loadmaster_egress_in_flight_dollars            account, store, route, kind                  gauge
loadmaster_egress_budget_dollars               scope, budget                                gauge
loadmaster_egress_budget_used_ratio            scope, budget                                gauge
loadmaster_gpus_starved                        node                                         gauge
loadmaster_fleet_gpus_starved                                                               gauge
loadmaster_fleet_gpus                                                                       gauge
loadmaster_retention_freed_bytes_total         store                                        counter
=============================================  ===========================================  ==========

A scrape job for it needs nothing special; where the site's scrape config attaches a ``node``
target label (as loadmaster's own telemetry expects of node_exporter targets), set
``honor_labels: true`` on this job, or Prometheus renames the exported ``node`` to ``exported_node``.
``docs/grafana/loadmaster.json`` is a Grafana dashboard of these metrics.

Where the figures come from: running jobs (``starting``, ``running``, ``cancelling``) and their
last recorded progress from the ``jobs`` table (or the records the caller passes as ``jobs=``,
e.g. what ``services.jobs.refresh()`` just returned, which also covers a state outage); job counts
per state and kind from the same table; the upload backlog is the age of the oldest running
``upload`` job on each node (since its runner started, else since it was launched); egress is
``services.egress.report()`` for this month, the same figures ``loadmaster egress report`` prints;
GPUs starved are the GPUs of each node's active ``gpu-starved`` alert in the fleet snapshot; bytes
freed by retention are the ``bytes_freed`` of every ``retention.apply`` audit record (one per
apply, counting only actions done in that apply), per configured store of the run's URL.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import json
import socket
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector, CollectorRegistry

from backend import __version__
from backend.errors import LoadmasterError
from backend.jobs.records import ACTIVE, TERMINAL, JobRecord
from backend.state import StateError

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from backend.alerts.sources import MetricsSources
    from backend.alerts.webconfig import WebConfig
    from backend.config import Config
    from backend.ledger import EgressGuard
    from backend.state import StateDB
    from backend.telemetry.model import FleetSnapshot

#: The parts ``loadmaster_up`` reports on, in order.
PARTS = ("state", "jobs", "egress", "retention", "telemetry")
#: The kind whose running jobs make the upload backlog.
UPLOAD_KIND = "upload"
#: The audit action a retention apply writes (backend.retention.apply), with ``detail.bytes_freed``.
RETENTION_AUDIT_ACTION = "retention.apply"
#: How far below the highest audit id already read the next read starts: on PostgreSQL ids are
#: handed out before commit, so a record may become visible after one with a higher id.
_AUDIT_LOOKBACK_IDS = 1000


class MetricsError(LoadmasterError):
    """The metrics address cannot be used: the message names it and what to change."""


# -- the snapshot -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TransferFigure:
    """One running job's transfer: its rate and bytes as last recorded."""

    job_id: str
    node: str
    kind: str
    bytes_done: int
    bytes_total: int | None
    rate_bps: float | None


@dataclass(frozen=True)
class EgressRouteFigure:
    """One route of this month's egress report (``loadmaster egress report``)."""

    account: str
    store: str
    route: str
    kind: str
    usd: float | None
    projected_usd: float | None
    in_flight_usd: float


@dataclass(frozen=True)
class EgressBudgetFigure:
    """One configured budget (scope ``account`` or ``store``) and what the month has spent of it."""

    scope: str
    key: str
    budget_usd: float
    spent_usd: float

    @property
    def ratio(self) -> float:
        """Spent / budget; a $0 budget is 1.0 once anything is spent (as the report shows it)."""
        if self.budget_usd:
            return self.spent_usd / self.budget_usd
        return 1.0 if self.spent_usd else 0.0


@dataclass(frozen=True)
class MetricsSnapshot:
    """The values one scrape exports; a ``None`` field is a part that could not be read this cycle."""

    #: Wall-clock epoch seconds when it was gathered.
    t: float
    version: str
    #: ``(part, up)`` for every part of :data:`PARTS`.
    up: tuple[tuple[str, bool], ...]
    #: ``(part, one line)`` saying why a part is missing (for the caller's log; never exported).
    notes: tuple[tuple[str, str], ...] = ()
    transfers: tuple[TransferFigure, ...] | None = None
    #: ``(state, kind, jobs)``, zeros included for the known states and kinds.
    jobs: tuple[tuple[str, str, int], ...] | None = None
    #: ``(node, seconds)`` for the nodes with a running upload.
    upload_backlog: tuple[tuple[str, float], ...] | None = None
    egress_month: str | None = None
    egress_usd: float | None = None
    egress_routes: tuple[EgressRouteFigure, ...] | None = None
    egress_budgets: tuple[EgressBudgetFigure, ...] | None = None
    #: ``(node, GPUs starved)`` for every node of the fleet snapshot.
    gpus_starved: tuple[tuple[str, int], ...] | None = None
    fleet_gpus: int | None = None
    #: ``(store, bytes freed)`` over every retention apply recorded.
    retention_freed: tuple[tuple[str, int], ...] | None = None

    def is_up(self, part: str) -> bool:
        return dict(self.up).get(part, False)


class MetricsHolder:
    """The last :class:`MetricsSnapshot`: set by the watch loop, read by the scrape thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot: MetricsSnapshot | None = None

    def set(self, snapshot: MetricsSnapshot) -> None:
        with self._lock:
            self._snapshot = snapshot

    @property
    def snapshot(self) -> MetricsSnapshot | None:
        """The last snapshot set, or None before the first."""
        with self._lock:
            return self._snapshot


# -- gathering ------------------------------------------------------------------------------------


async def gather_metrics(
    services: MetricsSources,
    fleet: FleetSnapshot | None,
    *,
    jobs: Sequence[JobRecord] | None = None,
    now: float | None = None,
) -> MetricsSnapshot:
    """This cycle's values (see the module docstring); never raises for a part that is down.

    ``jobs``: job records the caller just read (``services.jobs.refresh()``); when given, the
    running jobs' rates and the upload backlog come from them instead of the recorded rows.
    ``now``: the clock for ages and the egress month (wall-clock epoch seconds; default: now).
    """
    t = time.time() if now is None else now
    state = await asyncio.to_thread(_read_state, services, t, jobs is None)
    notes = list(state.notes)
    transfers, backlog = state.transfers, state.backlog
    if jobs is not None:
        transfers, backlog = _running_from_records(jobs, t)
    starved: tuple[tuple[str, int], ...] | None = None
    fleet_gpus: int | None = None
    if fleet is None:
        notes.append(("telemetry", "no fleet snapshot yet"))
    else:
        starved, fleet_gpus = _starved(fleet)
    up = {
        "state": state.db_ok,
        "jobs": transfers is not None,
        "egress": state.egress is not None,
        "retention": state.freed is not None,
        "telemetry": starved is not None,
    }
    egress = state.egress
    return MetricsSnapshot(
        t=t,
        version=__version__,
        up=tuple((p, up[p]) for p in PARTS),
        notes=tuple(notes),
        transfers=transfers,
        jobs=state.counts,
        upload_backlog=backlog,
        egress_month=egress.month if egress else None,
        egress_usd=egress.usd if egress else None,
        egress_routes=egress.routes if egress else None,
        egress_budgets=egress.budgets if egress else None,
        gpus_starved=starved,
        fleet_gpus=fleet_gpus,
        retention_freed=state.freed,
    )


@dataclass(frozen=True)
class _Egress:
    month: str
    usd: float
    routes: tuple[EgressRouteFigure, ...]
    budgets: tuple[EgressBudgetFigure, ...]


@dataclass(frozen=True)
class _StateFigures:
    db_ok: bool
    notes: tuple[tuple[str, str], ...]
    counts: tuple[tuple[str, str, int], ...] | None = None
    transfers: tuple[TransferFigure, ...] | None = None
    backlog: tuple[tuple[str, float], ...] | None = None
    egress: _Egress | None = None
    freed: tuple[tuple[str, int], ...] | None = None


def _read_state(services: MetricsSources, now: float, read_running: bool) -> _StateFigures:
    """Everything that needs the state database, in one worker thread; a part that fails is None
    with its one-line reason, and the others are still read."""
    notes: list[tuple[str, str]] = []
    ok = True

    def attempt(part: str, read: Any) -> Any:
        nonlocal ok
        try:
            return read()
        except LoadmasterError as exc:
            # StateUnavailable / StateError: the database; anything else (a config section) is
            # that part alone. One line each.
            if isinstance(exc, StateError):
                ok = False
            notes.append((part, str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
            return None

    db = attempt("state", lambda: services.db)
    if db is None:
        return _StateFigures(False, tuple(notes))
    counts = attempt("jobs", lambda: _job_counts(db))
    running = attempt("jobs", lambda: _running_from_rows(db, now)) if read_running else None
    egress = attempt("egress", lambda: _egress(services.egress, now))
    freed = attempt("retention", lambda: _retention_freed(db, services.config))
    return _StateFigures(
        db_ok=ok,
        notes=tuple(notes),
        counts=counts,
        transfers=running[0] if running else None,
        backlog=running[1] if running else None,
        egress=egress,
        freed=freed,
    )


def _known_kinds() -> tuple[str, ...]:
    from backend.agent.kinds import KINDS

    return tuple(sorted(KINDS))


def _job_counts(db: StateDB) -> tuple[tuple[str, str, int], ...]:
    counts = {(s, k): 0 for s in sorted(ACTIVE | TERMINAL) for k in _known_kinds()}
    for r in db.query("SELECT state, kind, COUNT(*) AS n FROM jobs GROUP BY state, kind"):
        counts[(str(r["state"]), str(r["kind"]))] = int(r["n"])
    return tuple((s, k, n) for (s, k), n in sorted(counts.items()))


def _running_from_rows(db: StateDB, now: float) -> tuple[tuple[TransferFigure, ...], tuple[tuple[str, float], ...]]:
    """Running jobs straight from the ``jobs`` table (every one, however old: a long upload)."""
    states = sorted(ACTIVE)
    rows = db.query(
        f"SELECT id, node, kind, created, started, progress FROM jobs WHERE state IN ({','.join('?' * len(states))})",
        states,
    )
    transfers = []
    oldest: dict[str, float] = {}
    for r in rows:
        prog = _progress(r["progress"])
        if prog is not None:
            transfers.append(TransferFigure(str(r["id"]), str(r["node"]), str(r["kind"]), *prog))
        if r["kind"] == UPLOAD_KIND:
            since = float(r["started"] or r["created"])
            oldest[r["node"]] = min(oldest.get(r["node"], since), since)
    return _sorted_transfers(transfers), _backlog(oldest, now)


def _progress(raw: Any) -> tuple[int, int | None, float | None] | None:
    try:
        p = json.loads(raw) if raw else None
    except (ValueError, TypeError):
        return None
    if not isinstance(p, dict):
        return None
    total, rate = p.get("bytes_total"), p.get("rate_bps")
    return (
        int(p.get("bytes_done") or 0),
        None if total is None else int(total),
        None if rate is None else float(rate),
    )


def _running_from_records(
    records: Sequence[JobRecord], now: float
) -> tuple[tuple[TransferFigure, ...], tuple[tuple[str, float], ...]]:
    transfers = []
    oldest: dict[str, float] = {}
    for rec in records:
        if rec.state not in ACTIVE:
            continue
        p = rec.progress
        if p is not None:
            transfers.append(TransferFigure(rec.id, rec.node, rec.kind, p.bytes_done, p.bytes_total, p.rate_bps))
        if rec.kind == UPLOAD_KIND:
            since = rec.started or rec.created
            oldest[rec.node] = min(oldest.get(rec.node, since), since)
    return _sorted_transfers(transfers), _backlog(oldest, now)


def _sorted_transfers(transfers: list[TransferFigure]) -> tuple[TransferFigure, ...]:
    return tuple(sorted(transfers, key=lambda f: (f.node, f.job_id)))


def _backlog(oldest: dict[str, float], now: float) -> tuple[tuple[str, float], ...]:
    return tuple((node, max(0.0, now - since)) for node, since in sorted(oldest.items()))


def _egress(guard: EgressGuard, now: float) -> _Egress:
    rep = guard.report(now=datetime.fromtimestamp(now, UTC))
    routes = tuple(
        EgressRouteFigure(
            account=r.account or "none",
            store=r.store,
            route=r.label,
            kind=r.kind,
            usd=r.usd,
            projected_usd=r.projected_usd,
            in_flight_usd=r.in_flight_usd,
        )
        for r in rep.routes
    )
    budgets = tuple(EgressBudgetFigure(b.scope, b.key, b.budget_usd, b.spent_usd) for b in rep.budgets)
    return _Egress(rep.month, rep.usd, routes, budgets)


@dataclass
class _FreedTally:
    """What was summed of one database's ``retention.apply`` records so far (read incrementally)."""

    seen: dict[int, tuple[str, int]]
    max_id: int = 0


#: Per state database object: the audit is append-only, so each cycle reads only new records.
_TALLIES: weakref.WeakKeyDictionary[StateDB, _FreedTally] = weakref.WeakKeyDictionary()
_TALLIES_LOCK = threading.Lock()


def _retention_freed(db: StateDB, config: Config) -> tuple[tuple[str, int], ...]:
    with _TALLIES_LOCK:
        tally = _TALLIES.setdefault(db, _FreedTally({}))
        rows = db.query(
            "SELECT id, target, detail FROM audit WHERE id > ? AND action = ? ORDER BY id",
            (max(0, tally.max_id - _AUDIT_LOOKBACK_IDS), RETENTION_AUDIT_ACTION),
        )
        for r in rows:
            rid = int(r["id"])
            if rid in tally.seen:
                continue
            tally.seen[rid] = (_store_of(config, str(r["target"])), _bytes_freed(r["detail"]))
            tally.max_id = max(tally.max_id, rid)
        by_store: dict[str, int] = {}
        for store, freed in tally.seen.values():
            by_store[store] = by_store.get(store, 0) + freed
    return tuple(sorted(by_store.items()))


def _store_of(config: Config, url: str) -> str:
    """The configured store a run URL lies in (bounded label values); ``other`` when none does."""
    try:
        prof = config.store_for_url(url)
    except LoadmasterError:
        prof = None
    return prof.name if prof is not None and prof.name else "other"


def _bytes_freed(raw: Any) -> int:
    try:
        detail = json.loads(raw) if raw else {}
        return max(0, int(detail.get("bytes_freed") or 0))
    except (ValueError, TypeError, AttributeError):
        return 0


def _starved(fleet: FleetSnapshot) -> tuple[tuple[tuple[str, int], ...], int]:
    per_node = {n.name: 0 for n in fleet.nodes}
    for a in fleet.active_alerts:
        if a.kind == "gpu-starved":
            per_node[a.node] = per_node.get(a.node, 0) + len(a.gpus)
    return tuple(sorted(per_node.items())), fleet.gpu_count


# -- exporting ------------------------------------------------------------------------------------


class SnapshotCollector(Collector):
    """Metric families from the holder's last snapshot; runs in the scrape thread and reads only
    that immutable snapshot."""

    def __init__(self, holder: MetricsHolder) -> None:
        self.holder = holder

    def collect(self) -> Iterable[Metric]:
        return list(families(self.holder.snapshot))


def families(snap: MetricsSnapshot | None) -> Iterator[Metric]:
    """The metric families of ``snap`` (only ``loadmaster_info`` before the first snapshot)."""
    info = GaugeMetricFamily("loadmaster_info", "loadmaster version exporting these metrics", labels=["version"])
    info.add_metric([__version__], 1.0)
    yield info
    if snap is None:
        return
    up = GaugeMetricFamily(
        "loadmaster_up", "1 when this part of the figures could be read in the last cycle, else 0", labels=["part"]
    )
    for part, ok in snap.up:
        up.add_metric([part], 1.0 if ok else 0.0)
    yield up
    yield GaugeMetricFamily(
        "loadmaster_snapshot_timestamp_seconds", "When the exported figures were gathered (Unix time)", value=snap.t
    )
    yield from _job_families(snap)
    yield from _egress_families(snap)
    if snap.gpus_starved is not None:
        g = GaugeMetricFamily(
            "loadmaster_gpus_starved", "GPUs of the node in an active GPU-starved alert", labels=["node"]
        )
        for node, n in snap.gpus_starved:
            g.add_metric([node], float(n))
        yield g
        yield GaugeMetricFamily(
            "loadmaster_fleet_gpus_starved",
            "GPUs in an active GPU-starved alert, over the fleet",
            value=float(sum(n for _, n in snap.gpus_starved)),
        )
    if snap.fleet_gpus is not None:
        yield GaugeMetricFamily("loadmaster_fleet_gpus", "GPUs on the bus over the fleet", value=float(snap.fleet_gpus))
    if snap.retention_freed is not None:
        c = CounterMetricFamily(
            "loadmaster_retention_freed_bytes",
            "Bytes deleted by retention applies, per configured store of the run",
            labels=["store"],
        )
        for store, freed in snap.retention_freed:
            c.add_metric([store], float(freed))
        yield c


def _job_families(snap: MetricsSnapshot) -> Iterator[Metric]:
    labels = ["job_id", "node", "kind"]
    if snap.transfers is not None:
        rate = GaugeMetricFamily(
            "loadmaster_transfer_bytes_per_second", "Throughput of a running job as last recorded", labels=labels
        )
        done = CounterMetricFamily("loadmaster_transfer_bytes", "Bytes a running job has moved so far", labels=labels)
        size = GaugeMetricFamily(
            "loadmaster_transfer_size_bytes", "Bytes a running job moves in all, where known", labels=labels
        )
        for f in snap.transfers:
            key = [f.job_id, f.node, f.kind]
            if f.rate_bps is not None:
                rate.add_metric(key, f.rate_bps)
            done.add_metric(key, float(f.bytes_done))
            if f.bytes_total is not None:
                size.add_metric(key, float(f.bytes_total))
        yield rate
        yield done
        yield size
    if snap.jobs is not None:
        g = GaugeMetricFamily("loadmaster_jobs", "Recorded jobs per state and kind", labels=["state", "kind"])
        for state, kind, n in snap.jobs:
            g.add_metric([state, kind], float(n))
        yield g
    if snap.upload_backlog is not None:
        b = GaugeMetricFamily(
            "loadmaster_upload_backlog_seconds",
            "How long the oldest running checkpoint upload on the node has been running",
            labels=["node"],
        )
        for node, secs in snap.upload_backlog:
            b.add_metric([node], secs)
        yield b


def _egress_families(snap: MetricsSnapshot) -> Iterator[Metric]:
    if snap.egress_routes is not None:
        labels = ["account", "store", "route", "kind"]
        usd = GaugeMetricFamily(
            "loadmaster_egress_dollars",
            "Egress cost this month (UTC) per route, in US dollars, running transfers at their quote",
            labels=labels,
        )
        proj = GaugeMetricFamily(
            "loadmaster_egress_projected_dollars",
            "Egress cost per route projected to the end of this month, in US dollars",
            labels=labels,
        )
        flying = GaugeMetricFamily(
            "loadmaster_egress_in_flight_dollars",
            "Quoted cost of the route's running transfers (included in loadmaster_egress_dollars)",
            labels=labels,
        )
        for r in snap.egress_routes:
            key = [r.account, r.store, r.route, r.kind]
            if r.usd is not None:
                usd.add_metric(key, r.usd)
            if r.projected_usd is not None:
                proj.add_metric(key, r.projected_usd)
            flying.add_metric(key, r.in_flight_usd)
        yield usd
        yield proj
        yield flying
    if snap.egress_budgets is not None:
        labels = ["scope", "budget"]
        budget = GaugeMetricFamily(
            "loadmaster_egress_budget_dollars", "Configured monthly egress budget, in US dollars", labels=labels
        )
        ratio = GaugeMetricFamily(
            "loadmaster_egress_budget_used_ratio", "Share of the monthly egress budget spent (1 = all)", labels=labels
        )
        for b in snap.egress_budgets:
            budget.add_metric([b.scope, b.key], b.budget_usd)
            ratio.add_metric([b.scope, b.key], b.ratio)
        yield budget
        yield ratio


#: Every metric name the exporter can serve (as scraped: counters with ``_total``).
METRIC_NAMES = frozenset(
    {
        "loadmaster_info",
        "loadmaster_up",
        "loadmaster_snapshot_timestamp_seconds",
        "loadmaster_transfer_bytes_per_second",
        "loadmaster_transfer_bytes_total",
        "loadmaster_transfer_size_bytes",
        "loadmaster_jobs",
        "loadmaster_upload_backlog_seconds",
        "loadmaster_egress_dollars",
        "loadmaster_egress_projected_dollars",
        "loadmaster_egress_in_flight_dollars",
        "loadmaster_egress_budget_dollars",
        "loadmaster_egress_budget_used_ratio",
        "loadmaster_gpus_starved",
        "loadmaster_fleet_gpus_starved",
        "loadmaster_fleet_gpus",
        "loadmaster_retention_freed_bytes_total",
    }
)


# -- serving --------------------------------------------------------------------------------------


#: Where ``:PORT`` (or a bare ``PORT``) listens: this machine alone. The export names jobs, nodes
#: and the month's spend; every interface is a choice the operator writes (``0.0.0.0:9464``).
DEFAULT_HOST = "127.0.0.1"


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``; ``:PORT`` listens on loopback only) -> (host, port).

    Port 0 picks a free one (``server.server_port`` says which). :class:`MetricsError` otherwise.
    """
    raw = text.strip()
    host, sep, port_text = raw.rpartition(":")
    if not sep:
        raise MetricsError(f"metrics address {text!r}: expected HOST:PORT (e.g. 127.0.0.1:9464 or :9464)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise MetricsError(f"metrics address {text!r}: {host!r} in brackets is not an IPv6 address") from None
    elif ":" in host:
        raise MetricsError(f"metrics address {text!r}: put an IPv6 address in brackets, e.g. [::1]:9464")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise MetricsError(f"metrics address {text!r}: port {port_text!r} is not a number from 0 to 65535")
    return host or DEFAULT_HOST, int(port_text)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def metrics_registry(holder: MetricsHolder) -> CollectorRegistry:
    """A registry of its own (never the global one) holding the holder's collector alone."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(holder))
    return registry


def serve_metrics(
    host: str, port: int, holder: MetricsHolder, web: WebConfig | None = None
) -> tuple[WSGIServer, threading.Thread]:
    """Serve the holder's last snapshot on ``http://HOST:PORT/metrics`` from a daemon thread;
    behind the TLS and basic auth of ``web`` (a web config file, :mod:`backend.alerts.webconfig`).

    Returns ``(server, thread)``; stop them with :func:`close_metrics_server`. A port in use, a
    host that does not resolve or is not this machine's: :class:`MetricsError`, one line naming
    the address.
    """
    where = _address(host, port)
    try:
        if web is not None:
            from prometheus_client.exposition import make_wsgi_app

            from backend.alerts.webconfig import serve_wsgi

            return serve_wsgi(host, port, make_wsgi_app(metrics_registry(holder)), web)
        return start_http_server(port, addr=host, registry=metrics_registry(holder))
    except socket.gaierror as exc:
        raise MetricsError(
            f"cannot serve metrics on {where}: host {host!r} does not resolve ({exc.strerror})"
        ) from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            why = "the address is already in use (another exporter, or a second watch?); choose another port"
        elif exc.errno == errno.EACCES:
            why = "permission denied (ports below 1024 need privileges); choose a port above 1024"
        elif exc.errno == errno.EADDRNOTAVAIL:
            why = "that address is not on this machine; use one of its addresses (0.0.0.0:PORT: every interface)"
        else:
            why = exc.strerror or str(exc)
        raise MetricsError(f"cannot serve metrics on {where}: {why}") from None


def close_metrics_server(server: WSGIServer, thread: threading.Thread, timeout: float = 5.0) -> None:
    """Stop serving and release the port."""
    server.shutdown()
    server.server_close()
    thread.join(timeout)


__all__ = [
    "METRIC_NAMES",
    "PARTS",
    "EgressBudgetFigure",
    "EgressRouteFigure",
    "MetricsError",
    "MetricsHolder",
    "MetricsSnapshot",
    "SnapshotCollector",
    "TransferFigure",
    "close_metrics_server",
    "families",
    "gather_metrics",
    "metrics_registry",
    "parse_listen",
    "serve_metrics",
]
