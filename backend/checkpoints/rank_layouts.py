"""Classifying layouts that every rank writes a part of: DCP (and the Lightning FSDP and Megatron
``torch_dist`` folders built on it), DeepSpeed ZeRO, and Megatron's legacy ``mp_rank_*`` folders.

Each one's commit marker is the file written last (DCP's ``.metadata``, Lightning's ``meta.pt``,
Megatron's ``metadata.json``) or a run-level file (DeepSpeed ``latest``, Megatron
``latest_checkpointed_iteration.txt``); a rank's missing or short file makes the step corrupt.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from backend.checkpoints.dcp import (
    MAX_METADATA_BYTES,
    METADATA_FILE,
    CheckpointError,
    TensorEntry,
    files_needed,
    load_metadata,
    storage_bytes_by_fqn,
    tensor_entries,
)
from backend.checkpoints.evidence import Facts, kind_from_torch, read_small, torch_facts, zero_byte
from backend.checkpoints.steps import DEEPSPEED_LATEST, MEGATRON_LATEST, Layout, RunMarkers, step_number
from backend.checkpoints.torchfile import key_paths_optimizer
from backend.storage import ObjectInfo, ObjectStore, join_key

LIGHTNING_META = "meta.pt"
MEGATRON_META = "metadata.json"

DS_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
DS_MODEL = re.compile(r"^(?:zero_pp_rank_\d+_)?mp_rank_(\d+)_model_states\.pt$")
MEGATRON_RANK_FILE = re.compile(r"^mp_rank_\d+(_\d+)*/(model_optim_rng|distrib_optim)\.pt$")


async def dcp_facts(
    store: ObjectStore, step_path: str, name: str, files: dict[str, ObjectInfo], markers: RunMarkers
) -> Facts:
    names = set(files)
    layout: Layout = "dcp"
    if name.endswith(".ckpt") or "meta.pt" in names:
        layout = "lightning"
    elif (
        "common.pt" in names
        or "metadata.json" in names
        or (re.match(r"^iter_\d+$", name) and markers.megatron_latest is not None)
    ):
        # Megatron's own evidence: its common.pt / metadata.json, or the run's tracker file. A DCP
        # checkpoint in an iter_ folder without them is plain DCP, committed by its .metadata.
        layout = "megatron"
    # The commit marker each writes last: DCP's .metadata; Lightning's FSDP strategy writes meta.pt
    # after dcp.save; Megatron's torch_dist writes metadata.json after the DCP files.
    last = {"lightning": LIGHTNING_META, "megatron": MEGATRON_META}.get(layout, METADATA_FILE)
    f = Facts(layout=layout, marker=join_key(name, last))
    if METADATA_FILE not in names:
        f.kind, f.note = "incomplete", f"no {METADATA_FILE} yet: DCP writes it last"
        return f
    if last not in names:
        f.kind, f.note = "incomplete", f"no {last} yet: {layout} writes it after the DCP files"
        return f
    if layout == "megatron" and (why := _megatron_uncommitted(name, markers)):
        f.kind, f.note, f.marker = "incomplete", why, MEGATRON_LATEST
        return f
    meta = files[METADATA_FILE]
    if meta.size == 0:
        f.kind, f.note = "corrupt", f"{METADATA_FILE}: empty file (0 bytes)"
        return f
    raw = await read_small(store, join_key(step_path, METADATA_FILE), meta.size, MAX_METADATA_BYTES)
    if raw is None:
        f.note = f"{METADATA_FILE} is over the {MAX_METADATA_BYTES}-byte limit: not read"
        return f
    try:
        # Read without torch (listing must not pay its import); unpickling a 405B model's
        # .metadata takes a while: off the event loop (the console stays live).
        md = await asyncio.to_thread(load_metadata, raw, where=join_key(step_path, METADATA_FILE), light=True)
    except ImportError:  # an unusual dtype sent the reader to torch, and torch is not here
        f.note = "torch is not installed here: DCP metadata cannot be read (pip install 'loadmaster[node]')"
        return f
    except CheckpointError as exc:
        f.kind, f.note = "corrupt", str(exc)
        return f
    for file, need in sorted(files_needed(md).items()):
        have = files.get(file)
        if have is None:
            f.kind, f.note = "corrupt", f"{file}: named by {METADATA_FILE} but missing"
            return f
        if have.size < need:
            f.kind, f.note = (
                "corrupt",
                (f"{file}: {have.size} bytes, shorter than the range {METADATA_FILE} assigns to it (needs {need})"),
            )
            return f
    entries = tensor_entries(md)  # once: the blob check and the BF16 size both walk it
    problem = await _embedded_blob_problem(store, step_path, files, entries)
    if problem:
        f.kind, f.note = "corrupt", problem
        return f
    keys = list(md.state_dict_metadata)
    optim = key_paths_optimizer(keys)
    per = storage_bytes_by_fqn(md)
    tensors = [k for k, m in md.state_dict_metadata.items() if hasattr(m, "chunks")]
    if optim:
        f.kind, f.note = "full", f"optimizer state in {METADATA_FILE} ({optim[0]})"
        from backend.checkpoints.dcp import weight_names

        weights = weight_names(keys, "auto")
        f.opt_bytes = sum(n for k, n in per.items() if k not in weights)
        f.keep_bytes = _bf16_bytes(entries, set(weights))
        from backend.checkpoints.strip_scope import dcp_loses

        f.strip_loses = dcp_loses(((e.fqn, bool(e.dtype.is_floating_point)) for e in entries), keys)
    elif tensors:
        f.kind, f.note = "weights", f"{len(tensors)} tensors, no optimizer state in {METADATA_FILE}"
        f.keep_bytes = _bf16_bytes(entries, set(keys))
    else:
        f.note = f"{METADATA_FILE} lists no tensors"
    return f


def _bf16_bytes(entries: list[TensorEntry], names: set[str]) -> int:
    """BF16 bytes of the tensors ``names`` of a DCP checkpoint (what an export of them keeps)."""
    total = 0
    for e in entries:
        if e.fqn in names:
            n = 1
            for d in e.shape:
                n *= int(d)
            total += 2 * n
    return total


async def _embedded_blob_problem(
    store: ObjectStore, step_path: str, files: dict[str, ObjectInfo], entries: list[TensorEntry]
) -> str | None:
    """For safetensors-serialized DCP files (every tensor of a file shares one offset), whether the
    embedded safetensors blob's own ranges fit the file. Other files cost no read."""
    from backend.checkpoints.dcp import locate_chunks

    shared: dict[str, set[int]] = {}
    count: dict[str, int] = {}
    for e in entries:
        for c in e.chunks:
            shared.setdefault(c.file, set()).add(c.offset)
            count[c.file] = count.get(c.file, 0) + 1
    suspects = {f for f, offs in shared.items() if len(offs) == 1 and count[f] > 1}
    if not suspects:
        return None

    async def read(file: str, offset: int, n: int) -> bytes:
        return await store.get_range(join_key(step_path, file), offset, n)

    suspect_entries = [e for e in entries if any(c.file in suspects for c in e.chunks)]
    try:
        located = await locate_chunks(suspect_entries, read, where=step_path)
    except CheckpointError as exc:
        return str(exc)
    for e in located:
        for c in e.chunks:
            if c.file in files and c.offset + c.length > files[c.file].size:
                return (
                    f"{c.file}: {files[c.file].size} bytes, shorter than its embedded safetensors header "
                    f"says ({e.fqn} ends at byte {c.offset + c.length})"
                )
    return None


