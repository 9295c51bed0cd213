"""Runs of the torch.distributed.checkpoint family, written by the real libraries on CPU.

Each builder writes a run folder the way its library lays one out on disk and says what a correct
classifier must make of every step. What is written by the library itself and what follows its
documented file set is said per builder below; every data file is written by ``dcp.save``,
``torch.save`` or the library's own save function (small JSON/text markers as the library writes them).

Builders (``build(<id>, root, steps, states=...)``), with the catalog layout id they must get:

- ``dcp-fsdp2`` (dcp): ``step-N/`` = ``.metadata``, ``__0_0.distcp``, ``__1_0.distcp``; a real
  2-process FSDP2 ``dcp.save`` (gloo on CPU) of ``{"model", "optim"}``.
- ``dcp-appstate`` (dcp): ``step-N/`` = ``.metadata``, ``__0_0.distcp``; the PyTorch DCP recipe's
  ``dcp.save({"app": AppState(model, optim)})``: keys ``app.model.*``, ``app.optim.*``.
- ``dcp-torchtitan`` (dcp): ``step-N/``; torchtitan's flat keys (``tok_embeddings.weight``,
  ``optimizer.state.<fqn>.exp_avg``, ``lr_scheduler.*``, ``dataloader.*``, ``train_state.*``);
  its last model-only save (bf16, model keys only) is ``weights``.
- ``dcp-safetensors`` (dcp): ``step-N/``; ``FileSystemWriter(serialization_format=SAFETENSORS)``.
- ``lightning`` (lightning): ``epoch=E-step=N.ckpt`` FILES in the run root, by a real Trainer.
- ``lightning-dir`` (lightning): ``epoch=E-step=N.ckpt/`` folders = DCP + ``meta.pt``, written by
  Lightning's own ``FSDPStrategy.save_checkpoint`` (state_dict_type="sharded").
- ``megatron-torch-dist`` (megatron): ``iter_000000N/`` = DCP + ``common.pt`` + ``metadata.json``,
  run root ``latest_checkpointed_iteration.txt``; optimizer as ``optimizer.distributed.*`` buckets
  (``dp_reshardable``, Megatron's default).
- ``megatron-torch-dist-model-space`` (megatron): same, optimizer as
  ``optimizer.state.exp_avg.<key>`` (``fully_sharded_model_space``).
- ``megatron-torch-dist-common-in-dcp`` (megatron): as megatron-torch-dist without ``common.pt``
  (Megatron-LM since 2026-07 keeps the common state as a DCP object, ``common_state/shard_0_1``).
- ``torch-save`` (torch-save): ``step-N/checkpoint.pt``, one ``torch.save`` dict.

``SUPPORTED_KINDS`` says which kinds each builder can write; asking for another raises ValueError
naming the reason (Lightning never leaves an in-flight ``.ckpt`` in the run folder; torchtitan
writes its model-only save only as the run's last step).

Templates are written once per pytest process (per layout and step list) under a private temp
dir and copied for every build, so the 2-process FSDP2 spawn and the Lightning Trainer run once.
The values are deterministic so tests can replay them: in the DCP, Megatron and torch.save runs
the i-th step (0-based) holds ``TinyLM`` and AdamW after ``trajectory(i + 1)`` (one optimizer step
per saved step, on ``batch(i, rank)``); the Lightning runs take AdamW to exactly global_step N
(see ``lightning_module_class``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import logging
import math
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tests.checkpoints.conftest import TinyLM
from tests.checkpoints.layouts import KINDS, BuiltRun, StepSpec, register
from tests.checkpoints.layouts.cache import template as cached_template

#: builder id -> the kinds it can write.
SUPPORTED_KINDS: dict[str, tuple[str, ...]] = {}

DCP_MARKER = ".metadata"  # DCP's commit: rank 0 writes it (tmp + rename) after every rank's data
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
LIGHTNING_META = "meta.pt"  # lightning.fabric.utilities.load._METADATA_FILENAME
TITAN_EXPORT_DTYPE = torch.bfloat16
FSDP2_TIMEOUT_S = 300  # the whole 2-rank run; gloo's own collective timeout is set below it


# ---------------------------------------------------------------------------------------------
# The training every layout saves: deterministic, so tests can replay it.


def batch(index: int, rank: int = 0) -> torch.Tensor:
    """The tokens rank ``rank`` trains on at optimizer step ``index``."""
    g = torch.Generator().manual_seed(10_000 + 97 * index + rank)
    return torch.randint(0, 96, (2, 8), generator=g)


def fresh() -> tuple[TinyLM, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = TinyLM()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return model(tokens).float().pow(2).mean()


def trajectory(count: int, *, world: int = 1) -> Iterator[tuple[TinyLM, torch.optim.Optimizer]]:
    """The model and AdamW after 1..count steps; ``world`` ranks' batches averaged (as DDP/FSDP)."""
    model, opt = fresh()
    for i in range(count):
        opt.zero_grad()
        (sum(loss(model, batch(i, r)) for r in range(world)) / world).backward()
        opt.step()
        yield model, opt


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one intra-op thread: tiny ops on a shared box run 10x faster without the pool,
    and a replay under the same setting gives bit-identical values."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # Single-process dcp.save warns that no process group is initialised; that is the point.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# ---------------------------------------------------------------------------------------------
