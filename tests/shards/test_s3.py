"""S3 -> S3 against the lab's real SeaweedFS: paginated listing, bounded GETs, multipart uploads."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import webdataset as wds

from backend.errors import LoadmasterError
from backend.shards.convert import convert, preview
from backend.shards.model import ShardRequest
from backend.shards.plan import ShardError
from backend.shards.verify import verify

pytestmark = pytest.mark.lab


def put_dataset(s3: Any, bucket: str, prefix: str, n: int, tmp: Path) -> dict[str, dict[str, bytes]]:
    """``n`` samples (a .jpg and a .json each) under ``prefix``, put with the real s5cmd from a
    local copy in ``tmp``: one process puts the thousand small objects in a fraction of the
    time a Python client's per-request work takes."""
    import random

    rng = random.Random(11)
    data: dict[str, dict[str, bytes]] = {}
    local = tmp / "dataset"
    local.mkdir()
    for i in range(n):
        key = f"{i:05d}"
        jpg = rng.randbytes(rng.randint(200, 2500))
        meta = json.dumps({"i": i}).encode()
        (local / f"{key}.jpg").write_bytes(jpg)
        (local / f"{key}.json").write_bytes(meta)
        data[key] = {"jpg": jpg, "json": meta}
    s5cmd = shutil.which("s5cmd") or str(Path(sys.executable).parent / "s5cmd")
    env = dict(os.environ, AWS_ACCESS_KEY_ID=s3.access_key, AWS_SECRET_ACCESS_KEY=s3.secret_key, AWS_REGION=s3.region)
    env.pop("AWS_PROFILE", None)
    subprocess.run(
        [s5cmd, "--endpoint-url", s3.endpoint, "cp", f"{local}/*", f"s3://{bucket}/{prefix}/"],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    shutil.rmtree(local)
    return data


def test_s3_to_s3_round_trip_and_verify(lab: Any, s3: Any, tmp_path: Path) -> None:
    src_bucket, dest_bucket = s3.new_bucket("shsrc"), s3.new_bucket("shdst")
    client = s3.client()
    # > 1000 objects: the listing must paginate
    data = put_dataset(s3, src_bucket, "raw", 520, tmp_path)
    base = lab.config.stores["lab"]
    sprof = dataclasses.replace(base, url=f"s3://{src_bucket}")
    dprof = dataclasses.replace(base, url=f"s3://{dest_bucket}")
    req = ShardRequest(
        f"s3://{src_bucket}/raw",
        f"s3://{dest_bucket}/shards",
        shard_size=64_000,
        fetch_concurrency=8,
        pending_uploads=1,
        spool_dir=str(tmp_path / "spool"),
    )

    pv = asyncio.run(preview(req, src_profile=sprof, dest_profile=dprof))
    assert (pv.files, pv.samples) == (1040, 520) and pv.ok
    assert pv.requests.gets_before == 1040 and pv.requests.gets_after == pv.shards
    # priced from the egress engineer's table for the store's provider (aws)
    assert pv.requests.price_source == "Amazon S3 GET price" and pv.requests.get_per_1000 == 0.0004

    progress: list[Any] = []
    result = asyncio.run(convert(req, src_profile=sprof, dest_profile=dprof, on_progress=progress.append))
    assert len(result.written) == pv.shards and progress[-1].final
    assert not list((tmp_path / "spool").rglob("*.tar"))  # spool emptied as shards went up

    listing = client.list_objects_v2(Bucket=dest_bucket, Prefix="shards/")["Contents"]
    names = sorted(o["Key"].rsplit("/", 1)[1] for o in listing if o["Key"].endswith(".tar"))
    assert names == [e.name for e in result.manifest.shards]
    head = client.head_object(Bucket=dest_bucket, Key=f"shards/{names[0]}")
    assert head["ETag"].strip('"').endswith("-1")  # went up as a multipart upload

    got: dict[str, dict[str, bytes]] = {}
    for name in names:
        body = client.get_object(Bucket=dest_bucket, Key=f"shards/{name}")["Body"].read()
        path = tmp_path / name
        path.write_bytes(body)
        for s in wds.WebDataset(str(path), shardshuffle=False):
            got[s["__key__"]] = {"jpg": s["jpg"], "json": s["json"]}
    assert got == data

    report = asyncio.run(verify(f"s3://{dest_bucket}/shards", profile=dprof))
    assert report.ok, report.summary()
    assert report.samples == 520

    # a second run into the same prefix is refused; --resume finds every shard done
    with pytest.raises(ShardError, match="already has"):
        asyncio.run(convert(req, src_profile=sprof, dest_profile=dprof))
    # a killed run can leave an unfinished multipart upload behind (its id in the destination's
    # journal): --resume aborts it, and leaves alone the upload someone else has in progress there
    from backend.storage.multipart import MultipartJournal

    killed = client.create_multipart_upload(Bucket=dest_bucket, Key=f"shards/{names[-1]}")["UploadId"]
    MultipartJournal.for_destination(f"s3://{dest_bucket}/shards").started(dest_bucket, f"shards/{names[-1]}", killed)
    theirs = client.create_multipart_upload(Bucket=dest_bucket, Key=f"shards/{names[0]}")["UploadId"]
    logs: list[str] = []
    again = asyncio.run(
        convert(dataclasses.replace(req, resume=True), src_profile=sprof, dest_profile=dprof, on_log=logs.append)
    )
    assert again.written == () and len(again.resumed) == len(names)
    left = client.list_multipart_uploads(Bucket=dest_bucket, Prefix="shards/").get("Uploads", [])
    assert [u["UploadId"] for u in left] == [theirs]
    assert any("aborted 1 unfinished multipart upload" in m for m in logs)
    client.abort_multipart_upload(Bucket=dest_bucket, Key=f"shards/{names[0]}", UploadId=theirs)

    # tamper with one shard in the bucket: verify catches it
    client.put_object(Bucket=dest_bucket, Key=f"shards/{names[0]}", Body=io.BytesIO(b"x" * 1024).read())
    bad = asyncio.run(verify(f"s3://{dest_bucket}/shards", profile=dprof))
    assert not bad.ok and [c.name for c in bad.checks if not c.ok] == [names[0]]


def test_local_to_s3_missing_bucket_is_a_clear_error(lab: Any, s3: Any, tmp_path: Path) -> None:
    from tests.shards.conftest import make_dataset

    make_dataset(tmp_path / "src", n=4)
    base = lab.config.stores["lab"]
    prof = dataclasses.replace(base, url="s3://no-such-bucket-lm")
    req = ShardRequest(str(tmp_path / "src"), "s3://no-such-bucket-lm/x", shard_size=64_000)
    with pytest.raises(LoadmasterError, match="bucket 'no-such-bucket-lm' does not exist"):
        asyncio.run(convert(req, dest_profile=prof))


def test_large_shard_goes_up_in_several_parts(lab: Any, s3: Any, tmp_path: Path) -> None:
    from tests.shards.conftest import make_dataset

    src = tmp_path / "src"
    data = make_dataset(src, n=12, jpg_size=(1_000_000, 1_000_000))
    bucket = s3.new_bucket("shbig")
    prof = dataclasses.replace(lab.config.stores["lab"], url=f"s3://{bucket}")
    req = ShardRequest(str(src), f"s3://{bucket}/big", shard_size=64_000_000, upload_part_size=5 * 2**20)
    result = asyncio.run(convert(req, dest_profile=prof))
    (entry,) = result.manifest.shards
    client = s3.client()
    head = client.head_object(Bucket=bucket, Key=f"big/{entry.name}")
    assert head["ETag"].strip('"').endswith("-3") and head["ContentLength"] == entry.bytes
    report = asyncio.run(verify(f"s3://{bucket}/big", profile=prof))
    assert report.ok and report.samples == len(data)


def test_closing_the_sink_aborts_an_upload_in_flight(lab: Any, s3: Any, tmp_path: Path) -> None:
    """A cancelled conversion's shard upload is aborted (no orphaned parts) before the client closes."""
    import errno
    import os

    from backend.shards.manifest import ShardEntry
    from backend.shards.sinks import S3Sink
    from backend.storage import S3Store

    bucket = s3.new_bucket("shcancel")
    prof = dataclasses.replace(lab.config.stores["lab"], url=f"s3://{bucket}/x")
    req = ShardRequest(str(tmp_path), f"s3://{bucket}/x", spool_dir=str(tmp_path / "spool"))
    client = s3.client()
    link = tmp_path / "fifo-link"

    def release_reader() -> None:
        """Let the part reader blocked opening the FIFO go (it then fails on its own, unheard)."""
        for _ in range(500):
            try:
                os.close(os.open(link, os.O_WRONLY | os.O_NONBLOCK))
                return
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # ENXIO: no reader (yet)
                    raise
            time.sleep(0.01)

    async def main() -> None:
        store = S3Store(f"s3://{bucket}/x", prof)
        sink = S3Sink(store, asyncio.get_running_loop(), req)
        await sink.open()
        # A FIFO as the spooled shard: reading its part blocks until a writer opens it, so the
        # multipart upload is certainly created and unfinished when the sink is closed.
        fifo = sink.temp_path("shard-000000.tar")
        os.mkfifo(fifo)
        os.link(fifo, link)  # the sink removes the spooled name; this one lets the reader go
        task = asyncio.ensure_future(sink._upload(ShardEntry("shard-000000.tar", 0, 0, 0, ""), fifo))
        for _ in range(2000):
            if client.list_multipart_uploads(Bucket=bucket, Prefix="x/").get("Uploads"):
                break
            await asyncio.sleep(0.01)
        assert client.list_multipart_uploads(Bucket=bucket, Prefix="x/").get("Uploads")
        try:
            await sink.aclose()
        finally:
            await asyncio.to_thread(release_reader)
        assert task.cancelled()
        assert not client.list_multipart_uploads(Bucket=bucket, Prefix="x/").get("Uploads")
        assert not (tmp_path / "spool").exists() or not any((tmp_path / "spool").iterdir())
        await store.close()

    asyncio.run(main())
