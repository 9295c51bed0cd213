"""Reading torch.distributed.checkpoint (DCP) directories without trusting them.

``.metadata`` is a pickle; we unpickle it with an allow-list of DCP/torch classes so a hostile
object store cannot run code in the console. Tensor payloads in ``*.distcp`` are ``torch.save``
blobs (or raw bytes for the safetensors serialization format); we read only the byte range of
one tensor chunk at a time and rebuild it without copying, so memory stays bounded by the
largest tensor, not by the checkpoint.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import struct
import threading
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from backend.errors import LoadmasterError

METADATA_FILE = ".metadata"
DISTCP_SUFFIX = ".distcp"
MAX_METADATA_BYTES = 512 * 1024 * 1024  # a 405B model's .metadata is tens of MB

#: Top-level keys that hold training state rather than model weights (torchtitan's flat layout
#: and the common ``{"model": ..., "optim": ...}`` layout).
NON_WEIGHT_ROOTS = frozenset(
    {
        "optim",
        "optimizer",
        "optimizers",
        "optimizer_state",
        "lr_scheduler",
        "lr_schedulers",
        "scheduler",
        "schedulers",
        "dataloader",
        "data_loader",
        "train_state",
        "rng",
        "rng_state",
        "rng_states",
        "scaler",
        "grad_scaler",
        "extra_state",
        "trainer",
    }
)


class CheckpointError(LoadmasterError):
    """A checkpoint is malformed, incomplete or in a layout this operation cannot handle."""


#: The exact (module, name) pairs a DCP ``.metadata`` pickle may name (torch 2.4 .. 2.13). No
#: whole modules: pickle's own ``find_class`` follows dotted names (``metadata.os.system`` under
#: protocol 4), so every name is looked up here, undotted, in an explicit table.
_ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        *(
            ("torch.distributed.checkpoint.metadata", n)
            for n in (
                "Metadata",
                "MetadataIndex",
                "ChunkStorageMetadata",
                "TensorStorageMetadata",
                "BytesStorageMetadata",
                "TensorProperties",
                "StorageMeta",
                "_MEM_FORMAT_ENCODING",
            )
        ),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.distributed.checkpoint.planner", "WriteItemType"),
        ("torch.distributed.checkpoint.planner", "LoadItemType"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PureWindowsPath"),
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "slice"),
        ("builtins", "complex"),
    }
)


def _allowed_global(module: str, name: str) -> Any:
    """The object for an allowed (module, name) pair; None for anything else."""
    import importlib

    import torch

    if "." in name or name.startswith("__"):
        return None
    if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
        return getattr(torch, name)
    if (module, name) not in _ALLOWED_GLOBALS:
        return None
    obj = getattr(importlib.import_module(module), name, None)
    return obj if isinstance(obj, type) or callable(obj) else None


class _SafeMetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        obj = _allowed_global(module, name)
        if obj is None:
            raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name} (not a DCP metadata class)")
        return obj


class _NeedsTorch(Exception):
    """The pickle names a torch object the light reader does not know (an unusual dtype)."""


class _Record:
    """Stand-in for one of DCP's metadata dataclasses: its fields as attributes."""

    _FIELDS: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__.update(zip(self._FIELDS, args, strict=False), **kwargs)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and (state[0] is None or isinstance(state[0], dict)):
            for part in state:  # (dict, slots)
                self.__dict__.update(part or {})
        elif isinstance(state, tuple) and self._FIELDS:  # TensorProperties' own __getstate__
            self.__dict__.update(zip(self._FIELDS, state, strict=False))
        elif isinstance(state, dict):
            self.__dict__.update(state)
        else:
            raise pickle.UnpicklingError(f"unexpected state for {type(self).__name__}")


class _MetadataIndex(_Record):
    """Equal and hashed by name and offset, as torch's (the index is a search hint)."""

    def _key(self) -> tuple[Any, Any]:
        return self.__dict__.get("fqn"), self.__dict__.get("offset")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _MetadataIndex) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


class _TensorProperties(_Record):
    _FIELDS = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory")


class _DType:
    """A torch dtype named in a pickle, without torch: its name and element size."""

    def __init__(self, name: str, itemsize: int) -> None:
        self.name, self.itemsize = name, itemsize
        self.is_floating_point = name.startswith(("float", "bfloat", "half", "double"))

    def __repr__(self) -> str:
        return f"torch.{self.name}"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _DType) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)