# Templates: written once (tests/checkpoints/layouts/cache.py), copied per build.


def _template(layout: str, key: object, write: Callable[[Path], None]) -> Path:
    """A directory written once by ``write`` for (layout, key), reused afterwards."""

    def write_quietly(path: Path) -> None:
        with one_thread():
            write(path)

    return cached_template(layout, key, write_quietly)


def _copy(src: Path, dest: Path) -> None:
    # copy, not copy2: a copied step gets a fresh mtime, like a step the library just wrote (the
    # template may have been written in an earlier session).
    if src.is_dir():
        shutil.copytree(src, dest, copy_function=shutil.copy)
    else:
        shutil.copy(src, dest)


# ---------------------------------------------------------------------------------------------
# Damage: what a crash or a bad copy leaves. Each layout picks one realistic corruption.


def _dcp_ranges(step_dir: Path) -> dict[str, int]:
    """File name -> the end of the furthest byte range ``.metadata`` assigns inside it."""
    from torch.distributed.checkpoint import FileSystemReader

    ends: dict[str, int] = {}
    for info in FileSystemReader(str(step_dir)).read_metadata().storage_data.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    return ends


def truncate_below_metadata(step_dir: Path, shard: str = "__0_0.distcp") -> None:
    """Cut ``shard`` to half its size: shorter than byte ranges ``.metadata`` assigns to it."""
    path = step_dir / shard
    size = path.stat().st_size // 2
    assert size < _dcp_ranges(step_dir)[shard], "truncation must cut into an assigned byte range"
    os.truncate(path, size)


def _drop_rank_shard(step_dir: Path) -> None:
    # A 2-rank save whose rank-1 file never arrived (node-local disk lost, upload of one file
    # failed): .metadata still names __1_0.distcp.
    assert "__1_0.distcp" in _dcp_ranges(step_dir)
    (step_dir / "__1_0.distcp").unlink()


def _empty_shard(step_dir: Path) -> None:
    # A zero-byte shard: the file was created but its data never reached the disk (ENOSPC,
    # a filesystem that lost unflushed pages).
    (step_dir / "__0_0.distcp").write_bytes(b"")


