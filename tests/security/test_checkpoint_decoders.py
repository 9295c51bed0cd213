"""The decoders of untrusted checkpoint bytes: DCP .metadata, torch.save structure, safetensors
headers, plan files. An attacker controls every byte; nothing they write may run code, crash
with a traceback, or cost unbounded memory."""

from __future__ import annotations

import io
import json
import pickle
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.checkpoints.catalog import list_checkpoints
from backend.checkpoints.dcp import CheckpointError, load_metadata
from backend.checkpoints.safetensors_check import SafetensorsError, parse_header
from backend.checkpoints.torchfile import TorchFileError, read_local_torch_file
from backend.errors import PolicyError
from backend.policy.retention import RetentionPlan
from backend.storage import LocalStore

#: Globals an attacker would reach for, each spelled the ways pickle lets them be spelled.
HOSTILE_GLOBALS = [
    ("os", "system"),
    ("posix", "system"),
    ("builtins", "eval"),
    ("builtins", "exec"),
    ("builtins", "getattr"),
    ("builtins", "__import__"),
    ("subprocess", "Popen"),
    ("torch.distributed.checkpoint.metadata", "os.system"),  # dotted: followed by protocol 4
    ("torch.distributed.checkpoint.metadata", "dataclasses.sys.modules"),
    ("torch.distributed.checkpoint.filesystem", "os.system"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo.__init__.__globals__"),
    ("torch", "load"),
    ("torch", "_C"),
    ("torch.serialization", "load"),
    ("pathlib", "Path.write_text"),
    ("collections", "OrderedDict.fromkeys"),
    ("torch.distributed.checkpoint.planner", "os.system"),
    ("builtins", "set.__class__"),
    ("torch", "float32.__class__"),
]
#: Names on the allow-list (and near it): the fuzzer mixes them in so the good path is walked too.
ALLOWED = [
    ("torch.distributed.checkpoint.metadata", "Metadata"),
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
    ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
    ("torch", "Size"),
    ("torch", "float32"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
]


def _global(module: str, name: str, proto: int) -> bytes:
    """A GLOBAL (protocol 0-3) or SHORT_BINUNICODE x2 + STACK_GLOBAL (protocol 4+) reference."""
    if proto < 4:
        return b"c" + module.encode() + b"\n" + name.encode() + b"\n"
    m, n = module.encode(), name.encode()
    return b"\x8c" + bytes([len(m)]) + m + b"\x8c" + bytes([len(n)]) + n + b"\x93"


_ARGS = st.sampled_from([b")", b"\x8c\x04echo\x85", b"\x8c\x0btouch /tmp/x\x85", b"K\x01\x85", b"N\x85"])


@st.composite
def opcode_streams(draw: st.DrawFn) -> bytes:
    """A pickle that references globals and calls them: REDUCE, BUILD, INST, OBJ, NEWOBJ."""
    proto = draw(st.sampled_from([2, 3, 4, 5]))
    out = b"\x80" + bytes([proto])
    for _ in range(draw(st.integers(1, 4))):
        module, name = draw(st.sampled_from(HOSTILE_GLOBALS + ALLOWED))
        how = draw(st.sampled_from(["reduce", "build", "newobj", "inst", "obj"]))
        if how == "inst":  # INST takes its module/name inline, after a MARK and the arguments
            out += (
                b"("
                + draw(st.sampled_from([b"", b"\x8c\x02id"]))
                + b"i"
                + module.encode()
                + b"\n"
                + name.encode()
                + b"\n"
            )
        elif how == "obj":
            out += b"(" + _global(module, name, proto) + b"o"
        else:
            out += _global(module, name, proto) + draw(_ARGS)
            out += {"reduce": b"R", "build": b"R}b", "newobj": b"\x81"}[how]
    return out + b"."


class _Canary:
    """Records whether any hostile callable ran (patched in for os.system and friends)."""

    ran: list[str] = []


@pytest.fixture
def canary(monkeypatch: pytest.MonkeyPatch) -> type[_Canary]:
    import os
    import subprocess

    _Canary.ran = []
    for mod, name in ((os, "system"), (subprocess, "Popen")):
        monkeypatch.setattr(mod, name, lambda *a, _n=name, **k: _Canary.ran.append(_n))
    return _Canary


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(opcode_streams())
def test_metadata_unpickler_never_reaches_a_callable_off_the_list(canary: type[_Canary], raw: bytes) -> None:
    try:
        load_metadata(raw, where="fuzz/.metadata")
    except CheckpointError as exc:
        assert str(exc).startswith("fuzz/.metadata: ")
    assert canary.ran == []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(opcode_streams())
def test_torch_file_skeleton_never_calls_anything(
    canary: type[_Canary], tmp_path_factory: pytest.TempPathFactory, raw: bytes
) -> None:
    import zipfile

    p = tmp_path_factory.mktemp("tf") / "model.pt"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("archive/data.pkl", raw)
    try:
        read_local_torch_file(str(p))
    except TorchFileError as exc:
        assert str(exc).startswith(str(p))
    assert canary.ran == []


@pytest.mark.parametrize("module,name", HOSTILE_GLOBALS)
def test_each_hostile_global_is_refused_by_name(canary: type[_Canary], module: str, name: str) -> None:
    raw = b"\x80\x04" + _global(module, name, 4) + b"\x8c\x05touch\x85R."
    with pytest.raises(CheckpointError, match=r"refusing to unpickle|not a readable DCP metadata"):
        load_metadata(raw, where="x")
    assert canary.ran == []


async def test_a_hostile_metadata_in_a_bucket_lists_as_corrupt_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            import os

            return (os.system, (f"touch {marker}",))

    # the dotted-name trick: an allowed module, then os.system reached through it
    dotted = (
        b"\x80\x04\x8c%torch.distributed.checkpoint.metadata\x8c\tos.system\x93\x8c"
        + bytes([len(f"touch {marker}")])
        + f"touch {marker}".encode()
        + b"\x85R."
    )
    for i, raw in enumerate((pickle.dumps(Evil()), dotted)):
        step = tmp_path / "run" / f"step-{i + 1}"
        step.mkdir(parents=True)
        (step / ".metadata").write_bytes(raw)
        (step / "__0_0.distcp").write_bytes(b"PK\x03\x04")
    cat = await list_checkpoints(LocalStore(tmp_path / "run"))
    assert [s.kind for s in cat.steps] == ["corrupt", "corrupt"]
    assert all("refusing to unpickle" in s.note for s in cat.steps)
    assert not marker.exists()


def _nested(depth: int) -> bytes:
    return ("[" * depth + "]" * depth).encode()


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=512),
        st.integers(1, 200_000).map(lambda d: b'{"a":' + _nested(d) + b"}"),
        st.dictionaries(
            st.text(max_size=8),
            st.recursive(
                st.none() | st.integers() | st.text(max_size=4) | st.lists(st.integers(), max_size=3),
                lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                max_leaves=20,
            ),
            max_size=5,
        ).map(lambda d: json.dumps(d).encode()),
    )
)
def test_safetensors_headers_fail_with_a_clear_error(header: bytes) -> None:
    try:
        parse_header(header, 8 + len(header) + 64, where="fuzz.safetensors")
    except SafetensorsError as exc:
        assert str(exc).startswith("fuzz.safetensors: ")


