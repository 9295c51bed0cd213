"""A shard source is someone else's directory: a symbolic link in it must never ship a file from
outside it (``000003.jpg -> ~/.aws/credentials``), neither at listing time nor when a file is
swapped for a link between the listing and the read."""

from __future__ import annotations

import asyncio
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.shards.convert import convert_sync, preview
from backend.shards.model import ShardPreview, ShardRequest
from backend.shards.plan import ShardError
from tests.shards.conftest import make_dataset
from tui.cli import main

SECRET = b"[default]\naws_secret_access_key = NEVER-IN-A-SHARD\n"


@pytest.fixture
def credentials(tmp_path: Path) -> Path:
    """A file outside the source that an attacker would like shipped."""
    creds = tmp_path / "home" / ".aws" / "credentials"
    creds.parent.mkdir(parents=True)
    creds.write_bytes(SECRET)
    return creds


def preview_sync(req: ShardRequest) -> ShardPreview:
    return asyncio.run(preview(req))


def _shard_bytes(dest: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(dest.glob("*.tar")))


def test_a_link_out_of_the_source_is_refused_naming_it(tmp_path: Path, credentials: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "out"
    make_dataset(src, n=6)
    (src / "000003.jpg").unlink()
    (src / "000003.jpg").symlink_to(credentials)
    with pytest.raises(
        ShardError,
        match=r"000003\.jpg \(symbolic link to .*/\.aws/credentials, outside "
        r"the source: refused\)",
    ):
        convert_sync(ShardRequest(str(src), str(dest), shard_size=10**6))
    assert SECRET not in _shard_bytes(dest)
    # A relative link climbing out (../) is the same escape.
    (src / "000003.jpg").unlink()
    (src / "000003.jpg").symlink_to(os.path.relpath(credentials, src))
    with pytest.raises(ShardError, match=r"000003\.jpg \(symbolic link to"):
        convert_sync(ShardRequest(str(src), str(dest), shard_size=10**6))


def test_the_cli_says_so_in_one_line(tmp_path: Path, credentials: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    make_dataset(src, n=4)
    (src / "000001.json").unlink()
    (src / "000001.json").symlink_to(credentials)
    assert main(["shard", str(src), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "000001.json (symbolic link to" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_directory_link_out_of_the_source_is_not_followed(tmp_path: Path, credentials: Path) -> None:
    src = tmp_path / "src"
    make_dataset(src, n=4)
    (src / "more").symlink_to(credentials.parent)  # ~/.aws as a "subdirectory"
    with pytest.raises(ShardError, match=r"more \(symbolic link to .*\.aws, outside the source"):
        convert_sync(ShardRequest(str(src), str(tmp_path / "out"), shard_size=10**6))


def test_links_within_the_source_are_data(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "out"
    data = make_dataset(src, n=4, sub="a")
    (src / "b").mkdir()
    (src / "b" / "000000.jpg").symlink_to(src / "a" / "000000.jpg")
    (src / "b" / "000000.json").symlink_to("../a/000000.json")
    result = convert_sync(ShardRequest(str(src), str(dest), shard_size=10**6))
    assert result.manifest.samples == 5
    with tarfile.open(next(dest.glob("*.tar"))) as tar:
        member = tar.extractfile("b/000000.jpg")
        assert member is not None and member.read() == data["a/000000"]["jpg"]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_file_swapped_for_a_link_after_the_listing_is_refused(
    tmp_path: Path, credentials: Path, workers: int
) -> None:
    """The conversion runs the plan the operator saw (``prepared``): the source is not listed
    again, so only the check on the opened file can catch the swap."""
    src, dest = tmp_path / "src", tmp_path / "out"
    make_dataset(src, n=6, jpg_size=(len(SECRET), len(SECRET)))
    req = ShardRequest(str(src), str(dest), shard_size=10**6, workers=workers)
    shown = preview_sync(req)
    assert shown.ok
    (src / "000004.jpg").unlink()
    (src / "000004.jpg").symlink_to(credentials)  # same size as listed: the size check passes
    with pytest.raises(
        ShardError,
        match=r"000004\.jpg resolves to .*/\.aws/credentials, outside the "
        r"source .*: refused",
    ):
        convert_sync(req, prepared=shown)
    assert SECRET not in _shard_bytes(dest)
    assert not list(dest.glob(".*.partial"))


def test_a_big_file_swapped_for_a_link_is_refused_too(tmp_path: Path, credentials: Path) -> None:
    """Files larger than a read buffer are streamed by another path: it checks the same way."""
    from backend.shards.sources import CHUNK_BYTES

    src, dest = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "000000.bin").write_bytes(os.urandom(CHUNK_BYTES + 10))
    outside = tmp_path / "outside.bin"
    outside.write_bytes(os.urandom(CHUNK_BYTES + 10))
    req = ShardRequest(str(src), str(dest), shard_size=10**9)
    shown = preview_sync(req)
    (src / "000000.bin").unlink()
    (src / "000000.bin").symlink_to(outside)
    with pytest.raises(ShardError, match=r"000000\.bin resolves to .*outside\.bin, outside the source"):
        convert_sync(req, prepared=shown)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_folder_swapped_for_a_link_after_the_listing_is_refused(tmp_path: Path, workers: int) -> None:
    """Files are opened by name under their folder's descriptor: the folder is checked when it is
    opened, so a folder replaced after the listing by a link to a look-alike outside (same names,
    same sizes) ships nothing from outside."""
    src, dest, outside = tmp_path / "src", tmp_path / "out", tmp_path / "outside"
    make_dataset(src, n=3, sub="a")
    make_dataset(src, n=3, sub="b", seed=7)
    req = ShardRequest(str(src), str(dest), shard_size=10**6, workers=workers)
    shown = preview_sync(req)
    assert shown.ok
    outside.mkdir()
    for f in (src / "b").iterdir():  # same names and sizes: the listing's sizes still match
        (outside / f.name).write_bytes(SECRET[:1] * f.stat().st_size)
    (src / "b").rename(tmp_path / "b-moved")
    (src / "b").symlink_to(outside)
    with pytest.raises(ShardError, match=r"source folder .*/src/b resolves to .*/outside, outside the source"):
        convert_sync(req, prepared=shown)
    assert SECRET[:1] * 64 not in _shard_bytes(dest)


_JPG, _JSON = 96, 24  # every file of a kind has one size: a swap passes the size check


def _tree(root: Path, folders: tuple[str, ...], n: int, mark: bytes) -> dict[str, bytes]:
    """``n`` samples in each folder ("" is the root), each byte string starting with ``mark``."""
    data: dict[str, bytes] = {}
    for folder in folders:
        (root / folder).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            for ext, size in (("jpg", _JPG), ("json", _JSON)):
                rel = f"{folder}/{i:04d}.{ext}" if folder else f"{i:04d}.{ext}"
                body = (mark + rel.encode() + b"|" * size)[:size]
                (root / rel).write_bytes(body)
                data[rel] = body
    return data


_SWAP = st.tuples(
    st.sampled_from(["file-out", "file-in", "folder-out"]), st.sampled_from(["", "a", "b"]), st.integers(0, 2)
)


@settings(max_examples=40, deadline=None)
@given(swaps=st.lists(_SWAP, max_size=3), workers=st.sampled_from([0, 2]))
def test_no_swap_after_the_listing_ships_a_byte_from_outside(swaps: list[tuple[str, str, int]], workers: int) -> None:
    """The class, not the named examples: files and folders swapped after the listing for links
    to look-alikes outside (same names, same sizes) or to other files inside. Whatever the mix,
    no byte from outside is in a shard; the conversion refuses, naming the thing that leads out,
    exactly when something leads out; links within the source are shipped as data."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="lm-swap-") as tmp:
        base = Path(tmp)
        src, dest, outside = base / "src", base / "out", base / "outside"
        _tree(src, ("", "a", "b"), 3, b"IN:")
        _tree(outside, ("", "a", "b"), 3, b"OUTSIDE:")
        req = ShardRequest(str(src), str(dest), shard_size=10**6, workers=workers)
        shown = preview_sync(req)
        assert shown.ok
        leads_out = False
        for kind, folder, i in swaps:
            where = src / folder if folder else src
            if kind == "folder-out":
                if not folder or where.is_symlink():
                    continue  # the source itself is not swapped; a folder once
                where.rename(base / f"moved-{folder}")
                where.symlink_to(outside / folder)
                leads_out = True
                continue
            if where.is_symlink():
                continue  # its files are already outside
            target = where / f"{i:04d}.jpg"
            other = where / f"{(i + 1) % 3:04d}.jpg"
            if target.is_symlink():
                continue
            target.unlink()
            if kind == "file-out":
                target.symlink_to((outside / folder if folder else outside) / target.name)
                leads_out = True
            else:
                target.symlink_to(other.name)  # a link inside the source: data
        if leads_out:
            with pytest.raises(ShardError, match=r"resolves to .*outside.*, outside the source"):
                convert_sync(req, prepared=shown)
        else:
            convert_sync(req, prepared=shown)
        assert b"OUTSIDE:" not in _shard_bytes(dest)