def _truncate_file(path: Path) -> None:
    # A half-written torch.save zip: no central directory at the end, which is what a killed
    # torch.save (or a cut copy) leaves.
    os.truncate(path, path.stat().st_size // 2)


def _uncommit_dcp(step_dir: Path) -> None:
    # DCP mid-save: every rank's data is written, rank 0 has not renamed .metadata into place.
    (step_dir / DCP_MARKER).unlink()


# ---------------------------------------------------------------------------------------------
# One layout = how to write a template step and how a step's kinds are made from it.


@dataclass(frozen=True)
class _Layout:
    builder: str
    catalog: str  # the catalog's layout id
    name: Callable[[int, int], str]  # (step, index) -> step folder / file name
    marker: Callable[[str], str | None]  # step name -> commit marker relative to the run root
    write: Callable[[Path, tuple[int, ...], frozenset[int]], None]  # template: full/ and weights/
    uncommit: Callable[[Path], None] | None  # full step -> incomplete; None: layout can't be
    corrupt: Callable[[Path], None]  # full step -> corrupt
    finish: Callable[[Path, Sequence[StepSpec]], None] = lambda root, specs: None
    check: Callable[[tuple[int, ...], Mapping[int, str]], None] = lambda steps, kinds: None
    weights_in_key: bool = False  # True: the template is written per set of weights steps
    #: True: a step's files depend only on its place in the run, not its number (FSDP2): one
    #: template of at least INDEX_TEMPLATE_STEPS steps serves every request, renamed on copy.
    by_index: bool = False
    kinds: tuple[str, ...] = field(default=KINDS)


def _kinds(layout: _Layout, steps: Sequence[int], states: Mapping[int, str]) -> dict[int, str]:
    ordered = tuple(sorted(steps))
    if len(set(ordered)) != len(ordered) or any(s < 0 for s in ordered) or not ordered:
        raise ValueError(f"{layout.builder}: steps must be distinct non-negative ints, got {list(steps)}")
    if stray := set(states) - set(ordered):
        raise ValueError(f"{layout.builder}: states name steps not in the run: {sorted(stray)}")
    kinds = {s: states.get(s, "full") for s in ordered}
    layout.check(ordered, kinds)  # first: it says why its library never writes a kind
    for step, kind in kinds.items():
        if kind not in layout.kinds:
            raise ValueError(f"{layout.builder}: step {step} kind {kind!r} not one of {layout.kinds}")
    return kinds


#: The steps a ``by_index`` template holds at least (the real-layout tests' run of six).
INDEX_TEMPLATE_STEPS = 6


def _build(layout: _Layout, root: Path, steps: Sequence[int], states: Mapping[int, str]) -> BuiltRun:
    kinds = _kinds(layout, steps, states)
    ordered = tuple(kinds)
    weights = frozenset(s for s, k in kinds.items() if k == "weights")
    if layout.by_index:
        places = tuple(range(max(len(ordered), INDEX_TEMPLATE_STEPS)))
        template = _template(layout.builder, ("by-index", len(places)), lambda d: layout.write(d, places, frozenset()))
    else:
        key = (ordered, weights) if layout.weights_in_key else ordered
        template = _template(layout.builder, key, lambda d: layout.write(d, ordered, weights))
    root.mkdir(parents=True, exist_ok=True)
    specs = []
    for index, (step, kind) in enumerate(kinds.items()):
        name = layout.name(step, index)
        held = layout.name(index, index) if layout.by_index else name
        source = template / ("weights" if kind == "weights" else "full") / held
        _copy(source, root / name)
        if kind == "incomplete":
            assert layout.uncommit is not None
            layout.uncommit(root / name)
        elif kind == "corrupt":
            layout.corrupt(root / name)
        specs.append(StepSpec(name=name, step=step, layout=layout.catalog, kind=kind, marker=layout.marker(name)))
    layout.finish(root, specs)
    return BuiltRun(root=root, layout=layout.builder, steps=tuple(specs))


def _install(layout: _Layout) -> None:
    SUPPORTED_KINDS[layout.builder] = layout.kinds

    def builder(root: Path, steps: Sequence[int], states: Mapping[int, str]) -> BuiltRun:
        return _build(layout, root, steps, states)

    builder.__name__ = f"build_{layout.builder.replace('-', '_')}"
    builder.__doc__ = f"Write a {layout.builder} run (see tests.checkpoints.layouts.dcp_family)."
    register(layout.builder)(builder)


def _step_dir(step: int, index: int) -> str:
    return f"step-{step}"


def _dcp_marker(name: str) -> str:
    return f"{name}/{DCP_MARKER}"


# ---------------------------------------------------------------------------------------------
# dcp-fsdp2: two real ranks, FSDP2 on CPU (gloo), every step of the run in one spawn.


def _fsdp2_rank(rank: int, store: str, out: str, steps: tuple[int, ...]) -> None:
    """One rank of the FSDP2 run: fully_shard TinyLM, then per step one AdamW step and two saves."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    warnings.simplefilter("ignore")
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=FSDP2_TIMEOUT_S // 2),
    )
    try:
        mesh = init_device_mesh("cpu", (2,))
        model, _ = fresh()
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for i, step in enumerate(steps):
            opt.zero_grad()
            loss(model, batch(i, rank)).backward()  # FSDP2 averages the two ranks' gradients
            opt.step()
            msd = get_model_state_dict(model)
            dcp.save(
                {"model": msd, "optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=f"{out}/full/step-{step}"
            )
            dcp.save({"model": msd}, checkpoint_id=f"{out}/weights/step-{step}")
    finally:
        dist.destroy_process_group()


def _write_fsdp2(out: Path, steps: tuple[int, ...], _weights: frozenset[int]) -> None:
    # A gloo rank has been seen to abort (std::terminate) while another process was importing
    # torch on the same 2 cores; such a crash is retried once, with the first one's log printed.
    try:
        _write_fsdp2_once(out, steps)
    except RuntimeError as exc:
        print(f"FSDP2 builder: first attempt failed, retrying once: {exc}", file=sys.stderr)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        _write_fsdp2_once(out, steps)


def _write_fsdp2_once(out: Path, steps: tuple[int, ...]) -> None:
    # Two fresh interpreters, as torchrun starts them (multiprocessing's spawn would re-import
    # whatever __main__ the caller runs under).
    repo = Path(__file__).resolve().parents[3]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]),
    }
    with tempfile.TemporaryDirectory(prefix="lm-fsdp2-") as tmp, contextlib.ExitStack() as logs:
        code = (
            "import sys; from tests.checkpoints.layouts.dcp_family import _fsdp2_rank; "
            f"_fsdp2_rank(int(sys.argv[1]), {str(Path(tmp) / 'store')!r}, {str(out)!r}, {steps!r})"
        )
        paths = [Path(tmp) / f"rank{rank}.log" for rank in (0, 1)]
        ranks = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(rank)],
                cwd=repo,
                env=env,
                stdout=logs.enter_context(path.open("wb")),
                stderr=subprocess.STDOUT,
            )
            for rank, path in enumerate(paths)
        ]
        try:
            deadline = time.monotonic() + FSDP2_TIMEOUT_S
            # Until both exit, or one fails (its peer would wait in a collective), or time is up.
            while time.monotonic() < deadline:
                codes = [rank.poll() for rank in ranks]
                if None not in codes or any(codes):
                    break
                time.sleep(0.1)
        finally:
            for rank in ranks:
                if rank.poll() is None:
                    rank.kill()
            codes = [rank.wait() for rank in ranks]
        if any(codes):
            tails = "\n".join(path.read_text(errors="replace")[-2000:] for path in paths)
            raise RuntimeError(f"FSDP2 ranks exited {codes}:\n{tails}")


_install(
    _Layout(
        builder="dcp-fsdp2",
        catalog="dcp",
        name=_step_dir,
        marker=_dcp_marker,
        write=_write_fsdp2,
        uncommit=_uncommit_dcp,
        corrupt=_drop_rank_shard,  # rank 1's __1_0.distcp missing
        by_index=True,  # _fsdp2_rank: step i's state is the i-th optimizer step, its number a name
    )
)


# ---------------------------------------------------------------------------------------------
# Single-process DCP layouts: one pass over the trajectory writes full/ and weights/ per step.


def _write_each_step(
    out: Path,
    steps: tuple[int, ...],
    save: Callable[[Path, int, TinyLM, torch.optim.Optimizer | None], None],
    name: Callable[[int, int], str] = _step_dir,
) -> None:
    with _quiet():
        for index, (step, (model, opt)) in enumerate(zip(steps, trajectory(len(steps)), strict=True)):
            save(out / "full" / name(step, index), step, model, opt)
            save(out / "weights" / name(step, index), step, model, None)


class AppState:
    """The Stateful of the PyTorch DCP recipe (recipes/distributed_checkpoint_recipe)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if self.optimizer is None:
            set_model_state_dict(self.model, state_dict["model"])
        else:
            set_state_dict(
                self.model, self.optimizer, model_state_dict=state_dict["model"], optim_state_dict=state_dict["optim"]
            )


def _save_appstate(dest: Path, step: int, model: TinyLM, opt: torch.optim.Optimizer | None) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save({"app": AppState(model, opt)}, checkpoint_id=str(dest))


_install(
    _Layout(
        builder="dcp-appstate",
        catalog="dcp",
        name=_step_dir,
        marker=_dcp_marker,
        write=lambda out, steps, _w: _write_each_step(out, steps, _save_appstate),
        uncommit=_uncommit_dcp,
        corrupt=truncate_below_metadata,  # __0_0.distcp cut to half its size
    )
)


class TitanOptimizers:
    """torchtitan's OptimizersContainer state: flat ``state.<fqn>.<k>`` / ``param_groups.<fqn>.<k>``."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        return get_optimizer_state_dict(
            self.model, self.optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True)
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        set_optimizer_state_dict(
            self.model, self.optimizer, state_dict, options=StateDictOptions(flatten_optimizer_state_dict=True)
        )


def titan_states(step: int, model: TinyLM, opt: torch.optim.Optimizer | None) -> dict[str, Any]:
    """What torchtitan's CheckpointManager hands dcp.save at ``step`` (opt None: last model-only)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    model_sd = get_model_state_dict(model)
    if opt is None:  # _save_last_step with last_save_model_only: model keys only, export dtype
        return {k: v.to(TITAN_EXPORT_DTYPE) if v.is_floating_point() else v for k, v in model_sd.items()}
    # _flattened_model_states_sd: model keys at the top, the other Statefuls under their names.
    return {
        **model_sd,
        "optimizer": TitanOptimizers(model, opt),
        "lr_scheduler": {"last_epoch": step},  # LRSchedulersContainer.state_dict
        # ParallelAwareDataloader: this dp rank's StatefulDataLoader state, pickled, + world size
        "dataloader": {
            "dp_rank_0": pickle.dumps({"_num_yielded": step, "_sampler_iter_yielded": step}),
            "world_size": 1,
        },
        "train_state": {"step": step, "ntokens_seen": step * 16},  # Trainer.state_dict
    }


def _save_titan(dest: Path, step: int, model: TinyLM, opt: torch.optim.Optimizer | None) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(titan_states(step, model, opt), checkpoint_id=str(dest))


def _titan_check(steps: tuple[int, ...], kinds: Mapping[int, str]) -> None:
    if any(k == "weights" for s, k in kinds.items() if s != steps[-1]):
        raise ValueError(
            "dcp-torchtitan: a model-only step is torchtitan's last save "
            "(last_save_model_only); only the run's newest step can be 'weights'"
        )


_install(
    _Layout(
        builder="dcp-torchtitan",
        catalog="dcp",
        name=_step_dir,
        marker=_dcp_marker,
        write=lambda out, steps, _w: _write_each_step(out, steps, _save_titan),
        uncommit=_uncommit_dcp,
        corrupt=_empty_shard,  # __0_0.distcp is zero bytes
        check=_titan_check,
    )
)


def _save_safetensors(dest: Path, step: int, model: TinyLM, opt: torch.optim.Optimizer | None) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    # {"model": ..., "optim": ...} (or model only), keys model.* / optim.* as in conftest's saves
    dcp.save(
        AppState(model, opt).state_dict(),
        storage_writer=FileSystemWriter(str(dest), serialization_format=SerializationFormat.SAFETENSORS),
    )


def safetensors_payload_start(step_dir: Path, shard: str = "__0_0.distcp") -> int:
    """Where the safetensors blob starts in a SAFETENSORS-format shard (after the byte items)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    md = FileSystemReader(str(step_dir)).read_metadata()
    return max(
        (
            info.offset + info.length
            for idx, info in md.storage_data.items()
            if info.relative_path == shard and isinstance(md.state_dict_metadata[idx.fqn], BytesStorageMetadata)
        ),
        default=0,
    )


def _cut_safetensors_payload(step_dir: Path) -> None:
    # A cut copy of the shard. In this format .metadata's byte ranges for tensors are not where
    # the tensors are (every tensor "starts" where the byte items end; the values sit in a
    # safetensors blob after them), so the cut is placed where every range .metadata names still
    # fits in the file while the safetensors data is short: only the embedded header can tell.
    path = step_dir / "__0_0.distcp"
    size = path.stat().st_size
    cut = (max(_dcp_ranges(step_dir).values()) + size) // 2
    assert max(_dcp_ranges(step_dir).values()) <= cut < size
    os.truncate(path, cut)


_install(
    _Layout(
        builder="dcp-safetensors",
        catalog="dcp",
        name=_step_dir,
        marker=_dcp_marker,
        write=lambda out, steps, _w: _write_each_step(out, steps, _save_safetensors),
        uncommit=_uncommit_dcp,
        corrupt=_cut_safetensors_payload,
    )
)


# ---------------------------------------------------------------------------------------------
# torch-save: one torch.save dict per step folder.

TORCH_SAVE_FILE = "checkpoint.pt"


def _save_torch(dest: Path, step: int, model: TinyLM, opt: torch.optim.Optimizer | None) -> None:
    dest.mkdir(parents=True)
    obj: dict[str, Any] = {"model": model.state_dict(), "step": step}
    if opt is not None:
        obj["optimizer"] = opt.state_dict()
    torch.save(obj, dest / TORCH_SAVE_FILE)


def _uncommit_torch_save(step_dir: Path) -> None:
    # Plain torch.save has no marker. The common safe idiom saves to "<file>.tmp" and
    # os.replace()s it into place; in flight there is only a partial .tmp.
    final = step_dir / TORCH_SAVE_FILE
    tmp = step_dir / (TORCH_SAVE_FILE + ".tmp")
    final.rename(tmp)
    _truncate_file(tmp)


_install(
    _Layout(
        builder="torch-save",
        catalog="torch-save",
        name=_step_dir,
        marker=lambda name: f"{name}/{TORCH_SAVE_FILE}",
        write=lambda out, steps, _w: _write_each_step(out, steps, _save_torch),
        uncommit=_uncommit_torch_save,
        corrupt=lambda d: _truncate_file(d / TORCH_SAVE_FILE),  # complete name, truncated zip
    )
)


# ---------------------------------------------------------------------------------------------
# Megatron-LM torch_dist: DCP written with Megatron's key names, + common.pt / metadata.json.

MEGATRON_DTYPE = torch.bfloat16  # --bf16: model params bf16; DistOpt keeps fp32 main params
MEGATRON_PAD = 64  # DistOpt pads each param's start in the grad buffer to a multiple of 64


def megatron_dir(step: int, index: int = 0) -> str:
    return f"iter_{step:07d}"


def _megatron_params(model: TinyLM) -> list[tuple[str, list[nn.Parameter]]]:
    """Megatron GPT (TE spec) tensor keys -> the TinyLM params behind them, per layer."""
    layers = model.layers
    return [
        ("embedding.word_embeddings.weight", [model.tok_embeddings.weight]),
        ("decoder.layers.self_attention.linear_qkv.layer_norm_weight", [b.attention_norm.weight for b in layers]),
        ("decoder.layers.self_attention.linear_qkv.weight", [b.wq.weight for b in layers]),  # + wk, wv
        ("decoder.layers.self_attention.linear_proj.weight", [b.wo.weight for b in layers]),
        ("decoder.layers.mlp.linear_fc1.layer_norm_weight", [b.ffn_norm.weight for b in layers]),
        ("decoder.layers.mlp.linear_fc1.weight", [b.w1.weight for b in layers]),
        ("decoder.layers.mlp.linear_fc2.weight", [b.w2.weight for b in layers]),
        ("decoder.final_layernorm.weight", [model.norm.weight]),
        ("output_layer.weight", [model.output.weight]),
    ]


def _megatron_tensor(
    model: TinyLM, key: str, get: Callable[[nn.Parameter], torch.Tensor], layer: int | None = None
) -> torch.Tensor:
    """The value of Megatron tensor ``key`` (one layer's slice if ``layer``), read through ``get``."""
    params = dict(_megatron_params(model))[key]
    if key.endswith("linear_qkv.weight"):  # fused q, k, v rows
        blocks = model.layers if layer is None else [model.layers[layer]]
        parts = [torch.cat([get(b.wq.weight), get(b.wk.weight), get(b.wv.weight)]) for b in blocks]
    else:
        parts = [get(p) for p in (params if layer is None else [params[layer]])]
    if key.startswith("decoder.layers.") and layer is None:
        return torch.stack(parts)  # homogeneous layers: one tensor, layer axis first
    return parts[0]


def megatron_model_sd(model: TinyLM) -> dict[str, torch.Tensor]:
    """The model part of Megatron's sharded state dict, as DCP stores it (bf16)."""
    return {
        key: _megatron_tensor(model, key, lambda p: p.detach()).to(MEGATRON_DTYPE) for key, _ in _megatron_params(model)
    }


def _megatron_buffer_params(model: TinyLM) -> list[tuple[str, int | None]]:
    """The DistOpt grad buffer's params in buffer order: model order reversed (backprop order)."""
    keys = [key for key, _ in _megatron_params(model)]
    per_layer = [k for k in keys if k.startswith("decoder.layers.")]
    rest: list[tuple[str, int | None]] = [(k, None) for k in keys if k not in per_layer]
    module_order = rest[:1] + [(k, i) for i in range(len(model.layers)) for k in per_layer] + rest[1:]
    return module_order[::-1]


def megatron_optimizer_sd(model: TinyLM, opt: torch.optim.Optimizer, sharding: str) -> dict[str, Any]:
    """The DistOpt tensors in Megatron's sharded state dict for ``sharding``, as DCP keys."""
    state = {
        "param": lambda p: p.detach().float(),
        "exp_avg": lambda p: opt.state[p]["exp_avg"],
        "exp_avg_sq": lambda p: opt.state[p]["exp_avg_sq"],
    }
    if sharding == "fully_sharded_model_space":
        # sharded_param_state_fs_model_space: optimizer.state.<state key>.<model tensor key>
        return {
            f"optimizer.state.{name}.{key}": _megatron_tensor(model, key, get).clone()
            for name, get in state.items()
            for key, _ in _megatron_params(model)
        }
    # dp_reshardable (the default since 2025): one flat fp32 tensor per bucket and state key,
    # params at 64-aligned starts, intra-param padding kept, trailing padding dropped.
    prefix = "optimizer.distributed.dp_group_idx_0"
    bucket = f"{prefix}.gbuf_idx_0.dtype_({MEGATRON_DTYPE}, torch.float32).bucket_idx_0"
    slots, end = [], 0
    for key, layer in _megatron_buffer_params(model):
        start = math.ceil(end / MEGATRON_PAD) * MEGATRON_PAD
        numel = _megatron_tensor(model, key, lambda p: p.detach(), layer).numel()
        slots.append((key, layer, start))
        end = start + numel
    out: dict[str, Any] = {}
    for name, get in state.items():
        flat = torch.zeros(end, dtype=torch.float32)
        for key, layer, start in slots:
            value = _megatron_tensor(model, key, get, layer).flatten()
            flat[start : start + value.numel()] = value
        out[f"{bucket}.{name}"] = flat
    padded = math.ceil(end / MEGATRON_PAD) * MEGATRON_PAD
    numel_key = (MEGATRON_DTYPE, torch.float32)
    out[f"{prefix}.per_bucket_numel/shard_0_1"] = _sharded_object([{numel_key: [padded]}])
    out[f"{prefix}.per_bucket_numel_unpadded/shard_0_1"] = _sharded_object([{numel_key: [end]}])
    # state_dict() items as ShardedObjects (dp_reshardable is not a fully reshardable format)
    out[f"{prefix}.optimizer/shard_0_1"] = _sharded_object(_megatron_param_groups(opt))
    return out


def _sharded_object(data: Any) -> io.BytesIO:
    # torch.py _mcore_to_torch_sharded_object: torch.save([data of each local shard])
    buf = io.BytesIO()
    torch.save([data], buf)
    buf.seek(0)
    return buf


def _megatron_param_groups(opt: torch.optim.Optimizer) -> dict[str, Any]:
    # DistributedOptimizer.state_dict(): the inner optimizer's state_dict minus "state", params
    # dropped from each group, "step" moved into the group.
    inner = opt.state_dict()
    step = int(next(iter(inner["state"].values()))["step"].item())
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "step": step} for g in inner["param_groups"]]
    return {"param_groups": groups}


