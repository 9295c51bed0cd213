"""The deep resumable check of a full step: its files are whole and match its commit marker.

Reads a fresh listing plus headers, zip directories and the first bytes of DCP records: no
tensor data.
"""

from __future__ import annotations

import asyncio

from backend.checkpoints.catalog import step_catalog
from backend.checkpoints.classify import dcp_roots
from backend.checkpoints.dcp import METADATA_FILE, CheckpointError, load_metadata
from backend.checkpoints.evidence import rel_files, torch_file
from backend.checkpoints.steps import TORCH_SUFFIXES, CheckpointStep
from backend.checkpoints.torchfile import TorchFileError
from backend.storage import ObjectStore, join_key

#: Files that hold checkpoint data: empty, they fail the check. Other empty files are markers
#: (an operator's or a trainer's MILESTONE, a done flag) and prove nothing either way.
_DATA_SUFFIXES = (".distcp", ".pt", ".pth", ".bin", ".ckpt", ".pkl", ".safetensors", ".metadata")
#: The deep check reads every torch.save file's directory, but no more than this many per step.
MAX_PROOF_FILES = 4096


async def prove_resumable(store: ObjectStore, step: CheckpointStep) -> str:
    """``"verified"`` when a full step's files are whole and match its commit marker, else the
    problem, naming the file. Reads a fresh listing plus headers, zip directories and the first
    bytes of DCP records: no tensor data."""
    from backend.checkpoints.safetensors_check import SafetensorsError, read_header

    fresh = await step_catalog(store, step.path)
    if fresh.kind != "full":
        return f"{step.path} now lists as {fresh.kind}" + (f" ({fresh.note})" if fresh.note else "")
    files = {fresh.name: fresh.objects[0]} if fresh.is_file else rel_files(fresh.objects, fresh.path)
    # every DCP checkpoint of the step, at the top or nested in a sub-folder (a trainer's
    # ``checkpoint/``, an optimizer saved apart from safetensors weights): each one a resume reads
    for root in dcp_roots(set(files)):
        if join_key(root, METADATA_FILE) not in files:
            return f"{join_key(root, METADATA_FILE)}: missing: that checkpoint is not committed"
        problem = await _dcp_records_problem(store, join_key(fresh.path, root), root)
        if problem:
            return problem
    torch_names = sorted(n for n in files if n.endswith(TORCH_SUFFIXES) and files[n].size > 0)
    if len(torch_names) > MAX_PROOF_FILES:
        return f"{len(torch_names)} torch files: more than the {MAX_PROOF_FILES} the deep check reads"
    for n in torch_names:
        if n == "training_args.bin":
            continue  # a pickled TrainingArguments: the Trainer reads it back, resuming does not need it
        try:
            tf = await torch_file(store, files[n].key, files[n].size)
        except TorchFileError as exc:
            return str(exc)
        problem = tf.check_records()
        if problem:
            return problem
    for n in sorted(files):
        if n.endswith(".safetensors"):
            try:
                await read_header(store, files[n].key, files[n].size)
            except SafetensorsError as exc:
                return str(exc)
        elif files[n].size == 0 and n.endswith(_DATA_SUFFIXES):
            return f"{n}: empty file (0 bytes)"
    return "verified"


async def _dcp_records_problem(store: ObjectStore, path: str, root: str) -> str | None:
    """Whether the DCP checkpoint at ``path`` (``root`` inside its step) holds a tensor record
    where its ``.metadata`` puts the first and the last one of each file (a file preallocated,
    zeroed or still being copied has the right size but not the records); None when it does."""
    from backend.checkpoints.dcp import locate_chunks, tensor_entries

    where = f"{root}/" if root else ""
    md = await asyncio.to_thread(
        load_metadata,
        await store.get_bytes(join_key(path, METADATA_FILE)),
        where=join_key(path, METADATA_FILE),
        light=True,  # no tensors are built: the plan must not pay torch's import
    )

    async def read(file: str, offset: int, n: int) -> bytes:
        return await store.get_range(join_key(path, file), offset, n)

    try:
        entries = await locate_chunks(tensor_entries(md), read, where=path)
    except CheckpointError as exc:
        return str(exc)
    ends: dict[str, set[tuple[int, bool]]] = {}
    for e in entries:
        for c in e.chunks:
            if c.length:
                ends.setdefault(c.file, set()).add((c.offset, c.raw))
    for file, records in sorted(ends.items()):
        ordered = sorted(records)
        for offset, raw in dict.fromkeys((ordered[0], ordered[-1])):
            if not raw and (await read(file, offset, 4)) != b"PK\x03\x04":
                return f"{where}{file}: no tensor record at byte {offset}, where {METADATA_FILE} puts one"
    return None
