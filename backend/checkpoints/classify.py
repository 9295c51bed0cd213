"""Classifying one step by its contents: which layout wrote it, and its kind (see
:mod:`backend.checkpoints.steps`).

The layout is recognised from the file names of the step's listing; the kind is then proven
from small reads by that layout's classifier (:mod:`backend.checkpoints.rank_layouts`,
:mod:`backend.checkpoints.file_layouts`). A file that cannot be read lists the step as unknown,
never crashes the listing.
"""

from __future__ import annotations

import re

from backend.checkpoints.dcp import DISTCP_SUFFIX, METADATA_FILE, CheckpointError
from backend.checkpoints.evidence import Facts, export_present, rel_files
from backend.checkpoints.file_layouts import lightning_file_facts, safetensors_facts, torch_save_facts, trainer_facts
from backend.checkpoints.rank_layouts import (
    DS_MODEL,
    DS_OPTIM,
    MEGATRON_RANK_FILE,
    dcp_facts,
    deepspeed_facts,
    megatron_legacy_facts,
)
from backend.checkpoints.steps import (
    INDEX_FILE,
    TORCH_SUFFIXES,
    TRAINER_STATE,
    TRAINING_STATE_FILES,
    CheckpointStep,
    RunMarkers,
    step_number,
)
from backend.storage import ObjectInfo, ObjectStore, StoreError


async def classify(
    store: ObjectStore,
    step_path: str,
    objects: list[ObjectInfo],
    *,
    latest_tag: str | None = None,
    markers: RunMarkers | None = None,
) -> CheckpointStep:
    """Classify one step (a folder, or a single ``.ckpt`` file) from its listing and small reads."""
    markers = markers or RunMarkers(deepspeed_latest=latest_tag)
    single = len(objects) == 1 and objects[0].key == step_path
    files = {step_path.rsplit("/", 1)[-1]: objects[0]} if single else rel_files(objects, step_path)
    total = sum(o.size for o in objects)
    mtime = max((o.mtime for o in objects), default=0.0)
    name = step_path.rsplit("/", 1)[-1]
    has_export = False if single else await export_present(store, step_path, files)
    try:
        f = await _facts(store, step_path, name, files, single, markers)
    except (CheckpointError, StoreError):
        raise
    except Exception as exc:  # noqa: BLE001 - a hostile file must list as unknown, never crash the listing
        f = Facts(note=f"could not be read ({type(exc).__name__}: {exc})")
    return CheckpointStep(
        step=step_number(name),
        path=step_path,
        layout=f.layout,
        kind=f.kind,
        total_bytes=total,
        object_count=len(objects),
        mtime=mtime,
        has_bf16_export=has_export,
        objects=tuple(objects),
        optimizer_bytes=f.opt_bytes,
        note=f.note,
        marker=f.marker,
        best=markers.best_checkpoint == name and not single,
        flags=tuple(f.flags),
    )


async def _facts(
    store: ObjectStore, step_path: str, name: str, files: dict[str, ObjectInfo], single: bool, markers: RunMarkers
) -> Facts:
    names = set(files)
    base = {n.rsplit("/", 1)[-1] for n in names}
    if single:
        return await lightning_file_facts(store, files)
    if METADATA_FILE in names or any(n.endswith(DISTCP_SUFFIX) and "/" not in n for n in names):
        return await dcp_facts(store, step_path, name, files, markers)
    if any(DS_MODEL.match(n) or DS_OPTIM.match(n) for n in base):
        return await deepspeed_facts(store, step_path, name, files, markers)
    if any(MEGATRON_RANK_FILE.match(n) for n in names):
        return await megatron_legacy_facts(store, step_path, name, files, markers)
    if TRAINER_STATE in names or (name.startswith("checkpoint-") and any(TRAINING_STATE_FILES.match(n) for n in names)):
        return await trainer_facts(store, step_path, files, "hf-trainer", TRAINER_STATE)
    if any(re.match(r"^random_states_\d+\.pkl$", n) for n in names) or any(
        re.match(r"^optimizer(_\d+)?\.bin$", n) for n in names
    ):
        marker = _accelerate_marker(names)
        return await trainer_facts(store, step_path, files, "accelerate", marker)
    if INDEX_FILE in names or any(n.endswith(".safetensors") and "/" not in n for n in names):
        return await safetensors_facts(store, step_path, files)
    torch_names = sorted(n for n in names if n.endswith(TORCH_SUFFIXES))
    if torch_names:
        return await torch_save_facts(store, step_path, files, torch_names)
    partial = sorted(n for n in names if re.search(r"\.(pt|pth|bin|ckpt)\.(tmp|part)$", n))
    if partial:
        return Facts(
            layout="torch-save",
            kind="incomplete",
            note=f"only {partial[0]} so far: the save has not been moved into place",
        )
    return Facts(note="no checkpoint files in this folder")


def _accelerate_marker(names: set[str]) -> str:
    # accelerate's save_state writes the RNG states of every process last
    rngs = sorted(n for n in names if re.match(r"^random_states_\d+\.pkl$", n))
    return rngs[-1] if rngs else "random_states_0.pkl"
