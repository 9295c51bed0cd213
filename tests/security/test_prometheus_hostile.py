"""A Prometheus that answers like an attacker (or a broken proxy in front of it): the source reads
what is sane, skips the rest, or refuses in one line; never a traceback, never another node's GPUs.

Real Prometheus will not serve these shapes, so a small hostile responder in the test plays it,
speaking the HTTP API's JSON (``/api/v1/query``, ``/api/v1/targets``).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from backend.config import Node
from backend.telemetry.prometheus import MAX_ANSWER_BYTES, PrometheusSource, PrometheusUnavailable
from backend.telemetry.settings import TelemetrySettings

NODES = [Node(name="gpu-01", host="10.0.0.1", scratch="/scratch"), Node(name="gpu-02", host="10.0.0.2")]


def ok(result: list[Any]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def series(labels: Any, value: Any) -> dict[str, Any]:
    return {"metric": labels, "value": [1_764_600_000.0, value]}


class Hostile:
    """``answer(query_text) -> bytes`` decides each /api/v1/query body; targets answer empty."""

    def __init__(self) -> None:
        self.answer: Callable[[str], bytes] = lambda q: ok([])
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                parts = urlsplit(self.path)
                if parts.path == "/api/v1/targets":
                    body = json.dumps({"status": "success", "data": {"activeTargets": []}}).encode()
                else:
                    body = outer.answer(parse_qs(parts.query).get("query", [""])[0])
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client cut it off
                    self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    h = Hostile()
    yield h
    h.server.shutdown()
    h.server.server_close()


def source(h: Hostile) -> PrometheusSource:
    return PrometheusSource(TelemetrySettings(source="prometheus", prometheus_url=h.url, prometheus_timeout=10), NODES)


async def test_bad_series_are_skipped_and_the_good_ones_kept(hostile: Hostile) -> None:
    def answer(q: str) -> bytes:
        if "DCGM_FI_DEV_GPU_UTIL" in q:
            return ok(
                [
                    series({"Hostname": "gpu-01", "gpu": "0"}, "91"),
                    series({"Hostname": ["gpu-02"], "gpu": "0"}, "5"),  # a label value that is not text
                    series({"Hostname": "gpu-01", "gpu": {"x": 1}}, "5"),  # nor here
                    series({"Hostname": "gpu-01", "gpu": "1"}, "+Inf"),
                    series({"Hostname": "gpu-01", "gpu": "2"}, "NaN"),
                    series("not a dict", "5"),
                    {"metric": {"Hostname": "gpu-01", "gpu": "3"}},  # no value
                    42,
                ]
            )
        if "DCGM_FI_DEV_XID_ERRORS" in q:
            return ok([series({"Hostname": "gpu-01", "gpu": "0"}, "Inf")])  # int(inf) would raise
        if "node_network" in q:
            return ok([series({"instance": "gpu-01:9100", "device": 7, "lm": "rx"}, "1")])
        return ok([])

    hostile.answer = answer
    src = source(hostile)
    try:
        reading = await src.read()
    finally:
        await src.close()
    assert set(reading.nodes) == {"gpu-01"}, "nothing lands on gpu-02 from a label that is not its name"
    (gpu,) = reading.nodes["gpu-01"].gpus
    assert (gpu.index, gpu.util_pct, gpu.xid) == (0, 91.0, None)
    assert reading.nodes["gpu-01"].nics == ()


@pytest.mark.parametrize(
    "body",
    [
        b"<html>502 Bad Gateway</html>",
        b"[" * 100_000 + b"]" * 100_000,  # nested past Python's recursion limit
        json.dumps({"status": "error", "error": "\x1b[2J\x1b]0;pwned\x07" + "x" * 5000}).encode(),
        json.dumps({"status": "success", "data": {"resultType": "vector", "result": "not a list"}}).encode(),
        json.dumps([1, 2, 3]).encode(),
    ],
    ids=["html", "deep", "escape-codes", "result-not-a-list", "not-an-object"],
)
async def test_broken_answers_are_one_line_or_empty(hostile: Hostile, body: bytes) -> None:
    hostile.answer = lambda q: body
    src = source(hostile)
    try:
        try:
            reading = await src.read()
        except PrometheusUnavailable as exc:
            msg = str(exc)
            assert "\n" not in msg and "\x1b" not in msg and "\x07" not in msg and len(msg) < 500, msg
            assert hostile.url in msg
        else:
            assert reading.nodes == {}
    finally:
        await src.close()


async def test_an_endless_answer_is_cut_off_not_read_into_memory(hostile: Hostile) -> None:
    big = b'{"status":"success","data":{"resultType":"vector","result":[' + b" " * (MAX_ANSWER_BYTES + (1 << 20))
    hostile.answer = lambda q: big
    src = source(hostile)
    try:
        with pytest.raises(PrometheusUnavailable, match=r"more than 64 MiB; not read"):
            await src.read()
    finally:
        await src.close()
