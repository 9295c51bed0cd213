"""A strip onto a full disk is one line naming the place and the space needed, never a traceback,
and it leaves no partial shard behind (on a real, full tmpfs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checkpoints.conftest import save_dcp, trained
from tui.cli import main


def test_strip_onto_a_full_disk_is_one_line(small_fs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    save_dcp(run / "step-10", *trained())
    (small_fs / "filler").write_bytes(b"\0" * (1024 * 1024 - 16 * 1024))  # leave 16 KiB free
    out = small_fs / "exports" / "step-10"
    assert main(["ckpt", "strip", str(run / "step-10"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"loadmaster: error: no space left on the device of {out}: the BF16 export needs ")
    assert "Traceback" not in err and err.count("\n") == 1
    assert not list(out.glob("*.tmp-lm")) and not list(out.glob("*.safetensors"))
    assert (run / "step-10" / ".metadata").exists()
