"""Strip a full training checkpoint to its model weights as sharded BF16 safetensors.

Streams tensor by tensor: only one source tensor (its bytes, read as one ranged read) and its
BF16 copy are in memory at a time, so peak memory is bounded by the largest tensor, not by the
model. The export (``model-0000i-of-0000N.safetensors`` + ``model.safetensors.index.json``)
goes into the step folder itself by default, index last, so a stripped milestone keeps its path
and a reader never sees an index without its shards. The result is verified before success.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.agent.kinds import FunctionKind
from backend.checkpoints.catalog import step_catalog
from backend.checkpoints.dcp import (
    MAX_METADATA_BYTES,
    METADATA_FILE,
    CheckpointError,
    chunk_tensor,
    load_metadata,
    locate_chunks,
    tensor_entries,
    weight_names,
)
from backend.checkpoints.safetensors_check import (
    DTYPE_SIZES,
    SafetensorsError,
    build_header,
    read_header,
)
from backend.checkpoints.steps import INDEX_FILE, MAX_INDEX_BYTES, MODEL_FILES, TRAINING_STATE_FILES
from backend.storage import LocalStore, ObjectStore, join_key
from backend.units import bytes_text

if TYPE_CHECKING:
    from backend.jobs.manager import JobManager

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
Progress = Callable[..., object]  # its return value is ignored


@dataclass(frozen=True)
class ExportCheck:
    """What verify_export found: ok, the shards, tensor count, bytes, and every problem."""

    ok: bool
    shards: tuple[str, ...]
    tensor_count: int
    total_bytes: int
    problems: tuple[str, ...] = ()
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class StripResult:
    """A finished strip: where the export went, what it holds, and its verification."""

    source: str
    layout: str
    out_url: str
    out_prefix: str
    shards: tuple[str, ...]
    tensor_count: int
    weight_bytes: int  # BF16 bytes written
    source_bytes_read: int
    seconds: float
    check: ExportCheck

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        d = {k: getattr(self, k) for k in ("source", "layout", "out_url", "out_prefix", "tensor_count",
                                            "weight_bytes", "source_bytes_read", "seconds")}
        d["shards"] = list(self.shards)
        d["verified"] = self.check.ok
        return d


@dataclass
class _Weight:
    name: str
    shape: tuple[int, ...]
    out_dtype: str
    src_bytes: int
    load: Callable[[_Buffers, int], Awaitable[Any]]  # (buffers, slot) -> contiguous CPU tensor, output dtype

    @property
    def out_bytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * DTYPE_SIZES[self.out_dtype]


def _st_dtype(dtype: Any) -> str:
    import torch

    if dtype.is_floating_point:
        return "BF16"
    table = {torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
             torch.uint8: "U8", torch.bool: "BOOL"}
    if dtype not in table:
        raise CheckpointError(f"unsupported tensor dtype {dtype} in the model weights")
    return table[dtype]


def _cast(t: Any) -> Any:
    import torch

    out = t.to(torch.bfloat16) if t.is_floating_point() else t
    return out.contiguous()


class _Buffers:
    """Reusable buffers: one read buffer and two output slots, grown to the largest tensor.

    Reusing them avoids page-faulting fresh memory for every tensor; two output slots let the
    write of tensor i overlap the read and cast of tensor i+1 (peak ~ 1x FP32 + 2x BF16 of the
    largest tensor).
    """

    def __init__(self) -> None:
        self._read: Any = None
        self._out: list[Any] = [None, None]

    def read(self, n: int) -> memoryview:
        import torch

        if self._read is None or self._read.numel() < n:
            self._read = None
            self._read = torch.empty(max(n, 1), dtype=torch.uint8)
        return memoryview(self._read.numpy())[:n]

    def out(self, slot: int, shape: tuple[int, ...], dtype: Any) -> Any:
        import torch

        n = 1
        for s in shape:
            n *= s
        nbytes = max(n * dtype.itemsize, 1)
        buf = self._out[slot]
        if buf is None or buf.numel() < nbytes:
            self._out[slot] = None
            buf = self._out[slot] = torch.empty(nbytes, dtype=torch.uint8)
        return buf[: n * dtype.itemsize].view(dtype).view(shape)


async def _read_range(store: ObjectStore, key: str, offset: int, length: int,
                      bufs: _Buffers | None = None) -> bytes | bytearray | memoryview:
    if isinstance(store, LocalStore):
        path = store.local_path(key)

        def pread() -> bytearray | memoryview:
            view = bufs.read(length) if bufs is not None else memoryview(bytearray(length))
            fd = os.open(path, os.O_RDONLY)
            try:
                got = 0
                while got < length:
                    n = os.preadv(fd, [view[got:]], offset + got)
                    if n == 0:
                        raise CheckpointError(f"{path}: truncated (wanted {length} bytes at {offset})")
                    got += n
            finally:
                os.close(fd)
            return view

        return await asyncio.to_thread(pread)
    data = await store.get_range(key, offset, length)
    if len(data) != length:
        raise CheckpointError(f"{store.url}/{key}: truncated (wanted {length} bytes at {offset})")
    return data


# -- sources --------------------------------------------------------------------------------------

async def _dcp_weights(store: ObjectStore, step_path: str, files: dict[str, Any], model_prefix: str) -> list[_Weight]:
    import torch

    meta = files.get(METADATA_FILE)
    if meta is None:
        raise CheckpointError(f"{step_path}: DCP checkpoint has no .metadata (still being written?)")
    if meta.size > MAX_METADATA_BYTES:
        raise CheckpointError(f"{step_path}/.metadata is {meta.size} bytes, over the {MAX_METADATA_BYTES} limit")
    md = load_metadata(await store.get_bytes(join_key(step_path, METADATA_FILE)),
                       where=f"{store.url}/{join_key(step_path, METADATA_FILE)}")
    async def read(file: str, offset: int, n: int) -> bytes | bytearray | memoryview:
        return await _read_range(store, join_key(step_path, file), offset, n)

    # safetensors-serialized DCP records the blob's start for every tensor: find the real ranges
    entries = await locate_chunks(tensor_entries(md), read, where=f"{store.url}/{step_path}")
    names = weight_names([e.fqn for e in entries], model_prefix)
    if not names:
        sample = ", ".join(e.fqn for e in entries[:3])
        raise CheckpointError(f"{step_path}: no model weights under prefix {model_prefix!r} (keys look like: "
                              f"{sample}); pass --model-prefix")
    out = []
    for e in sorted((e for e in entries if e.fqn in names), key=lambda e: (e.chunks[0].file, e.chunks[0].offset)
                    if e.chunks else ("", 0)):
        for c in e.chunks:
            if c.transformed:
                raise CheckpointError(f"{step_path}: tensor {e.fqn} is stored with a transform "
                                      "(compression/encryption extension); not supported by strip")
            if c.file not in files:
                raise CheckpointError(f"{step_path}: {c.file} (holding {e.fqn}) is missing")

        async def load(bufs: _Buffers, slot: int, e: Any = e) -> Any:
            where = f"{step_path}:{e.fqn}"
            out_dtype = torch.bfloat16 if e.dtype.is_floating_point else e.dtype
            dst = bufs.out(slot, e.shape, out_dtype)
            for c in e.chunks:
                blob = await _read_range(store, join_key(step_path, c.file), c.offset, c.length, bufs)
                idx = tuple(slice(o, o + s) for o, s in zip(c.offsets, c.sizes, strict=True))
                await asyncio.to_thread(_cast_chunk_into, dst, idx, blob, e.dtype, c.sizes, where, c.raw)
                del blob
            return dst

        out.append(_Weight(names[e.fqn], e.shape, _st_dtype(e.dtype), sum(c.length for c in e.chunks), load))
    return out


def _cast_chunk_into(dst: Any, idx: tuple[slice, ...], blob: Any, dtype: Any, sizes: tuple[int, ...],
                     where: str, raw: bool = False) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # frombuffer on read-only bytes: we never write
        part = chunk_tensor(blob, dtype, sizes, where=where, raw=raw)
    if idx and all(sl.start == 0 and sl.stop == n for sl, n in zip(idx, dst.shape, strict=True)):
        dst.copy_(part)
    else:
        dst[idx].copy_(part)


def _bytes_of(t: Any) -> memoryview:
    import torch

    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def _digest_of(t: Any) -> str:
    return hashlib.blake2b(_bytes_of(t), digest_size=16).hexdigest()


def _write_tensor(f: Any, t: Any) -> str:
    """Write a tensor's bytes; returns their blake2b digest (what verification re-reads)."""
    view = _bytes_of(t)
    f.write(view)
    return hashlib.blake2b(view, digest_size=16).hexdigest()


