"""Catalog classification of every layout, on a local directory store with real torch files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from backend.checkpoints.catalog import list_checkpoints
from backend.checkpoints.steps import step_number
from backend.storage import LocalStore
from tests.checkpoints.conftest import save_dcp, trained


def build_run(root: Path, full_dcp: Path) -> None:
    run = root / "run1"
    # DCP full (model + AdamW), copied from the session fixture
    shutil.copytree(full_dcp, run / "step-10")
    # DCP in flight: shards written, .metadata (the commit marker) not yet
    shutil.copytree(full_dcp, run / "step-9")
    (run / "step-9" / ".metadata").unlink()
    # DCP weights only
    model, _ = trained(seed=1)
    save_dcp(run / "step-100", model)
    # HF safetensors export (weights)
    hf = run / "step-200"
    hf.mkdir()
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    names = sorted(sd)
    save_file({k: sd[k] for k in names[:3]}, str(hf / "model-00001-of-00002.safetensors"))
    save_file({k: sd[k] for k in names[3:]}, str(hf / "model-00002-of-00002.safetensors"))
    wm = {
        k: "model-00001-of-00002.safetensors" if i < 3 else "model-00002-of-00002.safetensors"
        for i, k in enumerate(names)
    }
    (hf / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    # HF export whose index names a missing shard -> corrupt (committed, files do not match)
    shutil.copytree(hf, run / "step-300")
    (run / "step-300" / "model-00002-of-00002.safetensors").unlink()
    # DeepSpeed, plus the `latest` file
    for n in (400, 500):
        ds = run / f"global_step{n}"
        ds.mkdir()
        torch.save({"module": model.state_dict()}, ds / "mp_rank_00_model_states.pt")
        torch.save({"optimizer_state_dict": {"x": torch.zeros(64)}}, ds / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (run / "latest").write_text("global_step400")
    # plain torch.save: full and weights-only
    ts = run / "step-600"
    ts.mkdir()
    torch.save(model.state_dict(), ts / "model.pt")
    torch.save(trained(seed=1)[1].state_dict(), ts / "optimizer.pt")
    ts2 = run / "step-700"
    ts2.mkdir()
    torch.save(model.state_dict(), ts2 / "model.pt")
    # something else entirely
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out").write_bytes(b"x" * 10)


async def test_catalog_classifies_each_layout(tmp_path: Path, tiny_full_dcp: tuple[Path, dict]) -> None:
    build_run(tmp_path, tiny_full_dcp[0])
    cat = await list_checkpoints(LocalStore(tmp_path), "run1")
    rows = {s.name: s for s in cat.steps}
    assert [s.name for s in cat.steps] == [
        "step-9",
        "step-10",
        "step-100",
        "step-200",
        "step-300",
        "global_step400",
        "global_step500",
        "step-600",
        "step-700",
        "tensorboard",
    ]
    got = {n: (s.layout, s.kind) for n, s in rows.items()}
    assert got == {
        "step-9": ("dcp", "incomplete"),
        "step-10": ("dcp", "full"),
        "step-100": ("dcp", "weights"),
        "step-200": ("hf-safetensors", "weights"),
        "step-300": ("hf-safetensors", "corrupt"),  # its index names a shard that is missing
        "global_step400": ("deepspeed", "full"),
        "global_step500": ("deepspeed", "incomplete"),  # newer than `latest`: still being written
        "step-600": ("torch-save", "full"),
        "step-700": ("torch-save", "weights"),
        "tensorboard": ("unknown", "unknown"),
    }
    assert rows["step-200"].has_bf16_export and not rows["step-300"].has_bf16_export
    assert not rows["step-10"].has_bf16_export
    s10 = rows["step-10"]
    files = list((tmp_path / "run1" / "step-10").iterdir())
    assert s10.total_bytes == sum(f.stat().st_size for f in files)
    assert s10.object_count == len(files) and s10.path == "run1/step-10" and s10.step == 10
    # AdamW holds two FP32 moments per weight: optimizer state is about twice the weights
    assert s10.optimizer_bytes > 0.55 * s10.total_bytes
    assert rows["step-100"].optimizer_bytes < 0.2 * rows["step-100"].total_bytes
    assert rows["step-600"].optimizer_bytes == (tmp_path / "run1/step-600/optimizer.pt").stat().st_size
    assert rows["tensorboard"].step is None
    assert cat.bytes_by_kind()["unknown"] == 10


def test_step_numbers() -> None:
    assert [
        step_number(n)
        for n in ("step-9", "global_step48000", "checkpoint-500", "000123", "iter_0001000", "tensorboard", "step-9-old")
    ] == [9, 48000, 500, 123, 1000, None, None]


async def test_emptied_step_folders_are_not_listed(s3, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """After a delete, SeaweedFS still lists the empty prefix as a folder: it is no checkpoint."""
    import dataclasses

    from backend.storage import S3Store

    bucket = s3.new_bucket("emptied")
    client = s3.client()
    for step in (100, 200):
        client.put_object(Bucket=bucket, Key=f"run/step-{step}/.metadata", Body=b"m")
        client.put_object(Bucket=bucket, Key=f"run/step-{step}/__0_0.distcp", Body=b"x" * 10)
    profile = dataclasses.replace(s3_profile(s3), url=f"s3://{bucket}")
    store = S3Store(f"s3://{bucket}", profile)
    try:
        await store.delete_many(["run/step-100/.metadata", "run/step-100/__0_0.distcp"])
        cat = await list_checkpoints(store, "run")
    finally:
        await store.close()
    assert [s.step for s in cat.steps] == [200]
    empty = tmp_path / "local" / "run" / "step-5"
    empty.mkdir(parents=True)
    assert (await list_checkpoints(LocalStore(tmp_path / "local"), "run")).steps == ()


def s3_profile(s3):  # type: ignore[no-untyped-def]
    from backend.config import StoreProfile

    return StoreProfile(
        url="s3://x", endpoint_url=s3.endpoint, provider="aws", region=s3.region, profile="lab", addressing_style="path"
    )


async def test_a_missing_local_run_folder_is_an_error_not_an_empty_run(tmp_path: Path) -> None:
    import pytest

    from backend.errors import StoreError

    with pytest.raises(StoreError, match=r"checkpoints/llama-demo: no such directory"):
        await list_checkpoints(LocalStore(tmp_path / "checkpoints" / "llama-demo"))
    (tmp_path / "empty-run").mkdir()
    assert (await list_checkpoints(LocalStore(tmp_path / "empty-run"))).steps == ()
