"""Strip a full training checkpoint to its model weights as sharded BF16 safetensors.

Streams tensor by tensor (see :mod:`backend.checkpoints.strip.source`): peak memory is bounded by
the largest tensor, not by the model. The export (``model-0000i-of-0000N.safetensors`` +
``model.safetensors.index.json``) goes into the step folder itself by default, index last, so a
stripped milestone keeps its path and a reader never sees an index without its shards. The
result is verified (:mod:`backend.checkpoints.strip.verify`) before success. The node job that
runs a strip on a GPU node is :mod:`backend.checkpoints.strip.job`.
"""

from __future__ import annotations

import asyncio
import errno
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.checkpoints.dcp import CheckpointError
from backend.checkpoints.safetensors_check import build_header
from backend.checkpoints.steps import INDEX_FILE
from backend.checkpoints.strip.source import Buffers, Weight, source_weights, strippable_step, write_tensor
from backend.checkpoints.strip.verify import ExportCheck, verify_export
from backend.storage import LocalStore, ObjectStore, join_key
from backend.units import bytes_text

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
Progress = Callable[..., object]  # its return value is ignored


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
        d = {
            k: getattr(self, k)
            for k in (
                "source",
                "layout",
                "out_url",
                "out_prefix",
                "tensor_count",
                "weight_bytes",
                "source_bytes_read",
                "seconds",
            )
        }
        d["shards"] = list(self.shards)
        d["verified"] = self.check.ok
        return d


def plan_shards(weights: list[Weight], max_shard_bytes: int) -> list[list[Weight]]:
    """Greedy shards in source order, each <= max_shard_bytes (a bigger tensor gets its own)."""
    shards: list[list[Weight]] = []
    cur: list[Weight] = []
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
        raise CheckpointError(
            f"{out_store.url}/{join_key(out_prefix, INDEX_FILE)} already exists (the step already has an export)"
        )
    local_out = out_store if isinstance(out_store, LocalStore) else None
    local_dir = local_out.local_path(out_prefix) if local_out is not None else None
    tmp = Path(tempfile.mkdtemp(prefix="lm-strip-"))
    weights: list[Weight] = []
    try:
        weights = await source_weights(store, step, model_prefix, tmp)
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
        bufs = Buffers()
        slot = 0
        for name, shard in zip(names, shards, strict=True):
            header, _ = build_header([(w.name, w.out_dtype, w.shape) for w in shard], {"format": "pt"})
            # A local export is written beside its final name and renamed into place by the
            # folder the store's walk holds: a link planted in the output folder (at a shard's
            # name or on the way to it) is refused, never written through.
            part = tmp / name
            with (
                local_out.writing(join_key(out_prefix, name)) if local_out is not None else open(part, "wb")  # noqa: ASYNC230 - writes go through to_thread below
            ) as f:
                f.write(header)
                pending: asyncio.Future[Any] | None = None
                pending_name = ""
                try:
                    for w in shard:
                        if cancelled is not None and cancelled():
                            raise CheckpointError("strip cancelled")
                        t = await w.load(bufs, slot)
                        if tuple(t.shape) != w.shape:
                            raise CheckpointError(
                                f"{step_path}: {w.name} loaded as {tuple(t.shape)}, expected {w.shape}"
                            )
                        if pending is not None:
                            digests[pending_name] = await pending
                        # the write of this tensor overlaps the read and cast of the next one
                        pending = asyncio.ensure_future(asyncio.to_thread(write_tensor, f, t))
                        pending_name = w.name
                        slot ^= 1
                        src_read += w.src_bytes
                        done_bytes += w.out_bytes
                        done_items += 1
                        weight_map[w.name] = name
                        del t
                        if progress is not None:
                            progress(
                                bytes_done=done_bytes,
                                bytes_total=total_out,
                                items_done=done_items,
                                items_total=len(weights),
                                shard=name,
                                source_bytes_read=src_read,
                            )
                    if pending is not None:
                        digests[pending_name] = await pending
                        pending = None
                finally:
                    if pending is not None:
                        await asyncio.gather(pending, return_exceptions=True)
            if local_out is None:
                from backend.checkpoints.upload import upload_file

                await upload_file(out_store, part, join_key(out_prefix, name))
                part.unlink()
        index = {
            "metadata": {"total_size": total_out, "source": f"{store.url}/{step_path}", "source_layout": step.layout},
            "weight_map": dict(sorted(weight_map.items())),
        }
        # the index is the export's commit marker: written after every shard
        await out_store.put_bytes(join_key(out_prefix, INDEX_FILE), json.dumps(index, indent=2).encode())
    except BaseException as exc:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            where = local_dir if local_dir is not None else tmp
            need = bytes_text(sum(w.out_bytes for w in weights))
            raise CheckpointError(
                f"no space left on the device of {where}: the BF16 export needs {need}; free "
                "space there or give --out on another disk (nothing was deleted, the partial "
                "export was removed)"
            ) from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    zero = sorted(w.name for w in weights if w.out_bytes == 0 and w.src_bytes > 0)
    if zero or total_out == 0:
        raise CheckpointError(
            f"export at {out_store.url}/{out_prefix} holds no weights: "
            + (f"{len(zero)} zero-element tensors (e.g. {zero[0]})" if zero else "total_size 0")
            + " where the source has parameters"
        )
    check = await verify_export(out_store, out_prefix, expected={w.name: w.shape for w in weights}, digests=digests)
    if not check.ok:
        raise CheckpointError(
            f"export at {out_store.url}/{out_prefix} failed verification: " + "; ".join(check.problems[:5])
        )
    return StripResult(
        source=f"{store.url}/{step_path}",
        layout=step.layout,
        out_url=out_store.url,
        out_prefix=out_prefix,
        shards=tuple(names),
        tensor_count=len(weights),
        weight_bytes=total_out,
        source_bytes_read=src_read,
        seconds=time.monotonic() - t0,
        check=check,
    )
