"""The Prometheus source's fast paths say what its generic paths say, for any answer.

- :func:`honest_vector` (one typed decode of an honest instant vector) gives what ``json.loads``
  and :func:`vector_of` give, and hands everything else (an error, another result type, a label or
  a value of the wrong type, not JSON) back to the generic path, which judges it series by series.
- The DCGM answers' per-refresh memo (what a set of labels comes to, worked out once for the seven
  fields) lands each value where a series-by-series reading of the same answers does, counts the
  same skipped series and sees the same conflicts.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.config import Node
from backend.telemetry import prometheus as prom
from backend.telemetry.prometheus import (
    DCGM_FIELDS,
    MAX_GPUS_PER_NODE,
    PrometheusSource,
    PrometheusUnavailable,
    api_data,
    honest_vector,
    vector_of,
)
from backend.telemetry.settings import TelemetrySettings

_TEXT = st.text(max_size=6)
_LABEL_VALUE = st.one_of(_TEXT, _TEXT, st.integers(), st.none(), st.lists(_TEXT, max_size=2))
_VALUE_TEXT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e400", "12", "0.5", "abc", "", "1_000"]),
)
_SAMPLE = st.one_of(
    st.tuples(st.floats(0, 2e9), _VALUE_TEXT).map(list),
    st.tuples(st.floats(0, 2e9), st.floats(allow_nan=False)).map(list),  # a number, not text
    st.lists(_TEXT, max_size=3),
)
_SERIES = st.one_of(
    st.fixed_dictionaries(
        {"metric": st.dictionaries(_TEXT, _TEXT, max_size=4), "value": st.tuples(st.floats(0, 2e9), _VALUE_TEXT)}
    ),
    st.fixed_dictionaries({"metric": st.dictionaries(_TEXT, _LABEL_VALUE, max_size=4), "value": _SAMPLE}),
    st.fixed_dictionaries({"metric": st.dictionaries(_TEXT, _TEXT, max_size=2)}),  # no value
    st.integers(),
)
_ANSWER = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["success", "success", "success", "error"]),
        "data": st.fixed_dictionaries(
            {"resultType": st.sampled_from(["vector", "vector", "matrix"]), "result": st.lists(_SERIES, max_size=8)}
        ),
    },
    optional={"warnings": st.lists(_TEXT, max_size=2), "error": _LABEL_VALUE},
)


def generic(body: bytes, cut: list[str]) -> prom.Columns | str:
    """What the generic path makes of ``body``: the series, or the one-line refusal."""
    try:
        return prom.columns_of(vector_of(api_data(json.loads(body), "Prometheus", "/api/v1/query"), "q", cut))
    except PrometheusUnavailable as exc:
        return str(exc)


@given(_ANSWER)
@settings(max_examples=300)
def test_an_honest_vector_decodes_as_the_generic_path_and_the_rest_falls_to_it(answer: dict[str, Any]) -> None:
    body = json.dumps(answer).encode()
    fast_cut: list[str] = []
    slow_cut: list[str] = []
    fast = honest_vector(body, "q", fast_cut)
    slow = generic(body, slow_cut)
    honest = (
        answer["status"] == "success"
        and answer["data"]["resultType"] == "vector"
        and all(
            isinstance(s, dict)
            and all(type(x) is str for x in s["metric"].values())
            and [type(x) for x in s.get("value", ())] == [float, str]
            for s in answer["data"]["result"]
        )
    )
    assert (fast is not None) == honest, body  # anything else is left to the generic path
    if fast is not None:
        assert (fast, fast_cut) == (slow, slow_cut)
        assert all(
            math.isfinite(v) and all(type(x) is str for x in labels.values()) for labels, v in zip(*fast, strict=True)
        )


_HONEST = st.lists(
    st.fixed_dictionaries(
        {"metric": st.dictionaries(_TEXT, _TEXT, max_size=4), "value": st.tuples(st.floats(0, 2e9), _VALUE_TEXT)}
    ),
    max_size=12,
).map(lambda result: {"status": "success", "data": {"resultType": "vector", "result": result}})


@given(_HONEST)
def test_every_honest_vector_takes_the_typed_path_with_the_same_series(answer: dict[str, Any]) -> None:
    """NaN, infinities and text that is not a number skipped; every label kept as text."""
    body = json.dumps(answer).encode()
    fast_cut: list[str] = []
    assert honest_vector(body, "q", fast_cut) == generic(body, []) and fast_cut == []


def test_an_honest_vector_is_cut_at_the_series_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prom, "MAX_SERIES_PER_QUERY", 3)
    result = [{"metric": {"gpu": str(i)}, "value": [1.0, str(i)]} for i in range(5)]
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
    cut: list[str] = []
    got = honest_vector(body, "max(x)", cut)
    assert got == ([{"gpu": str(i)} for i in range(3)], [float(i) for i in range(3)])
    assert cut == ["5 series for max(x)"]


def test_what_is_not_an_honest_vector_is_left_to_the_generic_path() -> None:
    def answer(series: list[Any], status: str = "success", kind: str = "vector") -> bytes:
        return json.dumps({"status": status, "data": {"resultType": kind, "result": series}}).encode()

    assert honest_vector(answer([{"metric": {"a": "b"}, "value": [1.0, "2"]}]), "q", []) == ([{"a": "b"}], [2.0])
    for body in (
        answer([{"metric": {"a": ["b"]}, "value": [1.0, "2"]}]),  # a label that is not text
        answer([{"metric": {"a": "b"}, "value": [1.0, 2]}]),  # a value that is not text
        answer([{"metric": {"a": "b"}, "values": [[1.0, "2"]]}], kind="matrix"),
        answer([], status="error"),
        b'{"status":"error","errorType":"bad_data","error":"parse error"}',
        b"[" * 100_000 + b"]" * 100_000,
        b"<html>502</html>",
    ):
        assert honest_vector(body, "q", []) is None, body


# -- the DCGM memo against a series-by-series reading ---------------------------------------------

NODES = [Node(name="gpu-01", host="10.0.0.1"), Node(name="gpu-02", host="10.0.0.2")]
_HOSTNAME = st.sampled_from(["gpu-01", "gpu-02", "10.0.0.1", "gpu-01:9400", "other", ""]) | st.just(["gpu-01"])
_GPU = st.sampled_from(["0", "1", "7", "07", "63", "64", "-1", "x", ""]) | st.integers(0, 70) | st.none()
_SOURCE = st.sampled_from(["dcgm", "node"]) | st.just(["dcgm"])
_DCGM_SERIES = st.tuples(
    st.sampled_from(range(len(DCGM_FIELDS))),
    st.fixed_dictionaries(
        {"Hostname": _HOSTNAME, "gpu": _GPU},
        optional={"job": _SOURCE, "instance": st.sampled_from(["a:9400", "b:9400"]) | st.just({"x": 1})},
    ),
    st.integers(0, 100).map(float),
)


class Recorded:
    """An :class:`~backend.telemetry.prometheus.ApiClient` that answers each DCGM field's query
    with the series given for it, and nothing else."""

    def __init__(self, series: list[tuple[int, dict[str, Any], float]]) -> None:
        self.cut: list[str] = []
        self.series = series

    async def columns(self, expr: str) -> prom.Columns:
        mine = [(labels, v) for f, labels, v in self.series if expr.endswith(f"({DCGM_FIELDS[f]})")]
        return prom.columns_of(mine)

    async def targets(self) -> list[dict[str, Any]]:
        return []

    async def close(self) -> None:
        pass


def one_by_one(
    series: list[tuple[int, dict[str, Any], float]],
) -> tuple[dict[str, dict[int, dict[str, float]]], dict[str, int], set[str]]:
    """A reading of each series on its own: the node's GPU fields (the last value wins), the GPU
    series skipped a node (an index past the cap) and the nodes two sources claim."""
    index = prom.NodeIndex(NODES)
    gpus: dict[str, dict[int, dict[str, float]]] = {}
    skipped: dict[str, int] = {}
    sources: dict[str, set[str]] = {}
    for f in range(len(DCGM_FIELDS)):  # the source reads the fields in this order
        for g, labels, v in series:
            node = index.find(labels.get("Hostname"))
            if g != f or node is None:
                continue
            try:
                idx = int(labels.get("gpu", ""))
            except (TypeError, ValueError):
                continue
            if not 0 <= idx < MAX_GPUS_PER_NODE:
                skipped[node] = skipped.get(node, 0) + 1
                continue
            sources.setdefault(node, set()).add(prom._source(labels))
            gpus.setdefault(node, {}).setdefault(idx, {})[DCGM_FIELDS[f]] = v
    return gpus, skipped, {n for n, s in sources.items() if len(s) > 1}


@given(st.lists(_DCGM_SERIES, max_size=30))
@settings(max_examples=200, deadline=None)
def test_the_dcgm_memo_reads_as_each_series_on_its_own(series: list[tuple[int, dict[str, Any], float]]) -> None:
    import asyncio

    source = PrometheusSource(
        TelemetrySettings(source="prometheus", prometheus_url="http://127.0.0.1:9"), NODES, Recorded(series)
    )
    reading = asyncio.run(source.read())
    gpus, skipped, conflicts = one_by_one(series)
    assert set(reading.conflicts) == conflicts
    for node, fields in gpus.items():
        if node in conflicts:
            assert node not in reading.nodes
            continue
        got = {g.index: (g.util_pct, g.temp_c, g.power_w) for g in reading.nodes[node].gpus}
        want = {
            i: tuple(f.get(k) for k in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"))
            for i, f in fields.items()
        }
        assert got == want
    assert {w.split(":")[0]: int(w.split(": ")[1].split()[0]) for w in reading.warnings} == skipped


def test_a_node_whose_numbers_did_not_change_keeps_its_observed_and_a_change_is_seen() -> None:
    import asyncio

    first = [(0, {"Hostname": "gpu-01", "gpu": str(i), "job": "dcgm", "instance": "a:9400"}, 50.0) for i in range(2)]
    first.append((0, {"Hostname": "gpu-02", "gpu": "0", "job": "dcgm", "instance": "b:9400"}, 10.0))
    client = Recorded(first)
    source = PrometheusSource(
        TelemetrySettings(source="prometheus", prometheus_url="http://127.0.0.1:9"), NODES, client
    )
    one = asyncio.run(source.read())
    two = asyncio.run(source.read())  # the same answers
    assert two.nodes["gpu-01"] is one.nodes["gpu-01"] and two.nodes["gpu-02"] is one.nodes["gpu-02"]
    client.series = [*first[:2], (first[2][0], first[2][1], 11.0)]  # gpu-02's GPU moved
    three = asyncio.run(source.read())
    assert three.nodes["gpu-01"] is one.nodes["gpu-01"]
    assert three.nodes["gpu-02"] is not one.nodes["gpu-02"]
    assert [g.util_pct for g in three.nodes["gpu-02"].gpus] == [11.0]
    client.series = first[:1]  # gpu-01's second GPU is gone from the answer
    four = asyncio.run(source.read())
    assert [g.index for g in four.nodes["gpu-01"].gpus] == [0] and "gpu-02" not in four.nodes
