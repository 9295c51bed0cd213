"""A strip's local export is written beside its final names and renamed into place by the folder
the store holds open: a link planted in the output folder (at a shard's name, at the index, or on
the way to the folder) is refused with one line and never written through; a killed strip's
unfinished shards are removed without following a link."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from backend.agent.context import JobContext
from backend.checkpoints.strip import strip_step
from backend.checkpoints.strip.job import cleanup, strip_params
from backend.errors import LoadmasterError
from backend.storage import LocalStore
from tui.cli import main


@pytest.fixture
def step(tmp_path: Path, tiny_full_dcp: tuple[Path, dict[str, torch.Tensor]]) -> Path:
    shutil.copytree(tiny_full_dcp[0], tmp_path / "run" / "step-10")
    victim = tmp_path / "home" / "authorized_keys"
    victim.parent.mkdir()
    victim.write_bytes(b"ssh-ed25519 AAAA operator\n")
    return tmp_path / "run" / "step-10"


def _victim(step: Path) -> Path:
    return step.parents[1] / "home" / "authorized_keys"


async def test_a_step_holding_a_link_is_not_stripped_in_place(step: Path) -> None:
    os.symlink(_victim(step), step / "model-00001-of-00001.safetensors")
    with pytest.raises(LoadmasterError, match="holds a link") as err:
        await strip_step(LocalStore(step.parents[1]), "run/step-10", overwrite=True)
    assert "\n" not in str(err.value) and _victim(step).read_bytes() == b"ssh-ed25519 AAAA operator\n"


@pytest.mark.parametrize(
    "planted", ["model-00001-of-00001.safetensors", "model.safetensors.index.json", "(the export folder)"]
)
async def test_a_link_planted_in_the_output_store_is_refused_and_its_target_kept(step: Path, planted: str) -> None:
    exports = step.parents[1] / "exports"
    if planted == "(the export folder)":
        exports.mkdir()
        os.symlink(_victim(step).parent, exports / "step-10")
    else:
        (exports / "step-10").mkdir(parents=True)
        os.symlink(_victim(step), exports / "step-10" / planted)
    home_before = sorted(p.name for p in _victim(step).parent.iterdir())
    with pytest.raises(LoadmasterError, match="symbolic link") as err:
        await strip_step(
            LocalStore(step.parents[1]),
            "run/step-10",
            out_store=LocalStore(exports),
            out_prefix="step-10",
            overwrite=True,
        )
    assert "\n" not in str(err.value)
    assert _victim(step).read_bytes() == b"ssh-ed25519 AAAA operator\n"
    assert sorted(p.name for p in _victim(step).parent.iterdir()) == home_before
    assert not [p for p in exports.rglob("*") if p.name.endswith(".tmp-lm")]
    assert (step / ".metadata").exists()  # the source is as it was


async def test_a_link_at_the_old_predictable_part_name_is_never_written_through(step: Path) -> None:
    """Shards were once written at ``<shard>.tmp-lm`` by path: a link planted at that name took the
    shard's bytes wherever it pointed. A part now has a random name, created O_EXCL|O_NOFOLLOW."""
    exports = step.parents[1] / "exports"
    (exports / "step-10").mkdir(parents=True)
    os.symlink(_victim(step), exports / "step-10" / "model-00001-of-00001.safetensors.tmp-lm")
    res = await strip_step(
        LocalStore(step.parents[1]), "run/step-10", out_store=LocalStore(exports), out_prefix="step-10"
    )
    assert res.check.ok
    assert _victim(step).read_bytes() == b"ssh-ed25519 AAAA operator\n"


def test_the_cli_refuses_a_shard_name_planted_as_a_link_in_out(step: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = step.parents[1] / "exports" / "step-10"
    out.mkdir(parents=True)
    os.symlink(_victim(step), out / "model-00001-of-00001.safetensors")
    assert main(["ckpt", "strip", str(step), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("loadmaster: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert "symbolic link" in err and "model-00001-of-00001.safetensors" in err
    assert _victim(step).read_bytes() == b"ssh-ed25519 AAAA operator\n"


async def test_an_ordinary_export_still_lands_and_replaces_its_own_files(step: Path) -> None:
    store = LocalStore(step.parents[1])
    first = await strip_step(store, "run/step-10")
    again = await strip_step(store, "run/step-10", overwrite=True)
    assert first.check.ok and again.check.ok and first.shards == again.shards
    assert all((step / s).is_file() and not (step / s).is_symlink() for s in again.shards)
    assert (step / "model.safetensors.index.json").is_file()
    assert not [p for p in step.iterdir() if p.name.endswith(".tmp-lm")]
    assert (step / ".metadata").exists()


def test_a_killed_strips_parts_are_removed_and_nothing_else(step: Path) -> None:
    store = LocalStore(step.parents[1])
    part = step / ".model-00001-of-00001.safetensors.0123456789abcdef.tmp-lm"
    part.write_bytes(b"half a shard")
    keep = step / "model-00001-of-00001.safetensors"
    keep.write_bytes(b"an earlier export")
    elsewhere = step.parents[1] / "home" / ".x.tmp-lm"
    elsewhere.write_bytes(b"not the strip's")
    os.symlink(elsewhere.parent, step / "linked")
    cleanup(JobContext.in_process("strip", strip_params(store, "run/step-10")))
    assert not part.exists() and keep.read_bytes() == b"an earlier export"
    assert elsewhere.exists() and sorted(p.name for p in step.iterdir() if p.name.startswith("."))[:1] == [".metadata"]
    # a link as the output folder is not followed either
    linked = JobContext.in_process("strip", strip_params(store, "run/step-10/linked"))
    cleanup(linked)
    assert elsewhere.read_bytes() == b"not the strip's"
