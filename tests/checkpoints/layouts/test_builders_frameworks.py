"""The framework builders write what the libraries write: proven with the libraries' own loaders.

Each run mixes the kinds a layout has. A full step resumes in the library that wrote it (Trainer,
accelerate, the DeepSpeed engine); a model-only step loads as a model and has no optimizer
state; an in-flight step lacks exactly the library's commit marker; a corrupt step is refused by
the library's loader. What the libraries themselves get wrong (their own "latest" pickers choose
an in-flight folder) is pinned here too, because the classifier must not copy it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from tests.checkpoints.layouts import LAYOUTS, BuiltRun
from tests.checkpoints.layouts import frameworks as fw

warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")


def _build(layout: str, root: Path, steps: list[int], states: dict[int, str]) -> BuiltRun:
    root.mkdir(parents=True)
    return LAYOUTS[layout](root, steps, states)


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def _per_step_markers_hold(run: BuiltRun) -> None:
    """A per-step marker is present exactly on committed steps."""
    for s in run.steps:
        assert (run.root / s.name).is_dir(), s
        if s.marker is not None:
            assert (run.root / s.marker).is_file() == (s.kind != "incomplete"), s


# --------------------------------------------------------------------------------------------
# Hugging Face Trainer
# --------------------------------------------------------------------------------------------

HF_FULL = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "optimizer.pt",
    "rng_state.pth",
    "scheduler.pt",
    "trainer_state.json",
    "training_args.bin",
}
HF_MODEL_ONLY = HF_FULL - {"optimizer.pt", "rng_state.pth", "scheduler.pt"}


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory: pytest.TempPathFactory) -> BuiltRun:
    return _build(
        "hf-trainer",
        tmp_path_factory.mktemp("hf") / "run",
        [2, 4, 6, 8, 10],
        {4: "weights", 8: "corrupt", 10: "incomplete"},
    )


def test_trainer_steps_hold_the_files_the_trainer_writes(trainer_run: BuiltRun) -> None:
    _per_step_markers_hold(trainer_run)
    got = {s.kind: _files(trainer_run.root / s.name) for s in trainer_run.steps}
    assert got["full"] == HF_FULL
    assert got["weights"] == HF_MODEL_ONLY
    assert got["incomplete"] == HF_FULL - {"trainer_state.json"}
    assert got["corrupt"] == HF_FULL
    assert (trainer_run.root / "checkpoint-8" / "model.safetensors").stat().st_size == 0
    assert [s.layout for s in trainer_run.steps] == ["hf-trainer"] * 5


def test_trainer_resumes_a_full_step_with_its_optimizer(trainer_run: BuiltRun, tmp_path: Path) -> None:
    ckpt = trainer_run.root / "checkpoint-6"
    saved = torch.load(ckpt / "optimizer.pt", weights_only=True)
    trainer = fw.make_trainer(tmp_path / "resumed", max_steps=7)
    n_params = sum(1 for p in trainer.model.parameters() if p.requires_grad)
    assert len(saved["state"]) == n_params and all("exp_avg" in st for st in saved["state"].values())
    trainer.train(resume_from_checkpoint=str(ckpt))
    assert trainer.state.global_step == 7  # resumed at 6, trained one more step


def test_trainer_model_only_step_is_a_model_without_optimizer_state(trainer_run: BuiltRun, tmp_path: Path) -> None:
    from transformers import LlamaForCausalLM

    ckpt = trainer_run.root / "checkpoint-4"
    model = LlamaForCausalLM.from_pretrained(ckpt)
    on_disk = load_file(ckpt / "model.safetensors")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in on_disk.items())
    assert json.loads((ckpt / "trainer_state.json").read_text())["global_step"] == 4
    # Surprise: the Trainer resumes from it without a word, with a fresh optimizer and schedule.
    trainer = fw.make_trainer(tmp_path / "from-weights", max_steps=5)
    trainer.train(resume_from_checkpoint=str(ckpt))
    assert trainer.state.global_step == 5


def test_trainer_refuses_the_in_flight_folder_its_own_picker_chooses(trainer_run: BuiltRun, tmp_path: Path) -> None:
    from transformers.trainer_utils import get_last_checkpoint

    in_flight = trainer_run.root / "checkpoint-10"
    # get_last_checkpoint goes by the number in the name alone: it picks the folder still being written.
    assert Path(get_last_checkpoint(str(trainer_run.root))) == in_flight
    with pytest.raises(FileNotFoundError, match="trainer_state.json"):
        fw.make_trainer(tmp_path / "r", max_steps=11).train(resume_from_checkpoint=str(in_flight))


def test_trainer_corrupt_step_is_refused_by_from_pretrained(trainer_run: BuiltRun) -> None:
    from transformers import LlamaForCausalLM

    with pytest.raises(SafetensorError, match="header too small"):  # the file has zero bytes
        LlamaForCausalLM.from_pretrained(trainer_run.root / "checkpoint-8")


def test_trainer_best_checkpoint_is_named_by_the_newest_trainer_state(trainer_run: BuiltRun) -> None:
    best = [s for s in trainer_run.steps if s.best]
    assert [s.name for s in best] == ["checkpoint-2"]
    committed = [s for s in trainer_run.steps if s.kind != "incomplete"]
    state = json.loads((trainer_run.root / committed[-1].name / "trainer_state.json").read_text())
    assert state["best_global_step"] == 2
    # The Trainer records the path it wrote to (here the template's): only the base name is
    # the run's, as for any run copied off its training node.
    assert Path(state["best_model_checkpoint"]).name == "checkpoint-2"
    assert not Path(state["best_model_checkpoint"]).is_relative_to(trainer_run.root)


def _written_last(folder: Path, name: str) -> bool:
    """No file in ``folder`` is newer than ``name`` (ties allowed: mtimes are coarse)."""
    return (folder / name).stat().st_mtime_ns == max(p.stat().st_mtime_ns for p in folder.iterdir())


def test_trainer_state_json_is_the_file_written_last(trainer_run: BuiltRun) -> None:
    # Copies have fresh mtimes, so look at the template the Trainer itself wrote.
    template = fw._hf_trainer_template((2, 4, 6, 8, 10), frozenset({4}), 2)
    for name in ("checkpoint-2", "checkpoint-4", "checkpoint-6"):
        assert _written_last(template / name, "trainer_state.json")


# --------------------------------------------------------------------------------------------
# accelerate
# --------------------------------------------------------------------------------------------

ACC_FULL = {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"}


@pytest.fixture(scope="module")
def accelerate_run(tmp_path_factory: pytest.TempPathFactory) -> BuiltRun:
    return _build(
        "accelerate",
        tmp_path_factory.mktemp("acc") / "run",
        [1, 2, 3, 4],
        {2: "weights", 3: "corrupt", 4: "incomplete"},
    )


def test_accelerate_steps_hold_the_files_save_state_writes(accelerate_run: BuiltRun) -> None:
    _per_step_markers_hold(accelerate_run)
    got = {s.kind: _files(accelerate_run.root / s.name) for s in accelerate_run.steps}
    assert got == {
        "full": ACC_FULL,
        "weights": {"model.safetensors"},
        "corrupt": ACC_FULL,
        "incomplete": ACC_FULL - {"random_states_0.pkl"},
    }
    assert [s.layout for s in accelerate_run.steps] == ["accelerate", "hf-safetensors", "accelerate", "accelerate"]


def test_accelerate_load_state_restores_model_optimizer_and_scheduler(accelerate_run: BuiltRun) -> None:
    accelerator = fw.make_accelerator()
    model, opt, sched = fw.accelerate_objects(accelerator, seed=1)  # other weights than the saved ones
    accelerator.load_state(str(accelerate_run.root / "step_1"))
    on_disk = load_file(accelerate_run.root / "step_1" / "model.safetensors")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in on_disk.items())
    assert opt.state_dict()["state"] and all("exp_avg" in st for st in opt.state_dict()["state"].values())
    assert sched.scheduler.last_epoch == 1  # one step before the save


def test_accelerate_model_only_step_loads_as_a_model(accelerate_run: BuiltRun) -> None:
    from accelerate.utils import load_checkpoint_in_model

    accelerator = fw.make_accelerator()
    model, _, _ = fw.accelerate_objects(accelerator, seed=1)
    load_checkpoint_in_model(model, str(accelerate_run.root / "step_2" / "model.safetensors"))
    on_disk = load_file(accelerate_run.root / "step_2" / "model.safetensors")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in on_disk.items())


def test_accelerate_resumes_an_unfinished_save_without_complaint(
    accelerate_run: BuiltRun, caplog: pytest.LogCaptureFixture
) -> None:
    # Surprise: load_state swallows the missing random_states_0.pkl (an info-level log line), so
    # a folder whose save never finished "resumes"; only its absence tells it was in flight.
    accelerator = fw.make_accelerator()
    fw.accelerate_objects(accelerator)
    with caplog.at_level(logging.INFO):
        accelerator.load_state(str(accelerate_run.root / "step_4"))
    assert "Could not load random states" in caplog.text


def test_accelerate_corrupt_step_is_refused(accelerate_run: BuiltRun) -> None:
    accelerator = fw.make_accelerator()
    fw.accelerate_objects(accelerator)
    with pytest.raises(SafetensorError, match="not fully covered"):  # model.safetensors cut in half
        accelerator.load_state(str(accelerate_run.root / "step_3"))


def test_accelerate_random_states_are_written_last(tmp_path: Path) -> None:
    accelerator = fw.make_accelerator()
    model, opt, sched = fw.accelerate_objects(accelerator)
    accelerator.save_state(str(tmp_path / "s"))
    assert _written_last(tmp_path / "s", "random_states_0.pkl")


def test_accelerate_automatic_naming_and_its_picker(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = _build("accelerate-auto", tmp_path / "project", [10, 20], {20: "incomplete"})
    assert run.root == tmp_path / "project" / "checkpoints"
    assert [s.name for s in run.steps] == ["checkpoint_10", "checkpoint_20"]
    _per_step_markers_hold(run)
    accelerator = fw.make_accelerator(tmp_path / "project", automatic_naming=True)
    fw.accelerate_objects(accelerator, seed=1)
    # load_state() with no folder takes the highest checkpoint_N, finished or not.
    with caplog.at_level(logging.INFO):
        accelerator.load_state()
    assert f"Loading states from {run.root / 'checkpoint_20'}" in caplog.text
    assert "Could not load random states" in caplog.text


# --------------------------------------------------------------------------------------------
# DeepSpeed (the engine itself, two gloo ranks on CPU)
# --------------------------------------------------------------------------------------------

DS_STATES = {20: "corrupt", 30: "incomplete"}


def deepspeed_test(fn: Callable[..., None]) -> Callable[..., None]:
    """Slow (multi-rank launches), and skipped where deepspeed is not installed."""
    missing = importlib.util.find_spec("deepspeed") is None
    return pytest.mark.slow(pytest.mark.skipif(missing, reason="deepspeed is not installed")(fn))


class _DeepSpeedRuns:
    """One run per variant, built the first time a test asks (each build is a multi-rank launch)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.runs: dict[str, BuiltRun] = {}
        self.failed: dict[str, str] = {}

    def __getitem__(self, variant: str) -> BuiltRun:
        if variant in self.failed:  # the real error, not the half-built folder's FileExistsError
            pytest.fail(f"the {variant} run failed to build in an earlier test: {self.failed[variant]}")
        if variant not in self.runs:
            try:
                self.runs[variant] = _build(variant, self.base / variant, [10, 20, 30], DS_STATES)
            except Exception as exc:
                self.failed[variant] = f"{type(exc).__name__}: {str(exc)[:2000]}"
                raise
        return self.runs[variant]


