"""Slurm's output per shape, on recorded output: 22.05's JSON (recorded from this machine's real
slurmctld, ``openapi/v0.0.38``: a ``state`` word plus ``state_flags``), the text forms of the same
cluster (``scontrol show node/job -o -d``), and 23.02 and 24.05 JSON written from Slurm's documented
schema (``data_parser/v0.0.39`` and ``v0.0.41``: ``state`` a list, times as ``{"set", "number"}``).
Plus properties: hostile JSON never gives anything but one parse error or skipped records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.slurm.model import NodeState
from backend.slurm.parse import (
    SlurmParseError,
    gres_indices,
    node_state,
    parse_gres,
    parse_jobs_json,
    parse_jobs_text,
    parse_nodes_json,
    parse_nodes_text,
)

DATA = Path(__file__).parent / "data"


def read(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize(
    ("nodes_file", "parse", "shape"),
    [
        ("sinfo-22.05.json", parse_nodes_json, "v0.0.38"),
        ("scontrol-node-22.05.txt", parse_nodes_text, "text"),
    ],
)
def test_recorded_22_05_nodes(nodes_file: str, parse, shape: str) -> None:  # type: ignore[no-untyped-def]
    nodes, skipped = parse(read(nodes_file))
    assert skipped == []
    by = {n.name: n for n in nodes}
    assert [n.shape for n in nodes] == [shape] * 3
    # node-01 runs two jobs and was drained: DRAINING; node-02 idle and drained: DRAINED.
    assert by["node-01"].state == NodeState("allocated", frozenset({"DRAIN"}))
    assert by["node-01"].state.label == "draining" and by["node-01"].state.text() == "ALLOCATED+DRAIN"
    assert by["node-02"].state.label == "drained"
    assert by["node-03"].state.label == "down"
    assert by["node-01"].reason == "xid 79 [Xid 79 on GPU 1] | loadmaster:alice@ops | 2026-12-02T01:10Z"
    assert by["node-01"].reason_by == "root" and by["node-01"].reason_at is not None
    assert by["node-02"].reason == "bad ib link"
    assert by["node-01"].partitions == ("gpu",)
    assert by["node-01"].gpus == 4 and by["node-01"].gres_used == "gpu:3"
    assert by["node-01"].address == "127.0.0.1" and by["node-02"].address == "127.0.0.2"


def test_json_and_text_of_one_cluster_agree() -> None:
    j, _ = parse_nodes_json(read("sinfo-22.05.json"))
    t, _ = parse_nodes_text(read("scontrol-node-22.05.txt"))
    strip = [(n.name, n.state, n.reason, n.reason_by, n.reason_at, n.partitions, n.gres) for n in j]
    assert strip == [(n.name, n.state, n.reason, n.reason_by, n.reason_at, n.partitions, n.gres) for n in t]
    jj, _ = parse_jobs_json(read("squeue-22.05.json"))
    tj, _ = parse_jobs_text(read("scontrol-job-22.05.txt"))
    assert [(x.job_id, x.state, x.user, x.name, x.nodes, x.gpus, x.start_time) for x in jj] == [
        (x.job_id, x.state, x.user, x.name, x.nodes, x.gpus, x.start_time) for x in tj
    ]


@pytest.mark.parametrize(
    ("jobs_file", "parse"), [("squeue-22.05.json", parse_jobs_json), ("scontrol-job-22.05.txt", parse_jobs_text)]
)
def test_recorded_22_05_jobs_with_gpu_indices(jobs_file: str, parse) -> None:  # type: ignore[no-untyped-def]
    jobs, skipped = parse(read(jobs_file))
    assert skipped == []
    by = {j.job_id: j for j in jobs}
    assert by["1"].name == "train-llm" and by["1"].user == "root" and by["1"].state == "RUNNING"
    assert by["1"].gpus_on("node-01") == (0, 1)
    assert by["2"].gpus_on("node-01") == (2,)
    assert by["1"].elapsed(by["1"].start_time + 90) == 90  # type: ignore[operator]
    # A pending array stays one record in squeue: its id names the tasks.
    assert by["4_[0-3]"].state == "PENDING" and by["4_[0-3]"].nodes == () and by["4_[0-3]"].elapsed(0) is None


def test_23_02_shape() -> None:
    nodes, skipped = parse_nodes_json(read("sinfo-23.02.json"))
    assert skipped == []
    by = {n.name: n for n in nodes}
    assert {n.shape for n in nodes} == {"v0.0.39+"}
    assert by["gpu-001"].state.label == "draining"  # MIXED + DRAIN
    assert by["gpu-002"].state.label == "drained"  # IDLE + DRAIN
    assert by["gpu-003"].state.label == "down*"  # DOWN + NOT_RESPONDING
    assert by["gpu-004"].state.label == "allocated" and by["gpu-004"].reason_by is None
    assert by["gpu-001"].reason_by == "alice" and by["gpu-001"].reason_at == 1796174000
    assert by["gpu-001"].partitions == ("train", "debug")
    assert by["gpu-001"].gpus == 8 and by["gpu-001"].gpus_used_idx == (0, 1, 2, 3, 4, 5)
    assert by["gpu-002"].gpus_used_idx == ()
    jobs, skipped = parse_jobs_json(read("squeue-23.02.json"))
    assert skipped == []
    j = {x.job_id: x for x in jobs}
    assert j["812"].nodes == ("gpu-001", "gpu-004")
    assert j["812"].gpus_on("gpu-004") == tuple(range(8)) and j["812"].gpus_on("gpu-001") == (0, 1, 2, 3, 4, 5)
    assert j["812"].start_time == 1796170000
    assert j["900_5"].array_job_id == "900" and j["900_5"].array_task_id == "5"
    assert j["900_[6-9]"].state == "PENDING" and j["900_[6-9]"].reason == "Resources"


def test_24_05_shape() -> None:
    nodes, skipped = parse_nodes_json(read("sinfo-24.05.json"))
    assert skipped == []
    by = {n.name: n for n in nodes}
    assert by["gpu-101"].state.label == "draining"  # MIXED + DRAIN + COMPLETING
    assert by["gpu-102"].state.label == "drained"  # IDLE + DRAIN + REBOOT_REQUESTED
    assert by["gpu-101"].reason_at == 1796172600 and by["gpu-101"].reason_by == "erin"
    assert by["cpu-001"].state.label == "idle" and by["cpu-001"].reason_at is None and by["cpu-001"].gpus == 0
    jobs, _ = parse_jobs_json(read("squeue-24.05.json"))
    assert [(x.job_id, x.state) for x in jobs] == [("12001", "RUNNING"), ("12002", "PENDING")]
    assert jobs[0].gpus_on("gpu-101") == (3, 4)


def test_a_bad_record_is_skipped_with_one_line_the_rest_is_used() -> None:
    doc = json.loads(read("sinfo-22.05.json"))
    doc["nodes"][1]["state"] = {"nope": 1}
    doc["nodes"][2]["name"] = "../../etc\x1b[2J"
    nodes, skipped = parse_nodes_json(json.dumps(doc))
    assert [n.name for n in nodes] == ["node-01"]
    assert len(skipped) == 2 and all("\n" not in s and "\x1b" not in s for s in skipped)


def test_whole_document_errors_are_one_line() -> None:
    for bad in ("<html>", "[]", '{"nodes": 3}', "[" * 100000):
        with pytest.raises(SlurmParseError) as exc:
            parse_nodes_json(bad)
        assert "\n" not in str(exc.value)
    with pytest.raises(SlurmParseError, match="Invalid user"):
        parse_nodes_json('{"errors": [{"error": "Invalid user\\nline2"}], "nodes": []}')


def test_reason_control_characters_are_stripped() -> None:
    doc = json.loads(read("sinfo-22.05.json"))
    doc["nodes"][0]["reason"] = "bad\x1b[31m red\nnext"
    nodes, _ = parse_nodes_json(json.dumps(doc))
    assert "\x1b" not in nodes[0].reason and "\n" not in nodes[0].reason


def test_gres() -> None:
    assert [(g.name, g.type, g.count) for g in parse_gres("gpu:a100:8(S:0-1),nic:2")] == [
        ("gpu", "a100", 8),
        ("nic", None, 2),
    ]
    assert parse_gres("(null)") == ()
    assert gres_indices("gpu:a100:1(IDX:0),gpu:v100:2(IDX:3,5-6)") == (0, 3, 5, 6)
    assert gres_indices("gpu:3") is None
    assert gres_indices("gpu:0(IDX:N/A)") == ()


BASES = st.sampled_from(["idle", "allocated", "mixed", "down", "unknown"])
FLAGS = st.frozensets(st.sampled_from(["DRAIN", "COMPLETING", "NOT_RESPONDING", "REBOOT_REQUESTED", "MAINTENANCE"]))


@given(BASES, FLAGS)
def test_state_shapes_agree_and_draining_vs_drained(base: str, flags: frozenset[str]) -> None:
    old = node_state(base, sorted(flags))  # 22.05: word + state_flags
    new = node_state([base.upper(), *sorted(flags)])  # 23.02+: one list
    assert old == new
    busy = base in ("allocated", "mixed") or "COMPLETING" in flags
    if "DRAIN" in flags and base != "down":
        assert old.label.rstrip("*") == ("draining" if busy else "drained")
    assert not (old.drained and old.draining)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=6),
    max_leaves=30,
)
NODE_KEYS = ["name", "state", "state_flags", "reason", "reason_changed_at", "partitions", "gres", "gres_used", "cpus"]
JOB_KEYS = [
    "job_id",
    "name",
    "user_name",
    "job_state",
    "nodes",
    "start_time",
    "gres_detail",
    "array_job_id",
    "array_task_id",
]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.fixed_dictionaries({}, optional={k: JSON for k in NODE_KEYS}) | JSON, max_size=5))
def test_hostile_node_records_never_escape(records: list[object]) -> None:
    nodes, skipped = parse_nodes_json(json.dumps({"nodes": records}))
    assert len(nodes) + len(skipped) <= len(records)
    assert all("\n" not in s for s in skipped)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.fixed_dictionaries({}, optional={k: JSON for k in JOB_KEYS}) | JSON, max_size=5))
def test_hostile_job_records_never_escape(records: list[object]) -> None:
    jobs, skipped = parse_jobs_json(json.dumps({"jobs": records}))
    assert len(jobs) + len(skipped) == len(records)


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=300))
def test_hostile_text_lines_never_escape(text: str) -> None:
    for parse in (parse_nodes_text, parse_jobs_text):
        out, skipped = parse(text)
        assert all("\n" not in s for s in skipped)