class _Size(tuple):  # type: ignore[type-arg]
    """torch.Size without torch: a tuple of ints."""


def _light_class(module: str, name: str) -> Any:
    """The stand-in for an allowed torch (module, name), or the stdlib object; None otherwise."""
    from backend.checkpoints.torchfile import _DTYPE_SIZES

    if module == "torch" and name in _DTYPE_SIZES:
        return _DType(name, _DTYPE_SIZES[name])
    if (module, name) not in _ALLOWED_GLOBALS:
        if module == "torch" and name.isidentifier() and not name.startswith("_"):
            raise _NeedsTorch(f"{module}.{name}")  # maybe a dtype this table does not know
        return None
    if module == "torch" and name == "Size":
        return _Size
    if name == "MetadataIndex":
        return _MetadataIndex
    if name == "TensorProperties":
        return _TensorProperties
    if module == "torch.serialization":  # _get_layout("torch.strided"): the layout's name
        return str
    if name in ("_MEM_FORMAT_ENCODING", "WriteItemType", "LoadItemType"):
        return lambda value: value  # an enum member: its value
    if module.startswith("torch."):
        return type(name, (_Record,), {})
    import importlib

    obj = getattr(importlib.import_module(module), name, None)
    return obj if isinstance(obj, type) or callable(obj) else None


class _LightMetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if "." in name or name.startswith("__"):
            obj = None
        else:
            obj = _light_class(module, name)
        if obj is None:
            raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name} (not a DCP metadata class)")
        return obj


def load_metadata(raw: bytes, *, where: str = ".metadata", light: bool = False) -> Any:
    """Parse a DCP ``.metadata`` pickle with an allow-list of classes (never arbitrary code).

    ``light``: without importing torch (seconds on a cold start): torch's classes are read into
    plain stand-ins holding the same fields (dtypes carry their name and size), enough to list,
    classify and prove a step; a pickle naming a torch object the stand-ins do not know is read
    with torch after all. Whoever builds tensors (a strip) reads with torch (the default).
    """
    if light:
        try:
            if isinstance(raw, bytes) and len(raw) <= LIGHT_CACHE_MAX_BYTES:
                return _checked(lambda: _light_load(raw), where)
            return _checked(_LightMetadataUnpickler(io.BytesIO(raw)).load, where)
        except _NeedsTorch:
            pass
    return _checked(_SafeMetadataUnpickler(io.BytesIO(raw)).load, where)


#: Light reads are remembered by the bytes read (up to this size): a listing, the plan's deep
#: check, apply's fresh listing and its re-checks each read the same ``.metadata`` again. The
#: bytes are always read afresh; what is remembered is only what those exact bytes parse to, keyed
#: by their BLAKE2b digest (the bytes themselves are not kept: 128 of 1 MiB would hold 128 MiB).
LIGHT_CACHE_MAX_BYTES = 1 << 20
LIGHT_CACHE_ENTRIES = 128
_light_parsed: OrderedDict[bytes, Any] = OrderedDict()
_light_lock = threading.Lock()


def _light_load(raw: bytes) -> Any:
    """The light parse of ``raw``, remembered (failures are not remembered: they raise every time)."""
    key = hashlib.blake2b(raw, digest_size=32).digest()
    with _light_lock:
        if key in _light_parsed:
            _light_parsed.move_to_end(key)
            return _light_parsed[key]
    parsed = _LightMetadataUnpickler(io.BytesIO(raw)).load()
    with _light_lock:
        _light_parsed[key] = parsed
        while len(_light_parsed) > LIGHT_CACHE_ENTRIES:
            _light_parsed.popitem(last=False)
    return parsed


def _checked(load: Any, where: str) -> Any:
    """The metadata ``load()`` returns, its tables and storage ranges checked."""
    try:
        md = load()
    except _NeedsTorch:
        raise
    except RecursionError:
        raise CheckpointError(f"{where}: not a readable DCP metadata file (nested too deeply)") from None
    except Exception as exc:  # noqa: BLE001 - any parse failure is the same operator problem
        raise CheckpointError(f"{where}: not a readable DCP metadata file ({exc})") from None
    if not hasattr(md, "state_dict_metadata") or not hasattr(md, "storage_data"):
        raise CheckpointError(f"{where}: not a DCP Metadata object")
    if not isinstance(md.state_dict_metadata, dict) or not isinstance(md.storage_data, dict):
        raise CheckpointError(f"{where}: not a DCP Metadata object (malformed tables)")
    for info in md.storage_data.values():
        rel = getattr(info, "relative_path", None)
        off, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not isinstance(rel, str) or not rel or "/" in rel or "\\" in rel or rel.startswith("."):
            raise CheckpointError(f"{where}: names an unsafe or malformed storage file {rel!r}")
        if not isinstance(off, int) or not isinstance(length, int) or off < 0 or length < 0:
            raise CheckpointError(f"{where}: a storage range of {rel} is malformed ({off!r}, {length!r})")
    return md