def megatron_args(weights_only: bool) -> argparse.Namespace:
    """A few of the args Megatron saves in every checkpoint (the real Namespace has hundreds)."""
    return argparse.Namespace(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        seq_length=8,
        padded_vocab_size=96,
        bf16=True,
        ckpt_format="torch_dist",
        use_distributed_optimizer=True,
        no_save_optim=weights_only,
        no_save_rng=False,
        async_save=False,
    )


@dataclass(frozen=True)
class _MegatronFormat:
    sharding: str  # distrib_optim_sharding_type
    common_in_dcp: bool  # Megatron-LM 2026-07+: the common state is a DCP object, no common.pt


def _save_megatron(fmt: _MegatronFormat) -> Callable[[Path, int, TinyLM, torch.optim.Optimizer | None], None]:
    def save(dest: Path, step: int, model: TinyLM, opt: torch.optim.Optimizer | None) -> None:
        import torch.distributed.checkpoint as dcp

        weights_only = opt is None
        # generate_state_dict: args, checkpoint_version, iteration, model, optimizer,
        # opt_param_scheduler (both skipped under --no-save-optim), rng_state.
        sharded: dict[str, Any] = dict(megatron_model_sd(model))
        common: dict[str, Any] = {
            "args": megatron_args(weights_only),
            "checkpoint_version": 3.0,
            "iteration": step,
            "num_floating_point_operations_so_far": float(step) * 1.5e9,
            "content_metadata": {
                "distrib_optim_sharding_type": fmt.sharding,
                "singleton_local_shards": False,
                "chained_optim_avoid_prefix": True,
            },
        }
        if opt is not None:
            sharded.update(megatron_optimizer_sd(model, opt, fmt.sharding))
            optimizer_common: dict[str, Any] = {"param_state_sharding_type": fmt.sharding}
            if fmt.sharding == "fully_sharded_model_space":  # fully reshardable: groups in common
                optimizer_common["optimizer"] = _megatron_param_groups(opt)
            common["optimizer"] = optimizer_common
            common["opt_param_scheduler"] = {
                "max_lr": 1e-3,
                "lr_warmup_steps": 0,
                "num_steps": step * 16,
                "lr_decay_style": "cosine",
                "lr_decay_steps": 10**6,
                "min_lr": 1e-5,
                "start_wd": 0.1,
                "end_wd": 0.1,
                "wd_incr_style": "constant",
                "wd_incr_steps": 10**6,
            }
        # get_rng_state: ShardedObject "rng_state", global shape (pp, tp) = (1, 1). No CUDA here,
        # so the cuda_rng_state / rng_tracker_states entries of a GPU run are absent.
        import numpy as np

        rng = {
            "random_rng_state": random.getstate(),
            "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state(),
        }
        sharded["rng_state/shard_0.0_1.1"] = _sharded_object([rng])
        dest.mkdir(parents=True)
        if fmt.common_in_dcp:
            sharded["common_state/shard_0_1"] = _sharded_object(common)
        else:
            torch.save(common, dest / "common.pt")  # save_common, rank 0, before the shards
        dcp.save(sharded, checkpoint_id=str(dest))
        # metadata_finalize_fn: CheckpointingConfig, written once every shard is saved
        (dest / "metadata.json").write_text(
            json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch"})
        )

    return save


