"""A pull job's spec params are read once, with checks (backend.pulls.params, #30): a malformed
spec is a one-line JobError naming the field, never a traceback from deep in the copy."""

from __future__ import annotations

import pytest

from backend.agent.context import JobContext
from backend.errors import JobError
from backend.pulls.job import cleanup, run_pull_job
from backend.pulls.params import read_params

GOOD: dict[str, object] = {
    "src": "s3://b/p/*",
    "dest": "/tmp/x",
    "numworkers": 8,
    "concurrency": 4,
    "part_size_mib": 16,
    "store": "lab",  # not the pull job's: left to its readers
    "bytes_total": 10,
}


def test_a_good_spec_reads_as_written_and_null_is_absent() -> None:
    p = read_params({**GOOD, "region": None, "endpoint_url": "http://h:1", "expected": [["a", 1]], "pipeline": True})
    assert p == {
        "src": "s3://b/p/*",
        "dest": "/tmp/x",
        "numworkers": 8,
        "concurrency": 4,
        "part_size_mib": 16,
        "endpoint_url": "http://h:1",
        "expected": [["a", 1]],
        "pipeline": True,
    }


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"src": None}, "params.src is missing"),
        ({"dest": 5}, "params.dest must be a string"),
        ({"numworkers": "8"}, "params.numworkers must be a whole number >= 1"),
        ({"concurrency": 0}, "params.concurrency must be a whole number >= 1"),
        ({"part_size_mib": True}, "params.part_size_mib must be a whole number"),
        ({"s5cmd": ["s5cmd"]}, "params.s5cmd must be a string"),
        ({"region": 1}, "params.region must be a string"),
        ({"expected": {"a": 1}}, "params.expected must be a list"),
        ({"pipeline": "yes"}, "params.pipeline must be true or false"),
        ({"verify_workers": -1}, "params.verify_workers must be a whole number >= 0"),
        ({"unplanned_cap_bytes": 1.5}, "params.unplanned_cap_bytes must be a whole number"),
    ],
)
def test_a_malformed_field_is_named_in_one_line(change: dict[str, object], field: str) -> None:
    with pytest.raises(JobError) as e:
        read_params({**GOOD, **change})
    assert field in str(e.value) and "\n" not in str(e.value)


def test_the_runner_refuses_a_malformed_spec_before_it_does_anything() -> None:
    ctx = JobContext.in_process("pull", {**GOOD, "numworkers": "many"})
    with pytest.raises(JobError, match=r"params\.numworkers must be a whole number"):
        run_pull_job(ctx)
    with pytest.raises(JobError, match=r"params\.dest is missing"):
        cleanup(JobContext.in_process("pull", {"src": "s3://b/p/*"}))
