"""What a strip to weights may remove, and what it would lose.

A strip writes the model's weights as a BF16 export and then deletes the training state. Deny by
default: it may delete only what it proves is optimizer state, the model it exported, or the
trainer's named bookkeeping (scheduler, RNG, sampler and step counters, which the policy's
"keep weights" names). Any other floating-point state (EMA shadow weights, a discriminator, a
reference or critic model saved beside the policy) would be lost, so the strip is refused and the
plan says which tensor or file it would have lost.

Read at listing time from what the catalog already reads (DCP ``.metadata`` keys, torch.save
structures, the step's file names): no tensor data.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from backend.checkpoints.dcp import NON_WEIGHT_ROOTS, weight_names
from backend.checkpoints.steps import MODEL_FILES, TORCH_SUFFIXES, TRAINING_STATE_FILES
from backend.checkpoints.torchfile import key_paths_optimizer
from backend.storage import ObjectInfo

#: Optimizer files of the layouts (DeepSpeed ZeRO partitions, HF/accelerate, Megatron's distributed optimizer).
_OPTIM_FILE = re.compile(
    r"(^|/)((bf16_)?zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt|optimizer(_\d+)?\.(pt|bin)|distrib_optim\.pt)$"
)
#: The model files an export is made from (HF shards, DeepSpeed's model states, torch model files).
_MODEL_FILE = re.compile(
    r"^((model|pytorch_model|adapter_model)(-\d{5}-of-\d{5})?\.(safetensors|bin)|"
    r"(.*/)?(zero_pp_rank_\d+_)?mp_rank_\d+_model_states\.pt)$"
)
#: Trainer bookkeeping a strip may drop by name (the optimizer files are proven by content).
_BOOKKEEPING = re.compile(r"^random_states_\d+\.pkl$")
#: Suffixes of files that hold tensors: such a file is never dropped unless proven.
TENSOR_SUFFIXES = (*TORCH_SUFFIXES, ".safetensors", ".distcp", ".npy", ".npz", ".pkl", ".h5", ".msgpack", ".gguf")
#: A file without a tensor suffix up to this size is metadata (configs, markers, scripts).
_SMALL = 16 * 1024 * 1024


def lost_keys(
    keys: Iterable[tuple[str, bool]],
    exported: Iterable[str],
    *,
    all_keys: Iterable[str] = (),
    optim: Iterable[str] = (),
) -> list[str]:
    """The floating-point keys of ``(key, is_float)`` a strip exporting ``exported`` would lose:
    neither exported nor optimizer state (by the keys' structure, ``all_keys`` included, or under
    one of the ``optim`` paths) nor under a training-state root (scheduler, RNG, dataloader,
    counters)."""
    pairs = list(keys)
    roots = tuple(p for p in optim if p)
    found = set(key_paths_optimizer([k for k, _ in pairs] + [k for k in all_keys]))
    kept = set(exported)
    return [
        k
        for k, is_float in pairs
        if is_float
        and k not in kept
        and k not in found
        and "<root>" not in optim
        and not any(k == r or k.startswith(r + ".") for r in roots)
        and k.split(".", 1)[0] not in NON_WEIGHT_ROOTS
    ]


def dcp_loses(keys: Iterable[tuple[str, bool]], all_keys: Iterable[str]) -> str:
    """What a strip of a DCP checkpoint with these tensor keys (``all_keys``: every key of its
    ``.metadata``) would lose ("" when nothing)."""
    pairs = list(keys)
    every = list(all_keys)
    lost = lost_keys(pairs, weight_names(every, "auto"), all_keys=every)
    return _say(lost, ".metadata")


def torch_loses(files: Mapping[str, tuple[list[tuple[str, bool]], list[str]]]) -> str:
    """What a strip of a torch.save step (file -> its tensor keys and its optimizer paths) would
    lose: the file it exports keeps its model keys, every other file keeps nothing ("" when
    nothing is lost)."""
    source = strip_source(list(files))
    for name in sorted(files):
        pairs, optim = files[name]
        exported = weight_names([k for k, _ in pairs], "auto") if name == source else {}
        lost = lost_keys(pairs, exported, optim=optim)
        if lost:
            return _say(lost, name)
    return ""


def strip_source(names: list[str]) -> str | None:
    """The torch file a strip exports from (see ``strip.source``): the model file, else the one
    torch file that is not training state; None when that is not one file."""
    cands = sorted(n for n in names if MODEL_FILES.match(n))
    if not cands:
        cands = [n for n in names if n.endswith(TORCH_SUFFIXES) and not TRAINING_STATE_FILES.match(n)]
    return cands[0] if len(cands) == 1 else None


def files_loses(files: Mapping[str, ObjectInfo], layout: str) -> str:
    """A file of the step a strip would delete without proof of what it holds ("" when none):
    every file is the export, the model or optimizer state of its layout, named bookkeeping, or
    small metadata. The DCP and torch.save data files are proven by their content."""
    for name in sorted(files):
        if _droppable(name, files[name].size, layout):
            continue
        return f"{name}: a strip would delete it, and it is neither optimizer state nor the model it exports"
    return ""


def _droppable(name: str, size: int, layout: str) -> bool:
    top = "/" not in name
    if layout == "dcp" and top and (name.endswith(".distcp") or name == ".metadata"):
        return True
    if layout == "torch-save" and top and name.endswith(TORCH_SUFFIXES):
        return True
    leaf = name.rsplit("/", 1)[-1]
    if _OPTIM_FILE.search(name) or _MODEL_FILE.match(name) or (top and TRAINING_STATE_FILES.match(name)):
        return True
    if _BOOKKEEPING.match(leaf) and top:
        return True
    return not name.endswith(TENSOR_SUFFIXES) and size <= _SMALL


def _say(lost: list[str], where: str) -> str:
    if not lost:
        return ""
    more = f" and {len(lost) - 1} more" if len(lost) > 1 else ""
    return (
        f"{where} holds {lost[0]}{more}: floating-point state that is neither the model weights a strip "
        "exports nor optimizer state (EMA, a second model); a strip would lose it"
    )
