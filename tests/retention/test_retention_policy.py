"""The pure retention planner: every safety rail and the savings arithmetic, on CheckpointSteps."""

from __future__ import annotations

import dataclasses

import pytest

from backend.checkpoints.steps import CheckpointStep
from backend.config import parse_config
from backend.errors import ConfigError, PolicyError
from backend.policy.retention import (
    VERIFIED,
    Pin,
    RetentionPlan,
    RetentionPolicy,
    parse_pin,
    parse_step_list,
    saving_percent,
)
from backend.policy.retention_planner import plan_retention as _plan_retention
from backend.policy.retention_planner import recheck_plan, step_fingerprint
from backend.storage import ObjectInfo

NOW = 1_800_000_000.0
DAY = 86400.0


def step(
    n: int | None,
    *,
    kind: str = "full",
    layout: str = "dcp",
    total: int = 1000,
    opt: int = 600,
    export: bool = False,
    extra: tuple[str, ...] = (),
    age: float = DAY,
    name: str | None = None,
    run: str = "run1",
) -> CheckpointStep:
    path = f"{run}/{name or f'step-{n}'}"
    objs = [ObjectInfo(f"{path}/.metadata", 10, NOW - age), ObjectInfo(f"{path}/__0_0.distcp", total - 10, NOW - age)]
    objs += [ObjectInfo(f"{path}/{e}", 0, NOW - age) for e in extra]
    if export:
        objs += [
            ObjectInfo(f"{path}/model-00001-of-00001.safetensors", 200, NOW - age),
            ObjectInfo(f"{path}/model.safetensors.index.json", 50, NOW - age),
        ]
    return CheckpointStep(
        step=n,
        path=path,
        layout=layout,
        kind=kind,  # type: ignore[arg-type]
        total_bytes=sum(o.size for o in objs),
        object_count=len(objs),
        mtime=NOW - age,
        has_bf16_export=export,
        objects=tuple(objs),
        optimizer_bytes=opt,
    )


def plan_retention(steps, policy, **kw):  # type: ignore[no-untyped-def]
    """The planner as compute_plan calls it, with every committed full step proven resumable
    (unless the test passes its own ``proofs``)."""
    if "proofs" not in kw:
        kw["proofs"] = {s.path: VERIFIED for s in steps if s.kind == "full"}
    return _plan_retention(steps, policy, **kw)


def actions(plan: RetentionPlan) -> dict[int | None, str]:
    return {a.step: a.action for a in plan.actions}


def test_defaults_keep_latest_two_complete_and_delete_the_rest() -> None:
    steps = [step(n * 1000) for n in range(1, 7)]
    plan = plan_retention(steps, RetentionPolicy(), now=NOW)
    assert actions(plan) == {
        1000: "delete",
        2000: "delete",
        3000: "delete",
        4000: "delete",
        5000: "keep-full",
        6000: "keep-full",
    }
    assert plan.totals.bytes_after == 2 * steps[0].total_bytes


def test_steps_sort_numerically_not_lexically() -> None:
    steps = [step(9000), step(10000), step(11000), step(800)]
    plan = plan_retention(steps, RetentionPolicy(), now=NOW)
    assert [a.step for a in plan.actions] == [800, 9000, 10000, 11000]
    assert actions(plan) == {800: "delete", 9000: "delete", 10000: "keep-full", 11000: "keep-full"}


def test_in_flight_steps_never_count_toward_latest_and_are_never_touched() -> None:
    steps = [step(n * 1000) for n in range(1, 5)]
    steps.append(step(5000, kind="incomplete"))  # no commit marker yet
    steps.append(step(6000))  # complete, but a running job writes it
    plan = plan_retention(steps, RetentionPolicy(), now=NOW, in_flight=["run1/step-6000/"])
    got = actions(plan)
    assert got[5000] == "skip" and got[6000] == "skip"
    assert got[3000] == "keep-full" and got[4000] == "keep-full"  # the latest 2 *complete* ones
    assert got[1000] == got[2000] == "delete"
    assert "in flight" in next(a.reason for a in plan.actions if a.step == 5000)


def test_unknown_folders_and_layouts_are_never_touched() -> None:
    steps = [step(n * 1000) for n in range(1, 5)]
    steps.append(step(None, name="notes", layout="unknown", kind="unknown"))
    steps.append(step(500, layout="unknown", kind="unknown"))
    plan = plan_retention(steps, RetentionPolicy(keep_full_latest=1), now=NOW)
    assert actions(plan)[None] == "skip" and actions(plan)[500] == "skip"
    assert plan.actions[-1].path == "run1/notes"  # unnumbered folders sort last


