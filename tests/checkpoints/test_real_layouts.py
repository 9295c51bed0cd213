"""Every layout people train with, written by its own library: classification, commit marker,
the plan for ``--keep-full 2 --milestone-every 2 --others delete``, and that ``apply --yes``
leaves exactly what was promised.

The run of each layout: steps 1..6 with step 3 corrupt and step 6 in flight (the newest save,
still being written), the rest full (or weights, for an export-only layout). The plan must keep
4 and 5 full, never touch 3 or 6, turn the milestone 2 into BF16 weights where strip can read the
layout (else leave it untouched, refused), and delete 1 (unless it is the Trainer's best).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from backend.checkpoints.catalog import list_checkpoints
from backend.policy.retention import STRIPPABLE_LAYOUTS, RetentionPolicy
from backend.retention import apply_plan, compute_plan
from backend.storage import LocalStore
from tests.checkpoints.layouts import LAYOUTS, BuiltRun, StepSpec, build

pytestmark = pytest.mark.usefixtures("lock_read_back_at_once")
STEPS = (1, 2, 3, 4, 5, 6)
POLICY = RetentionPolicy(keep_full_latest=2, milestone_every=2, others="delete")


def _layout_ids() -> list[str]:
    from tests.checkpoints.layouts import dcp_family, frameworks, more_layouts  # noqa: F401 - they register

    return sorted(LAYOUTS)


def _states(layout: str) -> dict[int, str]:
    states = {3: "corrupt", 6: "incomplete"}
    if layout in ("lightning", "lightning-custom"):
        states.pop(6)  # Lightning writes each .ckpt file atomically: a run never shows one in flight
    if layout in ("torch-flat", "torch-unsharded"):
        states.pop(6)  # no commit marker: an in-flight torch.save is a torn file, listed as corrupt
    if layout == "dcp-torchtitan":
        states = {3: "corrupt", 6: "weights"}  # torchtitan's model-only export is only ever the last step
    if layout == "hf-export":
        states = {1: "weights", 2: "weights", 3: "corrupt", 4: "weights", 5: "weights", 6: "incomplete"}
    return states


def _digest(p: Path) -> str:
    if p.is_file():
        return hashlib.sha256(p.read_bytes()).hexdigest()
    h = hashlib.sha256()
    for f in sorted(p.rglob("*")):
        if f.is_file():
            h.update(f.relative_to(p).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _expected_action(spec: StepSpec, run: BuiltRun) -> str:
    full = [s.step for s in run.steps if s.kind == "full"]
    proven_newer = any(n > spec.step for n in full)  # deny by default: a newer resumable step
    if spec.kind in ("corrupt", "incomplete"):
        return "skip"
    if spec.step in full[-2:]:
        return "keep-full"
    if spec.best:
        return "keep-full" if spec.kind == "full" else "keep-weights"
    if spec.step == max(s.step for s in run.steps):
        return "keep-full" if spec.kind == "full" else "keep-weights"  # the newest artifact
    if spec.step % 2 == 0:
        if spec.kind == "weights":
            return "keep-weights"
        # strip writes its export into the step folder: not for a flat file, nor a nested checkpoint
        strippable = spec.layout in STRIPPABLE_LAYOUTS and run.layout not in ("torch-flat", "dcp-nested")
        return "strip-to-weights" if strippable and proven_newer else "skip"
    return "delete" if proven_newer else "skip"


@pytest.fixture
def state_url() -> None:
    """These tests are about checkpoint truth, not state: the embedded SQLite state only (the
    state paths they touch, pins and the apply audit, run on both backends in tests/retention)."""
    return None


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, BuiltRun]:
    return {}


@pytest.mark.slow
@pytest.mark.parametrize("layout", _layout_ids())
async def test_layout_classified_planned_and_applied(layout: str, tmp_path: Path, local_services) -> None:  # type: ignore[no-untyped-def]
    if layout.startswith("deepspeed"):
        pytest.importorskip("deepspeed")
    run = build(layout, tmp_path / "runs" / layout, STEPS, states=_states(layout))
    root = run.root
    specs = {s.step: s for s in run.steps}

    catalog = await list_checkpoints(LocalStore(root))
    got = {s.step: s for s in catalog.steps if s.step is not None}
    for n, spec in specs.items():
        s = got.get(n)
        assert s is not None, f"{layout}: step {n} ({spec.name}) not listed"
        assert (s.layout, s.kind) == (spec.layout, spec.kind), f"{layout} step {n}: {s.kind} ({s.note})"
        if spec.kind in ("full", "weights") and spec.marker is not None:
            assert s.marker == spec.marker, f"{layout} step {n}: marker {s.marker} != {spec.marker}"
        if spec.kind == "corrupt":
            assert s.note, f"{layout} step {n}: a corrupt step names what is wrong"
        assert s.best == spec.best

    plan = await compute_plan(local_services, str(root), POLICY)
    actions = {a.step: a for a in plan.actions if a.step is not None}
    expected = {n: _expected_action(spec, run) for n, spec in specs.items()}
    assert {n: actions[n].action for n in specs} == expected, [(a.step, a.action, a.reason) for a in plan.actions]
    for n, a in actions.items():
        if a.action == "keep-full":
            assert a.resumable == "verified", f"{layout} step {n}: {a.resumable}"

    # every planned action passes apply's checks: plan and apply --dry-run agree
    dry = await apply_plan(local_services, plan, dry_run=True)
    assert {o.path for o in dry.outcomes if o.outcome == "would-do"} == {a.path for a in plan.destructive_actions}
    before = {p.name: _digest(p) for p in root.iterdir()}
    report = await apply_plan(local_services, plan)
    assert report.ok, report.as_dict()
    for n, spec in specs.items():
        path = root / spec.name
        act = expected[n]
        if act == "delete":
            assert not path.exists() or not any(f.is_file() for f in path.rglob("*")), f"{layout}: {n} not deleted"
        elif act == "strip-to-weights":
            names = sorted(f.name for f in path.rglob("*") if f.is_file())
            assert "model.safetensors.index.json" in names, names
            fresh = await list_checkpoints(LocalStore(root))
            assert fresh.step(n).kind == "weights", fresh.step(n).note
        else:
            assert _digest(path) == before[spec.name], f"{layout}: step {n} ({act}) changed"
    # run-level files (DeepSpeed's latest, Megatron's iteration file, zero_to_fp32.py) untouched
    for name, d in before.items():
        if (root / name).is_file() and not name.endswith(".ckpt"):
            assert _digest(root / name) == d


async def test_safetensors_serialized_dcp_strips_to_the_right_values(tmp_path: Path) -> None:
    """torch's own FileSystemReader cannot read this format back; the safetensors library's
    decoder of the embedded blob is the reference the export is compared with."""
    import struct

    import torch
    from safetensors.torch import load as st_load
    from safetensors.torch import load_file

    from backend.checkpoints.strip import strip_step
    from tests.checkpoints.layouts.dcp_family import safetensors_payload_start

    run = build("dcp-safetensors", tmp_path / "run", (1, 2))
    step = run.root / run.spec(2).name
    raw = (step / "__0_0.distcp").read_bytes()
    start = safetensors_payload_start(step)
    (n,) = struct.unpack("<Q", raw[start : start + 8])
    reference = st_load(raw[start : start + 8 + n + (len(raw) - start - 8 - n)])
    res = await strip_step(LocalStore(run.root), run.spec(2).name)
    got: dict[str, torch.Tensor] = {}
    for shard in res.shards:
        got.update(load_file(str(step / shard)))
    model = {k.removeprefix("model."): v for k, v in reference.items() if k.startswith("model.")}
    assert model and set(got) == set(model)
    for k, v in model.items():
        assert torch.equal(got[k], v.to(torch.bfloat16) if v.is_floating_point() else v), k


async def test_zero3_strip_is_refused_and_its_partitions_survive(tmp_path: Path, local_services) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("deepspeed")
    from backend.checkpoints.dcp import CheckpointError
    from backend.checkpoints.strip import strip_step

    run = build("deepspeed-zero3", tmp_path / "run", (1, 2, 3, 4))
    s1 = run.spec(1).name
    before = _digest(run.root / s1)
    with pytest.raises(CheckpointError, match="ZeRO-3 checkpoint: its model_states holds empty placeholders"):
        await strip_step(LocalStore(run.root), s1)
    # a milestone plan refuses to strip it instead of deleting the only weights
    plan = await compute_plan(local_services, str(run.root), RetentionPolicy(keep_full_latest=2, milestones=(1,)))
    (a,) = [a for a in plan.actions if a.step == 1]
    assert a.action == "skip" and "ZeRO-3" in a.reason
    await apply_plan(local_services, plan)
    assert _digest(run.root / s1) == before


async def test_hand_made_folders_and_truncations_name_the_file(tmp_path: Path) -> None:
    import torch

    run = tmp_path / "run"
    (run / "step-1").mkdir(parents=True)
    torch.save({"notes": "hello"}, run / "step-1" / "stray.pt")  # no tensors: not a checkpoint
    (run / "step-2").mkdir()
    (run / "step-2" / "junk.pt").write_bytes(b"not a torch file at all")
    fam = build("dcp-appstate", tmp_path / "dcp", (3, 4), states={3: "corrupt"})
    shutil.copytree(fam.root / fam.spec(3).name, run / "step-3")
    cat = await list_checkpoints(LocalStore(run))
    s1, s2, s3 = cat.steps
    assert (s1.kind, s1.note) == ("unknown", "stray.pt: holds no tensors: not a checkpoint")
    assert s2.kind == "unknown" and s2.note.endswith("junk.pt: not a torch.save file (it does not start like a zip)")
    assert s3.kind == "corrupt" and ".distcp" in s3.note


@pytest.mark.parametrize(
    "layout",
    [
        "lightning",
        "dcp-fsdp2",
        "dcp-appstate",
        "torch-save",
        "megatron-legacy",
        "hf-trainer",
        "lightning-dir",
        "megatron-torch-dist",
    ],
)
async def test_model_only_saves_list_as_weights_and_never_count_as_resumable(layout: str, tmp_path: Path) -> None:
    """A weights-only save (Lightning save_weights_only, Megatron --no-save-optim, a model-only
    DCP) carries names like ``optim_progress`` or an ``optimizer`` entry of counters: it must not
    count toward keep-full-N, or the real full step it displaces gets deleted."""
    from backend.policy.retention_planner import plan_retention

    try:
        run = build(layout, tmp_path / "run", (1, 2, 3), states={2: "weights"})
    except ValueError as exc:
        pytest.skip(f"{layout} has no model-only save: {exc}")
    cat = await list_checkpoints(LocalStore(run.root))
    kinds = {s.step: s.kind for s in cat.steps}
    assert kinds == {1: "full", 2: "weights", 3: "full"}, [(s.step, s.kind, s.note) for s in cat.steps]
    plan = plan_retention(cat.steps, RetentionPolicy(keep_full_latest=2), now=1e10)
    assert {a.step: a.action for a in plan.actions}[1] == "keep-full"