def _megatron_uncommitted(name: str, markers: RunMarkers) -> str | None:
    num = step_number(name)
    if markers.megatron_release or markers.megatron_latest is None or num is None:
        return None
    if num > markers.megatron_latest:
        return f"iteration {num} is newer than {MEGATRON_LATEST} ({markers.megatron_latest}): still being written"
    return None


async def deepspeed_facts(
    store: ObjectStore, step_path: str, name: str, files: dict[str, ObjectInfo], markers: RunMarkers
) -> Facts:
    f = Facts(layout="deepspeed", marker=DEEPSPEED_LATEST)
    num, latest = step_number(name), markers.deepspeed_latest
    latest_num = step_number(latest) if latest else None
    if latest is not None and name != latest and num is not None and latest_num is not None and num > latest_num:
        f.kind, f.note = "incomplete", f"newer than the run's `latest` ({latest}): still being saved"
        return f
    models = sorted(n for n in files if DS_MODEL.match(n.rsplit("/", 1)[-1]))
    optims = sorted(n for n in files if DS_OPTIM.match(n.rsplit("/", 1)[-1]))
    if not models:
        f.kind, f.note = "incomplete", "no *model_states.pt yet"
        return f
    bad = zero_byte(files, models + optims)
    if bad:
        f.kind, f.note = "corrupt", bad
        return f
    tfs, problem = await torch_facts(store, step_path, files, models[:1] + optims[:1] + optims[-1:])
    if problem:
        f.kind, f.note = "corrupt", problem
        return f
    model_tf = tfs[models[0]]
    world = _int_entry(model_tf.obj, "dp_world_size")
    ranks = sorted({int(m.group(1)) for n in optims if (m := DS_OPTIM.match(n.rsplit("/", 1)[-1]))})
    expected = world if world else (max(ranks) + 1 if ranks else 0)
    missing = [r for r in range(expected) if r not in ranks]
    if optims and missing:
        f.kind, f.note = "corrupt", f"rank {missing[0]}'s *_optim_states.pt is missing ({len(ranks)} of {expected})"
        return f
    module = [t for p, t in model_tf.tensors() if p.startswith("module.")]
    if module and all(t.numel == 0 for t in module):
        f.flags.append("zero3-placeholders")
    if optims:
        f.kind = "full"
        f.note = f"optimizer partitions in {len(optims)} *_optim_states.pt file(s)"
        if "zero3-placeholders" in f.flags:
            f.note += "; ZeRO-3: the model_states file holds placeholders, the weights live in the partitions"
        f.opt_bytes = sum(files[n].size for n in optims)
    elif module and "zero3-placeholders" not in f.flags:
        f.kind, f.note = "weights", "model_states only, no optimizer partitions"
    else:
        f.note = "ZeRO-3 model_states without its optimizer partitions: no weights to keep"
        f.kind = "corrupt"
    return f


