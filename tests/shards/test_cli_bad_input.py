"""The CLI: each bad input gets a clear one-line message (exit 2), never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from backend.shards.manifest import MANIFEST_NAME
from tests.shards.conftest import make_dataset
from tui.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def test_cli_converts_verifies_and_reports_get_savings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    make_dataset(src, n=40)
    dest = tmp_path / "out"
    rc, out, err = run(capsys, "shard", str(src), str(dest), "--shard-size", "16KB", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["samples"] == 40 and doc["requests"]["gets_before"] == 80
    assert "below the recommended 256 MB - 1 GB" in err
    rc, out, _ = run(capsys, "shard", "verify", str(dest))
    assert rc == 0 and out.startswith("OK:")
    # corrupt one shard: verify names it and fails
    victim = sorted(dest.glob("shard-*.tar"))[1]
    blob = bytearray(victim.read_bytes())
    blob[600] ^= 0xFF
    victim.write_bytes(bytes(blob))
    rc, out, _ = run(capsys, "shard", "verify", str(dest), "--json")
    report = json.loads(out)
    assert rc == 1 and not report["ok"]
    bad = [s for s in report["shards"] if not s["ok"]]
    assert [s["name"] for s in bad] == [victim.name] and "blake3" in bad[0]["problems"][0]


def test_dry_run_previews_without_writing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    make_dataset(src, n=30)
    rc, out, _ = run(capsys, "shard", str(src), str(tmp_path / "out"), "--shard-size", "16KB", "--dry-run", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["samples"] == 30 and doc["files"] == 60 and doc["shards"] >= 2
    assert doc["requests"]["reduction"] == pytest.approx(60 / doc["shards"], rel=1e-2)
    assert not (tmp_path / "out").exists()


def test_destination_with_shards_is_refused_unless_overwrite_or_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    make_dataset(src, n=20)
    dest = tmp_path / "out"
    assert run(capsys, "shard", str(src), str(dest), "--shard-size", "16KB")[0] == 0
    rc, _, err = run(capsys, "shard", str(src), str(dest), "--shard-size", "16KB")
    assert rc == 2 and "already has" in err and "--resume" in err and "--overwrite" in err
    # a different shard size is a different plan: --resume refuses to mix them
    rc, _, err = run(capsys, "shard", str(src), str(dest), "--shard-size", "12KB", "--resume")
    assert rc == 2 and "different conversion" in err
    before = sorted(p.name for p in dest.glob("shard-*.tar"))
    rc, _, err = run(capsys, "shard", str(src), str(dest), "--shard-size", "64KB", "--overwrite")
    assert rc == 0, err
    after = sorted(p.name for p in dest.glob("shard-*.tar"))
    assert len(after) < len(before)  # stale shards of the old run are gone
    assert run(capsys, "shard", "verify", str(dest))[0] == 0


def test_foreign_tars_in_destination_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    make_dataset(src, n=5)
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "shard-000000.tar").write_bytes(b"not ours")
    rc, _, err = run(capsys, "shard", str(src), str(dest), "--resume")
    assert rc == 2 and "no loadmaster journal" in err


def test_empty_and_missing_sources(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    rc, _, err = run(capsys, "shard", str(tmp_path / "empty"), str(tmp_path / "out"))
    assert rc == 2 and "is empty" in err
    rc, _, err = run(capsys, "shard", str(tmp_path / "nope"), str(tmp_path / "out"))
    assert rc == 2 and "does not exist" in err


def test_files_without_partner_are_reported_with_count_and_examples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    make_dataset(src, n=20)
    (src / "000003.json").unlink()
    (src / "000011.json").unlink()
    (src / "README").write_text("no extension")
    dest = tmp_path / "out"
    rc, _, err = run(capsys, "shard", str(src), str(dest), "--shard-size", "16KB")
    assert rc == 2
    assert "2 sample(s) lack a partner file that most samples have (jpg, json)" in err
    assert "000003 (missing json)" in err and "000011 (missing json)" in err
    assert "1 file(s) without a WebDataset key" in err and "README" in err
    assert "--incomplete skip" in err
    assert not dest.exists()
    rc, out, err = run(capsys, "shard", str(src), str(dest), "--shard-size", "16KB", "--incomplete", "skip", "--json")
    assert rc == 0 and json.loads(out)["samples"] == 18
    manifest = json.loads((dest / MANIFEST_NAME).read_text())
    assert manifest["input_problems"]["incomplete"]["count"] == 2
    assert manifest["input_problems"]["unkeyed"]["examples"] == ["README"]
    rc, out, _ = run(
        capsys, "shard", str(src), str(tmp_path / "keep"), "--shard-size", "16KB", "--incomplete", "keep", "--json"
    )
    assert rc == 0 and json.loads(out)["samples"] == 20


def test_name_collisions_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    make_dataset(src, n=5)
    (src / "000002.JPG").write_bytes(b"same key and extension once lower-cased")
    rc, _, err = run(capsys, "shard", str(src), str(tmp_path / "out"))
    assert rc == 2 and "1 name collision(s)" in err
    assert "000002.JPG" in err and "000002.jpg" in err


def test_unreadable_files_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    make_dataset(src, n=5)
    os.symlink(tmp_path / "gone.json", src / "000009.json")  # dangling: cannot be read
    (src / "000009.jpg").write_bytes(b"x")
    rc, _, err = run(capsys, "shard", str(src), str(tmp_path / "out"))
    assert rc == 2 and "1 unreadable file(s)" in err and "000009.json" in err


def test_bad_options_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    make_dataset(src, n=3)
    rc, _, err = run(capsys, "shard", str(src), str(tmp_path / "o"), "--pattern", "shard.tar")
    assert rc == 2 and "exactly one integer field" in err
    rc, _, err = run(capsys, "shard", str(src), str(src))
    assert rc == 2 and "same place" in err
    rc, _, err = run(capsys, "shard", str(src), str(tmp_path / "o"), "--overwrite", "--resume")
    assert rc == 2 and "one of --overwrite and --resume" in err
    rc, _, err = run(capsys, "shard", "verify", str(tmp_path / "nothing"))
    assert rc == 2 and "no manifest.json" in err
    rc, _, err = run(capsys, "--readonly", "shard", str(src), str(tmp_path / "o"))
    assert rc == 2 and "read-only" in err


def test_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["shard", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert "--pattern shard-%06d.tar" in out and "loadmaster shard verify DEST" in out
    assert "--incomplete" in out and "--node" in out and "--resume" in out