def test_a_deeply_nested_safetensors_header_is_one_line(tmp_path: Path) -> None:
    header = b'{"a":' + _nested(500_000) + b"}"
    with pytest.raises(SafetensorsError, match="fuzz.safetensors: header (nests too deeply|is not valid JSON)"):
        parse_header(header, 8 + len(header), where="fuzz.safetensors")


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.text(max_size=300),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=6),
            lambda c: (
                st.lists(c, max_size=4)
                | st.dictionaries(
                    st.sampled_from(["schema", "url", "actions", "policy", "hash", "created", "path", "action"]),
                    c,
                    max_size=6,
                )
            ),
            max_leaves=30,
        ).map(json.dumps),
        st.integers(1, 100_000).map(lambda d: '{"schema": 2, "actions": ' + "[" * d + "]" * d + "}"),
    )
)
def test_plan_files_are_refused_with_a_clear_error(text: str) -> None:
    try:
        RetentionPlan.from_json(text, source="plan.json")
    except PolicyError as exc:
        assert str(exc).startswith("plan.json: ")


def test_a_truncated_torch_file_names_itself(tmp_path: Path) -> None:
    import torch

    p = tmp_path / "optimizer.pt"
    buf = io.BytesIO()
    torch.save({"state": {0: {"exp_avg": torch.zeros(1000)}}, "param_groups": [{"params": [0]}]}, buf)
    p.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(TorchFileError, match=f"{p}: truncated"):
        read_local_torch_file(str(p))
    p.write_bytes(struct.pack("<Q", 10) + b"not a zip")
    with pytest.raises(TorchFileError, match="not a torch.save file"):
        read_local_torch_file(str(p))