def _int_entry(obj: Any, key: str) -> int | None:
    v = obj.get(key) if isinstance(obj, dict) else None
    return v if isinstance(v, int) and v > 0 else None


async def megatron_legacy_facts(
    store: ObjectStore, step_path: str, name: str, files: dict[str, ObjectInfo], markers: RunMarkers
) -> Facts:
    f = Facts(layout="megatron", marker=MEGATRON_LATEST)
    why = _megatron_uncommitted(name, markers)
    if why:
        f.kind, f.note = "incomplete", why
        return f
    rank_files = sorted(n for n in files if MEGATRON_RANK_FILE.match(n))
    bad = zero_byte(files, rank_files)
    if bad:
        f.kind, f.note = "corrupt", bad
        return f
    ranks = sorted({n.split("/", 1)[0] for n in rank_files})
    dist = [r for r in ranks if f"{r}/distrib_optim.pt" in files]
    no_model = [r for r in ranks if f"{r}/model_optim_rng.pt" not in files]
    if no_model:
        f.kind, f.note = "corrupt", f"{no_model[0]}/model_optim_rng.pt is missing"
        return f
    if dist and len(dist) != len(ranks):
        missing = next(r for r in ranks if r not in dist)
        f.kind, f.note = "corrupt", f"{missing}/distrib_optim.pt is missing (other ranks have theirs)"
        return f
    tfs, problem = await torch_facts(
        store, step_path, files, [f"{ranks[0]}/model_optim_rng.pt"] + ([f"{ranks[0]}/distrib_optim.pt"] if dist else [])
    )
    if problem:
        f.kind, f.note = "corrupt", problem
        return f
    f = kind_from_torch(tfs, files, f)
    if dist and f.kind != "corrupt":
        f.kind, f.note = "full", f"distributed optimizer state in {len(dist)} distrib_optim.pt file(s)"
    if f.kind == "full":
        f.opt_bytes = sum(files[f"{r}/distrib_optim.pt"].size for r in dist)
    return f
