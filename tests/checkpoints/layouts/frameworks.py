"""Runs written by the Hugging Face Trainer, accelerate, DeepSpeed, Megatron-LM and save_pretrained.

Where the library installs on CPU its own save function writes the files: ``Trainer`` (a real
training loop with evaluation, so ``trainer_state.json`` carries ``best_model_checkpoint``),
``Accelerator.save_state`` / ``save_model``, DeepSpeed's ``engine.save_checkpoint`` (ZeRO-1/2/3,
one or two gloo ranks, in subprocesses) and ``PreTrainedModel.save_pretrained``. Megatron-LM's
training code is not on PyPI (megatron-core has no legacy checkpointing), so its builder writes
the file set of ``megatron/training/checkpointing.py`` (``save_checkpoint`` /
``generate_state_dict``) with real ``torch.save`` contents of the same structure.

States that are not a finished save are made the way they look on disk while the library is
still writing: the files of a finished save minus the one the library writes last (the commit
marker), or a run-level marker that names an older step. ``corrupt`` is a committed step whose
files do not match it (zero bytes, truncated, a rank's or a shard's file missing).

Expensive runs (the Trainer, DeepSpeed) are made once per pytest session per distinct request
into a template (tests/checkpoints/layouts/cache.py: shared by the workers and kept between sessions
while the libraries and builders are unchanged) and copied; copies get fresh mtimes, in step order.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from lab.ports import free_port
from tests.checkpoints.layouts import KINDS, BuiltRun, StepSpec, register
from tests.checkpoints.layouts.cache import template as cached_template


def _kinds(
    builder: str, steps: Sequence[int], states: Mapping[int, str], *, allowed: Sequence[str], default: str = "full"
) -> dict[int, str]:
    """Each step's requested kind, oldest first; a request the library cannot produce is refused."""
    if not steps:
        raise ValueError(f"{builder}: give at least one step")
    if len(set(steps)) != len(steps) or any(s < 0 for s in steps):
        raise ValueError(f"{builder}: steps must be distinct non-negative numbers, got {list(steps)}")
    unknown = sorted(set(states) - set(steps))
    if unknown:
        raise ValueError(f"{builder}: states name steps that are not in the run: {unknown}")
    kinds = {s: states.get(s, default) for s in sorted(steps)}
    for s, k in kinds.items():
        if k not in KINDS:
            raise ValueError(f"{builder}: step {s}: kind {k!r} is not one of {KINDS}")
        if k not in allowed:
            raise ValueError(f"{builder}: step {s}: this layout has no {k!r} step (it has {tuple(allowed)})")
    return kinds


def _newest_committed(builder: str, kinds: Mapping[int, str]) -> int | None:
    """The step a run-level 'latest' file names; in-flight steps must all be newer than it.

    DeepSpeed's ``latest`` and Megatron's tracker are rewritten after every finished save, so a
    step folder without a finished save that is *older* than the named one is not in flight: it
    is a leftover of a crash, which these builders do not pretend to know the kind of.
    """
    committed = [s for s, k in kinds.items() if k != "incomplete"]
    newest = max(committed, default=None)
    stale = [s for s, k in kinds.items() if k == "incomplete" and newest is not None and s < newest]
    if stale:
        raise ValueError(
            f"{builder}: in-flight steps {stale} are older than the committed step {newest}; "
            "only the newest saves can still be in flight"
        )
    return newest


def _copy_tree(src: Path, dst: Path) -> None:
    # copy, not copy2: a copied step gets a fresh mtime, like a step the library just wrote.
    shutil.copytree(src, dst, copy_function=shutil.copy)


def _truncate(path: Path, size: int) -> None:
    with path.open("r+b") as f:
        f.truncate(size)


# --------------------------------------------------------------------------------------------
# Hugging Face Trainer
# --------------------------------------------------------------------------------------------

#: A two-layer Llama small enough that a training step costs milliseconds on CPU.
TINY_LLAMA = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=32,
)


def _quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is made from a config; nothing is fetched
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def tiny_llama(seed: int = 0) -> Any:
    """A freshly initialised ``LlamaForCausalLM`` of TINY_LLAMA's shape."""
    _quiet_transformers()
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**TINY_LLAMA))


class TokenDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """``n`` fixed random sequences of 8 tokens, as causal-LM examples."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.tokens = torch.randint(0, TINY_LLAMA["vocab_size"], (n, 8), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def trainer_args(output_dir: Path, max_steps: int, **overrides: Any) -> Any:
    """The TrainingArguments every Trainer run here uses (CPU, no logging, best by ``eval_score``)."""
    _quiet_transformers()
    from transformers import TrainingArguments

    never = max_steps + 1  # saves and evaluations come from _SaveAt, at the requested steps only
    kw: dict[str, Any] = dict(
        output_dir=str(output_dir),
        max_steps=max_steps,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        eval_strategy="steps",
        save_strategy="steps",
        eval_steps=never,
        save_steps=never,
        load_best_model_at_end=True,
        metric_for_best_model="score",
        greater_is_better=True,
        save_total_limit=None,
        report_to="none",
        use_cpu=True,
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    kw.update(overrides)
    return TrainingArguments(**kw)


def make_trainer(
    output_dir: Path,
    max_steps: int,
    *,
    save_at: Mapping[int, bool] | None = None,
    best: int | None = None,
    model: Any = None,
    **overrides: Any,
) -> Any:
    """A Trainer on ``tiny_llama`` that saves (model-only where ``save_at[step]``) and evaluates at ``save_at``.

    The metric ``eval_score`` is 1 at ``best`` and 0 elsewhere, so the Trainer's own
    ``_determine_best_metric`` records ``best`` as ``best_model_checkpoint``.
    """
    _quiet_transformers()
    from transformers import PrinterCallback, Trainer, TrainerCallback

    plan = dict(save_at or {})
    holder: list[Any] = []

    class _SaveAt(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step in plan:
                control.should_evaluate = True
                control.should_save = True
                # The Trainer reads this flag in _save_checkpoint: True leaves out optimizer,
                # scheduler and RNG state, exactly what a save_only_model=True run writes.
                args.save_only_model = plan[state.global_step]

    def score(_: Any) -> dict[str, float]:
        return {"score": 1.0 if holder[0].state.global_step == best else 0.0}

    trainer = Trainer(
        model=model if model is not None else tiny_llama(),
        args=trainer_args(output_dir, max_steps, **overrides),
        train_dataset=TokenDataset(64),
        eval_dataset=TokenDataset(2, seed=1),
        compute_metrics=score,
        callbacks=[_SaveAt()],
    )
    trainer.remove_callback(PrinterCallback)
    holder.append(trainer)
    return trainer


def _hf_trainer_template(steps: tuple[int, ...], model_only: frozenset[int], best: int | None) -> Path:
    def write(folder: Path) -> None:
        make_trainer(folder / "run", max(steps), save_at={s: s in model_only for s in steps}, best=best).train()

    return cached_template("hf-trainer", (steps, sorted(model_only), best), write) / "run"


@register("hf-trainer")
def hf_trainer(root: Path, steps: Sequence[int], states: Mapping[int, str]) -> BuiltRun:
    """``checkpoint-N/`` folders written by a real ``Trainer.train()`` (``trainer_state.json`` last).

    full: model.safetensors, config.json, generation_config.json, training_args.bin, optimizer.pt,
    scheduler.pt, rng_state.pth, trainer_state.json. weights: the same without optimizer.pt,
    scheduler.pt and rng_state.pth (``save_only_model=True``). incomplete: a full folder without
    trainer_state.json. corrupt: a committed folder whose model.safetensors has zero bytes.
    The Trainer's best checkpoint is the oldest full step (else the oldest model-only step).
    """
    kinds = _kinds("hf-trainer", steps, states, allowed=KINDS)
    candidates = [s for s, k in kinds.items() if k == "full"] or [s for s, k in kinds.items() if k == "weights"]
    best = min(candidates, default=None)
    template = _hf_trainer_template(tuple(kinds), frozenset(s for s, k in kinds.items() if k == "weights"), best)
    specs = []
    for step, kind in kinds.items():
        name = f"checkpoint-{step}"
        _copy_tree(template / name, root / name)
        if kind == "incomplete":
            (root / name / "trainer_state.json").unlink()
        elif kind == "corrupt":
            _truncate(root / name / "model.safetensors", 0)
        specs.append(StepSpec(name, step, "hf-trainer", kind, f"{name}/trainer_state.json", best=step == best))
    return BuiltRun(root, "hf-trainer", tuple(specs))


# --------------------------------------------------------------------------------------------
# accelerate
# --------------------------------------------------------------------------------------------


def make_accelerator(project_dir: Path | None = None, *, automatic_naming: bool = False) -> Any:
    """A fresh CPU ``Accelerator`` (accelerate's process-wide state reset first)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState
    from accelerate.utils import ProjectConfiguration

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()
    config = ProjectConfiguration(
        project_dir=str(project_dir) if project_dir else None, automatic_checkpoint_naming=automatic_naming
    )
    return Accelerator(cpu=True, project_config=config)


def accelerate_objects(accelerator: Any, seed: int = 0) -> tuple[Any, Any, Any]:
    """TinyLM, AdamW and a LambdaLR scheduler, prepared by ``accelerator``."""
    from tests.checkpoints.conftest import TinyLM

    torch.manual_seed(seed)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda n: 1.0 / (1 + n))
    return accelerator.prepare(model, opt, sched)


