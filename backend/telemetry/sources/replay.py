"""The replay telemetry source: plays a recorded Prometheus answer (``[telemetry] source =
"replay"``, ``replay_file``), for tests and demos without a Prometheus.

A recording is JSON: ``{"format": FORMAT, "frames": [frame, ...]}``, each frame one refresh as the
API answered it: ``{"query": {expr: answer}, "targets": answer}``, ``answer`` being the whole body
of ``/api/v1/query`` or ``/api/v1/targets``. :func:`record` writes one from a live Prometheus.
Every ``prometheus_interval`` the next frame (round and round) goes through the same reading as a
live answer (:class:`backend.telemetry.prometheus.PrometheusSource`: labels matched to nodes, caps,
conflicts, down targets), so the hub cannot tell it from Prometheus. A node the recording does not
have is shown unreachable, saying so. What is wrong with the file is one line in ``source_note``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.errors import LoadmasterError
from backend.telemetry.prometheus import (
    Columns,
    PrometheusClient,
    PrometheusSource,
    api_data,
    columns_of,
    queries,
    targets_of,
    vector_of,
)
from backend.telemetry.settings import TelemetrySettings
from backend.telemetry.sources.prometheus import apply_reading
from backend.textfmt import safe_text

if TYPE_CHECKING:
    from backend.telemetry.sources.base import TelemetryFeed

log = logging.getLogger(__name__)

FORMAT = "loadmaster-prometheus-replay/1"
#: Largest recording read (a frame of a 1,024-node fleet is about 10 MB).
MAX_FILE_BYTES = 256 << 20


class ReplayError(LoadmasterError):
    """The recording cannot be played: one line naming the file and what to fix."""


def load_frames(path: Path) -> list[dict[str, Any]]:
    """The frames of a recording (ReplayError naming the file if it is not one)."""
    shown = safe_text(str(path), 200)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ReplayError(f"replay file {shown}: {size:,} bytes, more than {MAX_FILE_BYTES >> 20} MiB")
        doc = json.loads(path.read_bytes())
    except OSError as exc:
        raise ReplayError(f"replay file {shown}: {exc.strerror or type(exc).__name__}") from None
    except (ValueError, RecursionError):
        raise ReplayError(f"replay file {shown}: not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ReplayError(f'replay file {shown}: not a recording (its "format" is not "{FORMAT}")')
    frames = doc.get("frames")
    if not isinstance(frames, list) or not frames or not all(isinstance(f, dict) for f in frames):
        raise ReplayError(f'replay file {shown}: "frames" must be a non-empty list of refreshes')
    return frames


class RecordedClient:
    """Answers :class:`PrometheusSource`'s queries from one recorded frame."""

    def __init__(self, frame: dict[str, Any], shown: str) -> None:
        self.frame = frame
        self.shown = shown
        self.cut: list[str] = []

    async def columns(self, expr: str) -> Columns:
        answers = self.frame.get("query")
        if not isinstance(answers, dict) or expr not in answers:
            raise ReplayError(
                f"replay file {self.shown} has no answer for {expr[:80]!r}: "
                "recorded with other [telemetry] label or rate settings; record it again"
            )
        return columns_of(
            vector_of(api_data(answers[expr], f"replay file {self.shown}", "/api/v1/query"), expr, self.cut)
        )

    async def targets(self) -> list[dict[str, Any]]:
        got = self.frame.get("targets")
        return targets_of(api_data(got, f"replay file {self.shown}", "/api/v1/targets")) if got is not None else []

    async def close(self) -> None:
        return None


class ReplaySource:
    """Plays ``settings.replay_file``, one frame every ``prometheus_interval``."""

    def __init__(self, settings: TelemetrySettings) -> None:
        if not settings.replay_file:
            raise LoadmasterError('[telemetry] source = "replay" needs replay_file')
        self.settings = settings
        self.path = Path(settings.replay_file).expanduser()
        #: Frames played so far.
        self.played = 0

    def start(self, hub: TelemetryFeed, names: Sequence[str]) -> None:
        hub.spawn(self._run(hub, list(names)), "telemetry:replay")

    def stopped(self) -> None:
        return None

    async def _run(self, hub: TelemetryFeed, names: list[str]) -> None:
        s = self.settings
        shown = safe_text(str(self.path), 200)
        nodes = [hub.node(n) for n in names]

        def missing(name: str) -> None:
            hub.mark_unreachable(name, f"not in the recording {shown}")

        frames: list[dict[str, Any]] | None = None
        while not hub.stopping:
            try:
                if frames is None:
                    frames = load_frames(self.path)
                frame = frames[self.played % len(frames)]
                reading = await PrometheusSource(s, nodes, RecordedClient(frame, shown)).read()
            except LoadmasterError as exc:
                hub.source_note = str(exc)
            else:
                hub.source_note = "; ".join(reading.warnings)[:500] or None
                apply_reading(hub, names, reading, missing=missing)
                self.played += 1
            await asyncio.sleep(s.prometheus_interval)


async def record(settings: TelemetrySettings, path: Path, *, frames: int = 1, every: float | None = None) -> int:
    """Write ``frames`` refreshes of the Prometheus at ``settings.prometheus_url`` to ``path`` (the
    answers as the API gave them, for :class:`ReplaySource`); returns the bytes written."""
    if not settings.prometheus_url:
        raise LoadmasterError("[telemetry] prometheus_url is not set")
    client = PrometheusClient(settings.prometheus_url, settings.prometheus_timeout)
    got: list[dict[str, Any]] = []
    try:
        for i in range(frames):
            if i:
                await asyncio.sleep(settings.prometheus_interval if every is None else every)
            exprs = queries(settings)
            answers = await asyncio.gather(
                *(client.http.get_json("/api/v1/query", {"query": q}, check_depth=False) for q in exprs),
                client.http.get_json("/api/v1/targets", {"state": "active"}, check_depth=False),
            )
            got.append({"query": dict(zip(exprs, answers[:-1], strict=True)), "targets": answers[-1]})
    finally:
        await client.close()
    data = json.dumps({"format": FORMAT, "frames": got}).encode()
    if len(data) > MAX_FILE_BYTES:
        raise ReplayError(f"recording of {len(data):,} bytes is too large to replay")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return len(data)