def test_milestones_every_list_and_marker_are_stripped() -> None:
    steps = [step(n * 1000) for n in range(1, 13)]
    steps[4] = step(5000, extra=("MILESTONE",))
    policy = RetentionPolicy(milestone_every=4000, milestones=(3000,))
    got = actions(plan_retention(steps, policy, now=NOW))
    assert {s for s, a in got.items() if a == "strip-to-weights"} == {3000, 4000, 5000, 8000}
    assert got[12000] == "keep-full"  # a milestone among the latest stays full
    assert got[11000] == "keep-full"
    assert {s for s, a in got.items() if a == "delete"} == {1000, 2000, 6000, 7000, 9000, 10000}


def test_others_keep_weights_strips_instead_of_deleting() -> None:
    steps = [step(1000), step(2000, kind="weights", opt=0), step(3000), step(4000)]
    got = actions(plan_retention(steps, RetentionPolicy(others="keep-weights"), now=NOW))
    assert got == {1000: "strip-to-weights", 2000: "keep-weights", 3000: "keep-full", 4000: "keep-full"}


def test_weights_only_steps_are_deleted_when_others_is_delete() -> None:
    steps = [step(1000, kind="weights", opt=0), step(2000), step(3000)]
    assert actions(plan_retention(steps, RetentionPolicy(), now=NOW))[1000] == "delete"


def test_pins_keep_a_step_untouched_with_its_reason() -> None:
    steps = [step(n * 1000) for n in range(1, 5)]
    plan = plan_retention(steps, RetentionPolicy(pins=(Pin(1000, "eval baseline"),)), now=NOW)
    a = plan.actions[0]
    assert (a.action, a.reason, a.pinned) == ("keep-full", "pinned: eval baseline", "eval baseline")
    assert a.bytes_freed == 0


def test_min_age_protects_young_steps_from_being_counted_or_touched() -> None:
    # Young steps are neither touched nor counted toward the latest N: the two newest *old*
    # full steps stay full, so the run still resumes if the young ones turn out bad.
    steps = [step(n * 1000, age=3 * DAY) for n in range(1, 5)] + [step(5000, age=600), step(6000, age=60)]
    got = actions(plan_retention(steps, RetentionPolicy(min_age=7200), now=NOW))
    assert got == {
        1000: "delete",
        2000: "delete",
        3000: "keep-full",
        4000: "keep-full",
        5000: "skip",
        6000: "keep-full",
    }  # 6000: the newest artifact of the run is never deleted
    steps = [step(1000, age=3 * DAY), step(2000, age=600), step(3000, age=60), step(4000, age=30)]
    got = actions(plan_retention(steps, RetentionPolicy(min_age=7200), now=NOW))
    assert got == {1000: "keep-full", 2000: "skip", 3000: "skip", 4000: "keep-full"}


def test_deepspeed_without_export_is_refused_with_export_is_stripped() -> None:
    steps = [step(1000, layout="deepspeed"), step(2000, layout="deepspeed", export=True), step(3000), step(4000)]
    plan = plan_retention(steps, RetentionPolicy(milestone_every=1000), now=NOW)
    got = actions(plan)
    assert got[1000] == "skip" and "refused" in plan.actions[0].reason
    assert got[2000] == "strip-to-weights"
    assert plan.actions[1].estimated is False
    assert plan.actions[1].bytes_after == 250  # exactly the export files


def test_70b_run_saves_857_percent_per_stripped_step() -> None:
    gb = 10**9

    def full(n: int) -> CheckpointStep:
        return CheckpointStep(
            step=n,
            path=f"llama70b/step-{n}",
            layout="dcp",
            kind="full",
            total_bytes=980 * gb,
            object_count=1,
            mtime=NOW - DAY,
            has_bf16_export=False,
            objects=(ObjectInfo(f"llama70b/step-{n}/.metadata", 980 * gb, NOW - DAY),),
            optimizer_bytes=840 * gb,
        )

    # a historical milestone, with the 2 rolling recovery steps after it
    plan = plan_retention(
        [full(48000), full(50000), full(52000)],
        RetentionPolicy(keep_full_latest=2, milestones=(48000,)),
        now=NOW,
        usd_per_gb_month=0.023,
    )
    a = plan.actions[0]
    assert a.action == "strip-to-weights"
    assert (a.bytes_before, a.bytes_after) == (980 * gb, 140 * gb)
    assert round(saving_percent(a.bytes_before, a.bytes_after), 1) == 85.7
    assert round(saving_percent(980, 140), 1) == 85.7
    assert plan.totals.usd_month_saved == pytest.approx(840 * 0.023)


def test_plan_json_round_trips_and_rejects_edits() -> None:
    steps = [step(n * 1000) for n in range(1, 6)]
    plan = plan_retention(
        steps,
        RetentionPolicy(milestone_every=2000, pins=(Pin(1000, "x"),)),
        now=NOW,
        url="s3://b/run1",
        usd_per_gb_month=0.015,
    )
    text = plan.to_json()
    again = RetentionPlan.from_json(text)
    assert again == plan and again.hash == plan.hash
    tampered = text.replace('"delete"', '"keep-full"', 1)
    with pytest.raises(PolicyError, match="hash does not match"):
        RetentionPlan.from_json(tampered)
    with pytest.raises(PolicyError, match="not a retention plan"):
        RetentionPlan.from_json("{}")