@pytest.fixture(scope="module")
def ds_runs(tmp_path_factory: pytest.TempPathFactory) -> _DeepSpeedRuns:
    return _DeepSpeedRuns(tmp_path_factory.mktemp("ds"))


@deepspeed_test
@pytest.mark.parametrize("variant", list(fw.DEEPSPEED_VARIANTS))
def test_deepspeed_file_set_is_engine_naming(ds_runs: _DeepSpeedRuns, variant: str) -> None:
    run = ds_runs[variant]
    assert (run.root / "latest").read_text() == "global_step20"  # newest committed; no newline
    assert {"zero_to_fp32.py", "zero_to_torch.py"} <= {p.name for p in run.root.iterdir()}
    expected = set(fw.deepspeed_files(variant, 10))
    assert _files(run.root / "global_step10") == expected
    assert _files(run.root / "global_step30") == expected  # in flight: complete files, not yet `latest`
    corrupt = _files(run.root / "global_step20")
    if fw.DEEPSPEED_VARIANTS[variant]["ranks"] == 1:
        assert corrupt == expected
        assert min(p.stat().st_size for p in (run.root / "global_step20").glob("*optim_states.pt")) == 0
    else:
        assert expected - corrupt == {max(n for n in expected if n.endswith("optim_states.pt"))}