async def _source_weights(store: ObjectStore, step: Any, model_prefix: str, tmp: Path) -> list[_Weight]:
    files = {o.key[len(step.path) + 1:]: o for o in step.objects}
    if step.layout == "dcp":
        return await _dcp_weights(store, step.path, files, model_prefix)
    return await _torch_save_weights(store, step.path, files, model_prefix, step.layout, tmp)


async def source_digests(store: ObjectStore, step_path: str, *, model_prefix: str = "auto") -> dict[str, str]:
    """Tensor name -> blake2b of the BF16 bytes an export of this step must hold, computed by
    streaming the source one tensor at a time (the strip's memory bound); nothing is written."""
    step = await strippable_step(store, step_path.strip("/"))
    tmp = Path(tempfile.mkdtemp(prefix="lm-digest-"))
    try:
        bufs = _Buffers()
        out = {}
        for w in await _source_weights(store, step, model_prefix, tmp):
            t = await w.load(bufs, 0)
            out[w.name] = await asyncio.to_thread(_digest_of, t)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    elif isinstance(obj, torch.Tensor):
        out[prefix[:-1]] = obj
    return out


async def _torch_save_weights(store: ObjectStore, step_path: str, files: dict[str, Any], model_prefix: str,
                              layout: str, tmp: Path) -> list[_Weight]:
    import torch

    if layout == "deepspeed":
        cands = sorted(n for n in files if n.endswith("model_states.pt"))
    else:
        cands = sorted(n for n in files if MODEL_FILES.match(n))
        if not cands:  # one torch.save file holding {"model": ..., "optimizer": ..., "step": N}
            cands = [n for n in files if n.endswith((".pt", ".pth", ".bin", ".ckpt"))
                     and not TRAINING_STATE_FILES.match(n)]
    if len(cands) != 1:
        raise CheckpointError(f"{step_path}: expected one model file, found {cands or 'none'} "
                              "(tensor-parallel shards are not merged by strip)")
    key = join_key(step_path, cands[0])
    if isinstance(store, LocalStore):
        path = store.local_path(key)
    else:
        from backend.checkpoints.upload import download_file

        path = tmp / cands[0]
        await download_file(store, key, path)
    try:
        # mmap: tensors stay on disk until each one is cast; weights_only: never run pickled code
        sd = await asyncio.to_thread(torch.load, str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"{store.url}/{key}: cannot be loaded with weights_only=True ({exc}); "
                              "refusing to unpickle arbitrary objects") from None
    flat = _flatten(sd)
    if layout == "deepspeed":
        module = [t for k, t in flat.items() if k.startswith("module.")]
        if module and all(t.numel() == 0 for t in module):
            raise CheckpointError(
                f"{store.url}/{key}: a ZeRO-3 checkpoint: its model_states holds empty placeholders and the "
                "weights live only in the optimizer partitions; consolidate it first (DeepSpeed's "
                "zero_to_fp32.py) or keep it full. Nothing was written.")
    prefix = model_prefix
    if layout == "deepspeed" and model_prefix == "model" and not any(k.startswith("model.") for k in flat):
        prefix = "module"
    names = weight_names(list(flat), prefix)
    if not names:
        raise CheckpointError(f"{store.url}/{key}: no tensors under prefix {prefix!r}; pass --model-prefix")
    out = []
    for fqn, name in names.items():
        t = flat[fqn]

        async def load(bufs: _Buffers, slot: int, t: Any = t) -> Any:
            return await asyncio.to_thread(_cast, t)

        out.append(_Weight(name, tuple(t.shape), _st_dtype(t.dtype), t.numel() * t.element_size(), load))
    return out


