"""The DCP-family builders write what their libraries write: each library's own loader agrees.

Every run mixes kinds. A ``full`` step loads into a fresh model and optimizer through the library's
loader and gives back exactly the state ``dcp_family`` trained (replayed here); a ``weights`` step
loads the model and has no optimizer state; an ``incomplete`` step lacks the library's commit
marker and its loader refuses it; a ``corrupt`` step has the marker and its loader fails.
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

from tests.checkpoints.layouts import LAYOUTS, BuiltRun, StepSpec
from tests.checkpoints.layouts import dcp_family as F

STEPS = (100, 200, 300, 400)
MIXED = {100: "full", 200: "corrupt", 300: "weights", 400: "incomplete"}
STATES: dict[str, dict[int, str]] = {
    "dcp-torchtitan": {100: "full", 200: "corrupt", 300: "incomplete", 400: "weights"},  # export last
    "lightning": {100: "full", 200: "corrupt", 300: "weights", 400: "full"},  # no in-flight file
}
MEGATRON = ("megatron-torch-dist", "megatron-torch-dist-model-space", "megatron-torch-dist-common-in-dcp")

#: builder -> catalog layout id, and the files of one step per kind (the report's file table).
DCP_FILES = {".metadata", "__0_0.distcp"}
FILES: dict[str, tuple[str, dict[str, set[str]]]] = {
    "dcp-fsdp2": (
        "dcp",
        {
            "full": DCP_FILES | {"__1_0.distcp"},
            "weights": DCP_FILES | {"__1_0.distcp"},
            "incomplete": {"__0_0.distcp", "__1_0.distcp"},
            "corrupt": DCP_FILES,
        },
    ),
    **{
        b: ("dcp", {"full": DCP_FILES, "weights": DCP_FILES, "incomplete": {"__0_0.distcp"}, "corrupt": DCP_FILES})
        for b in ("dcp-appstate", "dcp-torchtitan", "dcp-safetensors")
    },
    "lightning-dir": (
        "lightning",
        {k: DCP_FILES | {"meta.pt"} for k in ("full", "weights", "corrupt")} | {"incomplete": DCP_FILES},
    ),
    **{
        b: (
            "megatron",
            {k: DCP_FILES | {"common.pt", "metadata.json"} for k in ("full", "weights", "corrupt")}
            | {"incomplete": {"__0_0.distcp", "common.pt"}},
        )
        for b in MEGATRON[:2]
    },
    MEGATRON[2]: (
        "megatron",
        {k: DCP_FILES | {"metadata.json"} for k in ("full", "weights", "corrupt")} | {"incomplete": {"__0_0.distcp"}},
    ),
    "torch-save": (
        "torch-save",
        {
            "full": {"checkpoint.pt"},
            "weights": {"checkpoint.pt"},
            "incomplete": {"checkpoint.pt.tmp"},
            "corrupt": {"checkpoint.pt"},
        },
    ),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], BuiltRun]:
    """Build each layout's mixed run once for this module."""
    made: dict[str, BuiltRun] = {}

    def get(layout: str) -> BuiltRun:
        if layout not in made:
            root = tmp_path_factory.mktemp(layout)
            made[layout] = LAYOUTS[layout](root / "run", STEPS, STATES.get(layout, MIXED))
        return made[layout]

    return get


def _path(run: BuiltRun, step: int) -> Path:
    return run.root / run.spec(step).name


def _reference(index: int, world: int = 1) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model and AdamW the builders saved as the run's step number ``index`` (0-based)."""
    with F.one_thread():  # as the templates were written: bit-identical
        for i, (model, opt) in enumerate(F.trajectory(index + 1, world=world)):
            if i == index:
                return model, opt
    raise AssertionError(index)


def _exp_avg(model: torch.nn.Module, opt: torch.optim.Optimizer, name: str) -> torch.Tensor:
    return opt.state[dict(model.named_parameters())[name]]["exp_avg"]


def _same_state(
    got: tuple[torch.nn.Module, torch.optim.Optimizer],
    want: tuple[torch.nn.Module, torch.optim.Optimizer],
    *,
    atol: float = 0.0,
) -> None:
    """Every weight and every AdamW exp_avg / exp_avg_sq / step equal (within ``atol``)."""
    (gm, go), (wm, wo) = got, want
    for (name, g), (_, w) in zip(gm.state_dict().items(), wm.state_dict().items(), strict=True):
        torch.testing.assert_close(g, w, atol=atol, rtol=0, msg=name)
    gp, wp = dict(gm.named_parameters()), dict(wm.named_parameters())
    for name in wp:
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(
                go.state[gp[name]][key], wo.state[wp[name]][key], atol=atol, rtol=0, msg=f"{name}.{key}"
            )


