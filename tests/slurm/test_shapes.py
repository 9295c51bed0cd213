"""One cluster in every JSON shape Slurm 22.05 .. 25.05 prints, read into the same model.

The records below are literal JSON written field by field from SchedMD's own source (github
SchedMD/slurm, the release tags named): the ``data_parser`` parsers (``src/plugins/data_parser/
v0.0.4x/parsers.c``: ``PARSER_ARRAY(NODE)``, ``PARSER_ARRAY(JOB_INFO)``, ``PARSER_FLAG_ARRAY(
NODE_STATES)``/``(JOB_STATE)``, ``DUMP_FUNC(UINT32_NO_VAL)``, ``DUMP_FUNC(JOB_STATE)``), the
commands that print them (``src/sinfo/sinfo.c``, ``src/squeue/squeue.c``, ``src/scontrol/
info_node.c``) and 22.05's ``src/plugins/openapi/v0.0.38/{nodes,jobs}.c``. Only the fields
loadmaster reads (and a few it must ignore) are written out.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from backend.slurm.client import SlurmClient
from backend.slurm.parse import SinfoGrouped, parse_jobs_json, parse_nodes_json
from backend.slurm.settings import SlurmSettings


def unset() -> dict[str, Any]:
    return {"set": False, "infinite": False, "number": 0}


def val(n: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": n}


REASON = "xid 79 | loadmaster:alice@ops | 2026-12-02T01:10Z"

# -- nodes --------------------------------------------------------------------------------------

# 22.05 (openapi/v0.0.38 nodes.c _dump_node): "state" a lower-case base word, "state_flags" the
# flags (node_state_flag_string_single), reason_changed_at a plain int, partitions a list.
NODES_22_05: dict[str, Any] = {
    "meta": {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"}},
    "errors": [],
    "nodes": [
        {
            "name": "gpu-001",
            "state": "mixed",
            "state_flags": ["DRAIN"],
            "cpus": 64,
            "gres": "gpu:h100:8(S:0-1)",
            "gres_used": "gpu:h100:6(IDX:0-5)",
            "partitions": ["train", "debug"],
            "address": "10.0.0.1",
            "hostname": "gpu-001",
            "reason": REASON,
            "reason_changed_at": 1796174000,
            "reason_set_by_user": "alice",
        },
        {
            "name": "gpu-002",
            "state": "idle",
            "state_flags": ["FAIL"],
            "cpus": 64,
            "gres": "gpu:h100:8(S:0-1)",
            "gres_used": "gpu:h100:0(IDX:N/A)",
            "partitions": ["train"],
            "address": "10.0.0.2",
            "hostname": "gpu-002",
            "reason": "",
            "reason_changed_at": 0,
            "reason_set_by_user": "",
        },
        {
            "name": "gpu-003",
            "state": "idle",
            "state_flags": ["MAINTENANCE", "NOT_RESPONDING"],
            "cpus": 64,
            "gres": "gpu:h100:8(S:0-1)",
            "gres_used": "gpu:h100:0(IDX:N/A)",
            "partitions": ["train"],
            "address": "10.0.0.3",
            "hostname": "gpu-003",
            "reason": "",
            "reason_changed_at": 0,
            "reason_set_by_user": "",
        },
    ],
}

# 23.02 (data_parser/v0.0.39, scontrol show node --json, info_node.c DATA_DUMP_CLI(NODES, "nodes")):
# "state" the NODES_STATES flag array (base first), reason_changed_at UINT64 (plain), partitions
# CSV_LIST, reason_set_by_user USER_ID (a name, "" when unknown), next_state_after_reboot
# ["INVALID"] (NO_VAL).
NODES_23_02: dict[str, Any] = {
    "meta": {
        "plugin": {"type": "openapi/v0.0.39", "name": "Slurm OpenAPI v0.0.39", "data_parser": "data_parser/v0.0.39"},
        "Slurm": {"version": {"major": 23, "micro": 8, "minor": 2}, "release": "23.02.8"},
    },
    "errors": [],
    "warnings": [],
    "nodes": [
        {
            "name": "gpu-001",
            "state": ["MIXED", "DRAIN"],
            "cpus": 64,
            "gres": "gpu:h100:8(S:0-1)",
            "gres_used": "gpu:h100:6(IDX:0-5)",
            "partitions": ["train", "debug"],
            "address": "10.0.0.1",
            "hostname": "gpu-001",
            "reason": REASON,
            "reason_changed_at": 1796174000,
            "reason_set_by_user": "alice",
            "next_state_after_reboot": ["INVALID"],
        },
        {
            "name": "gpu-002",
            "state": ["IDLE", "FAIL"],
            "cpus": 64,
            "gres": "gpu:h100:8(S:0-1)",
            "gres_used": "gpu:h100:0(IDX:N/A)",
            "partitions": ["train"],
            "address": "10.0.0.2",
            "hostname": "gpu-002",
            "reason": "",
            "reason_changed_at": 0,
            "reason_set_by_user": "",
            "next_state_after_reboot": ["INVALID"],
        },
        {
            "name": "gpu-003",
            "state": ["IDLE", "NOT_RESPONDING", "MAINTENANCE"],
            "cpus": 64,
            "gres": "gpu:h100:8(S:0-1)",
            "gres_used": "gpu:h100:0(IDX:N/A)",
            "partitions": ["train"],
            "address": "10.0.0.3",
            "hostname": "gpu-003",
            "reason": "",
            "reason_changed_at": 0,
            "reason_set_by_user": "",
            "next_state_after_reboot": ["INVALID"],
        },
    ],
}


def nodes_23_11_on(version: str, parser: str) -> dict[str, Any]:
    """23.11 .. 25.05 (data_parser v0.0.40 .. v0.0.43, OPENAPI_NODES_RESP): as 23.02 but
    reason_changed_at and resume_after are TIMESTAMP_NO_VAL objects, and the meta block names the
    release with strings; ``last_update`` beside ``nodes``."""
    major, minor = version.split(".")
    doc = copy.deepcopy(NODES_23_02)
    doc["meta"] = {
        "plugin": {"type": "", "name": "", "data_parser": parser, "accounting_storage": ""},
        "client": {"source": "/dev/pts/0", "user": "root", "group": "root"},
        "command": ["show", "node"],
        "slurm": {
            "version": {"major": major, "micro": "1", "minor": minor},
            "release": f"{version}.1",
            "cluster": "lab",
        },
    }
    doc["last_update"] = val(1796174100)
    for n in doc["nodes"]:
        n["reason_changed_at"] = val(n["reason_changed_at"]) if n["reason_changed_at"] else unset()
        n["resume_after"] = unset()
    return doc


NODE_DOCS = {
    "22.05": NODES_22_05,
    "23.02": NODES_23_02,
    "23.11": nodes_23_11_on("23.11", "data_parser/v0.0.40"),
    "24.05": nodes_23_11_on("24.05", "data_parser/v0.0.41"),
    "24.11": nodes_23_11_on("24.11", "data_parser/v0.0.42"),
    "25.05": nodes_23_11_on("25.05", "data_parser/v0.0.43"),
}

# -- jobs ---------------------------------------------------------------------------------------

# 22.05 (openapi/v0.0.38 jobs.c): job_state a word (job_state_string: COMPLETING wins over the
# base), array_job_id a plain int (0: none), array_task_id null when NO_VAL, times plain ints.
JOBS_22_05: dict[str, Any] = {
    "meta": {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"}},
    "errors": [],
    "jobs": [
        {
            "job_id": 812,
            "name": "train",
            "user_name": "carol",
            "user_id": 1001,
            "job_state": "RUNNING",
            "partition": "train",
            "nodes": "gpu-[001-002]",
            "start_time": 1796170000,
            "state_reason": "None",
            "gres_detail": ["gpu:h100:6(IDX:0-5)", "gpu:h100:8(IDX:0-7)"],
            "array_job_id": 0,
            "array_task_id": None,
            "array_task_string": "",
            "requeue": True,
        },
        {
            "job_id": 813,
            "name": "eval",
            "user_name": "dave",
            "user_id": 1002,
            "job_state": "COMPLETING",
            "partition": "train",
            "nodes": "gpu-003",
            "start_time": 1796171000,
            "state_reason": "None",
            "gres_detail": ["gpu:h100:1(IDX:7)"],
            "array_job_id": 0,
            "array_task_id": None,
            "array_task_string": "",
            "requeue": False,
        },
        {
            "job_id": 905,
            "name": "sweep",
            "user_name": "erin",
            "user_id": 1003,
            "job_state": "RUNNING",
            "partition": "train",
            "nodes": "gpu-003",
            "start_time": 1796172000,
            "state_reason": "None",
            "gres_detail": ["gpu:h100:1(IDX:0)"],
            "array_job_id": 900,
            "array_task_id": 5,
            "array_task_string": "",
            "requeue": True,
        },
        {
            "job_id": 900,
            "name": "sweep",
            "user_name": "erin",
            "user_id": 1003,
            "job_state": "PENDING",
            "partition": "train",
            "nodes": "",
            "start_time": 0,
            "state_reason": "Resources",
            "gres_detail": [],
            "array_job_id": 900,
            "array_task_id": None,
            "array_task_string": "6-9",
            "requeue": True,
        },
    ],
}

# 23.02 (data_parser/v0.0.39, squeue.c DATA_DUMP_CLI(JOB_INFO_MSG, "jobs")): job_state still one
# string (DUMP_FUNC(JOB_STATE) = job_state_string), array ids UINT32_NO_VAL objects, start_time
# UINT64 (plain), requeue BOOL16.
JOBS_23_02 = copy.deepcopy(JOBS_22_05)
JOBS_23_02["meta"] = NODES_23_02["meta"]
JOBS_23_02["warnings"] = []
for _j in JOBS_23_02["jobs"]:
    _j["array_job_id"] = val(_j["array_job_id"])
    _j["array_task_id"] = unset() if _j["array_task_id"] is None else val(_j["array_task_id"])


def jobs_23_11_on(version: str, parser: str) -> dict[str, Any]:
    """23.11 .. 25.05 (v0.0.40 .. v0.0.43, OPENAPI_JOB_INFO_RESP): job_state the JOB_STATE flag
    array (a base state and flags: a completing job is ["COMPLETED", "COMPLETING"]), start_time a
    TIMESTAMP_NO_VAL object, ``last_backfill``/``last_update`` beside ``jobs``."""
    doc = copy.deepcopy(JOBS_23_02)
    doc["meta"] = nodes_23_11_on(version, parser)["meta"]
    doc["last_backfill"] = val(1796174000)
    doc["last_update"] = val(1796174100)
    states = {812: ["RUNNING"], 813: ["COMPLETED", "COMPLETING"], 905: ["RUNNING"], 900: ["PENDING"]}
    for j in doc["jobs"]:
        j["job_state"] = states[j["job_id"]]
        j["start_time"] = val(j["start_time"])  # a pending job's expected start; 0 when unknown
    return doc


JOB_DOCS = {
    "22.05": JOBS_22_05,
    "23.02": JOBS_23_02,
    "23.11": jobs_23_11_on("23.11", "data_parser/v0.0.40"),
    "24.05": jobs_23_11_on("24.05", "data_parser/v0.0.41"),
    "24.11": jobs_23_11_on("24.11", "data_parser/v0.0.42"),
    "25.05": jobs_23_11_on("25.05", "data_parser/v0.0.43"),
}


def node_model(doc: dict[str, Any]) -> list[tuple[object, ...]]:
    nodes, skipped = parse_nodes_json(json.dumps(doc))
    assert skipped == []
    return [
        (
            n.name,
            n.state,
            n.state.label,
            n.state.unavailable,
            n.reason,
            n.reason_by,
            n.reason_at,
            n.partitions,
            n.gres,
            n.gpus_used_idx,
            n.cpus,
            n.address,
        )
        for n in nodes
    ]


def job_model(doc: dict[str, Any]) -> list[tuple[object, ...]]:
    jobs, skipped = parse_jobs_json(json.dumps(doc))
    assert skipped == []
    return [
        (
            j.job_id,
            j.state,
            j.ended,
            j.user,
            j.nodes,
            j.gpus,
            j.start_time,
            j.array_job_id,
            j.array_task_id,
            j.requeue,
            j.reason,
        )
        for j in jobs
    ]


@pytest.mark.parametrize("version", sorted(NODE_DOCS))
def test_every_release_reads_into_the_same_nodes(version: str) -> None:
    assert node_model(NODE_DOCS[version]) == node_model(NODES_22_05)
    by = {row[0]: row for row in node_model(NODE_DOCS[version])}
    assert by["gpu-001"][2:4] == ("draining", True) and by["gpu-001"][6] == 1796174000.0
    # FAIL, MAINTENANCE and NOT_RESPONDING are never "idle", and never available.
    assert by["gpu-002"][2:4] == ("fail", True)
    assert by["gpu-003"][2:4] == ("maint*", True)


@pytest.mark.parametrize("version", sorted(JOB_DOCS))
def test_every_release_reads_into_the_same_jobs(version: str) -> None:
    assert job_model(JOB_DOCS[version]) == job_model(JOBS_22_05)
    by = {row[0]: row for row in job_model(JOB_DOCS[version])}
    # A completing job still holds its node: not "COMPLETED" (ended) because its list starts so.
    assert by["813"][1:3] == ("COMPLETING", False)
    assert by["900_5"][7:9] == ("900", "5")
    assert by["900_[6-9]"][1] == "PENDING" and by["900_[6-9]"][6] is None and by["900_[6-9]"][4] == ()
    assert by["812"][4] == ("gpu-001", "gpu-002") and by["812"][5] == (
        ("gpu-001", tuple(range(6))),
        ("gpu-002", tuple(range(8))),
    )


def test_job_state_lists_reduce_like_job_state_string() -> None:
    """src/common/slurm_protocol_defs.c job_state_string: the first flag of COMPLETING, STAGE_OUT,
    CONFIGURING, RESIZING, REQUEUED, ... names the state; else the base."""
    cases = {
        ("RUNNING", "CONFIGURING"): "CONFIGURING",
        ("PENDING", "REQUEUED"): "REQUEUED",
        ("CANCELLED", "COMPLETING"): "COMPLETING",
        ("FAILED", "REQUEUED", "COMPLETING"): "COMPLETING",
        ("RUNNING", "SIGNALING"): "SIGNALING",
        ("PENDING",): "PENDING",
    }
    for words, want in cases.items():
        doc = copy.deepcopy(JOB_DOCS["24.11"])
        doc["jobs"] = [dict(doc["jobs"][0], job_state=list(words))]
        jobs, skipped = parse_jobs_json(json.dumps(doc))
        assert skipped == [] and jobs[0].state == want, words


# -- what cannot be read: one line naming the field, never a sentinel read as a number ------------


def one_job(**fields: Any) -> tuple[list[Any], list[str]]:
    rec = dict(JOB_DOCS["24.05"]["jobs"][0])
    rec.update(fields)
    return parse_jobs_json(json.dumps({"jobs": [rec]}))


def one_node(**fields: Any) -> tuple[list[Any], list[str]]:
    rec = dict(NODE_DOCS["24.05"]["nodes"][0])
    rec.update(fields)
    return parse_nodes_json(json.dumps({"nodes": [rec]}))


@pytest.mark.parametrize(
    "fields",
    [
        {"array_job_id": 4294967294, "array_task_id": 4294967294},  # plain NO_VAL (22.05-style ints)
        {"array_job_id": {"set": False, "infinite": True, "number": 0}, "array_task_id": unset()},
        {"array_job_id": val(0), "array_task_id": 4294967295},  # INFINITE
    ],
)
def test_no_val_sentinels_are_unset_not_numbers(fields: dict[str, Any]) -> None:
    jobs, skipped = one_job(**fields)
    assert skipped == []
    assert jobs[0].job_id == "812" and jobs[0].array_job_id is None and jobs[0].array_task_id is None


@pytest.mark.parametrize("value", [4294967294, 4294967295, 18446744073709551614, val(4294967294), 0, unset()])
def test_no_val_times_are_unknown(value: object) -> None:
    jobs, skipped = one_job(start_time=value)
    assert skipped == [] and jobs[0].start_time is None and jobs[0].elapsed(2e9) is None
    nodes, skipped = one_node(reason_changed_at=value)
    assert skipped == [] and nodes[0].reason_at is None


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"start_time": -5}, "start_time: not a time"),
        ({"start_time": {"number": 5}}, "start_time: a NO_VAL object"),
        ({"start_time": {"set": True, "infinite": False}}, "start_time: 'set' is true"),
        ({"job_state": []}, "job_state: unreadable job state"),
        ({"job_state": ["COMPLETING"]}, "job_state: no base job state"),
        ({"job_state": ["RUNNING", "FAILED"]}, "job_state: more than one base job state"),
        ({"nodes": "gpu-[001-"}, "nodes: unreadable node list"),
        ({"nodes": 7}, "nodes: expected a node list"),
        ({"job_id": val(-3)}, "job_id: unreadable id"),
        ({"job_id": unset()}, "job_id: missing or unset"),
        ({"user_name": 1001}, "user_name: expected text"),
        ({"gres_detail": "gpu:1(IDX:0)"}, "gres_detail: not a list"),
    ],
)
def test_an_unreadable_job_field_is_named_in_one_line(fields: dict[str, Any], named: str) -> None:
    jobs, skipped = one_job(**fields)
    assert jobs == [] and len(skipped) == 1 and named in skipped[0] and "\n" not in skipped[0], skipped


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"cpus": {"set": "yes", "number": 64}}, "cpus: a NO_VAL object"),
        ({"cpus": -1}, "cpus: out of range"),
        ({"cpus": 65534}, "cpus: out of range"),  # NO_VAL16
        ({"state": ["IDLE", "DOWN"]}, "state: two base states"),
        ({"state": ["INVALID"]}, "state: no base state"),
        ({"state": ["DRAIN"]}, "state: no base state"),
        ({"reason_changed_at": val(-1)}, "reason_changed_at: not a time"),
        ({"gres": "gpu:h100:4294967294"}, "gres: GRES count 4294967294"),
        ({"gres": "gpu:h100:x:y"}, "gres: unreadable GRES"),
        ({"partitions": 3}, "partitions: not a list"),
    ],
)
def test_an_unreadable_node_field_is_named_in_one_line(fields: dict[str, Any], named: str) -> None:
    nodes, skipped = one_node(**fields)
    assert nodes == [] and len(skipped) == 1 and named in skipped[0] and "\n" not in skipped[0], skipped


@pytest.mark.parametrize("value", ["true", "yes", 1, {"set": True, "number": 1}, None])
def test_requeue_is_true_only_when_slurm_says_true(value: object) -> None:
    """BOOL16 is JSON true/false; anything else proves nothing, so drain --now refuses the job."""
    jobs, skipped = one_job(requeue=value)
    assert skipped == [] and jobs[0].requeue is False


def test_errors_name_slurms_description() -> None:
    """23.02+ errors: {"description", "error_number", "error", "source"} (OPENAPI_ERRORS)."""
    from backend.slurm.parse import SlurmParseError

    doc = {
        "errors": [
            {
                "description": "Unable to query nodes",
                "error_number": 1007,
                "error": "Protocol authentication error",
                "source": "slurm_load_node",
            }
        ],
        "nodes": [],
    }
    with pytest.raises(SlurmParseError, match="Unable to query nodes - Protocol authentication error"):
        parse_nodes_json(json.dumps(doc))


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("gres/gpu:h100:8", [("gpu", "h100", 8)]),
        ("gpu:8(S:0-1)", [("gpu", None, 8)]),
        ("gpu:h100:4(S:0),gpu:a100:2(S:1)", [("gpu", "h100", 4), ("gpu", "a100", 2)]),
        ("gpu:h100:no_consume:2", [("gpu", "h100", 2)]),
        ("gpu:3g.20gb:2(S:0-1)", [("gpu", "3g.20gb", 2)]),
        ("gpu:3g.20gb", [("gpu", "3g.20gb", 1)]),
        ("mps:1K", [("mps", None, 1024)]),
        ("gpu:h100:8(S:0,1)", [("gpu", "h100", 8)]),
    ],
)
def test_gres_spellings(text: str, want: list[tuple[str, str | None, int]]) -> None:
    from backend.slurm.parse import parse_gres

    assert [(g.name, g.type, g.count) for g in parse_gres(text)] == want


# -- sinfo --json of 23.02+ is grouped: the client reads scontrol show node --json ---------------

# 24.05 sinfo --json (sinfo.c DATA_DUMP_CLI_SINGLE(OPENAPI_SINFO_RESP), parsers.c
# PARSER_ARRAY(SINFO_DATA)): one record per partition/state group, no "nodes" list.
SINFO_24_05: dict[str, Any] = {
    "meta": NODE_DOCS["24.05"]["meta"],
    "errors": [],
    "warnings": [],
    "sinfo": [
        {
            "port": 6818,
            "node": {"state": ["MIXED", "DRAIN"]},
            "nodes": {
                "allocated": 1,
                "idle": 0,
                "other": 0,
                "total": 1,
                "hostnames": ["gpu-001"],
                "addresses": ["10.0.0.1"],
                "nodes": ["gpu-001"],
            },
            "cpus": {"allocated": 48, "idle": 16, "other": 0, "total": 64},
            "gres": {"total": "gpu:h100:8(S:0-1)", "used": "gpu:h100:6(IDX:0-5)"},
            "reason": {"description": REASON, "time": 1796174000, "user": "alice"},
            "partition": {"name": "train"},
        },
    ],
}


def test_grouped_sinfo_is_refused_by_the_parser() -> None:
    with pytest.raises(SinfoGrouped, match="scontrol show node --json"):
        parse_nodes_json(json.dumps(SINFO_24_05))


def test_client_reads_scontrol_where_sinfo_is_grouped(tmp_path: Path) -> None:
    b = tmp_path / "bin"
    b.mkdir()
    (tmp_path / "sinfo.json").write_text(json.dumps(SINFO_24_05))
    (tmp_path / "nodes.json").write_text(json.dumps(NODE_DOCS["24.05"]))
    calls = tmp_path / "calls"
    for name, body in {
        "sinfo": f'echo sinfo "$@" >> {calls}; cat {tmp_path / "sinfo.json"}',
        "scontrol": f'echo scontrol "$@" >> {calls}; [ "$3" = --json ] && exec cat {tmp_path / "nodes.json"}; exit 1',
    }.items():
        (b / name).write_text("#!/bin/sh\n" + body + "\n")
        (b / name).chmod(0o755)
    client = SlurmClient(SlurmSettings(enabled=True, bin_dir=str(b), timeout=5.0))
    nodes, skipped = asyncio.run(client.nodes())
    assert skipped == [] and [n.name for n in nodes] == ["gpu-001", "gpu-002", "gpu-003"]
    assert nodes[0].reason_by == "alice" and nodes[0].state.label == "draining"
    nodes2, _ = asyncio.run(client.nodes())  # remembered: scontrol only from now on
    assert nodes2 == nodes
    assert calls.read_text().splitlines() == ["sinfo --json", "scontrol show node --json", "scontrol show node --json"]
