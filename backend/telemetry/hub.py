"""TelemetryHub: one sampler stream per node, rates, history, alerts, and a FleetSnapshot per tick.

The hub owns no connections and reads no node itself: its sources do
(:class:`backend.telemetry.sources.TelemetrySource`; SSH streams, Prometheus, a recording), chosen
by ``[telemetry] source`` unless given. Samples enter through :meth:`TelemetryHub.ingest` (a raw
sampler block) and :meth:`TelemetryHub.ingest_observed` (numbers per node), the doors that tests
and the benchmarks also use; both end in ``_apply``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from backend.config import Node
from backend.nodes.untrusted import clean_text
from backend.telemetry.history import NodeHistory
from backend.telemetry.model import (
    Alert,
    FleetSnapshot,
    GpuSample,
    NodeSnapshot,
    NodeState,
    Observed,
    SourceKind,
    XidEvent,
)
from backend.telemetry.parse import MALFORMED, MESSAGE_LIMIT, RawSample, compute_rates, parse_block
from backend.telemetry.settings import TelemetrySettings
from backend.telemetry.sources import TelemetrySource, build_sources
from backend.telemetry.starvation import StarvationDetector
from backend.telemetry.xid import describe as xid_info

if TYPE_CHECKING:
    from backend.nodes.pool import NodePool

log = logging.getLogger(__name__)

Subscriber = Callable[[FleetSnapshot], Any]

#: Cleared alerts kept for the alert list.
RECENT_ALERTS = 50
#: Seconds stop() waits for the samplers to close their streams.
STOP_TIMEOUT = 5.0
#: Xid events kept per node.
MAX_XIDS = 20


class _NodeState:
    """Mutable per-node bookkeeping (never handed out; snapshots are)."""

    def __init__(
        self, node: Node, settings: TelemetrySettings, to_wall: Callable[[float], float] | None = None
    ) -> None:
        self.node = node
        self.prev: RawSample | None = None
        self.prev_t: float | None = None
        self.last_t: float | None = None
        self.state: NodeState = "connecting"
        self.error: str | None = None
        self.latency_ms: float | None = None
        self.snap = NodeSnapshot(name=node.name, site=node.site, scratch=node.scratch)
        self.history = NodeHistory(settings.history_capacity)
        self.detector = StarvationDetector(node.name, settings, to_wall)
        self.changed = True
        self.source: SourceKind = "ssh"
        #: GPU index -> the last Xid code seen (0: none), so only a new one is an event.
        self.xid_seen: dict[int, int] = {}
        #: Kernel-log Xid lines already reported (insertion-ordered, bounded).
        self.xid_lines: dict[str, None] = {}


def _nodes_of(pool: NodePool) -> list[Node]:
    nodes = pool.nodes
    if isinstance(nodes, dict):
        nodes = nodes.values()
    return list(nodes)


class TelemetryHub:
    """Samples every node of ``pool`` through its sources and publishes a FleetSnapshot each interval."""

    def __init__(
        self,
        pool: NodePool,
        settings: TelemetrySettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        feed_only: bool = False,
        nodes: Iterable[str] | None = None,
        wall_clock: Callable[[], float] = time.time,
        sources: Sequence[TelemetrySource] | None = None,
    ) -> None:
        self.pool = pool
        #: True: samples arrive only through ingest()/tick() (benchmarks, replays); start() is a no-op.
        self.feed_only = feed_only
        self.settings = settings or TelemetrySettings()
        self.clock = clock
        self.wall_clock = wall_clock
        only = set(nodes) if nodes is not None else None
        # Hub times are monotonic (immune to clock steps); alerts also carry wall time.
        offset = wall_clock() - clock()
        self._nodes: dict[str, _NodeState] = {
            n.name: _NodeState(n, self.settings, lambda t: t + offset)
            for n in _nodes_of(pool)
            if only is None or n.name in only
        }
        self._recent: deque[Alert] = deque(maxlen=RECENT_ALERTS)
        self._subscribers: list[Subscriber] = []
        self._queues: list[asyncio.Queue[FleetSnapshot]] = []
        self._tasks: list[asyncio.Task[None]] = []
        #: Where the numbers come from (``[telemetry] source`` unless given).
        self.sources: list[TelemetrySource] = (
            list(sources) if sources is not None else build_sources(self.settings, pool)
        )
        #: Why the configured source is not working now (Prometheus unreachable), for the screen.
        self.source_note: str | None = None
        self._stopping = False
        self._seq = 0
        self._last: FleetSnapshot = self._build(self.clock(), changed=set(self._nodes))

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether samples are flowing (samplers started, or feed-only)."""
        return bool(self._tasks) or self.feed_only

    async def start(self, nodes: Iterable[str] | None = None) -> None:
        """Start the sources (for ``nodes``, or every node) and the ticker (idempotent)."""
        if self._tasks or self.feed_only:
            return
        names = [n for n in (list(nodes) if nodes is not None else list(self._nodes)) if n in self._nodes]
        for source in self.sources:
            source.start(self, names)
        self._tasks.append(asyncio.create_task(self._ticker(), name="telemetry:ticker"))

    # -- what sources use (backend.telemetry.sources.TelemetryFeed) -----------------------

    @property
    def stopping(self) -> bool:
        """Whether stop() is cancelling the tasks (a source's loop ends)."""
        return self._stopping

    def node(self, name: str) -> Node:
        """The inventory entry of a sampled node (KeyError for an unknown one)."""
        return self._nodes[name].node

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run a source's loop as a task the hub owns (stop() cancels it)."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.append(task)
        return task

    def discard(self, task: asyncio.Task[None]) -> None:
        """Cancel a task made by :meth:`spawn` and forget it."""
        task.cancel()
        with contextlib.suppress(ValueError):
            self._tasks.remove(task)

    async def stop(self) -> None:
        """Stop every sampler stream (closing them kills the loops on the nodes)."""
        tasks, self._tasks = self._tasks, []
        for source in self.sources:
            source.stopped()
        if not tasks:
            return
        self._stopping = True
        try:
            # Cancel until done: a cancellation can be lost inside a transport (Python 3.11's
            # wait_for drops one that races a completing read), and the loops also check
            # _stopping. A transport whose close hangs must not hang the console's exit.
            pending = set(tasks)
            deadline = asyncio.get_running_loop().time() + STOP_TIMEOUT
            while pending:
                for task in pending:
                    task.cancel()
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    for task in pending:
                        log.warning("telemetry task %s did not stop within %ss", task.get_name(), STOP_TIMEOUT)
                    break
                _done, pending = await asyncio.wait(pending, timeout=min(0.5, left))
        finally:
            self._stopping = False

    # -- reading ---------------------------------------------------------------------------

    @property
    def node_names(self) -> list[str]:
        """The sampled nodes, in inventory order."""
        return list(self._nodes)

    def snapshot(self) -> FleetSnapshot:
        """The latest published FleetSnapshot."""
        return self._last

    def history(self, node: str) -> NodeHistory:
        """The bounded history of ``node`` (KeyError for an unknown node)."""
        return self._nodes[node].history

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(snapshot)`` on every tick; returns a function that unsubscribes."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            """Stop calling the callback."""
            with contextlib.suppress(ValueError):
                self._subscribers.remove(callback)

        return unsubscribe

    async def updates(self) -> AsyncGenerator[FleetSnapshot, None]:
        """Async iterator of snapshots; a slow consumer skips ticks and gets the newest."""
        queue: asyncio.Queue[FleetSnapshot] = asyncio.Queue(maxsize=1)
        self._queues.append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._queues.remove(queue)

    # -- the single entry for samples -------------------------------------------------------

    def ingest(self, node: str, block: str, t: float | None = None) -> NodeSnapshot:
        """Apply one raw sampler block from ``node`` taken at hub time ``t``; returns its snapshot."""
        st = self._nodes[node]
        t = self.clock() if t is None else t
        raw = parse_block(block)
        dt: float | None = None
        if st.prev is not None:
            if raw.uptime is not None and st.prev.uptime is not None and raw.uptime > st.prev.uptime:
                dt = raw.uptime - st.prev.uptime  # the node's clock: immune to network jitter
            elif st.prev_t is not None and raw.boot_id == st.prev.boot_id:
                dt = t - st.prev_t
        nics, disks = compute_rates(st.prev, raw, dt)
        st.prev, st.prev_t = raw, t
        # A malformed part (a flood from nvidia-smi) is reported beside the node; the rest counts.
        error = f"{MALFORMED} sample: {'; '.join(raw.malformed)}" if raw.malformed else None
        if error is not None and error != st.error:
            log.warning("telemetry: malformed sample from %s: %s", node, error)
        return self._apply(
            st,
            t,
            Observed(
                gpus=raw.gpus,
                gpu_status=raw.gpu_status,
                nics=nics,
                disks=disks,
                scratch_free_bytes=raw.scratch_free_bytes,
                scratch_total_bytes=raw.scratch_total_bytes,
                scratch_error=raw.scratch_error,
            ),
            error=error,
            boot_id=raw.boot_id,
            source="ssh",
            log_xids=raw.xids,
        )

    def ingest_observed(
        self, node: str, obs: Observed, t: float | None = None, *, error: str | None = None
    ) -> NodeSnapshot:
        """Apply one node's numbers as Prometheus has them (rates already computed there)."""
        st = self._nodes[node]
        t = self.clock() if t is None else t
        return self._apply(st, t, obs, error=error, boot_id=None, source="prometheus")

    def _apply(
        self,
        st: _NodeState,
        t: float,
        obs: Observed,
        *,
        error: str | None,
        boot_id: str | None,
        source: SourceKind,
        log_xids: tuple[tuple[str, int, int], ...] | None = None,
    ) -> NodeSnapshot:
        """The one way a sample becomes the node's snapshot: state, alerts, Xids, history."""
        node = st.node.name
        st.last_t = t
        st.source = source
        st.state, st.error = "up", error
        xids = self._new_xids(st, obs.gpus, log_xids)
        snap = NodeSnapshot(
            name=node,
            site=st.node.site,
            state="up",
            error=error,
            latency_ms=st.latency_ms,
            gpus=obs.gpus,
            gpu_status=obs.gpu_status,
            nics=obs.nics,
            disks=obs.disks,
            scratch=st.node.scratch,
            scratch_free_bytes=obs.scratch_free_bytes,
            scratch_total_bytes=obs.scratch_total_bytes,
            scratch_error=obs.scratch_error,
            sampled_at=t,
            boot_id=boot_id,
            samples=st.snap.samples + 1,
            source=source,
            xids=xids,
        )
        alert, cleared = st.detector.update(t, obs.gpus, snap.rx_gbps, snap.rx_pct)
        if cleared is not None:
            self._recent.appendleft(cleared)
        if alert is not None:
            snap = replace(snap, alerts=(alert,))
        st.history.append(
            t,
            {
                "util_mean": snap.util_mean,
                "util_min": snap.util_min,
                "mem_used_mib": snap.mem_used_mib,
                "rx_gbps": snap.rx_gbps,
                "tx_gbps": snap.tx_gbps,
                "disk_write_mbps": snap.disk_write_mbps,
                "disk_read_mbps": snap.disk_read_mbps,
            },
            ((g.index, g.util_pct) for g in obs.gpus),
        )
        st.snap = snap
        st.changed = True
        return snap

    def _new_xids(
        self, st: _NodeState, gpus: tuple[GpuSample, ...], log_xids: tuple[tuple[str, int, int], ...] | None
    ) -> tuple[XidEvent, ...]:
        """The node's Xid events, with one more for each GPU whose last Xid (dcgm-exporter's
        gauge) changed to a code, and for each kernel-log Xid line not seen before (SSH)."""
        events = list(st.snap.xids)
        new: list[tuple[int, int]] = []
        for g in gpus:
            code = g.xid or 0
            before = st.xid_seen.get(g.index)
            st.xid_seen[g.index] = code
            if code and code != before:
                new.append((g.index, code))
        for key, gpu, code in log_xids or ():
            if key not in st.xid_lines:
                st.xid_lines[key] = None
                new.append((gpu, code))
        while len(st.xid_lines) > 4 * MAX_XIDS:
            st.xid_lines.pop(next(iter(st.xid_lines)))
        for gpu, code in new:
            info = xid_info(code)
            ev = XidEvent(
                node=st.node.name,
                gpu=gpu,
                code=code,
                mnemonic=info.mnemonic,
                meaning=info.meaning,
                action=info.action,
                drain=info.drain,
                seen=self.wall_clock(),
            )
            events.append(ev)
            log.warning("telemetry: %s", ev.message)
        return tuple(events[-MAX_XIDS:])

    def mark_unreachable(self, node: str, error: str, t: float | None = None) -> None:
        """The transport says ``node`` cannot be reached: show it, clear its alert."""
        st = self._nodes[node]
        t = self.clock() if t is None else t
        error = clean_text(error, MESSAGE_LIMIT)  # reasons can carry text the node chose
        cleared = st.detector.reset(t)
        if cleared is not None:
            self._recent.appendleft(cleared)
        st.prev = None  # counters after the outage are a fresh start, not a delta
        if st.state != "unreachable" or st.error != error:
            st.state, st.error = "unreachable", error
            st.snap = replace(st.snap, state="unreachable", error=error, alerts=(), samples=0)
            st.changed = True

    def mark_stale(self, node: str, error: str) -> None:
        """The source has no fresh numbers for ``node`` (its Prometheus target is down)."""
        st = self._nodes[node]
        error = clean_text(error, MESSAGE_LIMIT)
        if st.state != "stale" or st.error != error:
            st.state, st.error = "stale", error
            st.snap = replace(st.snap, state="stale", error=error)
            st.changed = True

    def note_error(self, node: str, error: str) -> None:
        """Remember a non-fatal sampler error (shown beside the state)."""
        st = self._nodes[node]
        error = clean_text(error, MESSAGE_LIMIT)
        if st.error != error:
            st.error = error
            st.snap = replace(st.snap, error=error)
            st.changed = True

    def set_latency(self, node: str, latency_ms: float) -> None:
        """Record an SSH round-trip latency measurement for ``node``."""
        st = self._nodes[node]
        if st.latency_ms is None or abs(st.latency_ms - latency_ms) >= 0.5:
            st.changed = True
            st.snap = replace(st.snap, latency_ms=latency_ms)
        st.latency_ms = latency_ms

    def tick(self, t: float | None = None) -> FleetSnapshot:
        """Age every node (up -> stale after the missed samples), build and publish a snapshot."""
        t = self.clock() if t is None else t
        s = self.settings
        limits = {
            source: every * (s.stale_after_missed + 0.5) + 0.5
            for source, every in (("ssh", s.interval), ("prometheus", s.prometheus_interval))
        }
        changed: set[str] = set()
        for name, st in self._nodes.items():
            if st.state == "up" and st.last_t is not None and t - st.last_t > limits[st.source]:
                st.state = "stale"
                st.snap = replace(st.snap, state="stale")
                st.changed = True
            if st.changed:
                changed.add(name)
                st.changed = False
        snap = self._build(t, changed)
        self._last = snap
        self._publish(snap)
        return snap

    # -- internals ---------------------------------------------------------------------------

    def _build(self, t: float, changed: set[str]) -> FleetSnapshot:
        self._seq += 1
        nodes = []
        active = []
        for st in self._nodes.values():
            # Unchanged nodes keep their snapshot object, so front ends can skip them by identity.
            nodes.append(st.snap)
            if st.detector.alert is not None:
                active.append(st.detector.alert)
        active.sort(key=lambda a: a.started)
        return FleetSnapshot(
            seq=self._seq,
            t=t,
            nodes=tuple(nodes),
            alerts=tuple(active) + tuple(self._recent),
            changed=frozenset(changed),
            source_note=getattr(self, "source_note", None),
        )

    def _publish(self, snap: FleetSnapshot) -> None:
        for cb in list(self._subscribers):
            try:
                cb(snap)
            except Exception:  # a broken subscriber must not stop sampling for the others
                log.exception("telemetry subscriber failed")
        for q in self._queues:
            if q.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
            q.put_nowait(snap)

    async def _ticker(self) -> None:
        interval = self.settings.interval
        next_t = self.clock()
        while not self._stopping:
            next_t += interval
            now = self.clock()
            if now > next_t + interval:
                next_t = now  # fell behind (suspended laptop, busy loop): do not burst-tick
            await asyncio.sleep(max(0.0, next_t - now))
            try:
                self.tick()
            except Exception:  # a bad tick must not stop every later one
                log.exception("telemetry tick failed")
