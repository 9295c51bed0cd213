"""What a resume reads is never deleted or stripped unless proven: layouts outside the usual
step folder, saved by the libraries themselves.

* a DCP checkpoint nested in a sub-folder of the step whose records are not there (zeroed shards
  of the right size): the deep check reads every DCP checkpoint of a step, not only the top one;
* a DCP step whose last records are not written yet (a preallocated or still-copying shard);
* Lightning ``ModelCheckpoint(filename="{epoch:02d}-{val_loss:.2f}")``: a name with several
  numbers and none marked as the step is no step (the loss's digits would order the run);
* a run's ``latest`` pointer (a file or a symlink) naming an older step: a resume reads that one;
* DCP's ``HuggingFaceStorageWriter`` given a training state: safetensors shards holding optimizer
  moments are not weights only.

The property at the end generates run folders of these and checks, on the plan the console
shows, that the step a resume reads is never in a delete or strip action, and that nothing is
deleted or stripped unless a newer step is resumable in truth.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from backend.checkpoints.catalog import list_checkpoints
from backend.policy.retention import RetentionPolicy
from backend.retention.apply import proven_plan
from backend.storage import LocalStore

#: template -> resumable in truth (what the library's own loader would resume from)
RESUMABLE = {
    "full": True,
    "nested-full": True,
    "nested-torn": False,
    "tail-torn": False,
    "weights": False,
    "hf-optim": False,
}


def _quiet() -> None:
    warnings.simplefilter("ignore")


def _zero_from_last_record(step: Path) -> None:
    """Zero each shard from its last tensor record on (its size stays what .metadata says)."""
    import torch.distributed.checkpoint as dcp

    md = dcp.FileSystemReader(str(step)).read_metadata()
    last: dict[str, int] = {}
    for info in md.storage_data.values():
        last[info.relative_path] = max(last.get(info.relative_path, 0), info.offset)
    for rel, offset in last.items():
        p = step / rel
        data = bytearray(p.read_bytes())
        data[offset:] = b"\0" * (len(data) - offset)
        p.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def templates() -> Iterator[Path]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    root = Path(tempfile.mkdtemp(prefix="lm-resume-"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    full = {"model": model.state_dict(), "optim": opt.state_dict()}
    with warnings.catch_warnings():
        _quiet()
        dcp.save(full, checkpoint_id=str(root / "full"))
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(root / "weights"))
        dcp.save(full, checkpoint_id=str(root / "nested-full" / "checkpoint"))
        torch.save({"rng": torch.get_rng_state(), "step": 7}, root / "nested-full" / "trainer_state.pt")
        # a training state through the HF storage writer (it takes tensors only)
        flat, _ = flatten_state_dict(full)
        tensors = {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}
        dcp.save(tensors, storage_writer=HuggingFaceStorageWriter(path=str(root / "hf-optim"), save_distributed=False))
    shutil.copytree(root / "nested-full", root / "nested-torn")
    for shard in (root / "nested-torn" / "checkpoint").glob("*.distcp"):
        shard.write_bytes(b"\0" * shard.stat().st_size)
    shutil.copytree(root / "full", root / "tail-torn")
    _zero_from_last_record(root / "tail-torn")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _plan(root: Path, policy: RetentionPolicy):  # type: ignore[no-untyped-def]
    """The plan ``retention plan`` shows: a fresh listing, the deep checks, the proof rule."""

    async def go():  # type: ignore[no-untyped-def]
        store = LocalStore(root)
        cat = await list_checkpoints(store, "run")
        plan, _ = await proven_plan(
            None, store, cat, policy, url=str(root / "run"), now=time.time() + 10**6, in_flight=(), unfinished={}
        )
        return cat, plan

    return asyncio.run(go())


def _destroyed(plan) -> set[str]:  # type: ignore[no-untyped-def]
    return {a.path.rsplit("/", 1)[-1] for a in plan.actions if a.destructive}


def _run(tmp: Path, templates: Path, layout: dict[str, str]) -> Path:
    run = tmp / "run"
    for name, state in layout.items():
        shutil.copytree(templates / state, run / name)
    return tmp


def test_nested_checkpoint_with_torn_records_proves_nothing(tmp_path: Path, templates: Path) -> None:
    root = _run(tmp_path, templates, {"step-100": "full", "step-200": "full", "step-300": "nested-torn"})
    cat, plan = _plan(root, RetentionPolicy(keep_full_latest=1))
    assert _destroyed(plan) == set(), [(a.path, a.action, a.reason) for a in plan.actions]
    kept = next(a for a in plan.actions if a.path.endswith("step-300"))
    assert kept.resumable and "checkpoint" in kept.resumable and kept.resumable != "verified"


def test_dcp_step_whose_last_records_are_not_written_proves_nothing(tmp_path: Path, templates: Path) -> None:
    root = _run(tmp_path, templates, {"step-100": "full", "step-200": "full", "step-300": "tail-torn"})
    _, plan = _plan(root, RetentionPolicy(keep_full_latest=1))
    assert _destroyed(plan) == set(), [(a.path, a.action, a.reason) for a in plan.actions]


def test_lightning_metric_in_the_file_name_is_not_a_step_number(tmp_path: Path) -> None:
    """ModelCheckpoint(filename="{epoch:02d}-{val_loss:.2f}"): the newest epoch has the lowest loss."""
    import lightning as L
    import torch

    losses = [0.91, 0.45, 0.33, 0.05]

    class M(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def training_step(self, batch, i):  # type: ignore[no-untyped-def]
            self.log("val_loss", torch.tensor(losses[self.current_epoch]))
            return self.lin(batch[0]).pow(2).mean()

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.AdamW(self.parameters())

    run = tmp_path / "run"
    cb = L.pytorch.callbacks.ModelCheckpoint(dirpath=str(run), filename="{epoch:02d}-{val_loss:.2f}", save_top_k=-1)
    trainer = L.Trainer(
        max_epochs=4,
        callbacks=[cb],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    with warnings.catch_warnings():
        _quiet()
        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
        trainer.fit(M(), data)
    newest = "epoch=03-val_loss=0.05.ckpt"
    assert (run / newest).is_file()
    cat, plan = _plan(tmp_path, RetentionPolicy(keep_full_latest=2))
    assert _destroyed(plan) == set()
    assert all(s.step is None and "several numbers" in s.note for s in cat.steps)
    # a name that marks its step keeps working: {epoch}-{step}-{val_loss}
    from backend.checkpoints.step_names import step_number

    assert step_number("epoch=3-step=1000-val_loss=0.05.ckpt") == 1000


@pytest.mark.parametrize("pointer", ["file", "symlink"])
def test_latest_pointer_names_the_step_a_resume_reads(tmp_path: Path, templates: Path, pointer: str) -> None:
    root = _run(tmp_path, templates, {f"step-{n}": "full" for n in (100, 200, 300, 400)})
    run = root / "run"
    if pointer == "file":
        (run / "latest").write_text("step-200\n")
    else:
        os.symlink("step-200", run / "latest")
    for policy in (RetentionPolicy(keep_full_latest=1), RetentionPolicy(keep_full_latest=1, others="keep-weights")):
        cat, plan = _plan(root, policy)
        assert "step-200" not in _destroyed(plan), [(a.path, a.action, a.reason) for a in plan.actions]
        rows = {s.name: s for s in cat.steps}
        assert rows["step-300"].kind == "incomplete" and "latest" in rows["step-300"].note
        assert {"step-300", "step-400"}.isdisjoint(_destroyed(plan))


def test_training_state_through_the_hf_storage_writer_is_not_weights(tmp_path: Path, templates: Path) -> None:
    root = _run(tmp_path, templates, {"step-100": "full", "step-200": "hf-optim", "step-300": "full"})
    cat, plan = _plan(root, RetentionPolicy(keep_full_latest=2))
    row = next(s for s in cat.steps if s.name == "step-200")
    assert row.kind == "unknown" and "optimizer state" in row.note and not row.has_bf16_export
    assert "step-200" not in _destroyed(plan)


# -- the property --------------------------------------------------------------------------

NAMES = ("step-{n}", "global_step{n}", "iter_{n:07d}", "epoch={e:02d}-val_loss=0.{r:02d}")


@st.composite
def runs(draw):  # type: ignore[no-untyped-def]
    count = draw(st.integers(2, 6))
    fmt = draw(st.sampled_from(NAMES))
    states = draw(st.lists(st.sampled_from(sorted(RESUMABLE)), min_size=count, max_size=count))
    losses = draw(st.lists(st.integers(1, 99), min_size=count, max_size=count, unique=True))
    layout = {}
    for i, (state, r) in enumerate(zip(states, losses, strict=True)):
        layout[fmt.format(n=(i + 1) * 100, e=i, r=r)] = state
    names = list(layout)
    pointer = draw(st.sampled_from(["none", "file", "symlink"]))
    target = draw(st.sampled_from(names)) if pointer != "none" else None
    policy = RetentionPolicy(
        keep_full_latest=draw(st.integers(0, 2)), others=draw(st.sampled_from(["delete", "keep-weights"]))
    )
    return names, layout, pointer, target, policy


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=runs())
@example(  # Lightning's metric names: the newest epoch has the lowest loss
    case=(
        names := [f"epoch={e:02d}-val_loss=0.{r:02d}" for e, r in enumerate((91, 45, 33, 5))],
        dict.fromkeys(names, "full"),
        "none",
        None,
        RetentionPolicy(keep_full_latest=2),
    )
)
@example(  # the newest step's checkpoint nested in a sub-folder, its records not there
    case=(
        ["step-100", "step-200", "step-300"],
        {"step-100": "full", "step-200": "full", "step-300": "nested-torn"},
        "none",
        None,
        RetentionPolicy(keep_full_latest=1),
    )
)
def test_what_a_resume_reads_is_never_destroyed_unproven(templates: Path, case) -> None:  # type: ignore[no-untyped-def]
    names, layout, pointer, target, policy = case
    with tempfile.TemporaryDirectory(prefix="lm-resume-case-") as tmp:
        root = _run(Path(tmp), templates, layout)
        run = root / "run"
        if pointer == "file":
            (run / "latest").write_text(target + "\n")
        elif pointer == "symlink":
            os.symlink(target, run / "latest")
        _, plan = _plan(root, policy)
    order = {n: i for i, n in enumerate(names)}  # the true order of the saves
    resumable = [n for n in names if RESUMABLE[layout[n]]]
    if target is not None:
        resume = target  # the trainer resumes from what its pointer names
    else:
        resume = resumable[-1] if resumable else None
    destroyed = _destroyed(plan)
    why = [(a.path, a.action, a.reason) for a in plan.actions]
    assert resume not in destroyed, why
    if destroyed:
        # a destructive action rests on a newer step that is resumable in truth, kept, and one a
        # resume may read (not past the step the run's pointer names)
        upto = order[target] if target is not None else len(names) - 1
        kept = [order[n] for n in resumable if order[n] <= upto and n not in destroyed]
        assert kept, why
        assert all(order[n] < max(kept) for n in destroyed), why