def files_needed(md: Any) -> dict[str, int]:
    """Each storage file a DCP checkpoint names, with the smallest size that holds its ranges."""
    out: dict[str, int] = {}
    for info in md.storage_data.values():
        end = int(info.offset) + int(info.length)
        out[str(info.relative_path)] = max(out.get(str(info.relative_path), 0), end)
    return out


@dataclass(frozen=True)
class ChunkRef:
    """Where one chunk of a tensor lives: file, byte range, and its place in the full tensor."""

    file: str
    offset: int
    length: int
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    transformed: bool
    raw: bool = False  # the range holds the bare tensor bytes (safetensors serialization)


@dataclass(frozen=True)
class TensorEntry:
    """A tensor in a DCP checkpoint: fully-qualified name, dtype, shape, chunks."""

    fqn: str
    dtype: Any
    shape: tuple[int, ...]
    chunks: tuple[ChunkRef, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * self.dtype.itemsize


def tensor_entries(md: Any) -> list[TensorEntry]:
    """Every tensor of a DCP checkpoint with the byte ranges of its chunks."""
    by_fqn: dict[str, list[tuple[Any, Any]]] = {}
    for index, info in md.storage_data.items():
        by_fqn.setdefault(index.fqn, []).append((index, info))
    out = []
    for fqn, meta in md.state_dict_metadata.items():
        if not hasattr(meta, "chunks"):
            continue  # BytesStorageMetadata: pickled Python objects (lr, step counters)
        infos = {tuple(ix.offset or ()): info for ix, info in by_fqn.get(fqn, [])}
        chunks = []
        for ch in meta.chunks:
            info = infos.get(tuple(ch.offsets)) or (infos.get(()) if len(meta.chunks) == 1 else None)
            if info is None:
                raise CheckpointError(f"DCP metadata has no storage for {fqn} chunk at {tuple(ch.offsets)}")
            chunks.append(
                ChunkRef(
                    str(info.relative_path),
                    int(info.offset),
                    int(info.length),
                    tuple(int(x) for x in ch.offsets),
                    tuple(int(x) for x in ch.sizes),
                    bool(getattr(info, "transform_descriptors", None)),
                )
            )
        out.append(TensorEntry(fqn, meta.properties.dtype, tuple(int(x) for x in meta.size), tuple(chunks)))
    return out


#: torch's DCP safetensors serialization writes this key into the embedded header's metadata.
_DCP_SHARDING_KEY = "DCP_SHARDING_INFO"
MAX_EMBEDDED_HEADER = 100 * 1024 * 1024  # the safetensors reference implementation's header cap


async def locate_chunks(entries: list[TensorEntry], read: Any, *, where: str) -> list[TensorEntry]:
    """The same entries with every chunk pointing at its tensor's real bytes.

    ``FileSystemWriter(serialization_format=SAFETENSORS)`` records, for every tensor of a file,
    the offset where the file's safetensors blob *starts* (all tensors share it) and the tensor's
    length; the tensor itself sits where that blob's own header says. Each such file's header is
    read (bounded) and the ranges rewritten; a torch.save record (a zip, ``PK``) is left as it is.
    ``read(file, offset, n)`` returns bytes.
    """
    import json
    import struct as _struct

    by_file: dict[str, int] = {}
    for e in entries:
        for c in e.chunks:
            by_file.setdefault(c.file, c.offset)
    headers: dict[str, tuple[int, dict[str, Any]]] = {}
    for file, off in by_file.items():
        probe = bytes(await read(file, off, 9))
        if probe[:2] == b"PK" or len(probe) < 9:
            continue
        (n,) = _struct.unpack("<Q", probe[:8])
        if probe[8:9] != b"{" or n > MAX_EMBEDDED_HEADER:
            raise CheckpointError(
                f"{where}: {file} holds neither torch.save records nor a safetensors blob at offset {off}"
            )
        try:
            hdr = json.loads(bytes(await read(file, off + 8, n)))
        except (ValueError, RecursionError):
            raise CheckpointError(f"{where}: {file}: the embedded safetensors header is not valid JSON") from None
        meta = hdr.get("__metadata__") if isinstance(hdr, dict) else None
        if not isinstance(meta, dict) or _DCP_SHARDING_KEY not in meta:
            raise CheckpointError(f"{where}: {file}: an embedded safetensors blob without DCP sharding info")
        headers[file] = (off + 8 + n, hdr)
    if not headers:
        return entries
    out = []
    for e in entries:
        chunks = []
        for c in e.chunks:
            if c.file not in headers:
                chunks.append(c)
                continue
            base, hdr = headers[c.file]
            t = hdr.get(e.fqn)
            offs = t.get("data_offsets") if isinstance(t, dict) else None
            if not (
                isinstance(t, dict)
                and isinstance(offs, list)
                and len(offs) == 2
                and all(isinstance(x, int) for x in offs)
                and 0 <= offs[0] <= offs[1]
            ):
                raise CheckpointError(f"{where}: {c.file}: no tensor {e.fqn} in its safetensors header")
            if tuple(t.get("shape", ())) != c.sizes:
                raise CheckpointError(
                    f"{where}: {c.file}: {e.fqn} has shape {t.get('shape')} in the file, {list(c.sizes)} in .metadata"
                )
            chunks.append(
                ChunkRef(c.file, base + offs[0], offs[1] - offs[0], c.offsets, c.sizes, c.transformed, raw=True)
            )
        out.append(TensorEntry(e.fqn, e.dtype, e.shape, tuple(chunks)))
    return out


def storage_bytes_by_fqn(md: Any) -> dict[str, int]:
    """Bytes on disk per fully-qualified name (tensors and pickled objects alike)."""
    out: dict[str, int] = {}
    for index, info in md.storage_data.items():
        out[index.fqn] = out.get(index.fqn, 0) + int(info.length)
    return out


def weight_names(fqns: list[str], model_prefix: str = "auto") -> dict[str, str]:
    """Map source FQN -> output tensor name for the model weights among ``fqns``.

    ``auto`` finds the model by structure: keys under ``model.`` (the DCP recipe and FSDP2's
    ``get_state_dict``), under one ``<name>.model.`` (a Stateful ``AppState`` saved as
    ``{"app": ...}``), under ``module.`` (DeepSpeed), else torchtitan's flat layout (every key
    that is not optimizer state nor under an lr-scheduler/dataloader/train-state root). An
    explicit prefix takes the keys under it. Optimizer keys never count as weights.
    """
    from backend.checkpoints.torchfile import key_paths_optimizer

    optim = set(key_paths_optimizer(fqns))
    plain = [f for f in fqns if f not in optim]
    if model_prefix != "auto":
        pre = model_prefix.rstrip(".") + "." if model_prefix else ""
        if pre:
            return {f: f[len(pre) :] for f in plain if f.startswith(pre)}
        return {f: f for f in plain if f.split(".", 1)[0] not in NON_WEIGHT_ROOTS}
    for pre in ("model.", "module."):
        if any(f.startswith(pre) for f in plain):
            return {f: f[len(pre) :] for f in plain if f.startswith(pre)}
    nested = {f.split(".", 2)[0] for f in plain if f.count(".") >= 2 and f.split(".", 2)[1] == "model"}
    if len(nested) == 1:
        pre = f"{nested.pop()}.model."
        return {f: f[len(pre) :] for f in plain if f.startswith(pre)}
    return {f: f for f in plain if f.split(".", 1)[0] not in NON_WEIGHT_ROOTS}


# -- reading one chunk --------------------------------------------------------------------------


class _TensorPickle(pickle.Unpickler):
    """Reads the data.pkl of a torch.save'd tensor: records storages and the rebuild call only."""

    def __init__(self, f: io.BytesIO) -> None:
        super().__init__(f)
        self.storages: dict[str, Any] = {}

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_args
        if module == "torch" and name.endswith("Storage"):
            return name
        if module == "collections" and name == "OrderedDict":
            import collections

            return collections.OrderedDict
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"unexpected {module}.{name} in a DCP tensor record")

    def persistent_load(self, pid: Any) -> Any:
        # ('storage', storage_type, key, location, numel)
        if not isinstance(pid, tuple) or len(pid) < 5 or pid[0] != "storage":
            raise pickle.UnpicklingError("unexpected persistent id in a DCP tensor record")
        return ("storage", pid[1], str(pid[2]), int(pid[4]))