# -- writing --------------------------------------------------------------------------------------

def plan_shards(weights: list[_Weight], max_shard_bytes: int) -> list[list[_Weight]]:
    """Greedy shards in source order, each <= max_shard_bytes (a bigger tensor gets its own)."""
    shards: list[list[_Weight]] = []
    cur: list[_Weight] = []
    size = 0
    for w in weights:
        if cur and size + w.out_bytes > max_shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(w)
        size += w.out_bytes
    if cur:
        shards.append(cur)
    return shards


def shard_name(i: int, n: int) -> str:
    """HF-style shard file name: model-00001-of-00003.safetensors."""
    return f"model-{i:05d}-of-{n:05d}.safetensors"


async def explain_missing_step(store: ObjectStore, step_path: str) -> CheckpointError:
    """The error for a path that holds no step: a run folder (name its steps), or nothing."""
    from backend.checkpoints.catalog import list_checkpoints

    where = f"{store.url}/{step_path}".rstrip("/")
    subdirs = await store.list_dirs(step_path)
    if subdirs:
        cat = await list_checkpoints(store, step_path)
        steps = [s for s in cat.steps if s.step is not None]
        if steps:
            names = ", ".join(s.name for s in steps[-3:])
            return CheckpointError(f"{where} is a run folder ({len(steps)} steps: ... {names}); give one step, "
                                   f"e.g. {where}/{steps[-1].name}")
    return CheckpointError(f"{where}: no such checkpoint (nothing there: check the path)")


