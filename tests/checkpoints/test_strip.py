"""Strip real DCP / torch.save checkpoints to BF16 safetensors and check them against the source."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from backend.agent.context import JobContext
from backend.checkpoints.catalog import list_checkpoints
from backend.checkpoints.dcp import CheckpointError
from backend.checkpoints.safetensors_check import SafetensorsError, read_header_file
from backend.checkpoints.strip import strip_step
from backend.checkpoints.strip.job import run_strip_job, strip_params
from backend.checkpoints.strip.verify import verify_export
from backend.storage import LocalStore
from tests.checkpoints.conftest import trained


def load_export(d: Path) -> dict[str, torch.Tensor]:
    index = json.loads((d / "model.safetensors.index.json").read_text())
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        out.update(load_file(str(d / shard)))
    return out


async def test_strip_dcp_into_step_folder_matches_source(tmp_path: Path, tiny_full_dcp: tuple[Path, dict]) -> None:
    src, weights = tiny_full_dcp
    shutil.copytree(src, tmp_path / "run" / "step-10")
    store = LocalStore(tmp_path)
    seen: list[dict] = []
    res = await strip_step(store, "run/step-10", max_shard_bytes=8000, progress=lambda **kw: seen.append(kw))
    assert res.check.ok and len(res.shards) > 1
    assert res.shards[0] == f"model-00001-of-{len(res.shards):05d}.safetensors"
    got = load_export(tmp_path / "run" / "step-10")
    assert set(got) == set(weights)
    for name, t in weights.items():
        assert got[name].dtype == torch.bfloat16
        assert torch.equal(got[name], t.to(torch.bfloat16)), name
    assert seen[-1]["bytes_done"] == seen[-1]["bytes_total"] == res.weight_bytes
    # every shard within the size limit (each tensor here is smaller than the limit)
    for s in res.shards:
        hdr = read_header_file(tmp_path / "run" / "step-10" / s)
        assert sum(t.nbytes for t in hdr.tensors) <= 8000
    # the milestone keeps its path and now shows its export in the catalog
    cat = await list_checkpoints(store, "run")
    assert cat.steps[0].has_bf16_export and cat.steps[0].kind == "full"
    # a second strip refuses to clobber the existing export
    with pytest.raises(CheckpointError, match="already has an export"):
        await strip_step(store, "run/step-10")


async def test_strip_to_other_store_and_flat_layout(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    model, opt = trained(seed=3)
    # torchtitan's flat layout: model keys at the top, training state under named roots
    sd = dict(model.state_dict())
    sd["optimizer"] = {"state": {"x": {"exp_avg": torch.ones(7)}}}
    sd["train_state"] = {"step": torch.tensor(5)}
    dcp.save(sd, checkpoint_id=str(tmp_path / "src" / "step-5"))
    out = LocalStore(tmp_path / "out")
    res = await strip_step(LocalStore(tmp_path / "src"), "step-5", out_store=out, out_prefix="export")
    got = load_export(tmp_path / "out" / "export")
    assert set(got) == set(model.state_dict())
    assert all(torch.equal(got[k], v.to(torch.bfloat16)) for k, v in model.state_dict().items())
    assert res.tensor_count == len(model.state_dict())


async def test_strip_torch_save_weights_only(tmp_path: Path) -> None:
    model, opt = trained(seed=4)
    d = tmp_path / "step-7"
    d.mkdir()
    torch.save({"model": model.state_dict()}, d / "model.pt")
    torch.save(opt.state_dict(), d / "optimizer.pt")
    await strip_step(LocalStore(tmp_path), "step-7")
    got = load_export(d)
    assert all(torch.equal(got[k], v.to(torch.bfloat16)) for k, v in model.state_dict().items())
    # a pickle that needs arbitrary code is refused, not executed
    e = tmp_path / "step-8"
    e.mkdir()
    torch.save({"model": model.state_dict(), "cfg": Path("/x")}, e / "model.pt")
    with pytest.raises(CheckpointError, match="weights_only=True"):
        await strip_step(LocalStore(tmp_path), "step-8")


async def test_strip_refuses_incomplete_and_unknown(tmp_path: Path, tiny_full_dcp: tuple[Path, dict]) -> None:
    shutil.copytree(tiny_full_dcp[0], tmp_path / "step-9")
    (tmp_path / "step-9" / ".metadata").unlink()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("hi")
    store = LocalStore(tmp_path)
    with pytest.raises(CheckpointError, match="incomplete"):
        await strip_step(store, "step-9")
    with pytest.raises(CheckpointError, match="not touching"):
        await strip_step(store, "notes")
    assert sorted(p.name for p in (tmp_path / "step-9").iterdir()) == ["__0_0.distcp"]


def test_strip_job_runner_in_process(tmp_path: Path, tiny_full_dcp: tuple[Path, dict]) -> None:
    shutil.copytree(tiny_full_dcp[0], tmp_path / "step-10")
    store = LocalStore(tmp_path)
    points: list[dict] = []
    ctx = JobContext.in_process("strip", strip_params(store, "step-10"), on_progress=points.append)
    result = run_strip_job(ctx)
    assert result["verified"] and result["tensor_count"] == len(tiny_full_dcp[1])
    assert points[-1]["bytes_done"] == points[-1]["bytes_total"]


async def test_verify_export_finds_problems(tmp_path: Path, tiny_full_dcp: tuple[Path, dict]) -> None:
    shutil.copytree(tiny_full_dcp[0], tmp_path / "s")
    store = LocalStore(tmp_path)
    await strip_step(store, "s", max_shard_bytes=4000)
    exp = {k: tuple(v.shape) for k, v in tiny_full_dcp[1].items()}
    assert (await verify_export(store, "s", expected=exp)).ok
    wrong = dict(exp)
    wrong["norm.weight"] = (99,)
    wrong["extra.weight"] = (1,)
    chk = await verify_export(store, "s", expected=wrong)
    assert not chk.ok and any("extra.weight" in p for p in chk.problems)
    assert any("norm.weight" in p and "(99,)" in p for p in chk.problems)
    shard = sorted((tmp_path / "s").glob("model-0000*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-3])
    chk = await verify_export(store, "s", expected=exp)
    assert not chk.ok and any("truncated" in p or "ends at byte" in p for p in chk.problems)
    shard.unlink()
    chk = await verify_export(store, "s")
    assert any("missing" in p for p in chk.problems)


def _write(p: Path, header: bytes, data: bytes = b"", length: int | None = None) -> Path:
    p.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)
    return p


@pytest.mark.parametrize(
    ("header", "data", "length", "match"),
    [
        (b"{}", b"", 2**62, "exceeds"),
        (b"{}", b"", 10**6, "does not fit"),
        (b"not json", b"", None, "not valid JSON"),
        (b"[1,2]", b"", None, "not a JSON object"),
        (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', b"1234", None, "truncated"),
        (b'{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', b"12345678", None, "needs 12 bytes"),
        (
            b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],'
            b'"data_offsets":[2,6]}}',
            b"123456",
            None,
            "overlaps",
        ),
        (b'{"a":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}}', b"1", None, "unknown dtype"),
        (b'{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}', b"1", None, "invalid shape"),
        (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}}', b"1", None, "invalid data_offsets"),
        (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{}}', b"1", None, "duplicate"),
        (b'{"__metadata__":{"k":1}}', b"", None, "__metadata__"),
    ],
)
def test_malformed_safetensors_rejected(
    tmp_path: Path, header: bytes, data: bytes, length: int | None, match: str
) -> None:
    p = _write(tmp_path / "bad.safetensors", header, data, length)
    with pytest.raises(SafetensorsError, match=match):
        read_header_file(p)


def test_short_file_rejected(tmp_path: Path) -> None:
    p = tmp_path / "tiny.safetensors"
    p.write_bytes(b"\x01\x02")
    with pytest.raises(SafetensorsError, match="too short"):
        read_header_file(p)


async def test_strip_rejects_hostile_dcp_metadata(tmp_path: Path, tiny_full_dcp: tuple[Path, dict]) -> None:
    import os
    import pickle

    shutil.copytree(tiny_full_dcp[0], tmp_path / "step-1")
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {marker}",))

    (tmp_path / "step-1" / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(CheckpointError, match="refusing to unpickle"):
        await strip_step(LocalStore(tmp_path), "step-1")
    assert not marker.exists()
    cat = await list_checkpoints(LocalStore(tmp_path))
    # committed (it has .metadata) but unreadable: corrupt, shown red, never touched
    assert cat.steps[0].kind == "corrupt" and "refusing to unpickle posix.system" in cat.steps[0].note
