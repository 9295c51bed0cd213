"""The checkpoint catalog: one row per step folder of a run prefix, in any configured store.

Listing is one paginated ``list_dirs`` of the run prefix, then each step folder listed
concurrently (bounded), never one request per object. Layouts recognised: DCP
(``.metadata`` + ``*.distcp``; complete only with ``.metadata``), HF safetensors, DeepSpeed
(``global_stepN`` with ``*model_states.pt``/``*optim_states.pt`` and the ``latest`` file) and
plain ``torch.save`` files. Anything else is listed as ``unknown`` and never touched.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from backend.checkpoints.dcp import (
    DISTCP_SUFFIX,
    MAX_METADATA_BYTES,
    METADATA_FILE,
    CheckpointError,
    load_metadata,
    storage_bytes_by_fqn,
    weight_names,
)
from backend.storage import ObjectInfo, ObjectStore, StoreError, join_key

Layout = Literal["dcp", "hf-safetensors", "deepspeed", "torch-save", "unknown"]
Kind = Literal["full", "weights", "incomplete", "unknown"]

INDEX_FILE = "model.safetensors.index.json"
MAX_INDEX_BYTES = 64 * 1024 * 1024
LIST_CONCURRENCY = 16

#: torch.save file names that are training state (what a strip frees), HF Trainer and plain.
TRAINING_STATE_FILES = re.compile(
    r"^(optimizer|optim|scheduler|lr_scheduler|rng_state(_\d+)?|scaler|trainer_state)\.(pt|pth|bin|json)$")
MODEL_FILES = re.compile(r"^(model|pytorch_model|consolidated(\.\d+)?)\.(pt|pth|bin)$")
_STEP_RE = re.compile(r"^[A-Za-z_\-.]*?(\d+)$")


@dataclass(frozen=True)
class CheckpointStep:
    """One step folder of a run: layout, completeness, sizes, and whether a BF16 export exists."""

    step: int | None
    path: str  # step dir relative to the store root, e.g. "run1/step-48000"
    layout: Layout
    kind: Kind
    total_bytes: int
    object_count: int
    mtime: float  # newest object
    has_bf16_export: bool  # model.safetensors.index.json + all its shards present in the step dir
    objects: tuple[ObjectInfo, ...]
    optimizer_bytes: int  # bytes that are optimizer/training state (what a strip frees)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def as_dict(self) -> dict[str, object]:
        """JSON-ready summary (without the object list)."""
        return {"step": self.step, "path": self.path, "layout": self.layout, "kind": self.kind,
                "total_bytes": self.total_bytes, "object_count": self.object_count, "mtime": self.mtime,
                "has_bf16_export": self.has_bf16_export, "optimizer_bytes": self.optimizer_bytes}


@dataclass(frozen=True)
class Catalog:
    """Every step folder under a run prefix, in numeric step order (unknown folders included)."""

    url: str
    prefix: str
    steps: tuple[CheckpointStep, ...]

    def bytes_by_kind(self) -> dict[str, int]:
        """Total bytes per kind (full / weights / incomplete / unknown)."""
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


def step_number(name: str) -> int | None:
    """The step number in a folder name (step-48000, global_step48000, checkpoint-500, 000123)."""
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def fmt_age(mtime: float, now: float | None = None) -> str:
    """How long ago ``mtime`` was, coarsely (``3d``, ``5h``, ``12m``, ``40s``); ``-`` when unknown."""
    if not mtime:
        return "-"
    s = max(0.0, (time.time() if now is None else now) - mtime)
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s / n:.0f}{unit}"
    return f"{s:.0f}s"


def _rel(objects: list[ObjectInfo], step_path: str) -> dict[str, ObjectInfo]:
    cut = len(step_path) + 1 if step_path else 0
    return {o.key[cut:]: o for o in objects}


async def _read_small(store: ObjectStore, key: str, size: int, cap: int) -> bytes | None:
    if size > cap:
        return None
    return await store.get_bytes(key)


async def export_present(store: ObjectStore, step_path: str, files: dict[str, ObjectInfo]) -> bool:
    """True when the step dir holds model.safetensors.index.json and every shard it names."""
    idx = files.get(INDEX_FILE)
    if idx is None:
        return False
    try:
        raw = await _read_small(store, join_key(step_path, INDEX_FILE), idx.size, MAX_INDEX_BYTES)
        data = json.loads(raw or b"")
        shards = set(data["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    return bool(shards) and all(isinstance(s, str) and s in files for s in shards)


async def classify(store: ObjectStore, step_path: str, objects: list[ObjectInfo], *,
                   latest_tag: str | None = None) -> CheckpointStep:
    """Classify one step folder from its object listing (reads only small manifests)."""
    files = _rel(objects, step_path)
    names = set(files)
    base = {n.rsplit("/", 1)[-1] for n in names}
    total = sum(o.size for o in objects)
    mtime = max((o.mtime for o in objects), default=0.0)
    has_export = await export_present(store, step_path, files)
    name = step_path.rsplit("/", 1)[-1]
    layout: Layout = "unknown"
    kind: Kind = "unknown"
    opt_bytes = 0

    if METADATA_FILE in names or any(n.endswith(DISTCP_SUFFIX) for n in names):
        layout = "dcp"
        if METADATA_FILE not in names:
            kind = "incomplete"  # .metadata is DCP's commit marker, written last
        else:
            kind, opt_bytes = await _dcp_kind(store, step_path, files)
    elif any(n.endswith("model_states.pt") for n in base) or any(n.endswith("optim_states.pt") for n in base):
        layout = "deepspeed"
        model = [o for n, o in files.items() if n.endswith("model_states.pt")]
        optim = [o for n, o in files.items() if n.endswith("optim_states.pt")]
        opt_bytes = sum(o.size for o in optim)
        num = step_number(name)
        latest_num = step_number(latest_tag) if latest_tag else None
        if not model or (latest_tag is not None and name != latest_tag and num is not None
                         and latest_num is not None and num > latest_num):
            kind = "incomplete"  # DeepSpeed writes `latest` only after every rank has saved
        else:
            kind = "full" if optim else "weights"
    elif INDEX_FILE in names or any(n.endswith(".safetensors") for n in names):
        layout = "hf-safetensors"
        state = [o for n, o in files.items() if TRAINING_STATE_FILES.match(n) and not n.startswith("trainer_state")]
        opt_bytes = sum(o.size for o in state)
        if INDEX_FILE in names and not has_export:
            kind = "incomplete"
        else:
            kind = "full" if any(n.startswith(("optimizer.", "optim.")) for n in names) else "weights"
    elif any(MODEL_FILES.match(n) for n in names) or any(TRAINING_STATE_FILES.match(n) for n in names):
        layout = "torch-save"
        state = [o for n, o in files.items() if TRAINING_STATE_FILES.match(n)]
        opt_bytes = sum(o.size for o in state)
        has_model = any(MODEL_FILES.match(n) for n in names)
        has_optim = any(n.startswith(("optimizer.", "optim.")) for n in names)
        kind = "incomplete" if not has_model else ("full" if has_optim else "weights")
    return CheckpointStep(step=step_number(name), path=step_path, layout=layout, kind=kind,
                          total_bytes=total, object_count=len(objects), mtime=mtime,
                          has_bf16_export=has_export, objects=tuple(objects), optimizer_bytes=opt_bytes)


async def _dcp_kind(store: ObjectStore, step_path: str, files: dict[str, ObjectInfo]) -> tuple[Kind, int]:
    meta = files[METADATA_FILE]
    raw = await _read_small(store, join_key(step_path, METADATA_FILE), meta.size, MAX_METADATA_BYTES)
    if raw is None:
        return "unknown", 0
    try:
        import torch  # noqa: F401 - DCP metadata classes live in torch
    except ImportError:
        # An operator laptop without torch: the pickle names optimizer keys in plain text.
        return ("full" if b"exp_avg" in raw or b"optim" in raw else "weights"), 0
    try:
        md = load_metadata(raw, where=join_key(step_path, METADATA_FILE))
    except CheckpointError:
        return "unknown", 0
    per = storage_bytes_by_fqn(md)
    weights = weight_names(list(md.state_dict_metadata), "model")
    training = {f: n for f, n in per.items() if f not in weights}
    has_tensor_state = any(f not in weights and hasattr(m, "chunks")
                           for f, m in md.state_dict_metadata.items())
    return ("full" if has_tensor_state else "weights"), sum(training.values())


def _sort_key(s: CheckpointStep) -> tuple[int, int, str]:
    return (0, s.step, s.path) if s.step is not None else (1, 0, s.path)


async def list_checkpoints(store: ObjectStore, prefix: str = "") -> Catalog:
    """List and classify every step folder under ``prefix`` (concurrent, paginated)."""
    prefix = prefix.strip("/")
    root = getattr(store, "root", None)
    if isinstance(root, Path) and not (root / prefix).is_dir():
        # A typo in a local run folder must not look like an empty run ("0 steps, nothing to do").
        raise StoreError(f"{root / prefix}: no such directory (a run folder is s3://bucket/prefix, "
                         "a configured store name (store/run) or an existing local directory)")
    dirs = await store.list_dirs(prefix)
    latest_tag = None
    latest = await store.stat(join_key(prefix, "latest"))
    if latest is not None and latest.size < 4096:
        latest_tag = (await store.get_bytes(latest.key)).decode("utf-8", "replace").strip() or None
    sem = asyncio.Semaphore(LIST_CONCURRENCY)

    async def one(d: str) -> CheckpointStep | None:
        async with sem:
            objs = await store.list(d)
            if not objs:
                # A folder with no objects is no checkpoint: some S3-compatible stores (SeaweedFS)
                # keep listing a prefix as a folder after every object under it was deleted.
                return None
            return await classify(store, d, objs, latest_tag=latest_tag)

    steps = [s for s in await asyncio.gather(*(one(d) for d in dirs)) if s is not None]
    if not dirs and prefix:
        # the prefix may itself be a step folder (e.g. ``ckpt list s3://b/run1/step-100``)
        objs = await store.list(prefix)
        if objs:
            steps.append(await classify(store, prefix, objs))
    return Catalog(url=store.url, prefix=prefix, steps=tuple(sorted(steps, key=_sort_key)))


async def step_catalog(store: ObjectStore, step_path: str) -> CheckpointStep:
    """Classify a single step folder."""
    step_path = step_path.strip("/")
    parent = step_path.rsplit("/", 1)[0] if "/" in step_path else ""
    latest = await store.stat(join_key(parent, "latest"))
    tag = None
    if latest is not None and latest.size < 4096:
        tag = (await store.get_bytes(latest.key)).decode("utf-8", "replace").strip() or None
    return await classify(store, step_path, await store.list(step_path), latest_tag=tag)