async def strippable_step(store: ObjectStore, step_path: str) -> Any:
    """The step at ``step_path`` if a strip may read it; a CheckpointError saying why not."""
    step = await step_catalog(store, step_path)
    where = f"{store.url}/{step_path}"
    if not step.objects or step.layout == "unknown" and (await store.list_dirs(step_path)):
        raise await explain_missing_step(store, step_path)
    if step.kind == "unknown" or step.layout == "unknown":
        raise CheckpointError(f"{where}: not a checkpoint strip can read ({step.note or step.layout}); "
                              "not touching it")
    if step.kind == "corrupt":
        raise CheckpointError(f"{where}: corrupt ({step.note}); not touching it")
    if step.kind == "incomplete":
        raise CheckpointError(f"{where}: still being written ({step.note or step.layout}); "
                              "wait for it to finish or pick another step")
    if step.layout == "hf-safetensors":
        raise CheckpointError(f"{where}: already a safetensors export (weights only)")
    if "zero3-placeholders" in step.flags:
        raise CheckpointError(f"{where}: a ZeRO-3 checkpoint: its model_states holds empty placeholders and the "
                              "weights live only in the optimizer partitions; consolidate it first (DeepSpeed's "
                              "zero_to_fp32.py) or keep it full. Nothing was written.")
    if step.layout not in ("dcp", "torch-save", "deepspeed"):
        raise CheckpointError(f"{where}: strip reads DCP, DeepSpeed ZeRO-1/2 and torch.save checkpoints, not "
                              f"{step.layout}; export its weights with the framework's own tool first")
    return step