@deepspeed_test
@pytest.mark.parametrize("variant", list(fw.DEEPSPEED_VARIANTS))
def test_deepspeed_zero_to_fp32_rebuilds_the_weights(ds_runs: _DeepSpeedRuns, variant: str) -> None:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from tests.checkpoints.conftest import TinyLM

    run = ds_runs[variant]
    names = set(TinyLM().state_dict())
    rebuilt = get_fp32_state_dict_from_zero_checkpoint(str(run.root), tag="global_step10")
    assert set(rebuilt) == names and all(t.numel() > 0 for t in rebuilt.values())
    with pytest.raises((ValueError, RuntimeError, EOFError, OSError)):  # DeepSpeed's own check
        get_fp32_state_dict_from_zero_checkpoint(str(run.root), tag="global_step20")


@deepspeed_test
def test_deepspeed_zero3_weights_live_only_in_the_optimizer_partitions(ds_runs: _DeepSpeedRuns) -> None:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    step = ds_runs["deepspeed-zero3"].root / "global_step10"
    for rank in (0, 1):
        ms = torch.load(step / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt", weights_only=True)
        assert ms["module"] and all(t.numel() == 0 for t in ms["module"].values())  # placeholders
        assert ms["param_shapes"][0]["tok_embeddings.weight"] == torch.Size([96, 32])
        # The optimizer files are refused by weights_only=True (LossScaler, ZeroStageEnum).
        with pytest.raises(Exception, match="Weights only load failed"):
            torch.load(step / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", weights_only=True)
    parts = [
        torch.load(step / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt", weights_only=False)[
            "optimizer_state_dict"
        ]["fp32_flat_groups"][0]
        for r in (0, 1)
    ]
    numel = sum(
        t.numel() for t in get_fp32_state_dict_from_zero_checkpoint(str(step.parent), tag="global_step10").values()
    )
    assert parts[0].numel() == parts[1].numel() and 2 * parts[0].numel() >= numel  # each rank a half (padded)


@dataclass(frozen=True)
class _EngineLoads:
    """What one engine launch made of ``deepspeed-zero3``: global_step10 by its tag, then the
    engine's own resume (no tag: ``latest``). An engine launch is mostly imports (~10 s), so one
    launch serves both tests."""

    results: list[dict[str, object]]  # rank 0's RESULT per load that succeeded, in order
    failure: str | None  # the run's error, from the first load that failed


@pytest.fixture(scope="module")
def ds_engine_loads(ds_runs: _DeepSpeedRuns) -> _EngineLoads:
    spec = {"load": str(ds_runs["deepspeed-zero3"].root), "tags": ["global_step10", None]}
    try:
        out, failure = fw.run_deepspeed("deepspeed-zero3", spec), None
    except fw.DeepSpeedRunFailed as exc:
        out, failure = exc.output, str(exc)
    results = [json.loads(line[len("RESULT ") :]) for line in out.splitlines() if line.startswith("RESULT ")]
    return _EngineLoads(results, failure)


@deepspeed_test
def test_deepspeed_zero3_resumes_in_the_engine(ds_runs: _DeepSpeedRuns, ds_engine_loads: _EngineLoads) -> None:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    run = ds_runs["deepspeed-zero3"]
    assert ds_engine_loads.results, ds_engine_loads.failure
    result = ds_engine_loads.results[0]  # the load by tag, the launch's first
    assert Path(str(result["path"])).parent.name == "global_step10" and result["global_steps"] == 10
    rebuilt = get_fp32_state_dict_from_zero_checkpoint(str(run.root), tag="global_step10")
    sums = result["sums"]
    assert isinstance(sums, dict)
    for name, t in rebuilt.items():
        assert sums[name] == pytest.approx(t.sum().item(), abs=0.05), name


@deepspeed_test
def test_deepspeed_engine_follows_latest_into_the_corrupt_step(ds_engine_loads: _EngineLoads) -> None:
    # `latest` names global_step20, whose rank-1 partition is missing: the engine's own resume
    # (tag from `latest`) fails; `latest` proves the save was started by rank 0, not that it landed.
    assert len(ds_engine_loads.results) == 1, ds_engine_loads.failure or "the resume from `latest` loaded"
    assert ds_engine_loads.failure is not None
    assert re.search(
        r"No such file or directory: .*global_step20/bf16_zero_pp_rank_1_mp_rank_00_optim", ds_engine_loads.failure
    ), ds_engine_loads.failure


@deepspeed_test
def test_deepspeed_zero3_16bit_export_matches_the_partitions(ds_runs: _DeepSpeedRuns) -> None:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    run = ds_runs["deepspeed-zero3-16bit"]
    exported = torch.load(run.root / "global_step10" / "pytorch_model.bin", weights_only=True)
    rebuilt = get_fp32_state_dict_from_zero_checkpoint(str(run.root), tag="global_step10")
    assert set(exported) == set(rebuilt)
    for name, t in rebuilt.items():
        assert exported[name].dtype == torch.bfloat16 and torch.equal(exported[name], t.to(torch.bfloat16)), name


# --------------------------------------------------------------------------------------------
# Megatron-LM legacy
# --------------------------------------------------------------------------------------------


def _load_megatron(path: Path) -> dict[str, object]:
    """What Megatron's load_checkpoint does: torch.load with weights_only=False."""
    return torch.load(path, weights_only=False)


@pytest.mark.parametrize("builder", ["megatron-legacy", "megatron-legacy-distopt"])
def test_megatron_file_set_and_contents(tmp_path: Path, builder: str) -> None:
    run = _build(builder, tmp_path / "run", [100, 200, 300, 400], {200: "weights", 300: "corrupt", 400: "incomplete"})
    distopt = builder.endswith("distopt")
    ranks = ["mp_rank_00", "mp_rank_01"] if distopt else ["mp_rank_00"]
    assert (run.root / fw.MEGATRON_TRACKER).read_text() == "300"
    full_files = {f"{r}/{f}" for r in ranks for f in (["distrib_optim.pt"] if distopt else []) + ["model_optim_rng.pt"]}
    assert _files(run.root / "iter_0000100") == full_files == _files(run.root / "iter_0000400")
    assert _files(run.root / "iter_0000200") == {f"{r}/model_optim_rng.pt" for r in ranks}

    full = _load_megatron(run.root / "iter_0000100" / "mp_rank_00" / "model_optim_rng.pt")
    assert set(full) == {
        "args",
        "checkpoint_version",
        "iteration",
        "model",
        "optimizer",
        "opt_param_scheduler",
        "rng_state",
        "num_floating_point_operations_so_far",
    }
    assert full["iteration"] == 100 and full["checkpoint_version"] == 3.0
    assert full["args"].use_distributed_optimizer is distopt
    weights = _load_megatron(run.root / "iter_0000200" / "mp_rank_00" / "model_optim_rng.pt")
    assert set(weights) == {"args", "checkpoint_version", "iteration", "model", "num_floating_point_operations_so_far"}
    with pytest.raises(Exception, match="Weights only load failed"):  # argparse.Namespace (and numpy rng)
        torch.load(run.root / "iter_0000200" / "mp_rank_00" / "model_optim_rng.pt", weights_only=True)

    optim = full["optimizer"]
    if distopt:
        assert set(optim["optimizer"]) == {"param_groups"} and "state" not in optim["optimizer"]
        shard = torch.load(run.root / "iter_0000100" / "mp_rank_00" / "distrib_optim.pt", weights_only=True)
        buf = shard[0][(torch.bfloat16, torch.float32)]
        numel = sum(t.numel() for k, t in full["model"].items() if not k.endswith("_extra_state"))
        assert buf["numel_unpadded"] == numel and {"param", "exp_avg", "exp_avg_sq"} <= set(buf)
        assert _files(run.root / "iter_0000300") == full_files - {"mp_rank_01/distrib_optim.pt"}
    else:
        assert all("exp_avg" in st for st in optim["optimizer"]["state"].values())
        assert sum(len(g) for g in optim["fp32_from_fp16_params"]) == len(optim["optimizer"]["state"])
        with pytest.raises(RuntimeError, match="failed finding central directory"):  # cut in half
            _load_megatron(run.root / "iter_0000300" / "mp_rank_00" / "model_optim_rng.pt")
    # TE's _extra_state without FP8 is an empty uint8 tensor: zero-element entries are normal here.
    assert any(k.endswith("_extra_state") and t.numel() == 0 for k, t in full["model"].items())


def test_megatron_in_flight_steps_must_be_the_newest(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="only the newest saves can still be in flight"):
        _build("megatron-legacy", tmp_path / "run", [100, 200], {100: "incomplete"})


# --------------------------------------------------------------------------------------------
# save_pretrained export
# --------------------------------------------------------------------------------------------


def test_hf_export_is_a_sharded_save_pretrained(tmp_path: Path) -> None:
    from transformers import LlamaForCausalLM

    run = _build("hf-export", tmp_path / "run", [1, 2, 3], {2: "incomplete", 3: "corrupt"})
    _per_step_markers_hold(run)
    assert [s.kind for s in run.steps] == ["weights", "incomplete", "corrupt"]
    index = json.loads((run.root / "step-1" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2 and index["metadata"]["total_size"] > 0
    assert _files(run.root / "step-1") == {
        "config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        *shards,
    }
    model = LlamaForCausalLM.from_pretrained(run.root / "step-1")
    assert model.dtype == torch.bfloat16
    assert _files(run.root / "step-2") == _files(run.root / "step-1") - {"model.safetensors.index.json"}
    missing = sorted(
        set(json.loads((run.root / "step-3" / "model.safetensors.index.json").read_text())["weight_map"].values())
    )[-1]
    with pytest.raises(FileNotFoundError, match=missing):  # the index names a shard that is not there
        LlamaForCausalLM.from_pretrained(run.root / "step-3")


def test_save_pretrained_writes_the_index_last(tmp_path: Path) -> None:
    fw.tiny_llama().save_pretrained(tmp_path / "x", max_shard_size=fw.HF_EXPORT_SHARD_BYTES)
    assert _written_last(tmp_path / "x", "model.safetensors.index.json")


def test_builders_refuse_what_the_library_cannot_write(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no 'full' step"):
        _build("hf-export", tmp_path / "a", [1], {1: "full"})
    with pytest.raises(ValueError, match="not in the run"):
        _build("hf-trainer", tmp_path / "b", [2], {3: "full"})
