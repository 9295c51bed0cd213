"""Every table the CLI prints is made of safe cells (#28): text from outside (an object key, a
Slurm reason, an alert's summary) reaches the terminal without escape sequences, OSC 52 clipboard
writes, C1 controls or bidi overrides, and the columns still line up.

End to end: ``loadmaster ckpt list`` of a real local run folder where a hostile job has made a step
folder whose name carries a clipboard write, a screen clear and a right-to-left override.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.textfmt import align_columns
from tests.checkpoints.conftest import save_dcp, trained
from tui.cli import main

HOSTILE = "step-20\x1b]52;c;cm0gLXJmIH4=\x07\u202eevil\x1b[2J\x9b31m"
#: Bidi embeddings, overrides, isolates and marks: what makes a line read differently than it is.
BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")


def _clean(line: str) -> bool:
    """No control character (C0, DEL, C1: every escape sequence starts with one) and no bidi control."""
    return all(unicodedata.category(ch) != "Cc" and ch not in BIDI for ch in line)


def test_ckpt_list_of_a_hostile_folder_name_prints_no_escape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("LOADMASTER_DATA_DIR", str(tmp_path / "data"))
    run = tmp_path / "run"
    save_dcp(run / "step-10", *trained())
    (run / HOSTILE).mkdir()
    (run / HOSTILE / "x.bin").write_bytes(b"1" * 10)
    assert main(["ckpt", "list", str(run)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert all(_clean(line) for line in lines), [ln for ln in lines if not _clean(ln)]
    [row] = [ln for ln in lines if "step-20" in ln]
    assert "step-20" in row and "evil" in row
    # Columns line up: FOLDER starts at the same place in the header and in both rows.
    header = lines[0]
    at = header.index("LAYOUT")
    assert all(ln[at - 2 : at] == "  " for ln in lines[1:3])


pieces = st.one_of(
    st.sampled_from([*BIDI, "\x1b", "\x07", "\x9b", "\x90", "\t", "\n", "\r", "\x7f", "]52;c;aGk=", "[2J"]),
    st.text(st.characters(codec="utf-8"), max_size=4),
)
cells = st.lists(pieces, max_size=12).map("".join)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(cells, min_size=3, max_size=3), min_size=1, max_size=6))
def test_align_columns_makes_every_cell_one_safe_line(rows: list[list[str]]) -> None:
    lines = align_columns(rows)
    assert len(lines) == len(rows)
    for line in lines:
        assert _clean(line), repr(line)


def test_ckpt_inspect_of_hostile_tensor_names_prints_no_escape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import struct

    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("LOADMASTER_DATA_DIR", str(tmp_path / "data"))
    step = tmp_path / "run" / "step-10"
    step.mkdir(parents=True)
    name = "model.w\x1b]52;c;cm0gLXJmIH4=\x07\u202e\x9b2J"
    header = json.dumps({name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (step / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0\0\0")
    main(["ckpt", "inspect", str(step)])
    captured = capsys.readouterr()
    for stream in (captured.out, captured.err):
        assert all(_clean(line) for line in stream.splitlines()), stream
    assert "model.w" in captured.out + captured.err
