"""What a ``torch.save`` file holds, read from its pickle alone, without running or loading it.

A ``torch.save`` file is a zip: ``data.pkl`` (the object structure) plus one record per tensor
storage. Classifying a checkpoint only needs the structure (is there an ``optimizer`` entry? are
the model tensors empty placeholders?), so this reads the zip's central directory and
``data.pkl`` through ranged reads (a few KB of a multi-GB file, over S3 too) and unpickles it
with an unpickler that never imports or calls anything: every global becomes an inert
:class:`Opaque` stand-in, tensors become :class:`TensorStub` (dtype, shape, storage size). That
is stricter than ``torch.load(weights_only=True)`` (which builds real objects from an
allow-list) and needs no torch at all.

It also proves the file whole: the zip end record must be present (a killed ``torch.save``
leaves a file without one) and every storage record must hold the bytes its tensors need.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from backend.errors import LoadmasterError

#: data.pkl larger than this is refused (an optimizer with a million param groups is still < 64 MB).
MAX_PICKLE_BYTES = 64 * 1024 * 1024
#: How deep the walkers follow nested containers (a hostile pickle nests far deeper).
MAX_DEPTH = 64
#: How many containers the walkers visit at most.
MAX_NODES = 2_000_000
_TAIL = 64 * 1024
_DTYPE_SIZES = {
    "float64": 8,
    "double": 8,
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "int64": 8,
    "long": 8,
    "int32": 4,
    "int": 4,
    "int16": 2,
    "short": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
}
_STORAGE_DTYPES = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
}


class TorchFileError(LoadmasterError):
    """A torch.save file is truncated, malformed, or not a torch.save zip at all."""


class Opaque:
    """Stands in for any object a pickle builds from a global: records the name, never runs it."""

    __slots__ = ("args", "name", "state")

    def __init__(self, name: str, args: tuple[Any, ...] = ()) -> None:
        self.name = name
        self.args = args
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<{self.name}>"


@dataclass(frozen=True)
class StorageStub:
    """A tensor storage record: its dtype, record name in the zip and element count."""

    dtype: str
    key: str
    numel: int


@dataclass
class TensorStub:
    """A tensor as the pickle describes it (no data read)."""

    dtype: str
    shape: tuple[int, ...]
    storage: StorageStub | None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def _opaque_class(name: str) -> type:
    def new(cls: type, *args: Any, **kw: Any) -> Opaque:
        return Opaque(name, args)

    return type("OpaqueGlobal", (), {"__new__": new, "__call__": lambda self, *a, **k: Opaque(name, a)})


class _Dict(dict):  # type: ignore[type-arg]
    """OrderedDict's stand-in: a state dict pickles its ``_metadata`` attribute as BUILD state."""

    def __setstate__(self, state: Any) -> None:
        pass


def _rebuild_tensor(storage: Any, offset: Any = 0, size: Any = (), stride: Any = (), *rest: Any) -> TensorStub:
    shape = tuple(int(s) for s in size) if isinstance(size, (tuple, list)) else ()
    if isinstance(storage, StorageStub):
        return TensorStub(storage.dtype, shape, storage)
    return TensorStub("unknown", shape, None)


def _rebuild_parameter(data: Any, *rest: Any) -> Any:
    return data  # nn.Parameter wraps a tensor: the tensor is what counts


class _SkeletonUnpickler(pickle.Unpickler):
    """Builds the object structure of a data.pkl; no global is ever imported or called."""

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if full in ("torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor"):
            return _rebuild_tensor
        if full in ("torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state"):
            return _rebuild_parameter
        if full == "collections.OrderedDict":
            return _Dict
        if module == "torch" and name.endswith("Storage"):
            return _STORAGE_DTYPES.get(name, name)
        if module == "torch" and name in _DTYPE_SIZES:
            return name
        if full == "torch.Size":
            return tuple
        return _opaque_class(full)

    def persistent_load(self, pid: Any) -> Any:
        # ('storage', storage_type, key, location, numel)
        if not isinstance(pid, tuple) or len(pid) < 5 or pid[0] != "storage":
            raise pickle.UnpicklingError("unexpected persistent id")
        stype = pid[1]
        dtype = stype if isinstance(stype, str) else getattr(stype, "name", "unknown")
        try:
            numel = int(pid[4])
        except (TypeError, ValueError):
            raise pickle.UnpicklingError("storage record without an element count") from None
        return StorageStub(_STORAGE_DTYPES.get(dtype, dtype), str(pid[2]), numel)