async def strip_step(
    store: ObjectStore,
    step_path: str,
    *,
    out_store: ObjectStore | None = None,
    out_prefix: str | None = None,
    model_prefix: str = "auto",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: Progress | None = None,
    overwrite: bool = False,
    cancelled: Callable[[], bool] | None = None,
) -> StripResult:
    """Write the BF16 weights of a full checkpoint as sharded safetensors, then verify them."""
    t0 = time.monotonic()
    step_path = step_path.strip("/")
    out_store = out_store or store
    out_prefix = (step_path if out_prefix is None else out_prefix).strip("/")
    step = await strippable_step(store, step_path)
    if max_shard_bytes < 1:
        raise CheckpointError("max_shard_bytes must be positive")
    existing = await out_store.stat(join_key(out_prefix, INDEX_FILE))
    if existing is not None and not overwrite:
        raise CheckpointError(f"{out_store.url}/{join_key(out_prefix, INDEX_FILE)} already exists "
                              "(the step already has an export)")
    local_dir = out_store.local_path(out_prefix) if isinstance(out_store, LocalStore) else None
    tmp = Path(tempfile.mkdtemp(prefix="lm-strip-"))
    weights: list[_Weight] = []
    try:
        weights = await _source_weights(store, step, model_prefix, tmp)
        seen: set[str] = set()
        for w in weights:
            if w.name in seen:
                raise CheckpointError(f"{step_path}: two source tensors map to {w.name!r}")
            seen.add(w.name)
        shards = plan_shards(weights, max_shard_bytes)
        total_out = sum(w.out_bytes for w in weights)
        names = [shard_name(i + 1, len(shards)) for i in range(len(shards))]
        done_bytes = done_items = src_read = 0
        weight_map: dict[str, str] = {}
        digests: dict[str, str] = {}
        bufs = _Buffers()
        slot = 0
        for name, shard in zip(names, shards, strict=True):
            header, _ = build_header([(w.name, w.out_dtype, w.shape) for w in shard], {"format": "pt"})
            if local_dir is not None:
                local_dir.mkdir(parents=True, exist_ok=True)
                part = local_dir / (name + ".tmp-lm")
            else:
                part = tmp / name
            with open(part, "wb") as f:  # noqa: ASYNC230 - writes go through to_thread below
                f.write(header)
                pending: asyncio.Future[Any] | None = None
                pending_name = ""
                try:
                    for w in shard:
                        if cancelled is not None and cancelled():
                            raise CheckpointError("strip cancelled")
                        t = await w.load(bufs, slot)
                        if tuple(t.shape) != w.shape:
                            raise CheckpointError(f"{step_path}: {w.name} loaded as {tuple(t.shape)}, "
                                                  f"expected {w.shape}")
                        if pending is not None:
                            digests[pending_name] = await pending
                        # the write of this tensor overlaps the read and cast of the next one
                        pending = asyncio.ensure_future(asyncio.to_thread(_write_tensor, f, t))
                        pending_name = w.name
                        slot ^= 1
                        src_read += w.src_bytes
                        done_bytes += w.out_bytes
                        done_items += 1
                        weight_map[w.name] = name
                        del t
                        if progress is not None:
                            progress(bytes_done=done_bytes, bytes_total=total_out, items_done=done_items,
                                     items_total=len(weights), shard=name)
                    if pending is not None:
                        digests[pending_name] = await pending
                        pending = None
                finally:
                    if pending is not None:
                        await asyncio.gather(pending, return_exceptions=True)
            if local_dir is not None:
                os.replace(part, local_dir / name)
            else:
                from backend.checkpoints.upload import upload_file

                await upload_file(out_store, part, join_key(out_prefix, name))
                part.unlink()
        index = {"metadata": {"total_size": total_out, "source": f"{store.url}/{step_path}",
                              "source_layout": step.layout},
                 "weight_map": dict(sorted(weight_map.items()))}
        # the index is the export's commit marker: written after every shard
        await out_store.put_bytes(join_key(out_prefix, INDEX_FILE), json.dumps(index, indent=2).encode())
    except BaseException as exc:
        if local_dir is not None:
            for p in local_dir.glob("model-*.safetensors.tmp-lm"):
                p.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            where = local_dir if local_dir is not None else tmp
            need = bytes_text(sum(w.out_bytes for w in weights))
            raise CheckpointError(f"no space left on the device of {where}: the BF16 export needs {need}; free "
                                  "space there or give --out on another disk (nothing was deleted, the partial "
                                  "export was removed)") from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    zero = sorted(w.name for w in weights if w.out_bytes == 0 and w.src_bytes > 0)
    if zero or total_out == 0:
        raise CheckpointError(f"export at {out_store.url}/{out_prefix} holds no weights: "
                              + (f"{len(zero)} zero-element tensors (e.g. {zero[0]})" if zero else "total_size 0")
                              + " where the source has parameters")
    check = await verify_export(out_store, out_prefix, expected={w.name: w.shape for w in weights},
                                digests=digests)
    if not check.ok:
        raise CheckpointError(f"export at {out_store.url}/{out_prefix} failed verification: "
                              + "; ".join(check.problems[:5]))
    return StripResult(source=f"{store.url}/{step_path}", layout=step.layout, out_url=out_store.url,
                       out_prefix=out_prefix, shards=tuple(names), tensor_count=len(weights),
                       weight_bytes=total_out, source_bytes_read=src_read,
                       seconds=time.monotonic() - t0, check=check)


