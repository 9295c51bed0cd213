"""Property: a launch names exactly its own jobs. Whatever launches and lone jobs a state database
holds, ``launch_ids(L)`` is the jobs recorded under L (never a launch whose id merely starts
with L's, never a lone job), each job id is unique and starts with its launch's; ``job cancel``
stops nothing it cannot name this way."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from backend.jobs.records import launch_job_ids, retry_job_id
from backend.jobs.store import JobStore
from backend.state import SQLiteState

# Launch ids that share prefixes with each other (L, L1, L.1) and with lone jobs' ids.
LAUNCH = st.sampled_from(["1202-0300-aa", "1202-0300-aa1", "1202-0300-aa.1", "1202-0300-ab"])
PLAN = st.lists(
    st.tuples(st.one_of(st.none(), LAUNCH), st.lists(st.sampled_from(["n1", "n2", "n3", "n4"]), min_size=1)),
    min_size=1,
    max_size=6,
)


def _spec(job_id: str, node: str, launch: str | None) -> dict[str, object]:
    spec: dict[str, object] = {
        "id": job_id,
        "node": node,
        "kind": "pull",
        "label": "",
        "params": {},
        "created": 1.0,
        "launched_by": "t@h",
        "launched_from": "h",
    }
    if launch:
        spec["launch"] = launch
    return spec


@settings(max_examples=60, deadline=None)
@given(PLAN)
def test_a_launch_names_exactly_its_own_jobs(plan: list[tuple[str | None, list[str]]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        db = SQLiteState(Path(d) / "state.sqlite3")
        store = JobStore(db)
        want: dict[str, set[str]] = {}
        seen: set[str] = set()
        for n, (launch, nodes) in enumerate(plan):
            if launch is None or launch in want:  # a lone job, or a retry within a launch seen before
                ids = {nodes[0]: retry_job_id(launch) if launch else f"{launch or 'lone'}-{n}"}
            else:
                ids = launch_job_ids(launch, nodes)
            for node, job_id in ids.items():
                if job_id in seen:
                    continue
                seen.add(job_id)
                store.insert(_spec(job_id, node, launch), None)
                if launch:
                    assert job_id.startswith(f"{launch}.")
                    want.setdefault(launch, set()).add(job_id)
        for launch in ["1202-0300-aa", "1202-0300-aa1", "1202-0300-aa.1", "1202-0300-ab", "1202-0300"]:
            got = store.launch_ids(launch)
            assert len(got) == len(set(got))
            assert set(got) == want.get(launch, set())
            assert all(store.get(i).launch == launch for i in got)
        db.close()
