"""The checkpoint catalog: one row per step of a run, classified by what its files hold.

Listing is one paginated ``list_dirs`` of the run prefix (plus the run's own files: Lightning
writes ``epoch=E-step=S.ckpt`` files there, DeepSpeed ``latest``, Megatron
``latest_checkpointed_iteration.txt``), then each step listed concurrently (bounded), never one
request per object. Only small things are read: DCP ``.metadata``, safetensors indexes, and the
zip directory plus ``data.pkl`` of each ``torch.save`` file (see ``torchfile``), never tensor data.

A step's *kind* is decided by its contents, never by names alone:

* ``full``       -- resumable: optimizer state is present (anywhere: DCP keys at any depth,
  ``torch.save`` dicts, DeepSpeed/Megatron/HF/accelerate optimizer files), commit marker present;
* ``weights``    -- committed, and its contents prove there is no optimizer state;
* ``incomplete`` -- in flight: the layout's commit marker is not written yet;
* ``corrupt``    -- committed, but its files do not match the marker (a ``.distcp`` shorter than a
  range ``.metadata`` gives it, a shard the index names is missing, zero-byte or truncated files,
  a rank's file missing);
* ``unknown``    -- anything that cannot be proven. Listed, never deleted, stripped or counted.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from backend.checkpoints.dcp import (
    DISTCP_SUFFIX,
    MAX_METADATA_BYTES,
    METADATA_FILE,
    CheckpointError,
    files_needed,
    load_metadata,
    storage_bytes_by_fqn,
)
from backend.checkpoints.torchfile import (
    TorchFile,
    TorchFileError,
    key_paths_optimizer,
    optimizer_paths,
    read_local_torch_file,
    read_torch_file,
)
from backend.storage import LocalStore, ObjectInfo, ObjectStore, StoreError, join_key

Layout = Literal["dcp", "hf-trainer", "accelerate", "lightning", "megatron", "deepspeed", "hf-safetensors",
                 "torch-save", "unknown"]
Kind = Literal["full", "weights", "incomplete", "corrupt", "unknown"]
KINDS: tuple[str, ...] = ("full", "weights", "incomplete", "corrupt", "unknown")

INDEX_FILE = "model.safetensors.index.json"
MAX_INDEX_BYTES = 64 * 1024 * 1024
MAX_JSON_BYTES = 16 * 1024 * 1024
LIST_CONCURRENCY = 16
#: torch.save files read per step at most (DeepSpeed writes one optimizer file per rank: the
#: first, the last and the model file prove the layout; the rest are checked by size).
MAX_TORCH_FILES_READ = 8

DEEPSPEED_LATEST = "latest"
MEGATRON_LATEST = "latest_checkpointed_iteration.txt"
TRAINER_STATE = "trainer_state.json"
LIGHTNING_META = "meta.pt"
MEGATRON_META = "metadata.json"

#: torch.save file names that are training state (what a strip frees), HF Trainer and plain.
TRAINING_STATE_FILES = re.compile(
    r"^(optimizer(_\d+)?|optim|scheduler(_\d+)?|lr_scheduler|rng_state(_\d+)?|scaler|trainer_state|"
    r"random_states_\d+|sampler(_\d+)?|training_args)\.(pt|pth|bin|json|pkl)$")
MODEL_FILES = re.compile(r"^(model|pytorch_model|consolidated(\.\d+)?)\.(pt|pth|bin)$")
_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
_OPTIM_FILE = re.compile(r"(^|/)((bf16_)?zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt|optimizer(_\d+)?\.(pt|bin)|"
                         r"distrib_optim\.pt)$")
_DS_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_DS_MODEL = re.compile(r"^(?:zero_pp_rank_\d+_)?mp_rank_(\d+)_model_states\.pt$")
_MEGATRON_RANK_FILE = re.compile(r"^mp_rank_\d+(_\d+)*/(model_optim_rng|distrib_optim)\.pt$")
_HF_SHARD = re.compile(r"^(model|pytorch_model)(-\d{5}-of-\d{5})?\.(safetensors|bin)$")
_STEP_RE = re.compile(r"^[A-Za-z_\-.]*?(\d+)$")
_LIGHTNING_STEP = re.compile(r"(?:^|[-_])step=(\d+)")
_SIDE_FILES = re.compile(r"^[^/]+\.(json|txt|yaml|yml|md|model|tiktoken|py)$", re.IGNORECASE)


@dataclass(frozen=True)
class CheckpointStep:
    """One step of a run: layout, kind (by content), why, sizes, and whether a BF16 export exists."""

    step: int | None
    path: str  # step dir (or file) relative to the store root, e.g. "run1/step-48000"
    layout: Layout
    kind: Kind
    total_bytes: int
    object_count: int
    mtime: float  # newest object
    has_bf16_export: bool  # model.safetensors.index.json + all its shards present in the step dir
    objects: tuple[ObjectInfo, ...]
    optimizer_bytes: int  # bytes that are optimizer/training state (what a strip frees)
    note: str = ""  # why: the file at fault for corrupt/unknown, the missing marker for incomplete
    marker: str | None = None  # the commit marker this kind rests on (relative to the run)
    best: bool = False  # the HF Trainer's best_model_checkpoint: protected like a pin
    flags: tuple[str, ...] = field(default=())  # e.g. "zero3-placeholders": weights live in the optimizer

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def is_file(self) -> bool:
        """A step that is one object (Lightning's ``epoch=E-step=S.ckpt`` file)."""
        return len(self.objects) == 1 and self.objects[0].key == self.path

    def as_dict(self) -> dict[str, object]:
        """JSON-ready summary (without the object list)."""
        return {"step": self.step, "path": self.path, "layout": self.layout, "kind": self.kind,
                "total_bytes": self.total_bytes, "object_count": self.object_count, "mtime": self.mtime,
                "has_bf16_export": self.has_bf16_export, "optimizer_bytes": self.optimizer_bytes,
                "note": self.note, "marker": self.marker, "best": self.best, "flags": list(self.flags)}


@dataclass(frozen=True)
class Catalog:
    """Every step under a run prefix, in numeric step order (unknown folders included)."""

    url: str
    prefix: str
    steps: tuple[CheckpointStep, ...]

    def bytes_by_kind(self) -> dict[str, int]:
        """Total bytes per kind (full / weights / incomplete / corrupt / unknown)."""
        out: dict[str, int] = {}
        for s in self.steps:
            out[s.kind] = out.get(s.kind, 0) + s.total_bytes
        return out

    def step(self, ref: str | int) -> CheckpointStep:
        """The step with this number, folder name or path."""
        for s in self.steps:
            if str(s.step) == str(ref) or s.name == str(ref) or s.path == str(ref):
                return s
        raise CheckpointError(f"no step {ref!r} under {join_key(self.url, self.prefix) or self.url}")


@dataclass(frozen=True)
class RunMarkers:
    """The run-level files that commit steps: DeepSpeed ``latest``, Megatron's iteration file,
    and the HF Trainer's best checkpoint (from the newest ``trainer_state.json``)."""

    deepspeed_latest: str | None = None
    megatron_latest: int | None = None
    megatron_release: bool = False
    best_checkpoint: str | None = None  # folder name


def step_number(name: str) -> int | None:
    """The step number in a folder or file name (step-48000, global_step48000, checkpoint-500,
    iter_0000100, epoch=0-step=100.ckpt, 000123)."""
    m = _LIGHTNING_STEP.search(name)
    if m:
        return int(m.group(1))
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def _rel(objects: Iterable[ObjectInfo], step_path: str) -> dict[str, ObjectInfo]:
    cut = len(step_path) + 1 if step_path else 0
    return {o.key[cut:]: o for o in objects}


async def _read_small(store: ObjectStore, key: str, size: int, cap: int) -> bytes | None:
    if size > cap:
        return None
    return await store.get_bytes(key)


async def _read_json(store: ObjectStore, key: str, size: int) -> Any:
    raw = await _read_small(store, key, size, MAX_JSON_BYTES)
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


async def export_present(store: ObjectStore, step_path: str, files: dict[str, ObjectInfo]) -> bool:
    """True when the step dir holds model.safetensors.index.json and every shard it names."""
    return (await _index_shards(store, step_path, files))[1] == []


async def _index_shards(store: ObjectStore, step_path: str, files: dict[str, ObjectInfo]
                        ) -> tuple[set[str], list[str] | None]:
    """The shards the step's safetensors index names, and those missing (None: no usable index)."""
    idx = files.get(INDEX_FILE)
    if idx is None:
        return set(), None
    try:
        raw = await _read_small(store, join_key(step_path, INDEX_FILE), idx.size, MAX_INDEX_BYTES)
        data = json.loads(raw or b"")
        shards = set(data["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return set(), None
    if not shards or not all(isinstance(s, str) for s in shards):
        return set(), None
    return shards, sorted(s for s in shards if s not in files or files[s].size == 0)


@dataclass
class _Facts:
    layout: Layout = "unknown"
    kind: Kind = "unknown"
    note: str = ""
    marker: str | None = None
    opt_bytes: int = 0
    flags: list[str] = field(default_factory=list)


def _zero_byte(files: dict[str, ObjectInfo], names: Iterable[str]) -> str | None:
    """The note for the first empty file among ``names`` (a corrupt step), None when none is."""
    for n in sorted(names):
        if n in files and files[n].size == 0:
            return f"{n}: empty file (0 bytes)"
    return None


async def _torch_facts(store: ObjectStore, step_path: str, files: dict[str, ObjectInfo],
                       names: list[str]) -> tuple[dict[str, TorchFile], str | None]:
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


async def classify(store: ObjectStore, step_path: str, objects: list[ObjectInfo], *,
                   latest_tag: str | None = None, markers: RunMarkers | None = None) -> CheckpointStep:
    """Classify one step (a folder, or a single ``.ckpt`` file) from its listing and small reads."""
    markers = markers or RunMarkers(deepspeed_latest=latest_tag)
    single = len(objects) == 1 and objects[0].key == step_path
    files = {step_path.rsplit("/", 1)[-1]: objects[0]} if single else _rel(objects, step_path)
    total = sum(o.size for o in objects)
    mtime = max((o.mtime for o in objects), default=0.0)
    name = step_path.rsplit("/", 1)[-1]
    has_export = False if single else await export_present(store, step_path, files)
    try:
        f = await _facts(store, step_path, name, files, single, markers)
    except (CheckpointError, StoreError):
        raise
    except Exception as exc:  # noqa: BLE001 - a hostile file must list as unknown, never crash the listing
        f = _Facts(note=f"could not be read ({type(exc).__name__}: {exc})")
    return CheckpointStep(step=step_number(name), path=step_path, layout=f.layout, kind=f.kind,
                          total_bytes=total, object_count=len(objects), mtime=mtime,
                          has_bf16_export=has_export, objects=tuple(objects), optimizer_bytes=f.opt_bytes,
                          note=f.note, marker=f.marker, best=markers.best_checkpoint == name and not single,
                          flags=tuple(f.flags))


async def _facts(store: ObjectStore, step_path: str, name: str, files: dict[str, ObjectInfo], single: bool,
                 markers: RunMarkers) -> _Facts:
    names = set(files)
    base = {n.rsplit("/", 1)[-1] for n in names}
    if single:
        return await _lightning_file(store, files)
    if METADATA_FILE in names or any(n.endswith(DISTCP_SUFFIX) and "/" not in n for n in names):
        return await _dcp_facts(store, step_path, name, files, markers)
    if any(_DS_MODEL.match(n) or _DS_OPTIM.match(n) for n in base):
        return await _deepspeed_facts(store, step_path, name, files, markers)
    if any(_MEGATRON_RANK_FILE.match(n) for n in names):
        return await _megatron_legacy_facts(store, step_path, name, files, markers)
    if TRAINER_STATE in names or (name.startswith("checkpoint-") and any(TRAINING_STATE_FILES.match(n) for n in names)):
        return await _trainer_facts(store, step_path, files, "hf-trainer", TRAINER_STATE)
    if any(re.match(r"^random_states_\d+\.pkl$", n) for n in names) or any(
            re.match(r"^optimizer(_\d+)?\.bin$", n) for n in names):
        marker = _accelerate_marker(names)
        return await _trainer_facts(store, step_path, files, "accelerate", marker)
    if INDEX_FILE in names or any(n.endswith(".safetensors") and "/" not in n for n in names):
        return await _safetensors_facts(store, step_path, files)
    torch_names = sorted(n for n in names if n.endswith(_TORCH_SUFFIXES))
    if torch_names:
        return await _torch_save_facts(store, step_path, files, torch_names)
    partial = sorted(n for n in names if re.search(r"\.(pt|pth|bin|ckpt)\.(tmp|part)$", n))
    if partial:
        return _Facts(layout="torch-save", kind="incomplete",
                      note=f"only {partial[0]} so far: the save has not been moved into place")
    return _Facts(note="no checkpoint files in this folder")


def _accelerate_marker(names: set[str]) -> str:
    # accelerate's save_state writes the RNG states of every process last
    rngs = sorted(n for n in names if re.match(r"^random_states_\d+\.pkl$", n))
    return rngs[-1] if rngs else "random_states_0.pkl"


def _optimizer_note(paths: list[str], where: str) -> str:
    return f"optimizer state in {where} ({paths[0]})" if paths else ""


async def _lightning_file(store: ObjectStore, files: dict[str, ObjectInfo]) -> _Facts:
    (fname, obj), = files.items()
    f = _Facts(layout="lightning" if fname.endswith(".ckpt") else "torch-save", marker=fname)
    if obj.size == 0:
        f.kind, f.note = "corrupt", f"{fname}: empty file (0 bytes)"
        return f
    tf = await _read_whole(store, obj, f)
    return f if tf is None else _kind_from_torch({fname: tf}, files, f)


async def _read_whole(store: ObjectStore, obj: ObjectInfo, f: _Facts) -> TorchFile | None:
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


def _kind_from_torch(tfs: dict[str, TorchFile], files: dict[str, ObjectInfo], f: _Facts) -> _Facts:
    opt: list[tuple[str, list[str]]] = [(n, p) for n, tf in tfs.items() if (p := optimizer_paths(tf.obj))]
    tensors = sum(1 for tf in tfs.values() for _, t in tf.tensors() if t.numel > 0)
    if opt:
        f.kind = "full"
        f.note = _optimizer_note(opt[0][1], opt[0][0])
        f.opt_bytes = sum(files[n].size for n, _ in opt if n in files)
    elif named := sorted(n for n in tfs if _OPTIM_FILE.search(n)):
        f.kind = "unknown"
        f.note = f"{named[0]}: named like optimizer state, but holds none the catalog recognises"
    elif tensors:
        f.kind = "weights"
        f.note = "no optimizer state in " + ", ".join(sorted(tfs))
    else:
        f.kind = "unknown"
        f.note = f"{sorted(tfs)[0]}: holds no tensors: not a checkpoint" if tfs else "nothing readable"
    return f


async def _dcp_facts(store: ObjectStore, step_path: str, name: str, files: dict[str, ObjectInfo],
                     markers: RunMarkers) -> _Facts:
    names = set(files)
    layout: Layout = "dcp"
    if name.endswith(".ckpt") or "meta.pt" in names:
        layout = "lightning"
    elif "common.pt" in names or re.match(r"^iter_\d+$", name) or "metadata.json" in names:
        layout = "megatron"
    # The commit marker each writes last: DCP's .metadata; Lightning's FSDP strategy writes meta.pt
    # after dcp.save; Megatron's torch_dist writes metadata.json after the DCP files.
    last = {"lightning": LIGHTNING_META, "megatron": MEGATRON_META}.get(layout, METADATA_FILE)
    f = _Facts(layout=layout, marker=join_key(name, last))
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
    raw = await _read_small(store, join_key(step_path, METADATA_FILE), meta.size, MAX_METADATA_BYTES)
    if raw is None:
        f.note = f"{METADATA_FILE} is over the {MAX_METADATA_BYTES}-byte limit: not read"
        return f
    try:
        import torch  # noqa: F401 - DCP metadata classes live in torch
    except ImportError:
        f.note = "torch is not installed here: DCP metadata cannot be read (pip install 'loadmaster[node]')"
        return f
    try:
        # unpickling a 405B model's .metadata takes a while: off the event loop (the console stays live)
        md = await asyncio.to_thread(load_metadata, raw, where=join_key(step_path, METADATA_FILE))
    except CheckpointError as exc:
        f.kind, f.note = "corrupt", str(exc)
        return f
    for file, need in sorted(files_needed(md).items()):
        have = files.get(file)
        if have is None:
            f.kind, f.note = "corrupt", f"{file}: named by {METADATA_FILE} but missing"
            return f
        if have.size < need:
            f.kind, f.note = "corrupt", (f"{file}: {have.size} bytes, shorter than the range {METADATA_FILE} "
                                         f"assigns to it (needs {need})")
            return f
    problem = await _embedded_blob_problem(store, step_path, files, md)
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
    elif tensors:
        f.kind, f.note = "weights", f"{len(tensors)} tensors, no optimizer state in {METADATA_FILE}"
    else:
        f.note = f"{METADATA_FILE} lists no tensors"
    return f


async def _embedded_blob_problem(store: ObjectStore, step_path: str, files: dict[str, ObjectInfo],
                                 md: Any) -> str | None:
    """For safetensors-serialized DCP files (every tensor of a file shares one offset), whether the
    embedded safetensors blob's own ranges fit the file. Other files cost no read."""
    from backend.checkpoints.dcp import locate_chunks, tensor_entries

    shared: dict[str, set[int]] = {}
    count: dict[str, int] = {}
    for e in tensor_entries(md):
        for c in e.chunks:
            shared.setdefault(c.file, set()).add(c.offset)
            count[c.file] = count.get(c.file, 0) + 1
    suspects = {f for f, offs in shared.items() if len(offs) == 1 and count[f] > 1}
    if not suspects:
        return None

    async def read(file: str, offset: int, n: int) -> bytes:
        return await store.get_range(join_key(step_path, file), offset, n)

    entries = [e for e in tensor_entries(md) if any(c.file in suspects for c in e.chunks)]
    try:
        located = await locate_chunks(entries, read, where=step_path)
    except CheckpointError as exc:
        return str(exc)
    for e in located:
        for c in e.chunks:
            if c.file in files and c.offset + c.length > files[c.file].size:
                return (f"{c.file}: {files[c.file].size} bytes, shorter than its embedded safetensors header "
                        f"says ({e.fqn} ends at byte {c.offset + c.length})")
    return None


def _megatron_uncommitted(name: str, markers: RunMarkers) -> str | None:
    num = step_number(name)
    if markers.megatron_release or markers.megatron_latest is None or num is None:
        return None
    if num > markers.megatron_latest:
        return f"iteration {num} is newer than {MEGATRON_LATEST} ({markers.megatron_latest}): still being written"
    return None


async def _deepspeed_facts(store: ObjectStore, step_path: str, name: str, files: dict[str, ObjectInfo],
                           markers: RunMarkers) -> _Facts:
    f = _Facts(layout="deepspeed", marker=DEEPSPEED_LATEST)
    num, latest = step_number(name), markers.deepspeed_latest
    latest_num = step_number(latest) if latest else None
    if latest is not None and name != latest and num is not None and latest_num is not None and num > latest_num:
        f.kind, f.note = "incomplete", f"newer than the run's `latest` ({latest}): still being saved"
        return f
    models = sorted(n for n in files if _DS_MODEL.match(n.rsplit("/", 1)[-1]))
    optims = sorted(n for n in files if _DS_OPTIM.match(n.rsplit("/", 1)[-1]))
    if not models:
        f.kind, f.note = "incomplete", "no *model_states.pt yet"
        return f
    bad = _zero_byte(files, models + optims)
    if bad:
        f.kind, f.note = "corrupt", bad
        return f
    tfs, problem = await _torch_facts(store, step_path, files, models[:1] + optims[:1] + optims[-1:])
    if problem:
        f.kind, f.note = "corrupt", problem
        return f
    model_tf = tfs[models[0]]
    world = _int_entry(model_tf.obj, "dp_world_size")
    ranks = sorted({int(m.group(1)) for n in optims if (m := _DS_OPTIM.match(n.rsplit("/", 1)[-1]))})
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


async def _megatron_legacy_facts(store: ObjectStore, step_path: str, name: str, files: dict[str, ObjectInfo],
                                 markers: RunMarkers) -> _Facts:
    f = _Facts(layout="megatron", marker=MEGATRON_LATEST)
    why = _megatron_uncommitted(name, markers)
    if why:
        f.kind, f.note = "incomplete", why
        return f
    rank_files = sorted(n for n in files if _MEGATRON_RANK_FILE.match(n))
    bad = _zero_byte(files, rank_files)
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
    tfs, problem = await _torch_facts(store, step_path, files, [f"{ranks[0]}/model_optim_rng.pt"]
                                      + ([f"{ranks[0]}/distrib_optim.pt"] if dist else []))
    if problem:
        f.kind, f.note = "corrupt", problem
        return f
    f = _kind_from_torch(tfs, files, f)
    if dist and f.kind != "corrupt":
        f.kind, f.note = "full", f"distributed optimizer state in {len(dist)} distrib_optim.pt file(s)"
    if f.kind == "full":
        f.opt_bytes = sum(files[f"{r}/distrib_optim.pt"].size for r in dist)
    return f


async def _trainer_facts(store: ObjectStore, step_path: str, files: dict[str, ObjectInfo], layout: Layout,
                         marker: str) -> _Facts:
    """HF Trainer ``checkpoint-N/`` and accelerate ``save_state`` folders."""
    names = set(files)
    f = _Facts(layout=layout, marker=join_key(step_path.rsplit("/", 1)[-1], marker))
    if marker not in names:
        f.kind, f.note = "incomplete", f"no {marker} yet: it is written last"
        return f
    problem = await _model_files_problem(store, step_path, files)
    if problem:
        f.kind, f.note = "corrupt", problem
        return f
    if layout == "hf-trainer":
        try:
            await _read_json(store, join_key(step_path, TRAINER_STATE), files[TRAINER_STATE].size)
        except CheckpointError as exc:
            f.kind, f.note = "corrupt", str(exc)
            return f
    optim_files = sorted(n for n in names if _OPTIM_FILE.search(n))
    bad = _zero_byte(files, optim_files)
    if bad:
        f.kind, f.note = "corrupt", bad
        return f
    read = [n for n in optim_files if n.endswith((".pt", ".bin"))]
    tfs, problem = await _torch_facts(store, step_path, files, read)
    if problem:
        f.kind, f.note = "corrupt", problem
        return f
    opt = [(n, p) for n, tf in tfs.items() if (p := optimizer_paths(tf.obj))]
    if opt:
        f.kind, f.note = "full", _optimizer_note(opt[0][1], opt[0][0])
        f.opt_bytes = sum(o.size for n, o in files.items() if (TRAINING_STATE_FILES.match(n)
                          and not n.endswith(".json")) or _OPTIM_FILE.search(n))
        return f
    if optim_files:
        f.note = f"{optim_files[0]} holds no optimizer state the catalog recognises"
        return f
    has_model = any(_HF_SHARD.match(n) or MODEL_FILES.match(n) for n in names)
    if has_model:
        f.kind, f.note = "weights", "model files only (saved without optimizer state)"
    else:
        f.note = "no model or optimizer files"
    return f


async def _model_files_problem(store: ObjectStore, step_path: str, files: dict[str, ObjectInfo]) -> str | None:
    shards, missing = await _index_shards(store, step_path, files)
    if INDEX_FILE in files and missing is None:
        return f"{INDEX_FILE}: unreadable or names no shards"
    if missing:
        return f"{missing[0]}: named by {INDEX_FILE} but missing or empty"
    model = sorted(n for n in files if _HF_SHARD.match(n))
    bad = _zero_byte(files, model)
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


async def _safetensors_facts(store: ObjectStore, step_path: str, files: dict[str, ObjectInfo]) -> _Facts:
    names = set(files)
    f = _Facts(layout="hf-safetensors", marker=None)
    if INDEX_FILE in names:
        f.marker = join_key(step_path.rsplit("/", 1)[-1], INDEX_FILE)
    shard_files = sorted(n for n in names if n.endswith(".safetensors") and "/" not in n)
    if INDEX_FILE not in names and len(shard_files) > 1 or any(re.search(r"-\d{5}-of-\d{5}\.", n)
                                                               for n in shard_files) and INDEX_FILE not in names:
        f.kind, f.note = "incomplete", f"shards without {INDEX_FILE} yet: the index is written last"
        return f
    problem = await _model_files_problem(store, step_path, files)
    if problem:
        f.kind, f.note = "corrupt", problem
        return f
    others = sorted(n for n in names if n not in shard_files and n != INDEX_FILE and not _SIDE_FILES.match(n))
    torch_names = [n for n in others if n.endswith(_TORCH_SUFFIXES)]
    if torch_names:
        tfs, problem = await _torch_facts(store, step_path, files, torch_names)
        if problem:
            f.kind, f.note = "corrupt", problem
            return f
        opt = [(n, p) for n, tf in tfs.items() if (p := optimizer_paths(tf.obj))]
        if opt:
            f.layout, f.kind, f.note = "torch-save", "full", _optimizer_note(opt[0][1], opt[0][0])
            f.opt_bytes = sum(files[n].size for n, _ in opt)
            return f
    unexplained = [n for n in others if n not in torch_names]
    if unexplained and any(files[n].size > 16 * 1024 * 1024 for n in unexplained):
        big = next(n for n in unexplained if files[n].size > 16 * 1024 * 1024)
        f.note = f"{big}: an unrecognised large file beside the safetensors shards: cannot prove it is not state"
        return f
    f.kind, f.note = "weights", "safetensors weights only"
    return f


async def _torch_save_facts(store: ObjectStore, step_path: str, files: dict[str, ObjectInfo],
                            torch_names: list[str]) -> _Facts:
    step_name = step_path.rsplit("/", 1)[-1]
    # a torch.save file is written whole, then renamed: the file itself is the commit marker
    f = _Facts(layout="torch-save", marker=join_key(step_name, torch_names[0]) if len(torch_names) == 1 else None)
    bad = _zero_byte(files, torch_names)
    if bad:
        f.kind, f.note = "corrupt", bad
        return f
    if len(torch_names) > MAX_TORCH_FILES_READ:
        f.note = f"{len(torch_names)} torch files: more than the {MAX_TORCH_FILES_READ} the catalog reads per step"
        return f
    tfs: dict[str, TorchFile] = {}
    for n in torch_names:
        tf = await _read_whole(store, files[n], f)
        if tf is None:
            return f
        tfs[n] = tf
    f = _kind_from_torch(tfs, files, f)
    if f.kind == "weights":
        empty = [n for n, tf in tfs.items() if not any(t.numel > 0 for _, t in tf.tensors())
                 and not TRAINING_STATE_FILES.match(n)]
        if empty:
            f.kind, f.note = "unknown", f"{empty[0]}: holds no tensors: a stray file, not a checkpoint"
    return f


def _sort_key(s: CheckpointStep) -> tuple[int, int, str]:
    return (0, s.step, s.path) if s.step is not None else (1, 0, s.path)


async def _root_files(store: ObjectStore, prefix: str) -> list[ObjectInfo]:
    """The objects directly in ``prefix`` (not in its sub-folders)."""
    if isinstance(store, LocalStore):
        base = store.local_path(prefix) if prefix else store.root

        def scan() -> list[ObjectInfo]:
            out = []
            if base.is_dir():
                for p in base.iterdir():
                    if p.is_file() and not p.is_symlink():
                        st = p.stat()
                        out.append(ObjectInfo(join_key(prefix, p.name), st.st_size, st.st_mtime))
            return out

        return await asyncio.to_thread(scan)
    from backend.storage import S3Store

    if not isinstance(store, S3Store):
        return []
    out: list[ObjectInfo] = []
    async for page in store.iter_pages(prefix, delimiter="/"):
        for obj in page.get("Contents", []):
            out.append(ObjectInfo(store._rel(obj["Key"]), int(obj["Size"]), obj["LastModified"].timestamp(),
                                  obj.get("ETag", "").strip('"')))
    return out


async def run_markers(store: ObjectStore, prefix: str, root_files: dict[str, ObjectInfo] | None = None,
                      trainer_states: list[str] | None = None) -> RunMarkers:
    """Read the run-level commit files (each small and bounded)."""
    if root_files is None:
        root_files = {o.key.rsplit("/", 1)[-1]: o for o in await _root_files(store, prefix)}

    async def small_text(n: str) -> str | None:
        o = root_files.get(n)
        if o is None or o.size > 4096:
            return None
        return (await store.get_bytes(o.key)).decode("utf-8", "replace").strip() or None

    ds = await small_text(DEEPSPEED_LATEST)
    mg = await small_text(MEGATRON_LATEST)
    mg_num = int(mg) if mg and mg.isdigit() else None
    best = None
    for key in trainer_states or []:
        try:
            info = await store.stat(key)
            state = await _read_json(store, key, info.size if info else 0) if info else None
        except CheckpointError:
            continue
        b = state.get("best_model_checkpoint") if isinstance(state, dict) else None
        if isinstance(b, str) and b:
            best = b.rstrip("/").rsplit("/", 1)[-1]
            break
    return RunMarkers(deepspeed_latest=ds, megatron_latest=mg_num, megatron_release=mg == "release",
                      best_checkpoint=best)


async def list_checkpoints(store: ObjectStore, prefix: str = "") -> Catalog:
    """List and classify every step under ``prefix`` (concurrent, paginated)."""
    prefix = prefix.strip("/")
    root = getattr(store, "root", None)
    if isinstance(root, Path) and not (root / prefix).is_dir():
        if (root / prefix).is_file():
            raise StoreError(f"{root / prefix}: a file, not a run folder (give the folder that holds the steps)")
        # A typo in a local run folder must not look like an empty run ("0 steps, nothing to do").
        raise StoreError(f"{root / prefix}: no such directory (a run folder is s3://bucket/prefix, "
                         "a configured store name (store/run) or an existing local directory)")
    dirs = [d for d in await store.list_dirs(prefix) if not d.rsplit("/", 1)[-1].startswith(".")]
    files = await _root_files(store, prefix)
    root_by_name = {o.key.rsplit("/", 1)[-1]: o for o in files}
    file_steps = [o for n, o in root_by_name.items() if n.endswith(".ckpt") and step_number(n) is not None]
    sem = asyncio.Semaphore(LIST_CONCURRENCY)

    async def listing(d: str) -> tuple[str, list[ObjectInfo]]:
        async with sem:
            return d, await store.list(d)

    listed = [(d, objs) for d, objs in await asyncio.gather(*(listing(d) for d in dirs)) if objs]
    # The newest trainer_state.json carries the run's best_model_checkpoint.
    states = [(step_number(d.rsplit("/", 1)[-1]) or -1, join_key(d, TRAINER_STATE)) for d, objs in listed
              if any(o.key == join_key(d, TRAINER_STATE) for o in objs)]
    markers = await run_markers(store, prefix, root_by_name, [k for _, k in sorted(states, reverse=True)])

    async def one(d: str, objs: list[ObjectInfo]) -> CheckpointStep:
        async with sem:
            return await classify(store, d, objs, markers=markers)

    steps = list(await asyncio.gather(*(one(d, objs) for d, objs in listed),
                                      *(one(o.key, [o]) for o in file_steps)))
    if not dirs and not file_steps and prefix:
        # the prefix may itself be a step folder (e.g. ``ckpt list s3://b/run1/step-100``)
        objs = await store.list(prefix)
        if objs:
            steps.append(await step_catalog(store, prefix, objects=objs))
    return Catalog(url=store.url, prefix=prefix, steps=tuple(sorted(steps, key=_sort_key)))


async def step_catalog(store: ObjectStore, step_path: str, *, objects: list[ObjectInfo] | None = None
                       ) -> CheckpointStep:
    """Classify a single step folder (or a single ``.ckpt`` file), with its run's markers."""
    step_path = step_path.strip("/")
    parent = step_path.rsplit("/", 1)[0] if "/" in step_path else ""
    objs = objects if objects is not None else await store.list(step_path)
    if not objs:
        info = await store.stat(step_path)
        objs = [info] if info is not None else []
    states = [join_key(step_path, TRAINER_STATE)] if any(o.key == join_key(step_path, TRAINER_STATE)
                                                         for o in objs) else []
    markers = await run_markers(store, parent, None, states)
    return await classify(store, step_path, objs, markers=markers)


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
    files = {fresh.name: fresh.objects[0]} if fresh.is_file else _rel(fresh.objects, fresh.path)
    if METADATA_FILE in files:
        md = await asyncio.to_thread(load_metadata, await store.get_bytes(join_key(fresh.path, METADATA_FILE)),
                                     where=join_key(fresh.path, METADATA_FILE))

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
    torch_names = sorted(n for n in files if n.endswith(_TORCH_SUFFIXES) and files[n].size > 0)
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
        elif files[n].size == 0 and not n.endswith((".json", ".txt")):
            return f"{n}: empty file (0 bytes)"
    return "verified"