async def verify_export(store: ObjectStore, step_path: str, *,
                        expected: dict[str, tuple[int, ...]] | None = None,
                        digests: dict[str, str] | None = None) -> ExportCheck:
    """Check a safetensors export: headers parse, offsets sane, BF16, index covers every shard,
    no empty export; with ``digests`` (name -> blake2b of the BF16 bytes computed from the
    source), every tensor's bytes are read back, one tensor at a time, and compared."""
    step_path = step_path.strip("/")
    problems: list[str] = []
    idx_key = join_key(step_path, INDEX_FILE)
    info = await store.stat(idx_key)
    if info is None:
        return ExportCheck(False, (), 0, 0, (f"{idx_key}: missing",))
    if info.size > MAX_INDEX_BYTES:
        return ExportCheck(False, (), 0, 0, (f"{idx_key}: {info.size} bytes, over the index size limit",))
    try:
        index = json.loads(await store.get_bytes(idx_key))
        wmap = index["weight_map"]
        if not isinstance(wmap, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wmap.items()):
            raise TypeError("weight_map must map tensor names to shard file names")
    except (ValueError, KeyError, TypeError) as exc:
        return ExportCheck(False, (), 0, 0, (f"{idx_key}: malformed index ({exc})",))
    shards = tuple(sorted(set(wmap.values())))
    listing = {o.key[len(step_path) + 1 if step_path else 0:]: o for o in await store.list(step_path)}
    shapes: dict[str, tuple[int, ...]] = {}
    total = 0
    for shard in shards:
        if "/" in shard or shard.startswith("."):
            problems.append(f"index names an unsafe shard path {shard!r}")
            continue
        obj = listing.get(shard)
        if obj is None:
            problems.append(f"shard {shard} named by the index is missing")
            continue
        try:
            hdr = await read_header(store, join_key(step_path, shard), obj.size)
        except SafetensorsError as exc:
            problems.append(str(exc))
            continue
        for t in hdr.tensors:
            if t.name in shapes:
                problems.append(f"tensor {t.name} appears in more than one shard")
            shapes[t.name] = t.shape
            total += t.nbytes
            if wmap.get(t.name) != shard:
                problems.append(f"tensor {t.name} is in {shard} but the index says {wmap.get(t.name)!r}")
            if t.dtype not in ("BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"):
                problems.append(f"tensor {t.name} is {t.dtype}, not BF16")
    for name, shard in wmap.items():
        if name not in shapes and shard in listing:
            problems.append(f"index maps {name} to {shard} but that shard does not hold it")
    declared = index.get("metadata", {}).get("total_size") if isinstance(index.get("metadata"), dict) else None
    if declared is not None and declared != total and not problems:
        problems.append(f"index total_size {declared} != {total} bytes in the shards")
    if not problems and total == 0:
        problems.append("the export holds no tensor bytes (total_size 0)")
    if expected is not None:
        empty = sorted(n for n, shp in shapes.items() if 0 in shp and n in expected and 0 not in expected[n])
        if empty:
            problems.append(f"{len(empty)} tensors are empty in the export but not in the source (e.g. {empty[0]})")
    if digests is not None and not problems:
        problems.extend(await _compare_digests(store, step_path, listing, shards, digests))
    if expected is not None:
        missing = sorted(set(expected) - set(shapes))
        extra = sorted(set(shapes) - set(expected))
        if missing:
            problems.append(f"{len(missing)} source tensors missing from the export (e.g. {missing[0]})")
        if extra:
            problems.append(f"{len(extra)} tensors in the export are not in the source (e.g. {extra[0]})")
        for name, shape in expected.items():
            if name in shapes and tuple(shapes[name]) != tuple(shape):
                problems.append(f"{name}: shape {shapes[name]} != source {tuple(shape)}")
    return ExportCheck(not problems, shards, len(shapes), total, tuple(problems), shapes)


