"""What a node's scan says of its jobs gets types and ranges: a record either passes whole, or is
marked with the field that failed (and nothing of it is used). Hypothesis over every field."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from backend.jobs.remote import MAX_BYTES, MAX_PID, TIME_MAX, parse_scan_checked, spec_digest

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 1e30, -1, 10**15, 1.7e9, "12ab", "1e30"]),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
)


def _scan(spec: Any, pid: Any, result: Any, beat: Any, progress: list[Any]) -> str:
    lines = ["@@HOME /h/jobs", "@@NOW 1800000000.5", "@@JOB j-1", "@@SPEC " + json.dumps(spec)]
    lines.append("@@PID " + json.dumps(pid))
    if result is not None:
        lines.append("@@RESULT " + json.dumps(result))
    lines.append(f"@@BEAT {beat}")
    lines += ["@@PROG " + json.dumps(p) for p in progress]
    return "\n".join(lines)


def _in(v: Any, lo: float, hi: float, *, integer: bool = False) -> bool:
    if v is None:
        return True
    if isinstance(v, bool) or not isinstance(v, int | float) or (integer and not isinstance(v, int)):
        return False
    return not math.isnan(v) and lo <= v <= hi


@settings(max_examples=400, deadline=None)
@given(
    kind=st.one_of(st.just("pull"), _values),
    created=_values,
    pid=st.fixed_dictionaries({"pid": _values, "pgid": _values, "started": _values}),
    result=st.none()
    | st.fixed_dictionaries(
        {
            "state": st.sampled_from(["succeeded", "failed", "cancelled", "lost"]) | _values,
            "finished": _values,
            # The byte counts the ledger settles a job with (backend/pulls/job.py settle).
            "details": _values | st.fixed_dictionaries({"bytes": _values, "unplanned_bytes": _values}),
        }
    ),
    beat=_values,
    progress=st.lists(
        st.fixed_dictionaries(
            {
                "t": _values,
                "bytes_done": _values,
                "rate_bps": _values,
                "extra": _values | st.fixed_dictionaries({"unplanned_bytes": _values}),
            }
        ),
        max_size=3,
    ),
)
def test_a_record_passes_whole_within_its_ranges_or_is_marked(
    kind: Any, created: Any, pid: dict[str, Any], result: Any, beat: Any, progress: list[Any]
) -> None:
    spec = {"id": "j-1", "kind": kind, "created": created}
    scan = parse_scan_checked(_scan(spec, pid, result, beat, progress))  # never raises
    [job] = scan.jobs
    assert job.spec_digest == spec_digest(json.dumps(spec))
    if job.problem is not None:
        assert len(job.problem) < 400
        return
    assert isinstance(job.spec["kind"], str) and _in(job.spec.get("created"), 0, TIME_MAX)
    assert job.pidinfo is not None
    assert _in(job.pidinfo["pid"], 1, MAX_PID, integer=True) and job.pidinfo["pid"] is not None
    assert _in(job.pidinfo.get("pgid"), 1, MAX_PID, integer=True)
    assert _in(job.beat, 0, TIME_MAX)
    if job.result is not None:
        assert job.result["state"] in ("succeeded", "failed", "cancelled", "lost")
        assert _in(job.result.get("finished"), 0, TIME_MAX)
        details = job.result.get("details")
        assert details is None or isinstance(details, dict)
        if isinstance(details, dict):  # a negative or text count would offset or break the settle
            for key in ("bytes", "unplanned_bytes"):
                assert _in(details.get(key), 0, MAX_BYTES, integer=True), key
    for p in job.progress:
        assert _in(p.get("t"), 0, TIME_MAX) and _in(p.get("bytes_done"), 0, MAX_BYTES, integer=True)
        assert _in(p.get("rate_bps"), 0, 1e13)
        extra = p.get("extra")
        if isinstance(extra, dict):
            assert _in(extra.get("unplanned_bytes"), 0, MAX_BYTES, integer=True)


def test_a_spec_that_is_not_an_object_is_skipped_with_one_line() -> None:
    scan = parse_scan_checked("@@JOB x-1\n@@SPEC [1]\n@@JOB x-2\n@@SPEC " + json.dumps({"id": "x-2", "kind": "pull"}))
    assert [j.id for j in scan.jobs] == ["x-2"] and scan.jobs[0].problem is None
    assert scan.skipped == ["job x-1: skipped: its spec is missing or not a JSON object"]


def test_a_byte_count_the_ledger_settles_with_is_checked_like_bytes() -> None:
    # A hostile node's negative unplanned_bytes would offset the bytes it really moved in the
    # ledger's settle, a text one would break it: the record is marked instead, naming the field.
    def scan(details: dict[str, Any], extra: dict[str, Any]) -> Any:
        spec = {"id": "j-1", "kind": "pull", "created": 1}
        result = {"state": "succeeded", "finished": 2, "details": details}
        [job] = parse_scan_checked(_scan(spec, {"pid": 5}, result, 3, [{"t": 1, "bytes_done": 1, "extra": extra}])).jobs
        return job

    assert scan({"bytes": 5, "unplanned_bytes": 7}, {"unplanned_bytes": 7}).problem is None
    for details, extra, field in [
        ({"bytes": 5, "unplanned_bytes": -100}, {}, "result details unplanned_bytes"),
        ({"bytes": 5, "unplanned_bytes": "9"}, {}, "result details unplanned_bytes"),
        ({"bytes": 5}, {"unplanned_bytes": -1}, "progress extra unplanned_bytes"),
        ({"bytes": 5}, {"unplanned_bytes": 1.5}, "progress extra unplanned_bytes"),
    ]:
        problem = scan(details, extra).problem
        assert problem is not None and field in problem, (details, extra, problem)
