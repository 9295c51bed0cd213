"""Layouts real teams arrange that the first rounds never listed, written by the libraries.

- ``dcp-nested`` (dcp): ``step-N/checkpoint/`` = a real ``dcp.save`` of ``{"model", "optim"}``,
  beside ``step-N/trainer_state.pt`` (a ``torch.save`` of RNG state and counters). The side file
  never decides the kind; the nested ``.metadata`` is the commit marker.
- ``dcp-iter`` (dcp): ``iter_NNNNNNN/`` = a plain ``dcp.save`` (no Megatron ``common.pt`` or
  ``metadata.json``, no tracker file): committed by its ``.metadata``.
- ``torch-unsharded`` (torch-save): OLMo's ``stepN-unsharded/`` = ``model.pt``, ``optim.pt``,
  ``train.pt``, each a ``torch.save``.
- ``torch-flat`` (torch-save): one ``torch.save`` file per step, flat in the run folder,
  ``model_N.pt`` (a name its siblings share).
- ``lightning-custom`` (lightning): a real Trainer with ``ModelCheckpoint(filename="ckpt-{step:06d}",
  auto_insert_metric_name=False)``: ``ckpt-000002.ckpt`` files.
- ``hf-trainer-adapter`` (hf-trainer): a real ``Trainer`` run whose checkpoints hold an adapter-only
  model save (``adapter_model.safetensors`` + ``adapter_config.json``, PEFT's file names) beside the
  optimizer, scheduler and trainer state.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from tests.checkpoints.conftest import TinyLM
from tests.checkpoints.layouts import BuiltRun, StepSpec, register
from tests.checkpoints.layouts.dcp_family import (
    DCP_MARKER,
    _install,
    _Layout,
    _truncate_file,
    _uncommit_dcp,
    _write_each_step,
    _write_lightning,
    truncate_below_metadata,
)

NESTED = "checkpoint"
#: The builders this module adds (beside dcp_family's in SUPPORTED_KINDS).
BUILDERS = ("dcp-nested", "dcp-iter", "torch-unsharded", "torch-flat", "lightning-custom")


def _save_nested(dest: Path, step: int, model: TinyLM, opt: torch.optim.Optimizer | None) -> None:
    import torch.distributed.checkpoint as dcp

    state = {"model": model.state_dict()} | ({"optim": opt.state_dict()} if opt is not None else {})
    dcp.save(state, checkpoint_id=str(dest / NESTED))
    torch.save({"rng": torch.get_rng_state(), "step": step, "epoch": 0}, dest / "trainer_state.pt")


def _save_dcp(dest: Path, step: int, model: TinyLM, opt: torch.optim.Optimizer | None) -> None:
    import torch.distributed.checkpoint as dcp

    state = {"model": model.state_dict()} | ({"optim": opt.state_dict()} if opt is not None else {})
    dcp.save(state, checkpoint_id=str(dest))


def _save_unsharded(dest: Path, step: int, model: TinyLM, opt: torch.optim.Optimizer | None) -> None:
    dest.mkdir(parents=True)
    torch.save(model.state_dict(), dest / "model.pt")
    if opt is not None:
        torch.save(opt.state_dict(), dest / "optim.pt")
    torch.save({"global_step": step, "rng": torch.get_rng_state()}, dest / "train.pt")


def _save_flat(dest: Path, step: int, model: TinyLM, opt: torch.optim.Optimizer | None) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    obj = {"model": model.state_dict(), "step": step} | ({"optimizer": opt.state_dict()} if opt is not None else {})
    torch.save(obj, dest)


_install(
    _Layout(
        builder="dcp-nested",
        catalog="dcp",
        name=lambda step, index: f"step-{step}",
        marker=lambda name: f"{name}/{NESTED}/{DCP_MARKER}",
        write=lambda out, steps, _w: _write_each_step(out, steps, _save_nested),
        uncommit=lambda d: _uncommit_dcp(d / NESTED),
        corrupt=lambda d: truncate_below_metadata(d / NESTED),
    )
)
_install(
    _Layout(
        builder="dcp-iter",
        catalog="dcp",
        name=lambda step, index: f"iter_{step:07d}",
        marker=lambda name: f"{name}/{DCP_MARKER}",
        write=lambda out, steps, _w: _write_each_step(out, steps, _save_dcp, lambda step, index: f"iter_{step:07d}"),
        uncommit=_uncommit_dcp,
        corrupt=truncate_below_metadata,
    )
)
_install(
    _Layout(
        builder="torch-unsharded",
        catalog="torch-save",
        name=lambda step, index: f"step{step}-unsharded",
        marker=lambda name: None,
        write=lambda out, steps, _w: _write_each_step(
            out, steps, _save_unsharded, lambda step, index: f"step{step}-unsharded"
        ),
        uncommit=None,
        corrupt=lambda d: _truncate_file(d / "optim.pt"),
        kinds=("full", "weights", "corrupt"),
    )
)
_install(
    _Layout(
        builder="torch-flat",
        catalog="torch-save",
        name=lambda step, index: f"model_{step}.pt",
        marker=lambda name: name,
        write=lambda out, steps, _w: _write_each_step(out, steps, _save_flat, lambda step, index: f"model_{step}.pt"),
        uncommit=None,
        corrupt=_truncate_file,
        kinds=("full", "weights", "corrupt"),
    )
)


def custom_lightning_name(step: int, index: int) -> str:
    return f"ckpt-{step:06d}.ckpt"


_install(
    _Layout(
        builder="lightning-custom",
        catalog="lightning",
        name=custom_lightning_name,
        marker=lambda name: name,
        write=_write_lightning(sharded=False, filename="ckpt-{step:06d}", name=custom_lightning_name),
        uncommit=None,
        corrupt=_truncate_file,
        weights_in_key=True,
        kinds=("full", "weights", "corrupt"),
    )
)


@register("hf-trainer-adapter")
def hf_trainer_adapter(root: Path, steps: Sequence[int], states: Mapping[int, str]) -> BuiltRun:
    """The real Trainer run, each checkpoint's model saved adapter-only (PEFT's file names)."""
    from tests.checkpoints.layouts import build

    run = build("hf-trainer", root, steps, states=states)
    for spec in run.steps:
        step = root / spec.name
        model = step / "model.safetensors"
        if model.exists():
            model.rename(step / "adapter_model.safetensors")
            (step / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    return BuiltRun(root=root, layout="hf-trainer-adapter", steps=tuple(StepSpec(**vars(s)) for s in run.steps))