def _uncommit_megatron(step_dir: Path) -> None:
    # An async save in flight: shards (and common.pt) written, DCP's finalize has not written
    # .metadata, metadata.json not yet written, the tracker still names the previous iteration.
    (step_dir / DCP_MARKER).unlink()
    (step_dir / "metadata.json").unlink()


def _megatron_tracker(root: Path, specs: Sequence[StepSpec]) -> None:
    # iter_finalize_fn, rank 0, after the save: the newest iteration that finished saving.
    committed = [s.step for s in specs if s.kind != "incomplete"]
    if committed:
        (root / MEGATRON_TRACKER).write_text(str(max(committed)))


for _builder, _fmt in {
    "megatron-torch-dist": _MegatronFormat("dp_reshardable", common_in_dcp=False),
    "megatron-torch-dist-model-space": _MegatronFormat("fully_sharded_model_space", common_in_dcp=False),
    "megatron-torch-dist-common-in-dcp": _MegatronFormat("dp_reshardable", common_in_dcp=True),
}.items():
    _install(
        _Layout(
            builder=_builder,
            catalog="megatron",
            name=megatron_dir,
            marker=lambda name: f"{name}/metadata.json",
            write=lambda out, steps, _w, fmt=_fmt: _write_each_step(  # type: ignore[misc]
                out, steps, _save_megatron(fmt), megatron_dir
            ),
            uncommit=_uncommit_megatron,
            corrupt=truncate_below_metadata,  # __0_0.distcp cut to half, tracker names the step
            finish=_megatron_tracker,
        )
    )