def _accelerate_saves(project: Path, run: Path, kinds: Mapping[int, str], *, automatic_naming: bool) -> None:
    """Train and save every step of ``kinds`` with the real accelerate, then break the
    incomplete and corrupt ones the way a crash or a bad disk would."""
    accelerator = make_accelerator(project, automatic_naming=automatic_naming)
    model, opt, sched = accelerate_objects(accelerator)
    gen = torch.Generator().manual_seed(0)
    for step, kind in kinds.items():
        accelerator.backward(model(torch.randint(0, 96, (2, 8), generator=gen)).float().pow(2).mean())
        opt.step()
        sched.step()
        opt.zero_grad()
        name = f"checkpoint_{step}" if automatic_naming else f"step_{step}"
        if kind == "weights":
            accelerator.save_model(model, run / name)
            continue
        if automatic_naming:
            # accelerate names the folder checkpoint_<iteration>; setting the iteration is the
            # documented way to number the folders by training step (its error message says so).
            accelerator.project_configuration.iteration = step
            accelerator.save_state()
        else:
            accelerator.save_state(str(run / name))
        if kind == "incomplete":
            (run / name / "random_states_0.pkl").unlink()
        elif kind == "corrupt":
            safetensors_file = run / name / "model.safetensors"
            _truncate(safetensors_file, safetensors_file.stat().st_size // 2)


def _accelerate_run(
    project: Path, run: Path, steps: Sequence[int], states: Mapping[int, str], *, builder: str, automatic_naming: bool
) -> BuiltRun:
    """The project folder written once per (builder, kinds) by :func:`_accelerate_saves` and
    copied to ``project``: the training and saving (and torch's optimizer import) run once."""
    kinds = _kinds(builder, steps, states, allowed=KINDS)
    sub = run.relative_to(project)

    def write(folder: Path) -> None:
        _accelerate_saves(folder / "project", folder / "project" / sub, kinds, automatic_naming=automatic_naming)

    template = cached_template(builder, tuple(kinds.items()), write) / "project"
    shutil.copytree(template, project, copy_function=shutil.copy, dirs_exist_ok=True)
    specs = []
    for step, kind in kinds.items():
        name = f"checkpoint_{step}" if automatic_naming else f"step_{step}"
        if kind == "weights":
            specs.append(StepSpec(name, step, "hf-safetensors", kind, None))
        else:
            specs.append(StepSpec(name, step, "accelerate", kind, f"{name}/random_states_0.pkl"))
    return BuiltRun(run, builder, tuple(specs))


@register("accelerate")
def accelerate_run(root: Path, steps: Sequence[int], states: Mapping[int, str]) -> BuiltRun:
    """``step_N/`` folders from ``Accelerator.save_state(dir)`` (random_states_0.pkl written last).

    full: model.safetensors, optimizer.bin, scheduler.bin, random_states_0.pkl. weights:
    ``accelerator.save_model`` (model.safetensors only; no marker, layout hf-safetensors).
    incomplete: a full folder without random_states_0.pkl. corrupt: model.safetensors cut in half.
    """
    return _accelerate_run(root, root, steps, states, builder="accelerate", automatic_naming=False)


@register("accelerate-auto")
def accelerate_auto_run(root: Path, steps: Sequence[int], states: Mapping[int, str]) -> BuiltRun:
    """``ProjectConfiguration(automatic_checkpoint_naming=True)``: ``root/checkpoints/checkpoint_N``.

    ``root`` is the project dir; the run folder returned is ``root/checkpoints``, the folder
    accelerate puts every save in. Files and states as for ``accelerate``.
    """
    return _accelerate_run(root, root / "checkpoints", steps, states, builder="accelerate-auto", automatic_naming=True)


# --------------------------------------------------------------------------------------------
# DeepSpeed
# --------------------------------------------------------------------------------------------

#: builder id -> the engine it runs: ZeRO stage, bf16, data-parallel ranks, consolidated 16-bit save.
DEEPSPEED_VARIANTS: dict[str, dict[str, Any]] = {
    "deepspeed-zero1": dict(stage=1, bf16=True, ranks=1, gather16=False),
    "deepspeed-zero2": dict(stage=2, bf16=False, ranks=2, gather16=False),
    "deepspeed-zero3": dict(stage=3, bf16=True, ranks=2, gather16=False),
    "deepspeed-zero3-16bit": dict(stage=3, bf16=True, ranks=2, gather16=True),
}
DEEPSPEED_WORKER = Path(__file__).with_name("deepspeed_worker.py")


def deepspeed_files(variant: str, step: int) -> list[str]:
    """The files DeepSpeed writes into ``global_stepN/`` for ``variant`` (engine.py's naming)."""
    v = DEEPSPEED_VARIANTS[variant]
    prefix = "bf16_" if v["bf16"] else ""  # _get_zero_ckpt_prefix
    optim = [f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(v["ranks"])]
    if v["stage"] == 3:  # zero_optimization_partition_weights: one model_states file per dp rank
        model = [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(v["ranks"])]
    else:
        model = ["mp_rank_00_model_states.pt"]
    return sorted(model + optim + (["pytorch_model.bin"] if v["gather16"] else []))


class DeepSpeedRunFailed(RuntimeError):
    """A rank of a DeepSpeed run exited non-zero; ``output`` is rank 0's log all the same (what it
    printed before the failure, e.g. the loads that succeeded)."""

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


def run_deepspeed(variant: str, spec: Mapping[str, Any]) -> str:
    """Run ``deepspeed_worker.py`` on every rank of ``variant`` with ``spec``; rank 0's output.

    Raises :class:`DeepSpeedRunFailed` (with each failed rank's log tail) if any rank fails."""
    v = DEEPSPEED_VARIANTS[variant]
    argv = json.dumps(dict(spec, stage=v["stage"], bf16=v["bf16"]))
    port = str(free_port())  # below the ephemeral range: rank 0 binds it later
    with tempfile.TemporaryDirectory(prefix="lm-deepspeed-") as logs:
        # Each rank logs to a file, not a pipe: a rank blocked on a full pipe while the other
        # waits for it in a collective would hang both.
        procs = []
        for rank in range(v["ranks"]):
            env = dict(
                os.environ,
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(v["ranks"]),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                DS_ACCELERATOR="cpu",
                CUDA_VISIBLE_DEVICES="",
                OMP_NUM_THREADS="1",
            )
            with open(Path(logs) / f"rank{rank}.log", "w") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, str(DEEPSPEED_WORKER), argv], env=env, stdout=log, stderr=subprocess.STDOUT
                    )
                )
        failures = []
        for rank, p in enumerate(procs):
            try:
                p.wait(timeout=240)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                p.wait()
            if p.returncode != 0:
                tail = (Path(logs) / f"rank{rank}.log").read_text(errors="replace")[-3000:]
                failures.append(f"rank {rank} exited {p.returncode}:\n{tail}")
        output = (Path(logs) / "rank0.log").read_text(errors="replace")
        if failures:
            raise DeepSpeedRunFailed(f"{variant}: the DeepSpeed run failed\n" + "\n".join(failures), output)
        return output


