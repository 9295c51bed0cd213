"""A Prometheus that answers like an attacker (or a broken proxy in front of it): the source reads
what is sane, skips the rest, or refuses in one line; never a traceback, never another node's GPUs.
A second machine claiming a node is a conflict on that node, never merged; an unrelated exporter
being down blanks nothing; label floods stop at the caps, with a warning.

Real Prometheus will not serve these shapes, so a small hostile responder in the test plays it,
speaking the HTTP API's JSON (``/api/v1/query``, ``/api/v1/targets``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

import backend.telemetry.prometheus as prom
from backend.config import Node
from backend.nodes.pool import NodePool
from backend.telemetry.hub import TelemetryHub
from backend.telemetry.prometheus import (
    MAX_ANSWER_BYTES,
    MAX_DEVICES_PER_NODE,
    MAX_GPUS_PER_NODE,
    PrometheusSource,
    PrometheusUnavailable,
)
from backend.telemetry.settings import TelemetrySettings
from tests.loopback_http import LoopbackHTTPServer, serve

NODES = [Node(name="gpu-01", host="10.0.0.1", scratch="/scratch"), Node(name="gpu-02", host="10.0.0.2")]


def ok(result: list[Any]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def series(labels: Any, value: Any) -> dict[str, Any]:
    return {"metric": labels, "value": [1_764_600_000.0, value]}


class Hostile:
    """``answer(query_text) -> bytes`` decides each /api/v1/query body; targets answer empty."""

    def __init__(self) -> None:
        self.answer: Callable[[str], bytes] = lambda q: ok([])
        #: The active targets /api/v1/targets lists (labels, health, lastError).
        self.targets: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                parts = urlsplit(self.path)
                if parts.path == "/api/v1/targets":
                    body = json.dumps({"status": "success", "data": {"activeTargets": outer.targets}}).encode()
                else:
                    body = outer.answer(parse_qs(parts.query).get("query", [""])[0])
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client cut it off
                    self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = LoopbackHTTPServer(("127.0.0.1", 0), Handler)
        serve(self.server, "hostile-prometheus")

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


# -- sources, conflicts and caps -------------------------------------------------------------------


def fleet(gpu01_dcgm: list[str], *, gpus: int = 2, util: float = 50.0) -> Callable[[str], bytes]:
    """gpu-01's GPUs from each dcgm-exporter instance in ``gpu01_dcgm`` (``util`` + its position),
    and its node_exporter on gpu-01:9100."""

    def answer(q: str) -> bytes:
        if "DCGM_FI_DEV_GPU_UTIL" in q:
            return ok(
                [
                    series({"Hostname": "gpu-01", "gpu": str(i), "job": "dcgm", "instance": inst}, str(util + k))
                    for k, inst in enumerate(gpu01_dcgm)
                    for i in range(gpus)
                ]
            )
        if "node_network" in q:
            return ok([series({"instance": "gpu-01:9100", "job": "node", "device": "eth0", "lm": "rx"}, "1000")])
        return ok([])

    return answer


async def read_once(h: Hostile) -> Any:
    """One refresh of a fresh source."""
    src = source(h)
    try:
        return await src.read()
    finally:
        await src.close()


async def read_twice(h: Hostile, first: Callable[[str], bytes], then: Callable[[str], bytes], targets: Any) -> Any:
    """Two refreshes of one source: ``first`` with every target up, then ``then`` with ``targets``."""
    src = source(h)
    try:
        h.answer = first
        await src.read()
        h.answer, h.targets = then, targets
        return await src.read()
    finally:
        await src.close()


async def test_a_second_machine_claiming_a_node_is_a_conflict_never_merged(hostile: Hostile) -> None:
    # Another machine's dcgm-exporter says Hostname=gpu-01: a starved GPU must not show its 99 %.
    hostile.answer = fleet(["gpu-01:9400", "evil:9400"])
    reading = await read_once(hostile)
    assert "gpu-01" not in reading.nodes  # neither source's numbers
    said = reading.conflicts["gpu-01"]
    assert said.startswith("conflict: 2 dcgm-exporter sources claim this node (dcgm/evil:9400, dcgm/gpu-01:9400)")
    assert reading.down["gpu-01"] == said  # the hub shows it on the node


async def test_one_source_is_read_and_keeps_its_instance(hostile: Hostile) -> None:
    hostile.answer = fleet(["gpu-01:9400"])
    src = source(hostile)
    try:
        reading = await src.read()
        assert src.sources["gpu-01"].keys() == {"dcgm/gpu-01:9400", "node/gpu-01:9100"}
    finally:
        await src.close()
    assert [g.util_pct for g in reading.nodes["gpu-01"].gpus] == [50.0, 50.0]
    assert reading.conflicts == {} and reading.down == {} and reading.warnings == ()


def _target(job: str, instance: str, health: str = "down", **extra: str) -> dict[str, Any]:
    return {"labels": {"job": job, "instance": instance, **extra}, "health": health, "lastError": "connection refused"}


async def test_an_unrelated_exporter_down_does_not_blank_a_healthy_node(hostile: Hostile) -> None:
    # A blackbox probe and a second node_exporter-like job name gpu-01 in their labels; neither is
    # where gpu-01's numbers come from.
    unrelated = [_target("blackbox", "gpu-01:9115"), _target("ipmi", "10.0.0.1:9290", node="gpu-01")]
    reading = await read_twice(hostile, fleet(["gpu-01:9400"]), fleet(["gpu-01:9400"]), unrelated)
    assert "gpu-01" in reading.nodes and "gpu-01" not in reading.down


async def test_the_exporter_a_node_s_numbers_come_from_being_down_marks_it(hostile: Hostile) -> None:
    # Its dcgm-exporter stops: the series vanish and the target is down.
    reading = await read_twice(hostile, fleet(["gpu-01:9400"]), fleet([]), [_target("dcgm", "gpu-01:9400")])
    assert reading.down["gpu-01"] == "dcgm target down: connection refused"


async def test_a_target_serving_several_nodes_down_marks_each_of_them(hostile: Hostile) -> None:
    # One federating dcgm target ("dcgm/fed:9400") carries both nodes' GPUs.
    def both(q: str) -> bytes:
        if "DCGM_FI_DEV_GPU_UTIL" in q:
            return ok(
                [
                    series({"Hostname": n, "gpu": "0", "job": "dcgm", "instance": "fed:9400"}, "10")
                    for n in ("gpu-01", "gpu-02")
                ]
            )
        return ok([])

    reading = await read_twice(hostile, both, lambda q: ok([]), [_target("dcgm", "fed:9400")])
    assert reading.down == {n: "dcgm target down: connection refused" for n in ("gpu-01", "gpu-02")}


async def test_a_node_with_no_numbers_is_marked_by_a_down_target_naming_it(hostile: Hostile) -> None:
    hostile.targets = [_target("node", "10.0.0.2:9100")]
    reading = await read_once(hostile)
    assert reading.down == {"gpu-02": "node target down: connection refused"}


async def test_sixty_thousand_gpu_labels_stop_at_the_cap_with_a_warning(hostile: Hostile) -> None:
    hostile.answer = fleet(["gpu-01:9400"], gpus=60_000)
    reading = await read_once(hostile)
    assert len(reading.nodes["gpu-01"].gpus) == MAX_GPUS_PER_NODE
    assert reading.warnings == (f"gpu-01: 59,936 GPU series skipped (gpu label 64 outside 0-{MAX_GPUS_PER_NODE - 1})",)


async def test_a_device_flood_and_an_oversized_answer_are_cut_with_a_warning(
    hostile: Hostile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prom, "MAX_SERIES_PER_QUERY", 5_000)

    def answer(q: str) -> bytes:
        if "node_network" in q:
            devs = [f"veth{i}" for i in range(MAX_DEVICES_PER_NODE + 100)]
            return ok([series({"instance": "gpu-01:9100", "job": "node", "device": d, "lm": "rx"}, "1") for d in devs])
        if "DCGM_FI_DEV_GPU_TEMP" in q:
            return ok([series({"Hostname": "gpu-02", "gpu": "0"}, "40")] * 6_000)
        return ok([])

    hostile.answer = answer
    reading = await read_once(hostile)
    assert len(reading.nodes["gpu-01"].nics) == MAX_DEVICES_PER_NODE
    w = "\n".join(reading.warnings)
    assert f"gpu-01: 100 device series skipped (more than {MAX_DEVICES_PER_NODE} devices)" in w
    assert "Prometheus answer cut at 5,000 series: 6,000 series for max by (Hostname, gpu, job, instance)" in w


async def test_the_console_shows_the_conflict_on_the_node_and_a_cap_in_its_note(hostile: Hostile) -> None:
    # Through the hub, as the console and `top` see it: gpu-01 stale with the conflict named,
    # gpu-02 up with its numbers, and the cap hit on gpu-02 said in the source's note.
    def answer(q: str) -> bytes:
        if "DCGM_FI_DEV_GPU_UTIL" in q:
            two = [
                series({"Hostname": "gpu-01", "gpu": "0", "job": "dcgm", "instance": i}, "50") for i in ("a:1", "b:1")
            ]
            gpu02 = [
                series({"Hostname": "gpu-02", "gpu": str(i), "job": "dcgm", "instance": "c:1"}, "70") for i in (0, 99)
            ]
            return ok(two + gpu02)
        return ok([])

    hostile.answer = answer
    s = TelemetrySettings(
        source="prometheus", prometheus_url=hostile.url, prometheus_timeout=10, prometheus_interval=1, interval=0.2
    )
    hub = TelemetryHub(NodePool(NODES), s)
    await hub.start()
    try:
        for _ in range(200):
            snap = hub.snapshot()
            one, two = snap.node("gpu-01"), snap.node("gpu-02")
            if one and two and one.state == "stale" and two.state == "up":
                break
            await asyncio.sleep(0.05)
        assert one is not None and two is not None
        assert one.state == "stale" and (one.error or "").startswith("conflict: 2 dcgm-exporter sources claim")
        assert one.gpus == ()  # never merged
        assert [g.util_pct for g in two.gpus] == [70.0]
        assert snap.source_note == "gpu-02: 1 GPU series skipped (gpu label 99 outside 0-63)"
    finally:
        await hub.stop()


async def test_a_password_in_the_prometheus_url_is_never_in_its_errors() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    url = f"http://scraper:hunter2@127.0.0.1:{port}"
    src = PrometheusSource(TelemetrySettings(source="prometheus", prometheus_url=url, prometheus_timeout=5), NODES)
    try:
        with pytest.raises(PrometheusUnavailable) as exc:
            await src.read()
    finally:
        await src.close()
    msg = str(exc.value)
    assert msg.startswith(f"Prometheus http://scraper:***@127.0.0.1:{port} unreachable") and "hunter2" not in msg
