"""Classifying one step by its contents: which layout wrote it, and its kind (see
:mod:`backend.checkpoints.steps`).

The layout is recognised from the file names of the step's listing; the kind is then proven
from small reads by that layout's classifier (:mod:`backend.checkpoints.rank_layouts`,
:mod:`backend.checkpoints.file_layouts`). A file that cannot be read lists the step as unknown,
never crashes the listing.
"""

from __future__ import annotations

import re
from typing import Literal

from backend.checkpoints.dcp import DISTCP_SUFFIX, METADATA_FILE, CheckpointError
from backend.checkpoints.evidence import Facts, export_problem, rel_files
from backend.checkpoints.file_layouts import lightning_file_facts, safetensors_facts, torch_save_facts, trainer_facts
from backend.checkpoints.rank_layouts import (
    DS_MODEL,
    DS_OPTIM,
    MEGATRON_RANK_FILE,
    dcp_facts,
    deepspeed_facts,
    megatron_legacy_facts,
)
from backend.checkpoints.step_names import nested_steps, template
from backend.checkpoints.steps import (
    INDEX_FILE,
    TORCH_SUFFIXES,
    TRAINER_STATE,
    TRAINING_STATE_FILES,
    CheckpointStep,
    RunMarkers,
    step_number,
)
from backend.storage import ObjectInfo, ObjectStore, StoreError, join_key


async def classify(
    store: ObjectStore,
    step_path: str,
    objects: list[ObjectInfo],
    *,
    latest_tag: str | None = None,
    markers: RunMarkers | None = None,
    step: int | None | Literal["name"] = "name",
) -> CheckpointStep:
    """Classify one step (a folder, or a single ``.ckpt`` file) from its listing and small reads.

    ``step`` is the step number the catalog's step rule gave the entry (default: read from the
    name alone)."""
    markers = markers or RunMarkers(deepspeed_latest=latest_tag)
    single = len(objects) == 1 and objects[0].key == step_path
    files = {step_path.rsplit("/", 1)[-1]: objects[0]} if single else rel_files(objects, step_path)
    total = sum(o.size for o in objects)
    mtime = max((o.mtime for o in objects), default=0.0)
    name = step_path.rsplit("/", 1)[-1]
    export_note = None
    if not single and INDEX_FILE in files:
        export_note = await export_problem(store, step_path, files)
    has_export = not single and INDEX_FILE in files and export_note is None
    try:
        f = await _facts(store, step_path, name, files, single, markers)
    except (CheckpointError, StoreError):
        raise
    except Exception as exc:  # noqa: BLE001 - a hostile file must list as unknown, never crash the listing
        f = Facts(note=f"could not be read ({type(exc).__name__}: {exc})")
    num = step_number(name) if step == "name" else step
    if f.kind in ("full", "weights") and (why := pointer_problem(name, num, markers)):
        f = Facts(layout=f.layout, kind="incomplete", note=why, marker=f.marker, flags=f.flags)
    loses = f.strip_loses
    if not loses and not single and f.kind == "full":
        from backend.checkpoints.strip_scope import files_loses

        loses = files_loses(files, f.layout)
    return CheckpointStep(
        step=num,
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
        weights_bytes=f.keep_bytes,
        export_note=export_note or "",
        strip_loses=loses,
        referenced_by=referenced_by(name, num, markers),
    )


def referenced_by(name: str, num: int | None, markers: RunMarkers) -> tuple[str, ...]:
    """The links and pointers of the run that name the step ``name`` (by its name, or by its
    number when a pointer holds a bare number, as Megatron's tracker file does)."""
    out = []
    for who, target in markers.references:
        if target == name or (num is not None and target.isdigit() and int(target) == num):
            out.append(who)
    return tuple(dict.fromkeys(out))


async def _facts(
    store: ObjectStore, step_path: str, name: str, files: dict[str, ObjectInfo], single: bool, markers: RunMarkers
) -> Facts:
    names = set(files)
    base = {n.rsplit("/", 1)[-1] for n in names}
    if single:
        return await lightning_file_facts(store, files)
    nested = dcp_roots(names)
    if nested and "" not in nested:
        inner = nested_steps(step_number(name), nested)
        if inner:
            return Facts(note=f"holds steps of its own ({inner[0]}): a run folder, not a step")
        return await nested_facts(store, step_path, name, files, markers, nested)
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


def pointer_problem(name: str, num: int | None, markers: RunMarkers) -> str | None:
    """Why a committed step is not the run's to count: a resume pointer of the run (``latest``
    file or symlink) names an older step of the same name pattern, so a resume reads that one
    and this newer step is not committed by the run (still being saved, or abandoned by a
    rollback). None when no pointer says so."""
    if num is None:
        return None
    for pointer, target in markers.pointers:
        named: int | None
        if target.isdigit():
            named = int(target)
        elif template(target) == template(name):
            named = step_number(target)
        else:
            continue
        if named is not None and num > named:
            return (
                f"newer than the step the run's `{pointer}` names ({target}): a resume reads that one, "
                "so this step is not committed by the run"
            )
    return None


