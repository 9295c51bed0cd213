"""Slurm operations on a partial or unusual read: Slurm's answer with job records that cannot be read,
and jobs that hold a node in every state Slurm says a job holds it (RUNNING, SUSPENDED and the
CONFIGURING, RESIZING, STOPPED, SIGNALING, COMPLETING, STAGE_OUT flags of ``slurm.h``).

The answers are the literal JSON records of tests/slurm/test_shapes.py (one cluster as every Slurm
release from 22.05 to 25.05 prints it), served by stand-in ``sinfo``/``squeue``/``scontrol`` that
also record every change asked of them. Deny by default: drain-now acts only when the read proves
which jobs hold the node; "no other job" is never concluded from a read that skipped records.
"""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.config import load_config
from backend.errors import ConfigError, PolicyError
from backend.ops import Operations
from backend.services import Services
from backend.slurm import model
from backend.slurm.client import CommandResult
from backend.slurm.model import HOLDING_JOB_STATES, SlurmJob, SlurmSnapshot
from lab.slurm import SlurmLab
from tests.slurm.test_shapes import JOB_DOCS, NODE_DOCS
from tests.slurm_fixtures import job_state

#: A record no Slurm release sends and the parser refuses (two base states): skipped with one line.
#: It names gpu-003 and cannot be requeued, but once skipped nothing of it is known.
HOSTILE = {
    "job_id": 999,
    "name": "hidden",
    "user_name": "mallory",
    "job_state": ["RUNNING", "PENDING"],
    "partition": "train",
    "nodes": "gpu-003",
    "requeue": False,
}


