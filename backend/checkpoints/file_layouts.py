"""Classifying layouts of whole files one process writes: HF Trainer ``checkpoint-N/`` and
accelerate ``save_state`` folders, safetensors exports, plain ``torch.save`` files, and
Lightning's ``epoch=E-step=S.ckpt`` files.

A torch.save file is written whole and then renamed, so the file itself is its commit marker; the
Trainer writes ``trainer_state.json`` last, accelerate its RNG states, an export its index.
"""

from __future__ import annotations

import re

from backend.checkpoints.dcp import CheckpointError
from backend.checkpoints.evidence import (
    HF_SHARD,
    MAX_EXPORT_SHARDS,
    MAX_TORCH_FILES_READ,
    OPTIM_FILE,
    Facts,
    kind_from_torch,
    model_files_problem,
    optimizer_note,
    read_json,
    read_whole,
    safetensors_optimizer,
    torch_facts,
    zero_byte,
)
from backend.checkpoints.steps import (
    INDEX_FILE,
    MODEL_FILES,
    TORCH_SUFFIXES,
    TRAINER_STATE,
    TRAINING_STATE_FILES,
    Layout,
)
from backend.checkpoints.torchfile import TorchFile, optimizer_paths
from backend.storage import ObjectInfo, ObjectStore, join_key

_SIDE_FILES = re.compile(r"^[^/]+\.(json|txt|yaml|yml|md|model|tiktoken|py)$", re.IGNORECASE)


async def lightning_file_facts(store: ObjectStore, files: dict[str, ObjectInfo]) -> Facts:
    ((fname, obj),) = files.items()
    f = Facts(layout="lightning" if fname.endswith(".ckpt") else "torch-save", marker=fname)
    if obj.size == 0:
        f.kind, f.note = "corrupt", f"{fname}: empty file (0 bytes)"
        return f
    tf = await read_whole(store, obj, f)
    return f if tf is None else kind_from_torch({fname: tf}, files, f)


async def trainer_facts(
    store: ObjectStore, step_path: str, files: dict[str, ObjectInfo], layout: Layout, marker: str
) -> Facts:
    """HF Trainer ``checkpoint-N/`` and accelerate ``save_state`` folders."""
    names = set(files)
    f = Facts(layout=layout, marker=join_key(step_path.rsplit("/", 1)[-1], marker))
    if marker not in names:
        f.kind, f.note = "incomplete", f"no {marker} yet: it is written last"
        return f
    problem = await model_files_problem(store, step_path, files)
    if problem:
        f.kind, f.note = "corrupt", problem
        return f
    if layout == "hf-trainer":
        try:
            await read_json(store, join_key(step_path, TRAINER_STATE), files[TRAINER_STATE].size)
        except CheckpointError as exc:
            f.kind, f.note = "corrupt", str(exc)
            return f
    optim_files = sorted(n for n in names if OPTIM_FILE.search(n))
    bad = zero_byte(files, optim_files)
    if bad:
        f.kind, f.note = "corrupt", bad
        return f
    read = [n for n in optim_files if n.endswith((".pt", ".bin"))]
    tfs, problem = await torch_facts(store, step_path, files, read)
    if problem:
        f.kind, f.note = "corrupt", problem
        return f
    opt = [(n, p) for n, tf in tfs.items() if (p := optimizer_paths(tf.obj))]
    if opt:
        f.kind, f.note = "full", optimizer_note(opt[0][1], opt[0][0])
        f.opt_bytes = sum(
            o.size
            for n, o in files.items()
            if (TRAINING_STATE_FILES.match(n) and not n.endswith(".json")) or OPTIM_FILE.search(n)
        )
        return f
    if optim_files:
        f.note = f"{optim_files[0]} holds no optimizer state the catalog recognises"
        return f
    has_model = any(HF_SHARD.match(n) or MODEL_FILES.match(n) for n in names)
    if has_model:
        f.kind, f.note = "weights", "model files only (saved without optimizer state)"
    else:
        f.note = "no model or optimizer files"
    return f


