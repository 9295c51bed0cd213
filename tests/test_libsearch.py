"""The quicker find_library used while asyncssh is imported answers as ctypes' own does."""

from __future__ import annotations

import ctypes.util
import sys
from pathlib import Path

import pytest

from backend.nodes.libsearch import quick_find_library, quick_library_search

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux library search")


@pytest.mark.parametrize("name", ["c", "m", "z", "no-such-library-here", "oqs"])
def test_same_answer_as_ctypes(name: str) -> None:
    assert quick_find_library(name, ctypes.util.find_library) == ctypes.util.find_library(name)


def test_a_file_outside_the_ldconfig_cache_goes_to_the_full_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "liblmfake.so.1").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    asked: list[str] = []

    def original(name: str) -> str | None:
        asked.append(name)
        return "liblmfake.so.1"

    assert quick_find_library("lmfake", original) == "liblmfake.so.1"
    assert asked == ["lmfake"]
    assert quick_find_library("lmabsent", original) is None and asked == ["lmfake"]


def test_the_patch_is_undone() -> None:
    before = ctypes.util.find_library
    with quick_library_search():
        assert ctypes.util.find_library is not before
        assert ctypes.util.find_library("c") == before("c")
    assert ctypes.util.find_library is before