@dataclass(frozen=True)
class TorchFile:
    """The structure of one torch.save file and the zip records that back its tensors."""

    where: str
    obj: Any
    records: dict[str, int] = field(default_factory=dict)  # storage key -> bytes stored

    def tensors(self) -> Iterator[tuple[str, TensorStub]]:
        """Every tensor with its dotted path (``model.layers.0.wq.weight``), depth-bounded."""
        for path, v in walk(self.obj):
            if isinstance(v, TensorStub):
                yield path, v

    def check_records(self) -> str | None:
        """A problem when a tensor's storage record is missing or shorter than the tensor needs."""
        for path, t in self.tensors():
            if t.storage is None:
                continue
            need = t.storage.numel * _DTYPE_SIZES.get(t.storage.dtype, 1)
            have = self.records.get(t.storage.key)
            if have is None:
                return f"{self.where}: tensor {path or '<root>'} has no storage record {t.storage.key!r}"
            if have < need:
                return f"{self.where}: tensor {path or '<root>'} needs {need} bytes, its record holds {have}"
        return None


def walk(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every node below ``obj``; stops at MAX_DEPTH / MAX_NODES."""
    stack: list[tuple[str, Any, int]] = [(prefix, obj, 0)]
    seen = 0
    while stack:
        path, v, depth = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise TorchFileError(f"more than {MAX_NODES} objects in one pickle: refusing to walk it")
        yield path, v
        if depth >= MAX_DEPTH:
            continue
        if isinstance(v, Opaque):
            v = v.state if v.state is not None else (v.args[0] if len(v.args) == 1 else None)
            if v is None:
                continue
            stack.append((path, v, depth + 1))
            continue
        if isinstance(v, dict):
            items: Any = v.items()
        elif isinstance(v, (list, tuple)):
            items = enumerate(v)
        else:
            continue
        for k, child in reversed(list(items)):
            stack.append((f"{path}.{k}" if path else str(k), child, depth + 1))


class _Need(Exception):
    def __init__(self, pos: int, n: int) -> None:
        self.pos, self.n = pos, n


class _SparseFile(io.RawIOBase):
    """A seekable file of known size whose bytes are present only in fetched ranges."""

    def __init__(self, size: int, ranges: list[tuple[int, bytes]]) -> None:
        super().__init__()
        self.size, self.ranges, self.pos = size, ranges, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = max(0, {0: 0, 1: self.pos, 2: self.size}[whence] + pos)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int | None = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        for start, data in self.ranges:
            if start <= self.pos and end <= start + len(data):
                out = data[self.pos - start : end - start]
                self.pos = end
                return out
        raise _Need(self.pos, end - self.pos)

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


RangeReader = Callable[[int, int], Awaitable[bytes]]


def _parse(f: Any, where: str) -> TorchFile:
    try:
        zf = zipfile.ZipFile(f)
    except zipfile.BadZipFile:
        # it starts like a zip (checked by the callers), so a missing end record means cut short
        raise TorchFileError(f"{where}: truncated (no zip end record: a torch.save cut short)") from None
    infos = zf.infolist()
    pkl = next((i for i in infos if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"), None)
    if pkl is None:
        raise TorchFileError(f"{where}: a zip without data.pkl is not a torch.save file")
    if pkl.file_size > MAX_PICKLE_BYTES:
        raise TorchFileError(f"{where}: data.pkl is {pkl.file_size} bytes, over the {MAX_PICKLE_BYTES} limit")
    root = pkl.filename[: -len("data.pkl")]
    records = {
        i.filename[len(root) + len("data/") :]: i.file_size for i in infos if i.filename.startswith(root + "data/")
    }
    try:
        raw = zf.read(pkl)
    except _Need:
        raise
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise TorchFileError(f"{where}: data.pkl is unreadable ({exc})") from None
    try:
        obj = _SkeletonUnpickler(io.BytesIO(raw)).load()
    except _Need:
        raise
    except RecursionError:
        raise TorchFileError(f"{where}: data.pkl nests too deeply to read") from None
    except Exception as exc:  # noqa: BLE001 - any malformed pickle is the same operator problem
        raise TorchFileError(f"{where}: data.pkl is not a readable pickle ({type(exc).__name__}: {exc})") from None
    return TorchFile(where, obj, records)


async def read_torch_file(read: RangeReader, size: int, *, where: str) -> TorchFile:
    """The structure of a torch.save file of ``size`` bytes, fetched with ``read(offset, n)``."""
    if size == 0:
        raise TorchFileError(f"{where}: empty file (0 bytes)")
    tail = min(size, _TAIL)
    ranges = [(size - tail, await read(size - tail, tail))]
    head = await read(0, min(size, 8))
    if not head.startswith(b"PK"):
        if head[:1] == b"\x80":
            raise TorchFileError(f"{where}: a legacy (pre-1.6, non-zip) torch.save file: not inspected")
        raise TorchFileError(f"{where}: not a torch.save file (it does not start like a zip)")
    fetched = tail
    for _ in range(16):
        try:
            return _parse(_SparseFile(size, ranges), where)
        except _Need as need:
            n = max(need.n, _TAIL)
            fetched += n
            if fetched > MAX_PICKLE_BYTES + 4 * _TAIL:
                raise TorchFileError(f"{where}: its zip directory and data.pkl are over the size limit") from None
            start = min(need.pos, max(0, size - n))
            ranges.append((start, await read(start, min(n, size - start))))
    raise TorchFileError(f"{where}: zip directory too fragmented to read")


def read_local_torch_file(path: str) -> TorchFile:
    """The structure of a local torch.save file."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if not head:
                raise TorchFileError(f"{path}: empty file (0 bytes)")
            if not head.startswith(b"PK"):
                what = (
                    "a legacy (pre-1.6, non-zip) torch.save file: not inspected"
                    if head[:1] == b"\x80"
                    else "not a torch.save file (it does not start like a zip)"
                )
                raise TorchFileError(f"{path}: {what}")
            f.seek(0)
            return _parse(f, path)
    except OSError as exc:
        raise TorchFileError(f"{path}: cannot be read ({exc.strerror})") from None


# -- what the structure says -------------------------------------------------------------------

#: Leaf names only optimizers write (Adam/AdamW moments, SGD momentum, RMSprop, Adagrad, Adafactor).
OPTIMIZER_LEAVES = frozenset(
    {
        "exp_avg",
        "exp_avg_sq",
        "max_exp_avg_sq",
        "momentum_buffer",
        "square_avg",
        "acc_delta",
        "exp_avg_sq_row",
        "exp_avg_sq_col",
        "fp32_flat_groups",
        "single_partition_of_fp32_groups",
    }
)
#: Entry names under which training frameworks store optimizer state.
OPTIMIZER_ENTRIES = frozenset(
    {
        "optimizer",
        "optim",
        "optimizers",
        "optimizer_states",
        "optimizer_state_dict",
        "optimizer_state",
        "optim_state",
        "base_optimizer_state",
    }
)


def _is_optimizer_state_dict(v: Any) -> bool:
    return isinstance(v, dict) and "state" in v and "param_groups" in v


def _holds_state(v: Any) -> bool:
    """An optimizer entry holds state when tensors or a ``{state, param_groups}`` dict sit under
    it (Lightning's ``loops...optim_progress.optimizer`` is a dict of step counters: no state)."""
    return any(isinstance(x, TensorStub) or _is_optimizer_state_dict(x) for _, x in walk(v))


def optimizer_paths(obj: Any) -> list[str]:
    """Where ``obj`` holds optimizer state: a ``{state, param_groups}`` dict, a framework's
    optimizer entry, or optimizer-only leaves (``exp_avg``...), at any depth."""
    out: list[str] = []
    for path, v in walk(obj):
        leaf = path.rsplit(".", 1)[-1]
        if _is_optimizer_state_dict(v):
            out.append(path or "<root>")
        elif leaf in OPTIMIZER_ENTRIES and _holds_state(v):
            out.append(path)
        elif leaf in OPTIMIZER_LEAVES:
            out.append(path)
    return out


def _under_a_root(parts: list[str], roots: set[str]) -> bool:
    """Whether a proper prefix of the dotted key ``parts`` (the empty one included) is in ``roots``;
    the prefixes are built one part at a time (a catalog asks this of every key of every step)."""
    prefix = ""
    for i, p in enumerate(parts):
        if prefix in roots:
            return True
        prefix = f"{prefix}.{p}" if i else p
    return False


def key_paths_optimizer(keys: list[str]) -> list[str]:
    """The optimizer-state keys among flat dotted keys (DCP's fully-qualified names).

    Structure first: a prefix ``P`` with both ``P.state.*`` and ``P.param_groups.*`` keys is a
    torch optimizer state dict wherever it sits (``app.optim``, ``optimizer``, ``optimizer_0``);
    then leaves only optimizers write, and entries named like a framework's optimizer state.
    """
    split = [k.split(".") for k in keys]
    state_prefixes: set[str] = set()
    group_prefixes: set[str] = set()
    for parts in split:
        if "state" not in parts and "param_groups" not in parts:
            continue
        for i, p in enumerate(parts):
            if p == "state":
                state_prefixes.add(".".join(parts[:i]))
            elif p == "param_groups":
                group_prefixes.add(".".join(parts[:i]))
    optim_roots = state_prefixes & group_prefixes
    out = []
    for k, parts in zip(keys, split, strict=True):
        if optim_roots and _under_a_root(parts, optim_roots):
            out.append(k)
        elif not OPTIMIZER_LEAVES.isdisjoint(parts) or not OPTIMIZER_ENTRIES.isdisjoint(parts[:-1]):
            out.append(k)
        elif any(p.startswith(("optimizer_", "optim_")) and p.split("_", 1)[1].isdigit() for p in parts[:-1]):
            out.append(k)  # accelerate / torchtitan numbered optimizers: optimizer_0.*
    return out