async def safetensors_facts(store: ObjectStore, step_path: str, files: dict[str, ObjectInfo]) -> Facts:
    names = set(files)
    f = Facts(layout="hf-safetensors", marker=None)
    if INDEX_FILE in names:
        f.marker = join_key(step_path.rsplit("/", 1)[-1], INDEX_FILE)
    shard_files = sorted(n for n in names if n.endswith(".safetensors") and "/" not in n)
    if (
        INDEX_FILE not in names
        and len(shard_files) > 1
        or any(re.search(r"-\d{5}-of-\d{5}\.", n) for n in shard_files)
        and INDEX_FILE not in names
    ):
        f.kind, f.note = "incomplete", f"shards without {INDEX_FILE} yet: the index is written last"
        return f
    problem = await model_files_problem(store, step_path, files)
    if problem:
        f.kind, f.note = "corrupt", problem
        return f
    if len(shard_files) > MAX_EXPORT_SHARDS:
        f.note = f"{len(shard_files)} safetensors files: more than the {MAX_EXPORT_SHARDS} read per step"
        return f
    from backend.checkpoints.safetensors_check import SafetensorsError

    try:
        in_shards = await safetensors_optimizer(store, step_path, files, shard_files)
    except SafetensorsError as exc:
        f.kind, f.note = "corrupt", str(exc)
        return f
    if in_shards is not None:
        # training state saved as safetensors (DCP's HuggingFaceStorageWriter takes any tensor):
        # not weights only, and nothing proves which loader resumes from it (no param groups, no
        # step counters beside the moments): never counted, never touched
        f.note = (
            f"optimizer state in {in_shards[0]} ({in_shards[1]}) saved as safetensors: "
            "not weights only, and not provably resumable"
        )
        return f
    others = sorted(n for n in names if n not in shard_files and n != INDEX_FILE and not _SIDE_FILES.match(n))
    torch_names = [n for n in others if n.endswith(TORCH_SUFFIXES)]
    if torch_names:
        tfs, problem = await torch_facts(store, step_path, files, torch_names)
        if problem:
            f.kind, f.note = "corrupt", problem
            return f
        opt = [(n, p) for n, tf in tfs.items() if (p := optimizer_paths(tf.obj))]
        if opt:
            f.layout, f.kind, f.note = "torch-save", "full", optimizer_note(opt[0][1], opt[0][0])
            f.opt_bytes = sum(files[n].size for n, _ in opt)
            return f
    unexplained = [n for n in others if n not in torch_names]
    if unexplained and any(files[n].size > 16 * 1024 * 1024 for n in unexplained):
        big = next(n for n in unexplained if files[n].size > 16 * 1024 * 1024)
        f.note = f"{big}: an unrecognised large file beside the safetensors shards: cannot prove it is not state"
        return f
    f.kind, f.note = "weights", "safetensors weights only"
    return f


async def torch_save_facts(
    store: ObjectStore, step_path: str, files: dict[str, ObjectInfo], torch_names: list[str]
) -> Facts:
    step_name = step_path.rsplit("/", 1)[-1]
    # a torch.save file is written whole, then renamed: the file itself is the commit marker
    f = Facts(layout="torch-save", marker=join_key(step_name, torch_names[0]) if len(torch_names) == 1 else None)
    bad = zero_byte(files, torch_names)
    if bad:
        f.kind, f.note = "corrupt", bad
        return f
    if len(torch_names) > MAX_TORCH_FILES_READ:
        f.note = f"{len(torch_names)} torch files: more than the {MAX_TORCH_FILES_READ} the catalog reads per step"
        return f
    tfs: dict[str, TorchFile] = {}
    for n in torch_names:
        tf = await read_whole(store, files[n], f)
        if tf is None:
            return f
        tfs[n] = tf
    f = kind_from_torch(tfs, files, f)
    if f.kind == "weights":
        empty = [
            n
            for n, tf in tfs.items()
            if not any(t.numel > 0 for _, t in tf.tensors()) and not TRAINING_STATE_FILES.match(n)
        ]
        if empty:
            f.kind, f.note = "unknown", f"{empty[0]}: holds no tensors: a stray file, not a checkpoint"
    return f
