"""Listing and planning read DCP ``.metadata`` without torch (its import costs seconds on a cold
start): the light reader yields the same tensors, ranges and files as torch's own classes, refuses
every hostile global the torch reader refuses, and ``ckpt list`` / ``retention plan`` on a real
DCP run never import torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from retention_helpers import STEPS, DcpRun  # type: ignore[import-not-found]

from backend.checkpoints.dcp import (
    CheckpointError,
    files_needed,
    load_metadata,
    storage_bytes_by_fqn,
    tensor_entries,
)
from tests.security.test_checkpoint_decoders import HOSTILE_GLOBALS, _Canary, _global, canary, opcode_streams

__all__ = ["canary"]  # a fixture, used by name

ROOT = Path(__file__).resolve().parents[2]


def _view(md: object) -> tuple[object, ...]:
    entries = [(e.fqn, str(e.dtype), e.dtype.itemsize, e.shape, e.nbytes, e.chunks) for e in tensor_entries(md)]
    return entries, files_needed(md), storage_bytes_by_fqn(md), sorted(md.state_dict_metadata)  # type: ignore[attr-defined]


def test_light_reader_reads_what_torch_reads(dcp_run: DcpRun) -> None:
    for step in STEPS[:-1]:
        raw = (dcp_run.root / f"step-{step}" / ".metadata").read_bytes()
        assert _view(load_metadata(raw, light=True)) == _view(load_metadata(raw)), step


def test_a_remembered_light_read_is_keyed_by_the_bytes_and_keeps_none_of_them(dcp_run: DcpRun) -> None:
    from backend.checkpoints import dcp

    a, b = (dcp_run.root / f"step-{step}" / ".metadata" for step in STEPS[:2])
    raw_a, raw_b = a.read_bytes(), b.read_bytes()
    first = load_metadata(raw_a, light=True)
    assert load_metadata(bytes(raw_a), light=True) is first  # equal bytes: the parse is reused
    other = load_metadata(raw_b, light=True)
    assert other is not first and _view(other) == _view(load_metadata(raw_b))  # other bytes: parsed anew
    assert all(isinstance(k, bytes) and len(k) == 32 for k in dcp._light_parsed)  # digests, not the files
    with pytest.raises(CheckpointError):  # a damaged copy of remembered bytes is read, and refused
        load_metadata(raw_a[: len(raw_a) // 2], light=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(opcode_streams())
def test_light_reader_never_reaches_a_callable_off_the_list(canary: type[_Canary], raw: bytes) -> None:
    try:
        load_metadata(raw, where="fuzz/.metadata", light=True)
    except CheckpointError as exc:
        assert str(exc).startswith("fuzz/.metadata: ")
    assert canary.ran == []


@pytest.mark.parametrize("module,name", HOSTILE_GLOBALS)
def test_light_reader_refuses_each_hostile_global(canary: type[_Canary], module: str, name: str) -> None:
    raw = b"\x80\x04" + _global(module, name, 4) + b"\x8c\x05touch\x85R."
    with pytest.raises(CheckpointError, match=r"refusing to unpickle|not a readable DCP metadata"):
        load_metadata(raw, where="x", light=True)
    assert canary.ran == []


@pytest.mark.parametrize("command", [["ckpt", "list"], ["retention", "plan"]])
def test_listing_and_planning_a_dcp_run_never_import_torch(tmp_path: Path, dcp_run: DcpRun, command: list[str]) -> None:
    run = dcp_run.copy_to(tmp_path / "run1")
    cfg = tmp_path / "loadmaster.toml"
    cfg.write_text(f'[[nodes]]\nname = "here"\ntransport = "local"\n\n[state]\ndir = "{tmp_path / "state"}"\n')
    code = (
        "import sys\nfrom tui.cli import main\n"
        f"rc = main(['--config', {str(cfg)!r}, *{command!r}, {str(run)!r}])\n"
        "print('TORCH', 'torch' in sys.modules, 'RC', rc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "TORCH False RC 0" in out.stdout, out.stdout + out.stderr
    assert "12000" in out.stdout  # it really listed / planned the steps