#: The steps one DeepSpeed run saves for every request within them (the real-layout tests' 1-6 and
#: the builder tests' 10, 20, 30): one launch per variant serves both. Each listed step is one
#: optimizer step, saved under that number.
DEEPSPEED_TEMPLATE_STEPS = (1, 2, 3, 4, 5, 6, 10, 20, 30)


def _deepspeed_template(variant: str, steps: tuple[int, ...]) -> Path:
    if set(steps) <= set(DEEPSPEED_TEMPLATE_STEPS):
        steps = DEEPSPEED_TEMPLATE_STEPS

    def write(folder: Path) -> None:
        gather16 = DEEPSPEED_VARIANTS[variant]["gather16"]
        run_deepspeed(variant, {"out": str(folder), "steps": list(steps), "gather16": gather16})

    return cached_template(variant, steps, write)


def _deepspeed_run(variant: str, root: Path, steps: Sequence[int], states: Mapping[int, str]) -> BuiltRun:
    import pytest

    pytest.importorskip("deepspeed", reason="the DeepSpeed layouts are written by deepspeed itself")
    kinds = _kinds(variant, steps, states, allowed=("full", "incomplete", "corrupt"))
    newest = _newest_committed(variant, kinds)
    template = _deepspeed_template(variant, tuple(kinds))
    for script in ("zero_to_fp32.py", "zero_to_torch.py"):  # rank 0 copies them beside the tags
        if (template / script).exists():
            shutil.copy(template / script, root / script)
    ranks = DEEPSPEED_VARIANTS[variant]["ranks"]
    specs = []
    for step, kind in kinds.items():
        name = f"global_step{step}"
        _copy_tree(template / name, root / name)
        if kind == "corrupt":
            optim = sorted((root / name).glob("*optim_states.pt"))
            if ranks == 1:
                _truncate(optim[0], 0)
            else:
                optim[-1].unlink()  # the last rank's partition never arrived
        specs.append(StepSpec(name, step, "deepspeed", kind, "latest"))
    if newest is not None:
        # engine.save_checkpoint: rank 0, after its own files, `fd.write(tag)` (no newline).
        (root / "latest").write_text(f"global_step{newest}")
    return BuiltRun(root, variant, tuple(specs))


