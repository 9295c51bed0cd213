"""Keys that a file system or an S3 gateway could read as another name are refused, local and S3
alike, with one line and before anything is deleted or written."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backend.errors import StoreError
from backend.storage import DeleteResult, LocalStore, S3Store
from backend.storage.keys import key_problem

BAD = [
    "",
    "../outside.pt",
    "run/../../outside.pt",
    "run/./step-1/model.pt",
    "run//step-1/model.pt",
    "/etc/passwd",
    "run/step-1/",
    "run/step\x00-1",
    "run\\step-1\\model.pt",
    "run/" + "x" * 256,
    "r/" * 600 + "x",
    "run/step\n-1",
    "run/\u202estep-1",  # a bidi override
    "run/\udcff.pt",  # a name that is not UTF-8 (surrogate escape)
]


@pytest.mark.parametrize("key", BAD)
def test_a_bad_key_is_named_in_one_line(key: str) -> None:
    assert key_problem(key) is not None
    if key == "":  # no object's key; as a local path, the store's root (a strip's output folder)
        assert LocalStore("/nonexistent-root").local_path(key) == Path("/nonexistent-root")
        return
    store = LocalStore("/nonexistent-root")
    if key_problem(key, acting=False) is None:
        # A control or formatting character: such a name exists and is read and listed (shown
        # cleaned), but never deleted or written.
        with pytest.raises(StoreError) as info:
            asyncio.run(store.put_bytes(key, b"x"))
        assert "\n" not in str(info.value) and "refused key" in str(info.value)
        assert asyncio.run(store.delete_many([key])).errors
        return
    with pytest.raises(StoreError) as info:
        store.local_path(key)
    assert "\n" not in str(info.value) and "refused key" in str(info.value)


@pytest.mark.parametrize(
    "key",
    [
        "run/step-1/model.pt",
        "a",
        "run/café.pt",
        "run/step-1/.metadata",
        "x" * 255,
        # Names as other tools write them: S3 and the file systems keep them byte for byte, so
        # the exact key names one object; refusing them would make such a dataset unreadable.
        "run/caf\u0065\u0301.pt",  # NFD, as macOS writes it
        "run/ﬁle.pt",  # a ligature
        "data/ｆｕｌｌ/x².jpg",  # full-width and superscript characters
    ],
)
def test_good_keys_pass(key: str) -> None:
    assert key_problem(key) is None


def test_a_local_delete_holding_one_bad_key_deletes_nothing(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.pt").write_bytes(b"k")
    (tmp_path / "outside.pt").write_bytes(b"o")
    store = LocalStore(tmp_path / "run")
    res = asyncio.run(store.delete_many(["keep.pt", "../outside.pt"]))
    assert res.deleted == () and set(res.errors) == {"keep.pt", "../outside.pt"}
    assert "'..' component" in res.errors["../outside.pt"] and "refused key" in res.errors["keep.pt"]
    assert (tmp_path / "run" / "keep.pt").exists() and (tmp_path / "outside.pt").exists()
    for key in ("run//x", "./x", "../x"):
        with pytest.raises(StoreError, match="refused key"):
            asyncio.run(store.put_bytes(key, b"x"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside.pt", "run"]


class NoClient:
    """A client that records every request it is asked to make (and makes none)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> object:
        self.calls.append(name)
        raise RuntimeError("offline")


@pytest.mark.parametrize("key", ["../x", "run//x", "/run/x", "run/./x", "run/x/", "run\\x"])
def test_an_s3_delete_or_write_of_a_bad_key_makes_no_request(key: str) -> None:
    store = S3Store("s3://bucket/prefix")
    store._client = client = NoClient()
    res: DeleteResult = asyncio.run(store.delete_many(["run/ok.pt", key]))
    assert res.deleted == () and set(res.errors) == {"run/ok.pt", key} and "refused key" in res.errors[key]
    with pytest.raises(StoreError, match="refused key"):
        asyncio.run(store.put_bytes(key, b"x"))
    with pytest.raises(StoreError, match="refused key"):
        asyncio.run(store.stat(key))
    assert client.calls == []


def test_an_s3_url_whose_prefix_is_not_a_key_is_refused() -> None:
    with pytest.raises(StoreError, match="refused key"):
        S3Store("s3://bucket/run/../other")