def _accelerate_marker(names: set[str]) -> str:
    # accelerate's save_state writes the RNG states of every process last
    rngs = sorted(n for n in names if re.match(r"^random_states_\d+\.pkl$", n))
    return rngs[-1] if rngs else "random_states_0.pkl"


def dcp_roots(names: set[str]) -> list[str]:
    """Folders of a step (relative; "" for the step itself) that hold a DCP checkpoint: its
    ``.metadata`` or any ``.distcp`` file (a save still in flight has only those)."""
    roots = set()
    for n in names:
        head, _, leaf = n.rpartition("/")
        if leaf == METADATA_FILE or leaf.endswith(DISTCP_SUFFIX):
            roots.add(head)
    return sorted(roots)


#: The most sub-checkpoints one step is read for (a step holding more is unknown).
MAX_NESTED = 16
#: Trainer-side files beside a nested checkpoint (RNG, counters, scheduler): they never decide
#: the kind on their own, and a strip keeps them only when they are small.
SIDE_FILE_MAX_BYTES = 64 * 1024 * 1024


async def nested_facts(
    store: ObjectStore,
    step_path: str,
    name: str,
    files: dict[str, ObjectInfo],
    markers: RunMarkers,
    roots: list[str],
) -> Facts:
    """A step whose checkpoints sit in sub-folders (one or several DCP saves, plus side files).

    Each sub-checkpoint is read like one at the top. The step is incomplete when any of them is
    uncommitted, corrupt or unknown when any is, full when any holds optimizer state, and weights
    only when every part proves it holds none. Side files never decide the kind."""
    if len(roots) > MAX_NESTED:
        return Facts(note=f"{len(roots)} checkpoints nested in one step: more than the {MAX_NESTED} read")
    parts: list[tuple[str, Facts]] = []
    covered: set[str] = set()
    for root in roots:
        sub = {n[len(root) + 1 :]: o for n, o in files.items() if n.startswith(root + "/")}
        covered.update(root + "/" + n for n in sub)
        f = await dcp_facts(store, join_key(step_path, root), root.rsplit("/", 1)[-1], sub, markers)
        f.marker = join_key(name, root, METADATA_FILE)
        parts.append((root, f))
    rest = {n: o for n, o in files.items() if n not in covered}
    side = await _side_facts(store, step_path, name, rest, markers)
    for root, f in parts:
        if f.kind == "incomplete":
            return Facts(layout=f.layout, kind="incomplete", note=f"{root}/: {f.note}", marker=f.marker)
    for root, f in parts:
        if f.kind in ("corrupt", "unknown"):
            return Facts(layout=f.layout, kind=f.kind, note=f"{root}/: {f.note or 'cannot be proven'}")
    if side is not None and side.kind in ("incomplete", "corrupt", "unknown"):
        return Facts(layout=parts[0][1].layout, kind=side.kind, note=side.note)
    full = [(root, f) for root, f in parts if f.kind == "full"]
    if side is not None and side.kind == "full":
        full.append(("", side))
    layout = parts[0][1].layout
    marker = parts[-1][1].marker
    if full:
        root, f = full[0]
        opt = sum(f.opt_bytes for _, f in full)
        where = f"{root}/" if root else "a side file"
        return Facts(
            layout=layout, kind="full", note=f"{where}: {f.note}", marker=marker, opt_bytes=opt, flags=["nested"]
        )
    return Facts(
        layout=layout,
        kind="weights",
        note=f"{len(parts)} nested checkpoint(s), no optimizer state in any part",
        marker=marker,
        flags=["nested"],
    )


async def _side_facts(
    store: ObjectStore, step_path: str, name: str, rest: dict[str, ObjectInfo], markers: RunMarkers
) -> Facts | None:
    """What the files beside nested checkpoints prove: None when they are only small side files
    (trainer state, RNG, counters) holding no optimizer state; their Facts otherwise."""
    if not rest:
        return None
    small = all(o.size <= SIDE_FILE_MAX_BYTES for o in rest.values())
    if small and all(_is_side_name(n) for n in rest):
        # side files only: read for optimizer state (or damage), never by the folder's name
        torch_names = sorted(n for n in rest if n.endswith(TORCH_SUFFIXES))
        if not torch_names:
            return None
        f = await torch_save_facts(store, step_path, rest, torch_names)
        return f if f.kind in ("full", "corrupt") else None
    f = await _facts(store, step_path, name, rest, False, markers)
    if f.kind == "full":
        return f  # optimizer state beside the nested checkpoint: still the step's state
    if f.kind == "weights":
        return None if small else Facts(note=f"{sorted(rest)[0]}: a large file beside the nested checkpoint")
    return f


def _is_side_name(n: str) -> bool:
    leaf = n.rsplit("/", 1)[-1]
    return bool(TRAINING_STATE_FILES.match(leaf)) or leaf.endswith(
        (".json", ".txt", ".yaml", ".yml", ".md", ".pt", ".pth", ".pkl")
    )