# ---------------------------------------------------------------------------------------------
# Lightning: a real Trainer on CPU; ModelCheckpoint(every_n_train_steps=1, save_top_k=-1).

LIGHTNING_BATCHES_PER_EPOCH = 2  # so file names carry epochs > 0: epoch=1-step=300.ckpt


def lightning_name(step: int, index: int) -> str:
    return f"epoch={index // LIGHTNING_BATCHES_PER_EPOCH}-step={step}.ckpt"


_LIGHTNING: dict[str, Any] = {}


def lightning_optimizer(params: Iterator[nn.Parameter]) -> torch.optim.Optimizer:
    """The Lightning runs' AdamW: fused (one kernel per step), so step 12000 costs seconds."""
    return torch.optim.AdamW(params, lr=1e-3, fused=True)


def lightning_module_class() -> type:
    """The LightningModule the Lightning runs train (TinyLM under ``self.model``), made once."""
    if "module" in _LIGHTNING:
        return _LIGHTNING["module"]  # type: ignore[no-any-return]
    import lightning as L

    class LitTinyLM(L.LightningModule):
        """Manual optimisation: batch i takes AdamW from the last saved step to ``steps[i]``.

        Lightning's global_step counts optimizer steps, so the checkpoint after batch i is
        Lightning's own save at global_step == steps[i], and a run to step 12000 costs one
        forward/backward per saved step (and 12000 fused AdamW steps) instead of 12000 batches. ``weights`` are the steps whose
        checkpoint is a ``save_weights_only`` one.
        """

        def __init__(self, steps: Sequence[int] = (), weights: Sequence[int] = ()) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.model = fresh()[0]
            self._steps, self._weights, self._done = list(steps), set(weights), 0

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> None:
            opt = self.optimizers()
            target = self._steps[self._done]
            self.manual_backward(loss(self.model, batch))
            while self.global_step < target:
                opt.step()
            opt.zero_grad()
            # ModelCheckpoint reads this attribute when it saves at this batch's end.
            self.trainer.checkpoint_callback.save_weights_only = target in self._weights
            self._done += 1

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return lightning_optimizer(self.parameters())

    _LIGHTNING["module"] = LitTinyLM
    return LitTinyLM


