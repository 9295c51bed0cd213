"""What the per-layout classifiers share: the facts they gather, bounded small reads, and the
checks every layout makes of its torch.save files, safetensors shards and index.

Only small things are read: safetensors headers and indexes, JSON files, and the zip directory
plus ``data.pkl`` of each ``torch.save`` file (see ``torchfile``), never tensor data.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from backend.checkpoints.dcp import CheckpointError
from backend.checkpoints.steps import INDEX_FILE, MAX_INDEX_BYTES, Kind, Layout
from backend.checkpoints.torchfile import (
    TorchFile,
    TorchFileError,
    key_paths_optimizer,
    optimizer_paths,
    read_local_torch_file,
    read_torch_file,
)
from backend.storage import LocalStore, ObjectInfo, ObjectStore, join_key

MAX_JSON_BYTES = 16 * 1024 * 1024
#: torch.save files read per step at most (DeepSpeed writes one optimizer file per rank: the
#: first, the last and the model file prove the layout; the rest are checked by size).
MAX_TORCH_FILES_READ = 8

OPTIM_FILE = re.compile(
    r"(^|/)((bf16_)?zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt|optimizer(_\d+)?\.(pt|bin)|"
    r"distrib_optim\.pt)$"
)
HF_SHARD = re.compile(r"^(model|pytorch_model|adapter_model)(-\d{5}-of-\d{5})?\.(safetensors|bin)$")


@dataclass
class Facts:
    layout: Layout = "unknown"
    kind: Kind = "unknown"
    note: str = ""
    marker: str | None = None
    opt_bytes: int = 0
    flags: list[str] = field(default_factory=list)
    keep_bytes: int | None = None  # BF16 bytes of the model tensors a strip keeps, when read
    strip_loses: str = ""  # state a strip would lose (EMA, a second model): see strip_scope


def rel_files(objects: Iterable[ObjectInfo], step_path: str) -> dict[str, ObjectInfo]:
    cut = len(step_path) + 1 if step_path else 0
    return {o.key[cut:]: o for o in objects}


async def read_small(store: ObjectStore, key: str, size: int, cap: int) -> bytes | None:
    if size > cap:
        return None
    return await store.get_bytes(key)


async def read_json(store: ObjectStore, key: str, size: int) -> Any:
    raw = await read_small(store, key, size, MAX_JSON_BYTES)
    if raw is None:
        raise CheckpointError(f"{store.url}/{key}: over the {MAX_JSON_BYTES}-byte limit for a JSON file")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise CheckpointError(f"{store.url}/{key}: not valid JSON") from None


async def torch_file(store: ObjectStore, key: str, size: int) -> TorchFile:
    """The structure of a torch.save object (zip directory + data.pkl only)."""
    if isinstance(store, LocalStore):
        return await asyncio.to_thread(read_local_torch_file, str(store.local_path(key)))

    async def read(offset: int, n: int) -> bytes:
        return await store.get_range(key, offset, n)

    return await read_torch_file(read, size, where=f"{store.url}/{key}")


#: Shards of one export whose headers are read to prove it is BF16 and complete.
MAX_EXPORT_SHARDS = 512


async def export_problem(store: ObjectStore, step_path: str, files: dict[str, ObjectInfo]) -> str | None:
    """Why the step holds no usable BF16 export (None: it holds one). A usable export is
    ``model.safetensors.index.json``, every shard it names, every tensor it maps found in its
    shard's header, and every tensor BF16 (read from the headers: FP32 safetensors shards are model
    weights, not an export)."""
    from backend.checkpoints.safetensors_check import SafetensorsError, read_header

    shards, missing = await index_shards(store, step_path, files)
    if missing is None:
        return f"no readable {INDEX_FILE}"
    if missing:
        return f"{missing[0]}: named by {INDEX_FILE} but missing or empty"
    if len(shards) > MAX_EXPORT_SHARDS:
        return f"{len(shards)} shards: more than the {MAX_EXPORT_SHARDS} read to prove an export"
    wanted = await _index_names(store, step_path, files)
    seen: set[str] = set()
    for shard in sorted(shards):
        try:
            hdr = await read_header(store, join_key(step_path, shard), files[shard].size)
        except SafetensorsError as exc:
            return str(exc)
        optim = key_paths_optimizer([t.name for t in hdr.tensors])
        if optim:
            return f"{shard}: holds optimizer state ({optim[0]}): a training checkpoint, not a BF16 export"
        for t in hdr.tensors:
            if t.dtype != "BF16":
                return f"{shard}: tensor {t.name} is {t.dtype}, not BF16: model weights, not a BF16 export"
            seen.add(t.name)
    lost = sorted(wanted - seen)
    if lost:
        return f"{INDEX_FILE} maps {lost[0]} but no shard holds it: the export is incomplete"
    return None


async def _index_names(store: ObjectStore, step_path: str, files: dict[str, ObjectInfo]) -> set[str]:
    raw = await read_small(store, join_key(step_path, INDEX_FILE), files[INDEX_FILE].size, MAX_INDEX_BYTES)
    try:
        return set(json.loads(raw or b"")["weight_map"])
    except (ValueError, KeyError, TypeError, RecursionError):
        return set()


async def index_shards(
    store: ObjectStore, step_path: str, files: dict[str, ObjectInfo]
) -> tuple[set[str], list[str] | None]:
    """The shards the step's safetensors index names, and those missing (None: no usable index)."""
    idx = files.get(INDEX_FILE)
    if idx is None:
        return set(), None
    try:
        raw = await read_small(store, join_key(step_path, INDEX_FILE), idx.size, MAX_INDEX_BYTES)
        data = json.loads(raw or b"")
        shards = set(data["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return set(), None
    if not shards or not all(isinstance(s, str) for s in shards):
        return set(), None
    return shards, sorted(s for s in shards if s not in files or files[s].size == 0)


def zero_byte(files: dict[str, ObjectInfo], names: Iterable[str]) -> str | None:
    """The note for the first empty file among ``names`` (a corrupt step), None when none is."""
    for n in sorted(names):
        if n in files and files[n].size == 0:
            return f"{n}: empty file (0 bytes)"
    return None


async def torch_facts(
    store: ObjectStore, step_path: str, files: dict[str, ObjectInfo], names: list[str]
) -> tuple[dict[str, TorchFile], str | None]:
    """Read the torch.save files ``names`` (bounded); a problem naming the first bad file."""
    out: dict[str, TorchFile] = {}
    for n in names[:MAX_TORCH_FILES_READ]:
        o = files[n]
        try:
            tf = await torch_file(store, o.key, o.size)
        except TorchFileError as exc:
            return out, str(exc)
        problem = tf.check_records()
        if problem:
            return out, problem
        out[n] = tf
    return out, None


async def read_whole(store: ObjectStore, obj: ObjectInfo, f: Facts) -> TorchFile | None:
    """A torch.save file's structure, proven whole; None with ``f`` saying why (corrupt when cut
    short or its records are short, unknown when it is no torch.save zip at all)."""
    try:
        tf = await torch_file(store, obj.key, obj.size)
    except TorchFileError as exc:
        f.kind = "unknown" if "legacy" in str(exc) or "not a torch.save" in str(exc) else "corrupt"
        f.note = str(exc)
        return None
    problem = tf.check_records()
    if problem:
        f.kind, f.note = "corrupt", problem
        return None
    return tf


FLOAT_DTYPES = frozenset({"float64", "double", "float32", "float", "float16", "half", "bfloat16"})


def model_tensor_bytes(tf: TorchFile) -> int:
    """BF16 bytes of the floating-point tensors outside optimizer state: what an export keeps."""
    opt = tuple(optimizer_paths(tf.obj))
    if "<root>" in opt:
        return 0
    return sum(
        2 * t.numel
        for path, t in tf.tensors()
        if t.dtype in FLOAT_DTYPES and not any(path == p or path.startswith(p + ".") for p in opt)
    )


def is_side_file(name: str, tf: TorchFile) -> bool:
    """A trainer-side file (RNG, scheduler, counters): no floating-point tensors, or named so."""
    from backend.checkpoints.steps import TRAINING_STATE_FILES

    leaf = name.rsplit("/", 1)[-1]
    return bool(TRAINING_STATE_FILES.match(leaf)) or not any(
        t.dtype in FLOAT_DTYPES and t.numel > 0 for _, t in tf.tensors()
    )


def kind_from_torch(tfs: dict[str, TorchFile], files: dict[str, ObjectInfo], f: Facts) -> Facts:
    opt: list[tuple[str, list[str]]] = [(n, p) for n, tf in tfs.items() if (p := optimizer_paths(tf.obj))]
    tensors = sum(1 for tf in tfs.values() for _, t in tf.tensors() if t.numel > 0)
    model = [n for n, tf in tfs.items() if not is_side_file(n, tf)]
    f.keep_bytes = sum(model_tensor_bytes(tf) for n, tf in tfs.items() if n in model or optimizer_paths(tf.obj))
    if opt:
        from backend.checkpoints.strip_scope import torch_loses

        f.kind = "full"
        f.note = optimizer_note(opt[0][1], opt[0][0])
        f.opt_bytes = sum(files[n].size for n, _ in opt if n in files)
        f.strip_loses = torch_loses(
            {
                n: ([(k, t.dtype in FLOAT_DTYPES and t.numel > 0) for k, t in tf.tensors()], optimizer_paths(tf.obj))
                for n, tf in tfs.items()
            }
        )
    elif named := sorted(n for n in tfs if OPTIM_FILE.search(n)):
        f.kind = "unknown"
        f.note = f"{named[0]}: named like optimizer state, but holds none the catalog recognises"
    elif tensors and model:
        f.kind = "weights"
        f.note = "no optimizer state in " + ", ".join(sorted(tfs))
    elif tensors:
        f.kind = "unknown"
        f.note = (
            f"{sorted(tfs)[0]}: trainer-side state only (RNG, scheduler, counters): "
            "no model or optimizer state to prove the kind"
        )
    else:
        f.kind = "unknown"
        f.note = f"{sorted(tfs)[0]}: holds no tensors: not a checkpoint" if tfs else "nothing readable"
    return f


def optimizer_note(paths: list[str], where: str) -> str:
    return f"optimizer state in {where} ({paths[0]})" if paths else ""


async def model_files_problem(store: ObjectStore, step_path: str, files: dict[str, ObjectInfo]) -> str | None:
    shards, missing = await index_shards(store, step_path, files)
    if INDEX_FILE in files and missing is None:
        return f"{INDEX_FILE}: unreadable or names no shards"
    if missing:
        return f"{missing[0]}: named by {INDEX_FILE} but missing or empty"
    model = sorted(n for n in files if HF_SHARD.match(n))
    bad = zero_byte(files, model)
    if bad:
        return bad
    from backend.checkpoints.safetensors_check import SafetensorsError, read_header

    for n in model:
        if n.endswith(".safetensors"):
            try:
                await read_header(store, files[n].key, files[n].size)
            except SafetensorsError as exc:
                return str(exc)
    return None


async def safetensors_optimizer(
    store: ObjectStore, step_path: str, files: dict[str, ObjectInfo], names: list[str]
) -> tuple[str, str] | None:
    """The first safetensors file among ``names`` whose header names optimizer state, and the
    key (DCP's HuggingFaceStorageWriter saves a whole training state this way); None when none
    does. Headers only: no tensor data."""
    from backend.checkpoints.safetensors_check import read_header

    for n in sorted(names)[:MAX_EXPORT_SHARDS]:
        hdr = await read_header(store, join_key(step_path, n), files[n].size)
        optim = key_paths_optimizer([t.name for t in hdr.tensors])
        if optim:
            return n, optim[0]
    return None
