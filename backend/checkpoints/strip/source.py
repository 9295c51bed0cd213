"""What a BF16 strip reads: the step it may read, and its model weights, streamed one tensor at a time.

Only one source tensor (its bytes, read as one ranged read) and its BF16 copy are in memory at a
time, in reusable buffers, so peak memory is bounded by the largest tensor, not by the model.
DCP steps are read record by record; torch.save files are memory-mapped and loaded with
``weights_only=True``. The digests here (blake2b of the BF16 bytes) are what an export's
verification compares against.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.checkpoints.catalog import list_checkpoints, step_catalog
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
from backend.checkpoints.safetensors_check import DTYPE_SIZES
from backend.checkpoints.steps import MODEL_FILES, TRAINING_STATE_FILES
from backend.storage import LocalStore, ObjectStore, join_key


@dataclass
class Weight:
    name: str
    shape: tuple[int, ...]
    out_dtype: str
    src_bytes: int
    load: Callable[[Buffers, int], Awaitable[Any]]  # (buffers, slot) -> contiguous CPU tensor, output dtype

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
    table = {
        torch.int64: "I64",
        torch.int32: "I32",
        torch.int16: "I16",
        torch.int8: "I8",
        torch.uint8: "U8",
        torch.bool: "BOOL",
    }
    if dtype not in table:
        raise CheckpointError(f"unsupported tensor dtype {dtype} in the model weights")
    return table[dtype]


def _cast(t: Any) -> Any:
    import torch

    out = t.to(torch.bfloat16) if t.is_floating_point() else t
    return out.contiguous()


class Buffers:
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


async def read_range(
    store: ObjectStore, key: str, offset: int, length: int, bufs: Buffers | None = None
) -> bytes | bytearray | memoryview:
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


async def _dcp_weights(store: ObjectStore, step_path: str, files: dict[str, Any], model_prefix: str) -> list[Weight]:
    import torch

    meta = files.get(METADATA_FILE)
    if meta is None:
        raise CheckpointError(f"{step_path}: DCP checkpoint has no .metadata (still being written?)")
    if meta.size > MAX_METADATA_BYTES:
        raise CheckpointError(f"{step_path}/.metadata is {meta.size} bytes, over the {MAX_METADATA_BYTES} limit")
    md = load_metadata(
        await store.get_bytes(join_key(step_path, METADATA_FILE)),
        where=f"{store.url}/{join_key(step_path, METADATA_FILE)}",
    )

    async def read(file: str, offset: int, n: int) -> bytes | bytearray | memoryview:
        return await read_range(store, join_key(step_path, file), offset, n)

    # safetensors-serialized DCP records the blob's start for every tensor: find the real ranges
    entries = await locate_chunks(tensor_entries(md), read, where=f"{store.url}/{step_path}")
    names = weight_names([e.fqn for e in entries], model_prefix)
    if not names:
        sample = ", ".join(e.fqn for e in entries[:3])
        raise CheckpointError(
            f"{step_path}: no model weights under prefix {model_prefix!r} (keys look like: "
            f"{sample}); pass --model-prefix"
        )
    out = []
    for e in sorted(
        (e for e in entries if e.fqn in names),
        key=lambda e: (e.chunks[0].file, e.chunks[0].offset) if e.chunks else ("", 0),
    ):
        for c in e.chunks:
            if c.transformed:
                raise CheckpointError(
                    f"{step_path}: tensor {e.fqn} is stored with a transform "
                    "(compression/encryption extension); not supported by strip"
                )
            if c.file not in files:
                raise CheckpointError(f"{step_path}: {c.file} (holding {e.fqn}) is missing")

        async def load(bufs: Buffers, slot: int, e: Any = e) -> Any:
            where = f"{step_path}:{e.fqn}"
            out_dtype = torch.bfloat16 if e.dtype.is_floating_point else e.dtype
            dst = bufs.out(slot, e.shape, out_dtype)
            for c in e.chunks:
                blob = await read_range(store, join_key(step_path, c.file), c.offset, c.length, bufs)
                idx = tuple(slice(o, o + s) for o, s in zip(c.offsets, c.sizes, strict=True))
                await asyncio.to_thread(_cast_chunk_into, dst, idx, blob, e.dtype, c.sizes, where, c.raw)
                del blob
            return dst

        out.append(Weight(names[e.fqn], e.shape, _st_dtype(e.dtype), sum(c.length for c in e.chunks), load))
    return out


def _cast_chunk_into(
    dst: Any, idx: tuple[slice, ...], blob: Any, dtype: Any, sizes: tuple[int, ...], where: str, raw: bool = False
) -> None:
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


def tensor_digest(t: Any) -> str:
    return hashlib.blake2b(_bytes_of(t), digest_size=16).hexdigest()


def write_tensor(f: Any, t: Any) -> str:
    """Write a tensor's bytes; returns their blake2b digest (what verification re-reads)."""
    view = _bytes_of(t)
    f.write(view)
    return hashlib.blake2b(view, digest_size=16).hexdigest()


async def source_weights(store: ObjectStore, step: Any, model_prefix: str, tmp: Path) -> list[Weight]:
    files = {o.key[len(step.path) + 1 :]: o for o in step.objects}
    if step.layout == "dcp":
        return await _dcp_weights(store, step.path, files, model_prefix)
    return await _torch_save_weights(store, step.path, files, model_prefix, step.layout, tmp)