def _keys(step_dir: Path) -> set[str]:
    return set(FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata)


def _quiet_load(state: dict[str, Any], step_dir: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(step_dir))


def _refuses(state: dict[str, Any], step_dir: Path) -> None:
    # CheckpointException derives from BaseException, not Exception: name it.
    with pytest.raises((CheckpointException, RuntimeError, FileNotFoundError)):
        _quiet_load(state, step_dir)


# --- every builder: the files, the layout id, the marker -------------------------------------


@pytest.mark.parametrize("layout", sorted(FILES))
def test_step_folders_hold_the_files_the_library_writes(runs: Callable[[str], BuiltRun], layout: str) -> None:
    run = runs(layout)
    catalog, files = FILES[layout]
    assert [s.step for s in run.steps] == list(STEPS)
    for spec in run.steps:
        assert spec.layout == catalog
        assert {p.name for p in _path(run, spec.step).iterdir()} == files[spec.kind], spec
        assert spec.marker is not None
        assert (run.root / spec.marker).exists() == (spec.kind != "incomplete"), spec


def test_lightning_steps_are_files_named_by_epoch_and_step(runs: Callable[[str], BuiltRun]) -> None:
    run = runs("lightning")
    assert sorted(p.name for p in run.root.iterdir()) == [
        "epoch=0-step=100.ckpt",
        "epoch=0-step=200.ckpt",
        "epoch=1-step=300.ckpt",
        "epoch=1-step=400.ckpt",
    ]
    assert all(_path(run, s).is_file() and run.spec(s).marker == run.spec(s).name for s in STEPS)


def test_builders_refuse_kinds_their_library_never_writes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="in-flight"):
        LAYOUTS["lightning"](tmp_path / "l", STEPS, {400: "incomplete"})
    with pytest.raises(ValueError, match="last save"):
        LAYOUTS["dcp-torchtitan"](tmp_path / "t", STEPS, {200: "weights"})
    with pytest.raises(ValueError, match="not in the run"):
        LAYOUTS["torch-save"](tmp_path / "s", STEPS, {500: "full"})
    assert F.SUPPORTED_KINDS["lightning"] == ("full", "weights", "corrupt")
    from tests.checkpoints.layouts.more_layouts import BUILDERS

    assert set(F.SUPPORTED_KINDS) - set(BUILDERS) == set(FILES) | {"lightning"}


def test_a_second_build_copies_the_same_bytes(runs: Callable[[str], BuiltRun], tmp_path: Path) -> None:
    first = runs("dcp-appstate")
    again = LAYOUTS["dcp-appstate"](tmp_path / "again", STEPS, MIXED)
    files = sorted(p.relative_to(first.root) for p in first.root.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again.root) for p in again.root.rglob("*") if p.is_file())
    assert all((first.root / f).read_bytes() == (again.root / f).read_bytes() for f in files)


# --- torch DCP: FSDP2, AppState, torchtitan, safetensors -------------------------------------


def test_fsdp2_two_rank_save_loads_into_one_process(runs: Callable[[str], BuiltRun]) -> None:
    run = runs("dcp-fsdp2")
    full = _path(run, 100)
    md = FileSystemReader(str(full)).read_metadata()
    # Both ranks wrote half of every sharded tensor: two chunks, one per file.
    wq = md.state_dict_metadata["model.layers.0.wq.weight"]
    assert len(wq.chunks) == 2
    assert {i.relative_path for i in md.storage_data.values()} == {"__0_0.distcp", "__1_0.distcp"}

    model, opt = F.fresh()
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    _quiet_load(state, full)
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    # The 2-rank run averages two batches per step: one process on the mean loss is the same run.
    _same_state((model, opt), _reference(0, world=2), atol=1e-6)

    weights = _path(run, 300)
    assert {k.split(".")[0] for k in _keys(weights)} == {"model"}
    _quiet_load({"model": get_model_state_dict(F.fresh()[0])}, weights)
    _refuses(dict(zip(("model", "optim"), get_state_dict(*F.fresh()), strict=True)), weights)
    _refuses(dict(zip(("model", "optim"), get_state_dict(*F.fresh()), strict=True)), _path(run, 200))  # rank 1 gone
    _refuses({"model": get_model_state_dict(F.fresh()[0])}, _path(run, 400))