def _sharded_save_strategy() -> Any:
    """One CPU device saving exactly as FSDPStrategy(state_dict_type="sharded") does."""
    from lightning.pytorch.core.optimizer import LightningOptimizer
    from lightning.pytorch.strategies import FSDPStrategy, SingleDeviceStrategy
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    class ShardedSaveStrategy(SingleDeviceStrategy):
        # FSDPStrategy needs CUDA; its save_checkpoint itself runs here unchanged: a folder,
        # dcp.save of {"model": ..., "optimizer_0": ...}, then rank 0's torch.save of the rest
        # to meta.pt (the file Lightning's _is_sharded_checkpoint looks for).
        _state_dict_type = "sharded"
        save_checkpoint = FSDPStrategy.save_checkpoint

        def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
            # FSDP.optim_state_dict under SHARDED_STATE_DICT is keyed by parameter FQN, as this is.
            if isinstance(optimizer, LightningOptimizer):
                optimizer = optimizer._optimizer
            return get_optimizer_state_dict(self.model, optimizer)

    return ShardedSaveStrategy(device=torch.device("cpu"))


def _write_lightning(
    sharded: bool, filename: str | None = None, name: Callable[[int, int], str] | None = None
) -> Callable[[Path, tuple[int, ...], frozenset[int]], None]:
    """A real Trainer run; ``filename`` is ModelCheckpoint's custom pattern (``ckpt-{step:06d}``,
    written without metric names) and ``name`` the file names it must produce."""
    named = name or lightning_name

    def write(out: Path, steps: tuple[int, ...], weights: frozenset[int]) -> None:
        import lightning as L
        from lightning.pytorch.callbacks import ModelCheckpoint

        tokens = [batch(i) for i in range(LIGHTNING_BATCHES_PER_EPOCH)]
        loader = torch.utils.data.DataLoader(tokens, batch_size=None)
        run = out / "run"
        custom = {"filename": filename, "auto_insert_metric_name": False} if filename else {}
        callback = ModelCheckpoint(dirpath=run, every_n_train_steps=1, save_top_k=-1, **custom)
        quiet = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric")]
        levels = [log.level for log in quiet]
        for log in quiet:
            log.setLevel(logging.ERROR)
        try:
            with _quiet():
                trainer = L.Trainer(
                    accelerator="cpu",
                    devices=1,
                    max_steps=steps[-1],
                    logger=False,
                    callbacks=[callback],
                    enable_progress_bar=False,
                    enable_model_summary=False,
                    default_root_dir=out,
                    **({"strategy": _sharded_save_strategy()} if sharded else {}),
                )
                trainer.fit(lightning_module_class()(steps, sorted(weights)), loader)
        finally:
            for log, level in zip(quiet, levels, strict=True):
                log.setLevel(level)
        written = sorted(p.name for p in run.iterdir())
        expected = sorted(named(s, i) for i, s in enumerate(steps))
        assert written == expected, (written, expected)
        # The one Trainer run wrote the kinds asked for; both template halves point at it.
        (out / "full").symlink_to(run)
        (out / "weights").symlink_to(run)

    return write


