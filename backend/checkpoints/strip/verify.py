"""Verifying a BF16 safetensors export: headers parse, offsets are sane, every tensor is BF16 (or
an integer type), the index covers every shard, the export is not empty; given the source's
digests, every tensor's bytes are read back, one at a time, and compared.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from backend.checkpoints.safetensors_check import SafetensorsError, read_header
from backend.checkpoints.steps import INDEX_FILE, MAX_INDEX_BYTES
from backend.checkpoints.strip.source import read_range
from backend.storage import ObjectStore, join_key


@dataclass(frozen=True)
class ExportCheck:
    """What verify_export found: ok, the shards, tensor count, bytes, and every problem."""

    ok: bool
    shards: tuple[str, ...]
    tensor_count: int
    total_bytes: int
    problems: tuple[str, ...] = ()
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


async def verify_export(
    store: ObjectStore,
    step_path: str,
    *,
    expected: dict[str, tuple[int, ...]] | None = None,
    digests: dict[str, str] | None = None,
) -> ExportCheck:
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
    listing = {o.key[len(step_path) + 1 if step_path else 0 :]: o for o in await store.list(step_path)}
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


async def _compare_digests(
    store: ObjectStore, step_path: str, listing: dict[str, Any], shards: tuple[str, ...], digests: dict[str, str]
) -> list[str]:
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
            data = await read_range(store, key, t.start, t.nbytes) if t.nbytes else b""
            got = hashlib.blake2b(data, digest_size=16).hexdigest()
            del data
            if got != want:
                problems.append(f"{shard}: {t.name} does not hold the source's values (checksum differs)")
                if len(problems) >= 5:
                    return problems
    missing = sorted(set(digests) - seen)
    if missing:
        problems.append(
            f"{len(missing)} source tensors were not found when reading the export back (e.g. {missing[0]})"
        )
    return problems