class FakeSlurm:
    """``sinfo``/``squeue``/``scontrol`` printing the documents the test sets; changes recorded."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.bin.mkdir()
        self.calls = root / "calls"
        self.calls.touch()
        self.nodes_file, self.jobs_file = root / "nodes.json", root / "jobs.json"
        scripts = {
            "sinfo": f"exec cat {self.nodes_file}",
            "squeue": f"exec cat {self.jobs_file}",
            "scontrol": f'echo "$@" >> {self.calls}',
        }
        for name, body in scripts.items():
            (self.bin / name).write_text("#!/bin/sh\n" + body + "\n")
            (self.bin / name).chmod(0o755)
        self.serve(NODE_DOCS["22.05"], JOB_DOCS["22.05"])

    def serve(self, nodes: dict[str, Any] | None = None, jobs: dict[str, Any] | None = None) -> None:
        if nodes is not None:
            self.nodes_file.write_text(json.dumps(nodes))
        if jobs is not None:
            self.jobs_file.write_text(json.dumps(jobs))

    def changes(self) -> list[str]:
        return self.calls.read_text().splitlines()


@pytest.fixture
def fake(tmp_path: Path) -> FakeSlurm:
    return FakeSlurm(tmp_path)


def ops_for(tmp_path: Path, fake: FakeSlurm):  # type: ignore[no-untyped-def]
    cfg = tmp_path / "lm.toml"
    cfg.write_text(
        f'[state]\ndir = "{tmp_path / "state"}"\n\n'
        f'[slurm]\nenabled = true\nbin_dir = "{fake.bin}"\ninterval = "30s"\ntimeout = "10s"\n'
    )
    return Operations(Services(load_config(cfg))).slurm


def with_jobs(version: str, *extra: dict[str, Any], **states: Any) -> dict[str, Any]:
    """The release's jobs document, job states replaced (``j812=["RUNNING", "CONFIGURING"]``) and
    ``extra`` records appended."""
    doc = copy.deepcopy(JOB_DOCS[version])
    for j in doc["jobs"]:
        for key, value in states.items():
            if key == f"j{j['job_id']}":
                j.update(value if isinstance(value, dict) else {"job_state": value})
    doc["jobs"].extend(copy.deepcopy(list(extra)))
    return doc


# -- 1. a partial read proves no absence ----------------------------------------------------------


@pytest.mark.parametrize("version", ["22.05", "24.05"])
def test_drain_now_refuses_when_a_job_record_was_skipped(tmp_path: Path, fake: FakeSlurm, version: str) -> None:
    """gpu-001 holds job 812 (requeueable): the read alone would requeue it and drain. But one job
    record could not be read, and it may be one on gpu-001 that cannot be requeued (before: planned
    the requeue of 812 as if the read were whole)."""
    fake.serve(NODE_DOCS["22.05"], with_jobs(version, HOSTILE))
    ops = ops_for(tmp_path, fake)
    snap = asyncio.run(ops.snapshot(fresh=True))
    assert [j.job_id for j in snap.jobs_on("gpu-001")] == ["812"] and len(snap.skipped) == 1
    with pytest.raises(PolicyError) as err:
        asyncio.run(ops.plan_drain(["gpu-001"], "bad ib link", now=True))
    msg = str(err.value)
    assert msg.startswith("drain now refused: 1 job record(s) of Slurm's answer could not be read")
    assert "(first: job record 4 (999) skipped: job_state: more than one base job state" in msg
    assert "\n" not in msg
    # A drain after the jobs assumes nothing about them: still planned.
    plan = asyncio.run(ops.plan_drain(["gpu-001"], "bad ib link"))
    assert plan.requeue == () and len(plan.commands) == 1
    assert fake.changes() == []


def test_drain_rechecks_the_plan_on_the_fresh_read(tmp_path: Path, fake: FakeSlurm) -> None:
    """Planned on a whole read; at the drain Slurm's answer has a record that cannot be read (or a
    new job on the node): refused and audited, nothing run (before: the plan ran as made)."""
    ops = ops_for(tmp_path, fake)
    plan = asyncio.run(ops.plan_drain(["gpu-001"], "bad ib link", now=True))
    assert plan.requeue == ("812",)
    fake.serve(jobs=with_jobs("22.05", HOSTILE))
    with pytest.raises(PolicyError, match="1 job record"):
        asyncio.run(ops.drain(plan))
    new_job = dict(JOB_DOCS["22.05"]["jobs"][0], job_id=1001, nodes="gpu-001", requeue=False)
    fake.serve(jobs=with_jobs("22.05", new_job))
    with pytest.raises(PolicyError, match="job 1001 cannot be requeued"):
        asyncio.run(ops.drain(plan))
    fake.serve(jobs=with_jobs("22.05", dict(new_job, requeue=True)))
    with pytest.raises(PolicyError, match=r"jobs changed since the plan \(job 1001\)"):
        asyncio.run(ops.drain(plan))
    assert fake.changes() == []
    audited = ops.services.db.audit_entries(action="slurm.drain")
    assert [e.outcome for e in audited] == ["refused"] * 3
    fake.serve(jobs=JOB_DOCS["22.05"])
    asyncio.run(ops.drain(plan))
    assert [c.split()[0] + " " + c.split()[1] for c in fake.changes()] == ["update NodeName=gpu-001", "requeue 812"]


def test_a_node_or_job_not_read_is_not_said_to_be_absent(tmp_path: Path, fake: FakeSlurm) -> None:
    nodes = copy.deepcopy(NODE_DOCS["22.05"])
    nodes["nodes"][2]["state"] = "sideways"  # gpu-003's record: skipped
    fake.serve(nodes, with_jobs("22.05", HOSTILE))
    ops = ops_for(tmp_path, fake)
    with pytest.raises(ConfigError) as err:
        asyncio.run(ops.plan_drain(["gpu-003"], "x"))
    assert "not among the nodes read: 1 node record(s)" in str(err.value) and "no node" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        asyncio.run(ops.job_nodes("999"))
    assert "not among the jobs read: 1 job record(s)" in str(err.value)


# -- 2. one definition of the job states that hold a node -----------------------------------------

#: 23.11+'s state lists (``data_parser`` JOB_STATE flag arrays) for each holding state.
HOLDING_LISTS = {
    "CONFIGURING": ["RUNNING", "CONFIGURING"],
    "RESIZING": ["RUNNING", "RESIZING"],
    "STOPPED": ["RUNNING", "STOPPED"],
    "SIGNALING": ["RUNNING", "SIGNALING"],
    "SUSPENDED": ["SUSPENDED"],
    "COMPLETING": ["COMPLETED", "COMPLETING"],
    "STAGE_OUT": ["COMPLETED", "STAGE_OUT"],
}


@pytest.mark.parametrize("version", ["22.05", "24.05"])
@pytest.mark.parametrize("word", sorted(HOLDING_LISTS))
def test_drain_now_sees_every_job_that_holds_the_node(tmp_path: Path, fake: FakeSlurm, version: str, word: str) -> None:
    """A job booting its nodes (CONFIGURING), resizing, stopped, being signalled, suspended, in its
    epilog or staging out holds the node: drain-now requeues it, and refuses when it cannot be
    (before: only RUNNING/COMPLETING/SUSPENDED were seen, a CONFIGURING job was left out)."""
    state = HOLDING_LISTS[word] if version != "22.05" else word
    fake.serve(jobs=with_jobs(version, j812=state))
    ops = ops_for(tmp_path, fake)
    snap = asyncio.run(ops.snapshot(fresh=True))
    assert {j.job_id: j.state for j in snap.jobs_on("gpu-001")} == {"812": word}
    plan = asyncio.run(ops.plan_drain(["gpu-001"], "bad ib link", now=True))
    assert plan.requeue == ("812",) and plan.shown()[1] == "scontrol requeue 812"
    fake.serve(jobs=with_jobs(version, j812={"job_state": state, "requeue": False}))
    with pytest.raises(PolicyError, match="job 812 cannot be requeued"):
        asyncio.run(ops.plan_drain(["gpu-001"], "bad ib link", now=True))
    rows = {r.name: r for r in asyncio.run(ops.rows(fresh=True))}
    assert [j.job_id for j in rows["gpu-001"].jobs] == ["812"]
    # A pull to the job's nodes: only while its work runs there, not while Slurm lets them go.
    if word in ("COMPLETING", "STAGE_OUT"):
        with pytest.raises(ConfigError, match="holds its nodes only while it runs"):
            asyncio.run(ops.job_nodes("812"))
    else:
        assert asyncio.run(ops.job_nodes("812")) == ["gpu-001", "gpu-002"]


def test_a_job_state_loadmaster_does_not_know_blocks_drain_now(tmp_path: Path, fake: FakeSlurm) -> None:
    fake.serve(jobs=with_jobs("22.05", j812="LAUNCHING"))  # a word a newer Slurm might print
    ops = ops_for(tmp_path, fake)
    with pytest.raises(PolicyError, match="job 812 names gpu-001 in state 'LAUNCHING'"):
        asyncio.run(ops.plan_drain(["gpu-001"], "x", now=True))


def test_holding_states_are_the_ones_slurm_h_defines() -> None:
    assert HOLDING_JOB_STATES == {
        "RUNNING", "SUSPENDED", "CONFIGURING", "RESIZING", "STOPPED", "SIGNALING", "COMPLETING", "STAGE_OUT"
    }  # fmt: skip
    assert not HOLDING_JOB_STATES & model.NOT_HOLDING_JOB_STATES


# -- the invariant, over generated snapshots ------------------------------------------------------

NODES = ("a", "b", "c")
#: Every word Slurm's job_state_string prints, and one it does not.
STATES = sorted(
    HOLDING_JOB_STATES
    | model.ENDED_JOB_STATES
    | {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "LAUNCHING"}
)
JOB = st.builds(
    lambda i, state, nodes, requeue: SlurmJob(str(i), "j", "u", state, nodes=tuple(nodes), requeue=requeue),
    st.integers(1, 40),
    st.sampled_from(STATES),
    st.lists(st.sampled_from(NODES), max_size=3, unique=True),
    st.booleans(),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(JOB, max_size=8, unique_by=lambda j: j.job_id), st.integers(0, 3), st.sampled_from(NODES))
def test_drain_now_acts_only_on_a_whole_proven_read(jobs: list[SlurmJob], skipped: int, node: str) -> None:
    """Whatever Slurm sent: with a skipped job record drain-now never proposes a requeue; otherwise
    it requeues exactly the jobs holding the node, all requeueable, and refuses when any holding
    job is not, or a job naming the node has a state nobody knows."""
    from backend.ops.slurm import requeue_now

    lines = tuple(f"job record {i} (?) skipped: job_state: more than one base job state" for i in range(skipped))
    snap = SlurmSnapshot((), tuple(jobs), 0.0, lines, skipped_jobs=skipped)
    holding = [j for j in jobs if node in j.nodes and j.state in HOLDING_JOB_STATES]
    try:
        got = requeue_now(snap, [node])
    except PolicyError as exc:
        assert str(exc).startswith("drain now refused: ") and "\n" not in str(exc)
        assert (
            skipped
            or any(not j.requeue for j in holding)
            or any(node in j.nodes and j.state == "LAUNCHING" for j in jobs)
            or any(not j.nodes and j.state in HOLDING_JOB_STATES for j in jobs)
        )
        return
    assert skipped == 0
    assert set(got) == {j.job_id for j in holding} and all(j.requeue for j in holding)


def test_drain_now_on_the_real_cluster_refuses_when_squeue_has_a_record_it_cannot_read(
    slurm: SlurmLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real slurmctld 22.05 (tests/slurm_fixtures.py) runs a requeueable job on node-02; its
    squeue --json answer gets one more record that cannot be read (a negative start time): drain-now
    of node-02 is refused and names the record, nothing runs; the whole answer plans the requeue."""
    from tests.slurm.test_ops_slurm import running, write_config

    job = slurm.sbatch("-w", "node-02", "--requeue", "--gres=gpu:1", "-J", "requeue-me")
    running(slurm, job)
    ops = Operations(Services(load_config(write_config(tmp_path, slurm)))).slurm
    assert asyncio.run(ops.plan_drain(["node-02"], "bad ib link", now=True)).requeue == (job,)
    real_run = ops.client.run

    async def run(argv: list[str], *, check: bool = True) -> CommandResult:
        res = await real_run(argv, check=check)
        if argv[0] != "squeue":
            return res
        doc = json.loads(res.stdout)
        doc["jobs"].append(dict(doc["jobs"][0], job_id=99999, requeue=False, start_time=-5))
        return replace(res, stdout=json.dumps(doc).encode())

    monkeypatch.setattr(ops.client, "run", run)
    with pytest.raises(PolicyError) as err:
        asyncio.run(ops.plan_drain(["node-02"], "bad ib link", now=True))
    assert "1 job record(s) of Slurm's answer could not be read" in str(err.value)
    assert "(99999) skipped: start_time: not a time" in str(err.value)
    assert job_state(slurm, job) == "RUNNING"
