"""The deep resumable check of a full step: its files are whole and match its commit marker.

Reads a fresh listing plus headers, zip directories and the first bytes of DCP records: no
tensor data.
"""

from __future__ import annotations

import asyncio

from backend.checkpoints.catalog import step_catalog
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
    from backend.checkpoints.dcp import locate_chunks, tensor_entries
    from backend.checkpoints.safetensors_check import SafetensorsError, read_header

    fresh = await step_catalog(store, step.path)
    if fresh.kind != "full":
        return f"{step.path} now lists as {fresh.kind}" + (f" ({fresh.note})" if fresh.note else "")
    files = {fresh.name: fresh.objects[0]} if fresh.is_file else rel_files(fresh.objects, fresh.path)
    if METADATA_FILE in files:
        md = await asyncio.to_thread(
            load_metadata,
            await store.get_bytes(join_key(fresh.path, METADATA_FILE)),
            where=join_key(fresh.path, METADATA_FILE),
            light=True,  # no tensors are built: the plan must not pay torch's import
        )

        async def read(file: str, offset: int, n: int) -> bytes:
            return await store.get_range(join_key(fresh.path, file), offset, n)

        try:
            entries = await locate_chunks(tensor_entries(md), read, where=fresh.path)
        except CheckpointError as exc:
            return str(exc)
        firsts: dict[str, tuple[int, bool]] = {}
        for e in entries:
            for c in e.chunks:
                if c.length and (c.file not in firsts or c.offset < firsts[c.file][0]):
                    firsts[c.file] = (c.offset, c.raw)
        for file, (offset, raw) in sorted(firsts.items()):
            if not raw and (await read(file, offset, 4)) != b"PK\x03\x04":
                return f"{file}: no tensor record at byte {offset}, where {METADATA_FILE} puts one"
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
