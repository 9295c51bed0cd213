"""An S3 delete names exact keys (1000 a request), never a prefix; a key counts as deleted only
when the response says so; a delete marker (a versioned bucket) is not a delete of the bytes.
Listing a folder never lists its longer-named siblings ("run/step-1" vs "run/step-10")."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from backend.config import StoreProfile
from backend.credentials import Credentials
from backend.errors import StoreError
from backend.storage import DELETE_BATCH, S3Store
from lab.seaweed import SeaweedS3


@pytest.fixture(scope="module")
def weed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    s3 = SeaweedS3(root=tmp_path_factory.mktemp("weed"))
    s3.start()
    try:
        yield s3
    finally:
        s3.stop()


def weed_store(weed: SeaweedS3, prefix: str = "") -> S3Store:
    bucket = weed.new_bucket("del")
    url = f"s3://{bucket}/{prefix}".rstrip("/")
    profile = StoreProfile(url=url, endpoint_url=weed.endpoint, region=weed.region, addressing_style="path")
    return S3Store(url, profile, credentials=Credentials(weed.access_key, weed.secret_key))


def put(weed: SeaweedS3, store: S3Store, keys: list[str]) -> None:
    weed.put_many(store.bucket, {(f"{store.prefix}/{k}" if store.prefix else k): k.encode() for k in keys})


def keys_of(weed: SeaweedS3, bucket: str) -> set[str]:
    out: set[str] = set()
    for page in weed.client().get_paginator("list_objects_v2").paginate(Bucket=bucket):
        out |= {o["Key"] for o in page.get("Contents", [])}
    return out


async def _list_and_delete(store: S3Store, sub: str) -> tuple[list[str], Any]:
    async with store:
        keys = [o.key for o in await store.list(sub)]
        return keys, await store.delete_many(keys)


def test_deleting_step_1_never_touches_step_10(weed: SeaweedS3) -> None:
    store = weed_store(weed, "team")
    put(weed, store, ["run/step-1/model.pt", "run/step-1/optim.pt", "run/step-10/model.pt", "run/step-1.bak"])
    for sub in ("run/step-1", "run/step-1/"):
        keys, res = asyncio.run(_list_and_delete(weed_store_same(store), sub))
        assert all(k.startswith("run/step-1/") for k in keys)
        assert res.ok
    assert keys_of(weed, store.bucket) == {"team/run/step-10/model.pt", "team/run/step-1.bak"}


def weed_store_same(store: S3Store) -> S3Store:
    return S3Store(store.url, store.profile, credentials=store._credentials)


def test_more_than_a_batch_is_deleted_key_by_key(weed: SeaweedS3) -> None:
    store = weed_store(weed)
    keys = [f"run/step-1/{i:05d}.bin" for i in range(DELETE_BATCH + 7)]
    put(weed, store, [*keys, "run/step-10/keep.bin"])
    calls: list[int] = []

    async def go() -> Any:
        async with store:
            client = await store.client()
            client.meta.events.register(
                "before-call.s3.DeleteObjects", lambda params, **_: calls.append(params["body"].count(b"<Key>"))
            )
            return await store.delete_many(keys)

    res = asyncio.run(go())
    assert res.ok and sorted(res.deleted) == keys and calls == [DELETE_BATCH, 7]
    assert keys_of(weed, store.bucket) == {"run/step-10/keep.bin"}


class FakeClient:
    """DeleteObjects answering what a store may answer: 200 with Errors, silent omissions,
    keys never asked for, delete markers."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[list[str]] = []

    async def delete_objects(self, Bucket: str, Delete: dict[str, Any]) -> dict[str, Any]:  # noqa: N803
        full = [o["Key"] for o in Delete["Objects"]]
        self.asked.append(full)
        return self.answer(full)


def fake_store(answer: Any) -> tuple[S3Store, FakeClient]:
    store = S3Store("s3://bucket/team")
    client = FakeClient(answer)
    store._client = client
    return store, client


def test_keys_not_in_deleted_are_not_deleted() -> None:
    def answer(full: list[str]) -> dict[str, Any]:
        return {
            "Deleted": [{"Key": full[0]}, {"Key": "team/run/step-10/model.pt"}],  # one asked, one never asked
            "Errors": [{"Key": full[1], "Code": "AccessDenied", "Message": "Access Denied"}],
        }  # full[2]: named nowhere

    store, client = fake_store(answer)
    res = asyncio.run(store.delete_many(["run/step-1/a", "run/step-1/b", "run/step-1/c"]))
    assert client.asked == [["team/run/step-1/a", "team/run/step-1/b", "team/run/step-1/c"]]
    assert res.deleted == ("run/step-1/a",)
    assert res.errors["run/step-1/b"] == "AccessDenied: Access Denied"
    assert "did not confirm" in res.errors["run/step-1/c"]
    assert "run/step-10/model.pt" not in res.deleted and not res.ok


def test_a_delete_marker_is_not_a_delete_of_the_bytes() -> None:
    def answer(full: list[str]) -> dict[str, Any]:
        return {"Deleted": [{"Key": k, "DeleteMarker": True, "DeleteMarkerVersionId": "v2"} for k in full]}

    store, _ = fake_store(answer)
    res = asyncio.run(store.delete_many(["run/step-1/a"]))
    assert res.deleted == () and res.hidden == ("run/step-1/a",)


def test_a_listing_returning_keys_outside_the_folder_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime as dt

    store = S3Store("s3://bucket/team")

    async def pages(sub: str = "", *, delimiter: str | None = None) -> Any:
        now = dt.datetime.now(dt.UTC)
        yield {"Contents": [{"Key": "team/run/step-1/a", "Size": 1, "LastModified": now}]}
        yield {"Contents": [{"Key": "team/run/step-10/a", "Size": 1, "LastModified": now}]}

    monkeypatch.setattr(store, "iter_pages", pages)
    with pytest.raises(StoreError, match="outside it"):
        asyncio.run(store.list("run/step-1"))


def test_the_listing_prefix_is_always_a_folder() -> None:
    store = S3Store("s3://bucket/team")
    assert store.folder_prefix("run/step-1") == "team/run/step-1/"
    assert store.folder_prefix("run/step-1/") == "team/run/step-1/"
    assert store.folder_prefix("") == "team/"
    assert S3Store("s3://bucket").folder_prefix("") == ""