def _uncommit_lightning_dir(step_dir: Path) -> None:
    # DCP committed (.metadata renamed into place), Lightning not yet: rank 0 writes meta.pt after
    # dcp.save returns, and Lightning only treats a folder with meta.pt as a checkpoint.
    (step_dir / LIGHTNING_META).unlink()


def _lightning_no_incomplete(steps: tuple[int, ...], kinds: Mapping[int, str]) -> None:
    # _atomic_save writes through an fsspec transaction: locally the bytes go to a mkstemp() file
    # in $TMPDIR and are moved into place on commit, so no in-flight .ckpt ever sits in the run
    # folder (on object stores the write is one PUT).
    if "incomplete" in kinds.values():
        raise ValueError("lightning: Lightning never leaves an in-flight .ckpt file in the run folder")


_install(
    _Layout(
        builder="lightning",
        catalog="lightning",
        name=lightning_name,
        marker=lambda name: name,
        write=_write_lightning(sharded=False),
        uncommit=None,
        corrupt=_truncate_file,  # the .ckpt zip cut to half (a cut copy or upload)
        check=_lightning_no_incomplete,
        weights_in_key=True,
        kinds=("full", "weights", "corrupt"),
    )
)

_install(
    _Layout(
        builder="lightning-dir",
        catalog="lightning",
        name=lightning_name,
        marker=lambda name: f"{name}/{LIGHTNING_META}",
        write=_write_lightning(sharded=True),
        uncommit=_uncommit_lightning_dir,
        corrupt=truncate_below_metadata,  # __0_0.distcp cut to half, meta.pt present
        weights_in_key=True,
    )
)