def test_recheck_stops_actions_whose_facts_changed() -> None:
    steps = [step(n * 1000) for n in range(1, 6)]
    policy = RetentionPolicy()
    plan = plan_retention(steps, policy, now=NOW)
    # a new step lands, step 1000 gains an object, step 2000 is pinned after the plan
    later = [step(1000, extra=("MILESTONE",)), *steps[1:], step(6000)]
    fresh = plan_retention(later, policy.with_pins([Pin(2000, "hold")]), now=NOW)
    check = recheck_plan(plan, fresh)
    assert any("new step run1/step-6000 landed" in c for c in check.changes)
    assert set(check.stopped) == {"run1/step-1000", "run1/step-2000", "run1/step-4000"}
    assert "objects changed" in check.stopped["run1/step-1000"]
    assert "pinned" in check.stopped["run1/step-2000"]
    assert "now says delete" in check.stopped["run1/step-4000"]
    assert "run1/step-3000" not in check.stopped
    assert recheck_plan(plan, plan).clean


def test_fingerprint_ignores_export_files() -> None:
    a = step(1000)
    b = dataclasses.replace(a, objects=a.objects + step(1000, export=True).objects[-2:])
    assert step_fingerprint(a) == step_fingerprint(b)


def test_config_section_and_flags_parse_strictly() -> None:
    cfg = parse_config(
        {
            "nodes": [{"name": "n1", "transport": "local"}],
            "retention": {
                "keep_full_latest": 3,
                "milestone_every": 48000,
                "milestones": [1000, 96000],
                "others": "keep-weights",
                "min_age": "2h",
                "pins": [{"step": 5, "reason": "eval"}],
            },
        }
    )
    pol = cfg.section(RetentionPolicy)
    assert pol == RetentionPolicy(
        keep_full_latest=3,
        milestone_every=48000,
        milestones=(1000, 96000),
        others="keep-weights",
        min_age=7200.0,
        pins=(Pin(5, "eval"),),
    )
    with pytest.raises(ConfigError, match="retention.keep_ful"):
        parse_config({"nodes": [{"name": "n1", "transport": "local"}], "retention": {"keep_ful": 1}})
    with pytest.raises(ConfigError, match="others"):
        parse_config({"nodes": [{"name": "n1", "transport": "local"}], "retention": {"others": "zap"}})
    assert parse_pin("48000:eval baseline") == Pin(48000, "eval baseline")
    assert parse_step_list("48000, 96000") == (48000, 96000)
    with pytest.raises(PolicyError, match="--pin"):
        parse_pin("latest")


# -- deny by default: nothing is deleted or stripped without a newer proven-resumable step ------


def test_without_any_proof_nothing_is_deleted_or_stripped() -> None:
    steps = [step(n * 1000) for n in range(1, 7)]
    plan = _plan_retention(steps, RetentionPolicy(milestone_every=2000), now=NOW)
    assert not plan.destructive_actions
    skipped = [a for a in plan.actions if a.action == "skip"]
    assert skipped and all("no step of this run is proven resumable" in a.reason for a in skipped)


def test_only_steps_older_than_the_newest_proven_step_may_go() -> None:
    steps = [step(n * 1000) for n in range(1, 7)]
    # only step 3000 passed the deep check: 1000 and 2000 may go, 4000 (older than none) stays
    proofs = {"run1/step-3000": VERIFIED, "run1/step-5000": "x: truncated", "run1/step-6000": "y: truncated"}
    got = _plan_retention(steps, RetentionPolicy(keep_full_latest=1), now=NOW, proofs=proofs)
    acts = actions(got)
    # a kept step that failed its proof stops everything
    assert not got.destructive_actions, acts
    proofs = {"run1/step-3000": VERIFIED}
    acts = actions(_plan_retention(steps, RetentionPolicy(keep_full_latest=1), now=NOW, proofs=proofs))
    assert acts[1000] == acts[2000] == "delete"
    assert acts[4000] == acts[5000] == "skip"
    assert acts[6000] == "keep-full"


def test_an_unproven_newest_step_never_lets_the_only_proven_one_go() -> None:
    steps = [step(1000), step(2000), step(3000, kind="incomplete")]
    plan = plan_retention(steps, RetentionPolicy(keep_full_latest=1), now=NOW)
    acts = actions(plan)
    assert acts[2000] == "keep-full" and acts[3000] == "skip" and acts[1000] == "delete"
    assert acts == {1000: "delete", 2000: "keep-full", 3000: "skip"}
