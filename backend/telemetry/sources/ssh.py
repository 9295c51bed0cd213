"""The SSH telemetry source: ONE long-lived ``transport.stream(sampler_script)`` per node (sampling
never pays an SSH handshake) and a latency probe beside it; blocks enter through ``hub.ingest``."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from backend.backoff import Backoff
from backend.errors import NodeUnreachable
from backend.telemetry.sampler import BEGIN, END, MAX_BLOCK_BYTES, MAX_BLOCK_LINES, sampler_script
from backend.telemetry.settings import TelemetrySettings

if TYPE_CHECKING:
    from backend.nodes.pool import NodePool
    from backend.telemetry.sources.base import TelemetryFeed

log = logging.getLogger(__name__)


class SshSource:
    """Samples nodes over SSH: ``pool.transport(name)`` (a NodePool, or anything with
    ``.transport(name)``) gives each node's Transport; the source owns no connection."""

    def __init__(self, pool: NodePool, settings: TelemetrySettings) -> None:
        self.pool = pool
        self.settings = settings
        #: node -> its sampler and latency-probe tasks
        self.running: dict[str, tuple[asyncio.Task[None], asyncio.Task[None]]] = {}

    def start(self, hub: TelemetryFeed, names: Sequence[str]) -> None:
        for name in names:
            self.cover(hub, name)

    def stopped(self) -> None:
        self.running.clear()

    def cover(self, hub: TelemetryFeed, name: str) -> None:
        """Sample ``name`` over SSH (its sampler stream and latency probe), unless it is already."""
        if name in self.running:
            return
        self.running[name] = (
            hub.spawn(self._run_node(hub, name), f"telemetry:{name}"),
            hub.spawn(self._probe_latency(hub, name), f"telemetry-latency:{name}"),
        )

    def release(self, hub: TelemetryFeed, name: str) -> None:
        """Stop sampling ``name`` over SSH (another source has it again)."""
        for task in self.running.pop(name, None) or ():
            hub.discard(task)

    async def _transport(self, name: str) -> Any:
        tr = self.pool.transport(name)
        if inspect.isawaitable(tr):
            tr = await tr
        return tr

    async def _run_node(self, hub: TelemetryFeed, name: str) -> None:
        s = self.settings
        script = sampler_script(interval=s.interval, scratch=hub.node(name).scratch, nvidia_smi=s.nvidia_smi)
        # A stream that prints nothing for this long is presumed half-dead and restarted.
        silence = max(10 * s.interval, 15.0)
        backoff = Backoff(s.backoff_initial, s.backoff_max)
        loop = asyncio.get_running_loop()
        while not hub.stopping:
            try:
                transport = await self._transport(name)
                # Connect first: at fleet scale the wait for a handshake slot (sshd's
                # MaxStartups) is not the stream's silence, and must not restart it.
                await transport.connect()
                got_block = False
                # One deadline per block, pushed forward at each block's end. (Not
                # asyncio.wait_for per line: on Python 3.11 it can swallow a cancellation that
                # races a completing read, and it costs a task per line at fleet scale.)
                async with (
                    contextlib.aclosing(transport.stream(script)) as stream,
                    asyncio.timeout(silence) as deadline,
                ):
                    lines: list[str] | None = None
                    size = 0
                    flood: str | None = None  # why the block in progress is malformed
                    async for line in stream:
                        if line == BEGIN:
                            lines, size, flood = [], 0, None
                        elif line == END:
                            if lines is not None:
                                if flood is None:
                                    hub.ingest(name, "\n".join(lines))
                                else:
                                    hub.note_error(name, flood)
                                got_block = True
                                backoff.reset()
                                # A deadline already expiring cannot be moved (3.11 raises): its
                                # TimeoutError is on its way and restarts the stream.
                                if not deadline.expired():
                                    deadline.reschedule(loop.time() + silence)
                            lines = None
                        elif lines is not None and flood is None:
                            size += len(line) + 1
                            if len(lines) >= MAX_BLOCK_LINES or size > MAX_BLOCK_BYTES:
                                # Bounded memory: the block is dropped, not kept in part.
                                flood = (
                                    f"malformed sample: more than {MAX_BLOCK_LINES:,} lines or "
                                    f"{MAX_BLOCK_BYTES // (1 << 20)} MiB in one block; dropped"
                                )
                                lines = []
                            else:
                                lines.append(line)
                hub.note_error(
                    name, "sampler stream ended" if got_block else "sampler stream ended before the first sample"
                )
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                hub.note_error(name, f"no sample for {silence:g}s; restarting the sampler")
            except NodeUnreachable as exc:
                hub.mark_unreachable(name, exc.detail)
            except Exception as exc:  # any failure: show it and retry; never kill the hub
                log.warning("telemetry sampler on %s failed", name, exc_info=True)
                hub.note_error(name, f"{type(exc).__name__}: {exc}")
            await backoff.sleep()

    async def _probe_latency(self, hub: TelemetryFeed, name: str) -> None:
        every = self.settings.latency_every
        while not hub.stopping:
            try:
                transport = await self._transport(name)
                t0 = time.perf_counter()
                await transport.run(":", timeout=max(10.0, every))
                hub.set_latency(name, (time.perf_counter() - t0) * 1000.0)
            except asyncio.CancelledError:
                raise
            except NodeUnreachable as exc:
                hub.mark_unreachable(name, exc.detail)
            except Exception as exc:
                log.debug("latency probe on %s failed: %s", name, exc)
            await asyncio.sleep(every)