def test_appstate_recipe_round_trips_through_dcp_load(runs: Callable[[str], BuiltRun]) -> None:
    run = runs("dcp-appstate")
    keys = _keys(_path(run, 100))
    assert all(k.startswith(("app.model.", "app.optim.")) for k in keys)
    assert "app.optim.state.layers.0.wq.weight.exp_avg" in keys

    model, opt = F.fresh()
    _quiet_load({"app": F.AppState(model, opt)}, _path(run, 100))  # calls AppState.load_state_dict
    _same_state((model, opt), _reference(0))

    weights = _path(run, 300)
    assert all(k.startswith("app.model.") for k in _keys(weights))
    model = F.fresh()[0]
    _quiet_load({"app": F.AppState(model)}, weights)
    torch.testing.assert_close(model.state_dict(), _reference(2)[0].state_dict(), atol=0, rtol=0)
    _refuses({"app": F.AppState(*F.fresh())}, weights)
    _refuses({"app": F.AppState(*F.fresh())}, _path(run, 200))  # truncated shard
    _refuses({"app": F.AppState(*F.fresh())}, _path(run, 400))  # no .metadata


def test_torchtitan_flat_states_load_like_its_checkpointer(runs: Callable[[str], BuiltRun]) -> None:
    run = runs("dcp-torchtitan")
    keys = _keys(_path(run, 100))
    assert "tok_embeddings.weight" in keys and not any(k.startswith("model.") for k in keys)
    assert {
        "optimizer.state.layers.0.wq.weight.exp_avg",
        "optimizer.param_groups.layers.0.wq.weight.lr",
        "lr_scheduler.last_epoch",
        "dataloader.dp_rank_0",
        "train_state.step",
    } <= keys

    model, opt = F.fresh()
    states = F.titan_states(0, model, opt)
    _quiet_load(states, _path(run, 100))  # model tensors in place, optimizer via its Stateful
    assert states["train_state"]["step"] == 100 and states["lr_scheduler"]["last_epoch"] == 100
    _same_state((model, opt), _reference(0))

    export = _path(run, 400)  # last_save_model_only: model keys only, bf16
    md = FileSystemReader(str(export)).read_metadata().state_dict_metadata
    assert set(md) == set(_reference(0)[0].state_dict())
    assert {m.properties.dtype for m in md.values()} == {torch.bfloat16}
    exported = F.titan_states(400, F.fresh()[0], None)
    _quiet_load(exported, export)
    want = _reference(3)[0].state_dict()
    assert all(torch.equal(exported[k], want[k].to(torch.bfloat16)) for k in want)
    _refuses(F.titan_states(400, *F.fresh()), export)
    _refuses(F.titan_states(200, *F.fresh()), _path(run, 200))  # zero-byte shard
    _refuses(F.titan_states(300, *F.fresh()), _path(run, 300))  # no .metadata


def test_safetensors_format_dcp_is_read_by_safetensors_not_dcp_load(runs: Callable[[str], BuiltRun]) -> None:
    from safetensors import safe_open
    from safetensors.torch import load as load_safetensors

    run = runs("dcp-safetensors")
    full = _path(run, 100)
    # torch 2.13's own FileSystemReader torch.load()s each tensor from the .metadata byte range,
    # but this writer put the values in a safetensors blob after the byte items: dcp.load fails.
    _refuses(dict(zip(("model", "optim"), get_state_dict(*F.fresh()), strict=True)), full)
    md = FileSystemReader(str(full)).read_metadata()
    start = F.safetensors_payload_start(full)
    tensor_offsets = {
        i.offset for k, i in md.storage_data.items() if isinstance(md.state_dict_metadata[k.fqn], TensorStorageMetadata)
    }
    assert tensor_offsets == {start}  # every tensor "starts" at the same place

    blob = load_safetensors((full / "__0_0.distcp").read_bytes()[start:])
    model, opt = _reference(0)
    assert torch.equal(blob["model.layers.0.wq.weight"], model.layers[0].wq.weight.detach())
    assert torch.equal(blob["optim.state.layers.0.wq.weight.exp_avg"], _exp_avg(model, opt, "layers.0.wq.weight"))

    weights = _path(run, 300)  # no byte items at all: the shard is a plain safetensors file
    assert F.safetensors_payload_start(weights) == 0
    with safe_open(str(weights / "__0_0.distcp"), framework="pt") as f:
        assert set(f.keys()) == {f"model.{k}" for k in model.state_dict()}
        assert torch.equal(f.get_tensor("model.output.weight"), _reference(2)[0].output.weight.detach())

    corrupt = _path(run, 200)
    size = (corrupt / "__0_0.distcp").stat().st_size
    ends = [i.offset + i.length for i in FileSystemReader(str(corrupt)).read_metadata().storage_data.values()]
    assert max(ends) <= size  # .metadata's ranges all fit: only the safetensors header shows the cut
    with pytest.raises(Exception, match="(?i)incomplete|invalid|header|metadata"):
        load_safetensors((corrupt / "__0_0.distcp").read_bytes()[F.safetensors_payload_start(corrupt) :])
    assert not (_path(run, 400) / ".metadata").exists()