async def _compare_digests(store: ObjectStore, step_path: str, listing: dict[str, Any], shards: tuple[str, ...],
                           digests: dict[str, str]) -> list[str]:
    """Re-read every exported tensor (one at a time) and compare it with the source's digest."""
    problems: list[str] = []
    seen: set[str] = set()
    for shard in shards:
        key = join_key(step_path, shard)
        hdr = await read_header(store, key, listing[shard].size)
        for t in hdr.tensors:
            seen.add(t.name)
            want = digests.get(t.name)
            if want is None:
                continue
            data = await _read_range(store, key, t.start, t.nbytes) if t.nbytes else b""
            got = hashlib.blake2b(data, digest_size=16).hexdigest()
            del data
            if got != want:
                problems.append(f"{shard}: {t.name} does not hold the source's values (checksum differs)")
                if len(problems) >= 5:
                    return problems
    missing = sorted(set(digests) - seen)
    if missing:
        problems.append(f"{len(missing)} source tensors were not found when reading the export back (e.g. {missing[0]})")
    return problems


def strip_params(store: ObjectStore, step_path: str, *, out_store: ObjectStore | None = None,
                 out_prefix: str | None = None, model_prefix: str = "auto",
                 max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> dict[str, Any]:
    """The params of a "strip" job (what ``services.jobs.launch`` sends to the node)."""
    from backend.checkpoints.upload import store_params, url_join

    dest = out_store or store
    return {"src": url_join(store.url, step_path), "dest": url_join(dest.url, out_prefix or step_path),
            "src_store": store_params(store), "out_store": store_params(out_store) if out_store else None,
            "step_path": step_path, "out_prefix": out_prefix, "model_prefix": model_prefix,
            "max_shard_bytes": max_shard_bytes}


async def launch_strip(jobs: JobManager, node: str, store: ObjectStore, step_path: str, *,
                       out_store: ObjectStore | None = None, out_prefix: str | None = None,
                       model_prefix: str = "auto", max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> Any:
    """Launch a "strip" job of ``step_path`` in ``store`` on ``node``; returns its job record."""
    from backend.checkpoints.upload import store_secrets

    params = strip_params(store, step_path, out_store=out_store, out_prefix=out_prefix,
                          model_prefix=model_prefix, max_shard_bytes=max_shard_bytes)
    secrets = await store_secrets(store)
    if out_store is not None:
        secrets.update(await store_secrets(out_store))
    return await jobs.launch(node, "strip", params, secrets=secrets, label=f"strip {step_path}")


def cleanup(ctx: Any) -> None:
    """Remove partial shards a cancelled strip left in a local output directory."""
    p = ctx.params
    target = p.get("out_store") or p.get("src_store") or {}
    url = target.get("url", "")
    if url and not url.startswith("s3://"):
        d = Path(os.path.expanduser(url)) / (p.get("out_prefix") or p.get("step_path") or "")
        for part in d.glob("model-*.safetensors.tmp-lm"):
            part.unlink(missing_ok=True)


def run_strip_job(ctx: Any) -> dict[str, Any]:
    """Durable-job runner for kind "strip" (params from :func:`strip_params`)."""
    from backend.checkpoints.upload import open_store_params

    p = ctx.params
    env = ctx.secret_env()

    async def main() -> dict[str, Any]:
        src = open_store_params(p["src_store"], env)
        out = open_store_params(p["out_store"], env) if p.get("out_store") else None
        try:
            res = await strip_step(
                src, p["step_path"], out_store=out, out_prefix=p.get("out_prefix"),
                model_prefix=p.get("model_prefix", "auto"),
                max_shard_bytes=int(p.get("max_shard_bytes", DEFAULT_MAX_SHARD_BYTES)),
                progress=lambda **kw: ctx.progress(**kw), cancelled=lambda: ctx.cancelled,
                overwrite=bool(p.get("overwrite", False)))
        finally:
            await src.close()
            if out is not None:
                await out.close()
        ctx.log(f"stripped {res.source}: {res.tensor_count} tensors, {res.weight_bytes} bytes in "
                f"{len(res.shards)} shards, verified")
        return res.as_dict()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return asyncio.run(main())


#: Kind "strip" in the job registry (backend.agent.kinds).
JOB_KIND = FunctionKind("strip", run_strip_job, cleanup)