def _register_deepspeed(variant: str) -> None:
    def builder(root: Path, steps: Sequence[int], states: Mapping[int, str]) -> BuiltRun:
        return _deepspeed_run(variant, root, steps, states)

    v = DEEPSPEED_VARIANTS[variant]
    builder.__name__ = variant.replace("-", "_")
    builder.__doc__ = (
        f"``global_stepN/`` from ``engine.save_checkpoint`` (ZeRO-{v['stage']}, {v['ranks']} rank(s), "
        f"bf16={v['bf16']}) and the run-level ``latest``; corrupt = a rank's optim_states "
        "missing (zero bytes with one rank); incomplete = newer than ``latest``."
    )
    register(variant)(builder)


for _variant in DEEPSPEED_VARIANTS:
    _register_deepspeed(_variant)


# --------------------------------------------------------------------------------------------
# Megatron-LM (legacy "torch" checkpoint format)
# --------------------------------------------------------------------------------------------

#: The shape of the tiny GPT the Megatron builders save (mcore GPTModel, Transformer Engine spec).
MEGATRON_SHAPE = dict(layers=2, hidden=32, ffn=64, heads=4, vocab=128)
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"


def megatron_args(*, tp: int, iteration: int, distributed_optimizer: bool, weights_only: bool) -> argparse.Namespace:
    """A slice of the argparse.Namespace Megatron pickles as ``args`` (the fields loaders read)."""
    s = MEGATRON_SHAPE
    return argparse.Namespace(
        num_layers=s["layers"],
        hidden_size=s["hidden"],
        ffn_hidden_size=s["ffn"],
        num_attention_heads=s["heads"],
        padded_vocab_size=s["vocab"],
        seq_length=64,
        max_position_embeddings=64,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=1,
        virtual_pipeline_model_parallel_size=None,
        expert_model_parallel_size=1,
        world_size=tp,
        data_parallel_size=1,
        micro_batch_size=2,
        global_batch_size=2,
        train_iters=10**6,
        iteration=iteration,
        consumed_train_samples=iteration * 2,
        consumed_valid_samples=0,
        bf16=True,
        fp16=False,
        params_dtype=torch.bfloat16,
        swiglu=True,
        normalization="RMSNorm",
        position_embedding_type="rope",
        untie_embeddings_and_output_weights=True,
        transformer_impl="transformer_engine",
        use_distributed_optimizer=distributed_optimizer,
        optimizer="adam",
        lr=3e-4,
        min_lr=3e-5,
        weight_decay=0.1,
        adam_beta1=0.9,
        adam_beta2=0.95,
        ckpt_format="torch",
        use_dist_ckpt=False,
        no_save_optim=weights_only,
        no_save_rng=weights_only,
        save="/checkpoints/gpt-tiny",
        load="/checkpoints/gpt-tiny",
        save_interval=100,
        async_save=False,
    )