# --- torch.save ------------------------------------------------------------------------------


def test_torch_save_steps_load_with_weights_only(runs: Callable[[str], BuiltRun]) -> None:
    run = runs("torch-save")
    obj = torch.load(_path(run, 100) / "checkpoint.pt", weights_only=True)
    assert set(obj) == {"model", "optimizer", "step"} and obj["step"] == 100
    model, opt = F.fresh()
    model.load_state_dict(obj["model"])
    opt.load_state_dict(obj["optimizer"])
    _same_state((model, opt), _reference(0))

    weights = torch.load(_path(run, 300) / "checkpoint.pt", weights_only=True)
    assert set(weights) == {"model", "step"}
    with pytest.raises(RuntimeError, match="central directory"):
        torch.load(_path(run, 200) / "checkpoint.pt", weights_only=True)
    with pytest.raises(RuntimeError, match="central directory"):
        torch.load(_path(run, 400) / "checkpoint.pt.tmp", weights_only=True)


# --- Lightning -------------------------------------------------------------------------------


def _lightning_reference(upto: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Replay LitTinyLM: batch i backprops once, then AdamW steps up to STEPS[i]."""
    model = F.fresh()[0]
    opt = F.lightning_optimizer(model.parameters())
    done = 0
    with F.one_thread():
        for i, target in enumerate(STEPS[: upto + 1]):
            F.loss(model, F.batch(i % F.LIGHTNING_BATCHES_PER_EPOCH)).backward()
            for _ in range(target - done):
                opt.step()
            opt.zero_grad()
            done = target
    return model, opt


def test_lightning_ckpt_files_load_with_lightning(runs: Callable[[str], BuiltRun]) -> None:
    run = runs("lightning")
    module = F.lightning_module_class()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = module.load_from_checkpoint(_path(run, 100))  # Lightning's own loader
        weights = module.load_from_checkpoint(_path(run, 300))
        with pytest.raises(RuntimeError, match="central directory"):
            module.load_from_checkpoint(_path(run, 200))
    want_model, want_opt = _lightning_reference(0)
    torch.testing.assert_close(full.model.state_dict(), want_model.state_dict(), atol=0, rtol=0)
    torch.testing.assert_close(weights.model.state_dict(), _lightning_reference(2)[0].state_dict(), atol=0, rtol=0)

    ck = torch.load(_path(run, 100), weights_only=False)  # fine in a test, never in the backend
    assert ck["global_step"] == 100 and ck["epoch"] == 0
    exp_avg = ck["optimizer_states"][0]["state"][2]["exp_avg"]  # param 2 = layers.0.wq.weight
    assert torch.equal(exp_avg, _exp_avg(want_model, want_opt, "layers.0.wq.weight"))
    ck = torch.load(_path(run, 300), weights_only=False)
    assert ck["global_step"] == 300 and ck["epoch"] == 1
    assert "optimizer_states" not in ck and "lr_schedulers" not in ck


def test_lightning_sharded_folders_load_with_lightning(runs: Callable[[str], BuiltRun]) -> None:
    from lightning.fabric.strategies.fsdp import _is_sharded_checkpoint
    from lightning.fabric.utilities.load import _load_distributed_checkpoint

    run = runs("lightning-dir")
    assert [_is_sharded_checkpoint(_path(run, s)) for s in STEPS] == [True, True, True, False]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ck = _load_distributed_checkpoint(_path(run, 100))
        weights = _load_distributed_checkpoint(_path(run, 300))
        with pytest.raises(CheckpointException):
            _load_distributed_checkpoint(_path(run, 200))
    want_model, want_opt = _lightning_reference(0)
    assert ck["global_step"] == 100
    assert torch.equal(ck["model"]["model.output.weight"], want_model.output.weight.detach())
    assert torch.equal(
        ck["optimizer_0"]["state"]["model.layers.0.wq.weight"]["exp_avg"],
        _exp_avg(want_model, want_opt, "layers.0.wq.weight"),
    )
    assert "optimizer_0" not in weights and weights["global_step"] == 300
    assert torch.equal(weights["model"]["model.output.weight"], _lightning_reference(2)[0].output.weight.detach())


# --- Megatron-LM torch_dist ------------------------------------------------------------------


def _megatron_load(step_dir: Path, like: dict[str, Any]) -> dict[str, Any]:
    """dcp.load into tensors shaped like ``like`` (BytesIO entries come back as BytesIO)."""
    import io

    state = {k: io.BytesIO() if isinstance(v, io.BytesIO) else torch.empty_like(v) for k, v in like.items()}
    _quiet_load(state, step_dir)
    return state


def _load_common(step_dir: Path, layout: str) -> dict[str, Any]:
    import io

    with torch.serialization.safe_globals([argparse.Namespace]):  # as megatron.core.safe_globals
        if layout != MEGATRON[2]:
            return torch.load(step_dir / "common.pt", weights_only=True)  # type: ignore[no-any-return]
        got = _megatron_load(step_dir, {"common_state/shard_0_1": io.BytesIO()})["common_state/shard_0_1"]
        got.seek(0)
        return torch.load(got, weights_only=True)[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("layout", MEGATRON)
def test_megatron_torch_dist_iterations(runs: Callable[[str], BuiltRun], layout: str) -> None:
    run = runs(layout)
    sharding = "fully_sharded_model_space" if layout.endswith("model-space") else "dp_reshardable"
    assert (run.root / "latest_checkpointed_iteration.txt").read_text() == "300"  # newest committed
    full = _path(run, 100)
    assert json.loads((full / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    common = _load_common(full, layout)
    assert common["iteration"] == 100 and common["checkpoint_version"] == 3.0
    assert common["optimizer"]["param_state_sharding_type"] == sharding

    model, opt = _reference(0)
    want = {**F.megatron_model_sd(model), **F.megatron_optimizer_sd(model, opt, sharding)}
    keys = _keys(full)
    assert "decoder.layers.self_attention.linear_qkv.weight" in keys  # layers stacked, no "model."
    assert all(
        k.startswith(("embedding.", "decoder.", "output_layer.", "optimizer.", "rng_state/", "common_state/"))
        for k in keys
    )
    got = _megatron_load(full, {k: v for k, v in want.items() if isinstance(v, torch.Tensor)})
    assert all(torch.equal(got[k], want[k]) for k in got)
    assert got["decoder.layers.self_attention.linear_qkv.weight"].shape == (2, 64, 32)
    if sharding == "dp_reshardable":
        # The bucket holds params in backprop order: output_layer first, at offset 0.
        (bucket,) = [k for k in got if k.endswith("bucket_idx_0.exp_avg")]
        out = _exp_avg(model, opt, "output.weight").flatten()
        assert torch.equal(got[bucket][: out.numel()], out)
    else:
        assert torch.equal(got["optimizer.state.exp_avg.output_layer.weight"], _exp_avg(model, opt, "output.weight"))

    weights = _path(run, 300)  # --no-save-optim
    assert not any(k.startswith("optimizer.") for k in _keys(weights))
    assert "optimizer" not in _load_common(weights, layout) and _load_common(weights, layout)["args"].no_save_optim
    model_only = {k: v for k, v in F.megatron_model_sd(_reference(2)[0]).items()}
    got = _megatron_load(weights, model_only)
    assert all(torch.equal(got[k], model_only[k]) for k in got)

    _refuses({k: torch.empty_like(v) for k, v in want.items() if isinstance(v, torch.Tensor)}, _path(run, 200))
    _refuses({k: torch.empty_like(v) for k, v in model_only.items()}, _path(run, 400))


def test_step_specs_are_what_the_interface_says(runs: Callable[[str], BuiltRun]) -> None:
    run = runs("megatron-torch-dist")
    assert run.layout == "megatron-torch-dist"
    assert run.spec(300) == StepSpec(
        name="iter_0000300", step=300, layout="megatron", kind="weights", marker="iter_0000300/metadata.json"
    )
