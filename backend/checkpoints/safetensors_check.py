"""A bounded safetensors header parser that does not trust its input.

Format: 8-byte little-endian header length N, N bytes of JSON ``{name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {str: str}}``, then the data buffer. We cap N,
read only the header (a ranged read on object stores), and check every offset against the file
size before anyone maps the data, so a hostile or truncated file fails with a clear error
instead of exhausting memory.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.checkpoints.dcp import CheckpointError
from backend.storage import ObjectStore

MAX_HEADER_BYTES = 100 * 1024 * 1024

DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}


class SafetensorsError(CheckpointError):
    """A safetensors file is malformed (bad header, offsets out of bounds, truncated)."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors file; ``start``/``end`` are absolute byte offsets in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SafetensorsHeader:
    """A parsed, validated safetensors header."""

    header_len: int
    file_size: int
    metadata: dict[str, str]
    tensors: tuple[TensorInfo, ...]

    def by_name(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise SafetensorsError(f"duplicate key {k!r} in header")
        out[k] = v
    return out


def header_length(first8: bytes, file_size: int, *, where: str, cap: int = MAX_HEADER_BYTES) -> int:
    """Validate the 8-byte length prefix against the cap and the file size."""
    if len(first8) < 8 or file_size < 8:
        raise SafetensorsError(f"{where}: truncated: {file_size} bytes is too short for a safetensors file")
    (n,) = struct.unpack("<Q", first8[:8])
    if n > cap:
        raise SafetensorsError(f"{where}: header length {n} exceeds the {cap}-byte limit (corrupt or hostile file)")
    if n < 2 or 8 + n > file_size:
        raise SafetensorsError(f"{where}: header length {n} does not fit in a {file_size}-byte file (truncated?)")
    return n


def parse_header(header: bytes, file_size: int, *, where: str) -> SafetensorsHeader:
    """Parse and validate header JSON bytes (everything after the 8-byte prefix)."""
    n = len(header)
    try:
        doc = json.loads(header.decode("utf-8").rstrip(" \x00"), object_pairs_hook=_no_duplicates)
    except SafetensorsError as exc:
        raise SafetensorsError(f"{where}: {exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise SafetensorsError(f"{where}: header is not valid JSON ({exc})") from None
    except RecursionError:
        raise SafetensorsError(f"{where}: header nests too deeply (corrupt or hostile file)") from None
    if not isinstance(doc, dict):
        raise SafetensorsError(f"{where}: header is not a JSON object")
    meta = doc.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise SafetensorsError(f"{where}: __metadata__ must map strings to strings")
    data_len = file_size - 8 - n
    tensors = []
    for name, spec in doc.items():
        if not isinstance(spec, dict):
            raise SafetensorsError(f"{where}: entry {name!r} is not an object")
        dtype, shape, offs = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        if dtype not in DTYPE_SIZES:
            raise SafetensorsError(f"{where}: tensor {name!r} has unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
            raise SafetensorsError(f"{where}: tensor {name!r} has an invalid shape {shape!r}")
        if (
            not isinstance(offs, list)
            or len(offs) != 2
            or not all(type(o) is int for o in offs)
            or not 0 <= offs[0] <= offs[1]
        ):
            raise SafetensorsError(f"{where}: tensor {name!r} has invalid data_offsets {offs!r}")
        if offs[1] > data_len:
            raise SafetensorsError(
                f"{where}: tensor {name!r} ends at byte {offs[1]} of a {data_len}-byte "
                "data section (file truncated or offsets corrupt)"
            )
        numel = 1
        for s in shape:
            numel *= s
        if numel * DTYPE_SIZES[dtype] != offs[1] - offs[0]:
            raise SafetensorsError(
                f"{where}: tensor {name!r}: {dtype}{shape} needs {numel * DTYPE_SIZES[dtype]} "
                f"bytes but data_offsets span {offs[1] - offs[0]}"
            )
        tensors.append(TensorInfo(name, dtype, tuple(shape), 8 + n + offs[0], 8 + n + offs[1]))
    tensors.sort(key=lambda t: (t.start, t.end))
    pos = 8 + n
    for t in tensors:
        if t.start < pos:
            raise SafetensorsError(f"{where}: tensor {t.name!r} overlaps the previous tensor")
        pos = max(pos, t.end)
    if pos != file_size:
        raise SafetensorsError(f"{where}: data section ends at byte {pos} but the file has {file_size} bytes")
    return SafetensorsHeader(n, file_size, dict(meta), tuple(tensors))


def read_header_file(path: str | Path) -> SafetensorsHeader:
    """Read and validate the header of a local safetensors file (reads only the header)."""
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as f:
        n = header_length(f.read(8), size, where=str(p))
        return parse_header(f.read(n), size, where=str(p))


async def read_header(store: ObjectStore, key: str, size: int | None = None) -> SafetensorsHeader:
    """Read and validate the header of a safetensors object with two ranged reads."""
    where = f"{store.url}/{key}"
    if size is None:
        info = await store.stat(key)
        if info is None:
            raise SafetensorsError(f"{where}: no such object")
        size = info.size
    n = header_length(await store.get_range(key, 0, 8) if size >= 8 else b"", size, where=where)
    return parse_header(await store.get_range(key, 8, n), size, where=where)


def build_header(
    entries: list[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str] | None = None
) -> tuple[bytes, list[tuple[int, int]]]:
    """Header bytes (length prefix + JSON padded to 8 bytes) and each tensor's data range."""
    doc: dict[str, Any] = {}
    if metadata:
        doc["__metadata__"] = metadata
    ranges = []
    pos = 0
    for name, dtype, shape in entries:
        numel = 1
        for s in shape:
            numel *= s
        end = pos + numel * DTYPE_SIZES[dtype]
        doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, end]}
        ranges.append((pos, end))
        pos = end
    raw = json.dumps(doc, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as the reference writer does
    return struct.pack("<Q", len(raw)) + raw, ranges