async def source_digests(store: ObjectStore, step_path: str, *, model_prefix: str = "auto") -> dict[str, str]:
    """Tensor name -> blake2b of the BF16 bytes an export of this step must hold, computed by
    streaming the source one tensor at a time (the strip's memory bound); nothing is written."""
    step = await strippable_step(store, step_path.strip("/"))
    tmp = Path(tempfile.mkdtemp(prefix="lm-digest-"))
    try:
        bufs = Buffers()
        out = {}
        for w in await source_weights(store, step, model_prefix, tmp):
            t = await w.load(bufs, 0)
            out[w.name] = await asyncio.to_thread(tensor_digest, t)
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


async def _torch_save_weights(
    store: ObjectStore, step_path: str, files: dict[str, Any], model_prefix: str, layout: str, tmp: Path
) -> list[Weight]:
    import torch

    if layout == "deepspeed":
        cands = sorted(n for n in files if n.endswith("model_states.pt"))
    else:
        cands = sorted(n for n in files if MODEL_FILES.match(n))
        if not cands:  # one torch.save file holding {"model": ..., "optimizer": ..., "step": N}
            cands = [
                n for n in files if n.endswith((".pt", ".pth", ".bin", ".ckpt")) and not TRAINING_STATE_FILES.match(n)
            ]
    if len(cands) != 1:
        raise CheckpointError(
            f"{step_path}: expected one model file, found {cands or 'none'} "
            "(tensor-parallel shards are not merged by strip)"
        )
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
        raise CheckpointError(
            f"{store.url}/{key}: cannot be loaded with weights_only=True ({exc}); "
            "refusing to unpickle arbitrary objects"
        ) from None
    flat = _flatten(sd)
    if layout == "deepspeed":
        module = [t for k, t in flat.items() if k.startswith("module.")]
        if module and all(t.numel() == 0 for t in module):
            raise CheckpointError(
                f"{store.url}/{key}: a ZeRO-3 checkpoint: its model_states holds empty placeholders and the "
                "weights live only in the optimizer partitions; consolidate it first (DeepSpeed's "
                "zero_to_fp32.py) or keep it full. Nothing was written."
            )
    prefix = model_prefix
    if layout == "deepspeed" and model_prefix == "model" and not any(k.startswith("model.") for k in flat):
        prefix = "module"
    names = weight_names(list(flat), prefix)
    if not names:
        raise CheckpointError(f"{store.url}/{key}: no tensors under prefix {prefix!r}; pass --model-prefix")
    out = []
    for fqn, name in names.items():
        t = flat[fqn]

        async def load(bufs: Buffers, slot: int, t: Any = t) -> Any:
            return await asyncio.to_thread(_cast, t)

        out.append(Weight(name, tuple(t.shape), _st_dtype(t.dtype), t.numel() * t.element_size(), load))
    return out


async def explain_missing_step(store: ObjectStore, step_path: str) -> CheckpointError:
    """The error for a path that holds no step: a run folder (name its steps), or nothing."""
    where = f"{store.url}/{step_path}".rstrip("/")
    subdirs = await store.list_dirs(step_path)
    if subdirs:
        cat = await list_checkpoints(store, step_path)
        steps = [s for s in cat.steps if s.step is not None]
        if steps:
            names = ", ".join(s.name for s in steps[-3:])
            return CheckpointError(
                f"{where} is a run folder ({len(steps)} steps: ... {names}); give one step, "
                f"e.g. {where}/{steps[-1].name}"
            )
    return CheckpointError(f"{where}: no such checkpoint (nothing there: check the path)")


async def strippable_step(store: ObjectStore, step_path: str) -> Any:
    """The step at ``step_path`` if a strip may read it; a CheckpointError saying why not."""
    step = await step_catalog(store, step_path)
    where = f"{store.url}/{step_path}"
    if not step.objects or step.layout == "unknown" and (await store.list_dirs(step_path)):
        raise await explain_missing_step(store, step_path)
    if step.kind == "unknown" or step.layout == "unknown":
        raise CheckpointError(f"{where}: not a checkpoint strip can read ({step.note or step.layout}); not touching it")
    if step.kind == "corrupt":
        raise CheckpointError(f"{where}: corrupt ({step.note}); not touching it")
    if step.kind == "incomplete":
        raise CheckpointError(
            f"{where}: still being written ({step.note or step.layout}); wait for it to finish or pick another step"
        )
    if step.layout == "hf-safetensors":
        raise CheckpointError(f"{where}: already a safetensors export (weights only)")
    if "zero3-placeholders" in step.flags:
        raise CheckpointError(
            f"{where}: a ZeRO-3 checkpoint: its model_states holds empty placeholders and the "
            "weights live only in the optimizer partitions; consolidate it first (DeepSpeed's "
            "zero_to_fp32.py) or keep it full. Nothing was written."
        )
    if step.layout not in ("dcp", "torch-save", "deepspeed"):
        raise CheckpointError(
            f"{where}: strip reads DCP, DeepSpeed ZeRO-1/2 and torch.save checkpoints, not "
            f"{step.layout}; export its weights with the framework's own tool first"
        )
    return step