def _rebuild_args(storage: Any, offset: int, size: Any, stride: Any, *rest: Any) -> tuple[Any, ...]:
    return ("tensor", storage, int(offset), tuple(size), tuple(stride))


def _storage_dtype(stype: Any) -> Any:
    import torch

    if isinstance(stype, torch.dtype):
        return stype
    names = {
        "FloatStorage": torch.float32,
        "DoubleStorage": torch.float64,
        "HalfStorage": torch.float16,
        "BFloat16Storage": torch.bfloat16,
        "LongStorage": torch.int64,
        "IntStorage": torch.int32,
        "ShortStorage": torch.int16,
        "CharStorage": torch.int8,
        "ByteStorage": torch.uint8,
        "BoolStorage": torch.bool,
    }
    if stype not in names:
        raise CheckpointError(f"unsupported storage type {stype!r} in a DCP tensor record")
    return names[stype]


class _MemFile(io.RawIOBase):
    """A read-only file over a buffer that never copies more than each read asks for.

    ``io.BytesIO(bytearray)`` would copy the whole tensor record; zipfile only needs the
    central directory and the small data.pkl record.
    """

    def __init__(self, buf: bytes | bytearray | memoryview) -> None:
        super().__init__()
        self._mv = memoryview(buf).cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: len(self._mv)}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, n: int | None = -1) -> bytes:
        end = len(self._mv) if n is None or n < 0 else min(len(self._mv), self._pos + n)
        out = bytes(self._mv[self._pos : end])
        self._pos = max(self._pos, end)
        return out

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def chunk_tensor(
    blob: bytes | bytearray | memoryview, dtype: Any, sizes: tuple[int, ...], *, where: str, raw: bool = False
) -> Any:
    """A tensor view over one chunk's bytes (torch.save zip, or raw), without copying the data."""
    import torch

    numel = 1
    for s in sizes:
        numel *= s
    if raw or bytes(blob[:2]) != b"PK":
        # safetensors serialization format: the chunk is the raw little-endian tensor data
        if len(blob) != numel * dtype.itemsize:
            raise CheckpointError(f"{where}: chunk is {len(blob)} bytes, expected {numel * dtype.itemsize}")
        if numel == 0:
            return torch.empty(sizes, dtype=dtype)
        return torch.frombuffer(blob, dtype=dtype, count=numel).view(sizes)
    try:
        zf = zipfile.ZipFile(_MemFile(blob))  # type: ignore[arg-type]
        names = zf.namelist()
        pkl = next(n for n in names if n.endswith("/data.pkl") or n == "data.pkl")
        root = pkl[: -len("data.pkl")]
        up = _TensorPickle(io.BytesIO(zf.read(pkl)))
        obj = up.load()
        if not (isinstance(obj, tuple) and obj and obj[0] == "tensor"):
            raise CheckpointError(f"{where}: record is not a single tensor")
        _, (_, stype, key, snumel), offset, size, stride = obj
        sdtype = _storage_dtype(stype)
        info = zf.getinfo(f"{root}data/{key}")
        if info.compress_type != zipfile.ZIP_STORED:
            raise CheckpointError(f"{where}: compressed tensor records are not supported")
        # local file header: 30 bytes + name + extra, then the stored data
        hdr = info.header_offset
        if bytes(blob[hdr : hdr + 4]) != b"PK\x03\x04":
            raise CheckpointError(f"{where}: corrupt zip record")
        nlen, xlen = struct.unpack("<HH", bytes(blob[hdr + 26 : hdr + 30]))
        start = hdr + 30 + nlen + xlen
        if start + snumel * sdtype.itemsize > len(blob) or info.file_size < snumel * sdtype.itemsize:
            raise CheckpointError(f"{where}: tensor record is truncated")
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"{where}: unreadable tensor record ({type(exc).__name__}: {exc})") from None
    if sdtype != dtype:
        raise CheckpointError(f"{where}: record dtype {sdtype} differs from metadata dtype {dtype}")
    if snumel == 0:
        return torch.empty(sizes, dtype=dtype)
    storage = torch.frombuffer(blob, dtype=sdtype, count=snumel, offset=start)
    t = storage.as_strided(size, stride, offset)
    if tuple(t.shape) != tuple(sizes):
        raise CheckpointError(f"{where}: record shape {tuple(t.shape)} differs from metadata {sizes}")
    return t