def megatron_model(tp_rank: int, tp: int, seed: int) -> dict[str, torch.Tensor]:
    """``state_dict_for_save_checkpoint`` of a tiny mcore GPTModel (TE spec) for one TP rank.

    Column-parallel weights are split on dim 0, row-parallel on dim 1; TE modules carry an
    ``_extra_state`` that is an empty uint8 tensor when FP8 is off (TE's get_extra_state).
    """
    s = MEGATRON_SHAPE
    h, f, v = s["hidden"], s["ffn"], s["vocab"]
    gen = torch.Generator().manual_seed(seed)

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    def col(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(tp, 0)[tp_rank].clone()

    def row(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(tp, 1)[tp_rank].clone()

    extra = torch.empty(0, dtype=torch.uint8)
    sd: dict[str, torch.Tensor] = {"embedding.word_embeddings.weight": col(w(v, h))}
    for i in range(s["layers"]):
        p = f"decoder.layers.{i}."
        sd[p + "self_attention.core_attention._extra_state"] = extra.clone()
        sd[p + "self_attention.linear_proj.weight"] = row(w(h, h))
        sd[p + "self_attention.linear_proj._extra_state"] = extra.clone()
        sd[p + "self_attention.linear_qkv.layer_norm_weight"] = torch.ones(h, dtype=torch.bfloat16)
        sd[p + "self_attention.linear_qkv.weight"] = col(w(3 * h, h))
        sd[p + "self_attention.linear_qkv._extra_state"] = extra.clone()
        sd[p + "mlp.linear_fc1.layer_norm_weight"] = torch.ones(h, dtype=torch.bfloat16)
        sd[p + "mlp.linear_fc1.weight"] = col(w(2 * f, h))  # swiglu: gate and up, fused
        sd[p + "mlp.linear_fc1._extra_state"] = extra.clone()
        sd[p + "mlp.linear_fc2.weight"] = row(w(h, f))
        sd[p + "mlp.linear_fc2._extra_state"] = extra.clone()
    sd["decoder.final_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    sd["output_layer.weight"] = col(w(v, h))
    sd["output_layer._extra_state"] = extra.clone()
    return sd


def _megatron_adam(model: dict[str, torch.Tensor], iteration: int) -> tuple[list[list[torch.Tensor]], dict[str, Any]]:
    """fp32 main params per param group and the state_dict of the Adam that stepped them.

    Megatron's two groups: weights with weight decay, norms without.
    """
    names = [k for k in model if not k.endswith("_extra_state")]
    main = [model[k].float().clone().requires_grad_(True) for k in names]
    decay = [p for k, p in zip(names, main, strict=True) if not k.endswith("norm_weight") and "layernorm" not in k]
    no_decay = [p for k, p in zip(names, main, strict=True) if k.endswith("norm_weight") or "layernorm" in k]
    group_extra = dict(wd_mult=1.0, lr_mult=1.0, is_expert_parallel=False, is_decoupled_lr=False)
    opt = torch.optim.Adam(
        [
            dict(params=decay, weight_decay=0.1, **group_extra),
            dict(params=no_decay, weight_decay=0.0, **dict(group_extra, wd_mult=0.0)),
        ],
        lr=3e-4,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    for p in main:
        p.grad = torch.full_like(p, 1e-3)
    opt.step()
    sd = opt.state_dict()
    for st in sd["state"].values():
        st["step"] = torch.tensor(float(iteration))
    return [[p.detach() for p in decay], [p.detach() for p in no_decay]], sd


def _megatron_rng(seed: int) -> list[dict[str, Any]]:
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

    def cuda_like() -> torch.Tensor:  # a CUDA philox generator state is 16 bytes (seed, offset)
        return torch.tensor(list(seed.to_bytes(8, "little")) + [0] * 8, dtype=torch.uint8)

    return [
        {
            "random_rng_state": random.getstate(),
            "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state(),
            "cuda_rng_state": cuda_like(),
            "rng_tracker_states": {
                "model-parallel-rng": cuda_like(),
                "expert-parallel-rng": cuda_like(),
                "data-parallel-rng": cuda_like(),
            },
        }
    ]


def megatron_state(
    *, tp: int, tp_rank: int, iteration: int, distributed_optimizer: bool, weights_only: bool
) -> tuple[dict[str, Any], dict[Any, Any] | None]:
    """(model_optim_rng.pt contents, distrib_optim.pt contents or None) for one rank of one save."""
    model = megatron_model(tp_rank, tp, seed=1000 * iteration + tp_rank)
    state: dict[str, Any] = {
        "args": megatron_args(
            tp=tp, iteration=iteration, distributed_optimizer=distributed_optimizer, weights_only=weights_only
        ),
        "checkpoint_version": 3.0,
        "iteration": iteration,
        "model": model,
    }
    distrib = None
    if not weights_only:
        groups_main, adam = _megatron_adam(model, iteration)
        main = [p for g in groups_main for p in g]  # optimizer state ids 0..n-1 follow this order
        if distributed_optimizer:
            # DistributedOptimizer.state_dict(): param_groups without "params", with "step";
            # the per-parameter state lives in distrib_optim.pt (get_parameter_state_dp_zero).
            groups = [{k: v for k, v in g.items() if k != "params"} | {"step": iteration} for g in adam["param_groups"]]
            state["optimizer"] = {"optimizer": {"param_groups": groups}}
            flat = {
                key: torch.cat([adam["state"][i][key].flatten() for i in range(len(main))][::-1])
                for key in ("exp_avg", "exp_avg_sq")
            }
            param = torch.cat([p.flatten() for p in main][::-1])  # grad buffers hold params in reverse
            distrib = {
                "buckets_coalesced": True,
                0: {(torch.bfloat16, torch.float32): {"param": param, **flat, "numel_unpadded": param.numel()}},
            }
        else:
            # Float16OptimizerWithFloat16Params.state_dict() (bf16, so no grad_scaler entry).
            state["optimizer"] = {"optimizer": adam, "fp32_from_fp16_params": groups_main}
        state["opt_param_scheduler"] = {
            "max_lr": 3e-4,
            "lr_warmup_steps": 10,
            "num_steps": iteration * 2,
            "lr_decay_style": "cosine",
            "lr_decay_steps": 10**6,
            "min_lr": 3e-5,
            "start_wd": 0.1,
            "end_wd": 0.1,
            "wd_incr_style": "constant",
            "wd_incr_steps": 10**6,
        }
        state["rng_state"] = _megatron_rng(iteration + tp_rank)
    state["num_floating_point_operations_so_far"] = float(iteration) * 1.5e12
    return state, distrib


def megatron_iter_dir(iteration: int) -> str:
    """``iter_{:07d}`` (get_checkpoint_name)."""
    return f"iter_{iteration:07d}"


def _megatron_run(
    builder: str, root: Path, steps: Sequence[int], states: Mapping[int, str], *, tp: int, distributed_optimizer: bool
) -> BuiltRun:
    kinds = _kinds(builder, steps, states, allowed=KINDS)
    newest = _newest_committed(builder, kinds)
    specs = []
    for step, kind in kinds.items():
        name = megatron_iter_dir(step)
        for tp_rank in range(tp):
            rank_dir = root / name / f"mp_rank_{tp_rank:02d}"
            rank_dir.mkdir(parents=True)
            state, distrib = megatron_state(
                tp=tp,
                tp_rank=tp_rank,
                iteration=step,
                distributed_optimizer=distributed_optimizer,
                weights_only=kind == "weights",
            )
            if distrib is not None:  # save_checkpoint writes distrib_optim.pt before the model file
                torch.save(distrib, rank_dir / "distrib_optim.pt")
            torch.save(state, rank_dir / "model_optim_rng.pt")
        if kind == "corrupt":
            last = root / name / f"mp_rank_{tp - 1:02d}"
            if distributed_optimizer:
                (last / "distrib_optim.pt").unlink()  # the last rank's optimizer shard is missing
            else:
                f = last / "model_optim_rng.pt"
                _truncate(f, f.stat().st_size // 2)
        specs.append(StepSpec(name, step, "megatron", kind, MEGATRON_TRACKER))
    if newest is not None:
        # iter_finalize_fn: rank 0, after the barrier that follows every rank's torch.save.
        (root / MEGATRON_TRACKER).write_text(str(newest))
    return BuiltRun(root, builder, tuple(specs))


@register("megatron-legacy")
def megatron_legacy(root: Path, steps: Sequence[int], states: Mapping[int, str]) -> BuiltRun:
    """``iter_NNNNNNN/mp_rank_00/model_optim_rng.pt`` (TP=1, Float16Optimizer) + the tracker file.

    weights: saved with --no-save-optim --no-save-rng (same file name, no optimizer,
    opt_param_scheduler or rng_state). corrupt: model_optim_rng.pt cut in half.
    incomplete: an iteration newer than latest_checkpointed_iteration.txt.
    """
    return _megatron_run("megatron-legacy", root, steps, states, tp=1, distributed_optimizer=False)


@register("megatron-legacy-distopt")
def megatron_legacy_distopt(root: Path, steps: Sequence[int], states: Mapping[int, str]) -> BuiltRun:
    """TP=2 with the distributed optimizer: ``mp_rank_0{0,1}/{distrib_optim.pt,model_optim_rng.pt}``.

    model_optim_rng.pt's "optimizer" holds only param_groups; the Adam moments and fp32 params are
    in distrib_optim.pt. corrupt: mp_rank_01/distrib_optim.pt missing. weights: no distrib_optim.pt.
    """
    return _megatron_run("megatron-legacy-distopt", root, steps, states, tp=2, distributed_optimizer=True)


# --------------------------------------------------------------------------------------------
# Hugging Face save_pretrained export (sharded safetensors)
# --------------------------------------------------------------------------------------------

#: Small enough that TINY_LLAMA in bf16 (~15 KB) splits into several shards.
HF_EXPORT_SHARD_BYTES = 6000


def _hf_export_template(step: int) -> Path:
    """Step ``step``'s export, written once by ``save_pretrained`` (the model is made per step)."""

    def write(folder: Path) -> None:
        model = tiny_llama(seed=step).to(torch.bfloat16)
        model.save_pretrained(folder / "step", max_shard_size=HF_EXPORT_SHARD_BYTES)

    return cached_template("hf-export", step, write) / "step"


@register("hf-export")
def hf_export(root: Path, steps: Sequence[int], states: Mapping[int, str]) -> BuiltRun:
    """``step-N/`` from ``save_pretrained(max_shard_size=...)`` of a bf16 tiny Llama (index written last).

    weights: config.json, generation_config.json, model-0000i-of-0000N.safetensors,
    model.safetensors.index.json. incomplete: the shards without the index. corrupt: the index
    names a shard that is missing.
    """
    kinds = _kinds("hf-export", steps, states, allowed=("weights", "incomplete", "corrupt"), default="weights")
    specs = []
    for step, kind in kinds.items():
        name = f"step-{step}"
        _copy_tree(_hf_export_template(step), root / name)
        index = root / name / "model.safetensors.index.json"
        if kind == "incomplete":
            index.unlink()
        elif kind == "corrupt":
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            (root / name / shards[-1]).unlink()
        specs.append(StepSpec(name, step, "hf-safetensors", kind, f"{name}/model.safetensors.index.json"))
    return BuiltRun(root, "hf-export", tuple(specs))
