"""Sample data for the sandbox lab: a small dataset, tar shards and real DCP checkpoints."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import tarfile
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

DATASET_PREFIX = "datasets/laion-mini"
CHECKPOINT_RUN = "checkpoints/llama-demo"


#: The checksum the lab's objects carry: AWS S3 stores a full-object CRC64NVME for every object
#: written today (one the client sent, or one it computes), so the lab's store serves one too.
SEED_CHECKSUM = "CRC64NVME"


#: Uploads in flight at once while seeding: each PUT is one round trip to a store on this machine,
#: so a few at a time keep both the client and SeaweedFS busy (botocore's pool holds 10).
SEED_THREADS = 8


def put_all(
    client: Any, bucket: str, objects: list[tuple[str, bytes]], *, checksum: str | None = SEED_CHECKSUM
) -> None:
    """PUT every ``(key, body)`` a few at a time (botocore clients are thread-safe), with
    ``checksum`` as :func:`put_object`; the first failure is raised once every upload has ended.
    Nothing here orders one object after another: callers that need an order (a commit marker
    last) call this again for the later objects."""
    if not objects:
        return
    with ThreadPoolExecutor(max_workers=min(SEED_THREADS, len(objects)), thread_name_prefix="lab-seed") as pool:
        futures = [pool.submit(put_object, client, bucket, key, body, checksum=checksum) for key, body in objects]
    for fut in futures:
        fut.result()


def put_object(client: Any, bucket: str, key: str, body: bytes, *, checksum: str | None = SEED_CHECKSUM) -> None:
    """PUT ``body`` with the store keeping ``checksum`` (an S3 additional checksum algorithm) for
    it; ``None`` sends none beyond what the client adds by default."""
    kwargs = {"ChecksumAlgorithm": checksum} if checksum else {}
    client.put_object(Bucket=bucket, Key=key, Body=body, **kwargs)


def put_multipart(
    client: Any,
    bucket: str,
    key: str,
    body: bytes,
    *,
    part_size: int,
    checksum: str | None = SEED_CHECKSUM,
    checksum_type: str = "FULL_OBJECT",
) -> str:
    """A multipart upload of ``body`` in parts of ``part_size`` (the last one shorter), with
    ``checksum`` kept over the full object ("FULL_OBJECT", as the AWS CLI does with CRC64NVME)
    or over the parts ("COMPOSITE"); no checksum at all with ``checksum=None``. Returns the ETag."""
    import base64

    kwargs = {"ChecksumAlgorithm": checksum, "ChecksumType": checksum_type} if checksum else {}
    upload = client.create_multipart_upload(Bucket=bucket, Key=key, **kwargs)["UploadId"]
    parts = []
    part_kwargs = {"ChecksumAlgorithm": checksum} if checksum else {}
    for n, off in enumerate(range(0, max(len(body), 1), part_size), start=1):
        r = client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload, PartNumber=n, Body=body[off : off + part_size], **part_kwargs
        )
        parts.append({"PartNumber": n, "ETag": r["ETag"], **{k: v for k, v in r.items() if k.startswith("Checksum")}})
    done: dict[str, Any] = {}
    if checksum and checksum_type == "FULL_OBJECT":
        from backend.pulls.integrity import ALGORITHMS, new_hasher

        h = new_hasher(checksum.lower())
        h.update(body)
        assert checksum.lower() in ALGORITHMS
        done = {f"Checksum{checksum}": base64.b64encode(h.digest()).decode(), "ChecksumType": "FULL_OBJECT"}
    r = client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}, **done
    )
    return str(r["ETag"]).strip('"')


def s3_client(endpoint: str, access_key: str, secret_key: str, region: str = "us-east-1"):  # type: ignore[no-untyped-def]
    """A synchronous botocore S3 client on a lab store (test set-up and the lab's seeding; never
    used by the product)."""
    import botocore.session
    from botocore.config import Config as BotoConfig

    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
    )


def lab_client(root: Path) -> Any:
    """A botocore S3 client on the store of the lab running in ``root`` (its ``lab.json`` and
    credentials file), for looking at or restoring the sample data from another process."""
    import configparser

    info = json.loads((root / "lab.json").read_text())
    creds = configparser.ConfigParser()
    creds.read(root / "s3" / "aws-credentials")
    return s3_client(info["s3"]["endpoint"], creds["lab"]["aws_access_key_id"], creds["lab"]["aws_secret_access_key"])


def list_objects(client: Any, bucket: str, prefix: str = "") -> dict[str, tuple[int, str]]:
    """Every object under ``prefix``: its size and ETag, by key."""
    objects: dict[str, tuple[int, str]] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        objects.update((o["Key"], (o["Size"], o["ETag"])) for o in page.get("Contents", []))
    return objects


def seed_dataset(
    client: Any, bucket: str, *, samples: int = 120, shards: int = 8, shard_bytes: int = 4 * 2**20, rng_seed: int = 7
) -> dict[str, int]:
    """Raw jpg+json sample files and a few tar shards (what a pull or a conversion reads); the
    bytes come from ``rng_seed`` in a fixed order, then go up a few at a time."""
    rng = random.Random(rng_seed)
    raw = 0
    shard_total = 0
    objects: list[tuple[str, bytes]] = []
    for i in range(samples):
        key = f"{i:06d}"
        jpg = rng.randbytes(rng.randint(8_000, 24_000))
        meta = json.dumps({"key": key, "caption": f"sample {i}", "width": 256, "height": 256}).encode()
        objects += [(f"{DATASET_PREFIX}/raw/{key}.jpg", jpg), (f"{DATASET_PREFIX}/raw/{key}.json", meta)]
        raw += len(jpg) + len(meta)
    for s in range(shards):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            payload = rng.randbytes(shard_bytes)
            info = tarfile.TarInfo(f"{s:06d}.bin")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        objects.append((f"{DATASET_PREFIX}/shards/shard-{s:06d}.tar", buf.getvalue()))
        shard_total += len(buf.getvalue())
    put_all(client, bucket, objects)
    return {"raw_objects": samples * 2, "raw_bytes": raw, "shards": shards, "shard_bytes": shard_total}


def seed_checkpoints(
    client: Any,
    bucket: str,
    *,
    steps: range = range(1000, 12001, 1000),
    in_flight: int | None = 12000,
    milestones: tuple[int, ...] = (4000, 8000),
) -> list[int]:
    """Real torch.distributed.checkpoint saves of a tiny model + AdamW, one per step.

    The ``in_flight`` step is uploaded without its ``.metadata`` commit marker, the way a reader
    sees a checkpoint whose upload is still running. Milestone steps carry a MILESTONE marker.
    Every step's data goes up first, then the markers (``.metadata`` and MILESTONE): no step is
    ever listed committed before all of its files are there.
    """
    saved = saved_checkpoints(steps)
    data: list[tuple[str, bytes]] = []
    markers: list[tuple[str, bytes]] = []
    for step in steps:
        for f in sorted((saved / f"step-{step}").iterdir()):
            key = f"{CHECKPOINT_RUN}/step-{step}/{f.name}"
            if f.name != ".metadata":
                data.append((key, f.read_bytes()))
            elif step != in_flight:
                markers.append((key, f.read_bytes()))
        if step in milestones:
            markers.append((f"{CHECKPOINT_RUN}/step-{step}/MILESTONE", b""))
    put_all(client, bucket, data)
    put_all(client, bucket, markers)
    return list(steps)


def saved_checkpoints(steps: range) -> Path:
    """The folder holding a ``step-N`` DCP save for each of ``steps``, made once per torch version.

    Importing torch, and the ``torch._dynamo`` its optimizers import, is most of a ``lab up``
    (~6 s of a quiet machine's CPU) while the same seed saves the same tiny model every time:
    the saves are kept in the user's cache dir and made again only for another torch or steps.
    Raises ImportError without torch, as the import would.
    """
    import importlib.metadata

    import platformdirs

    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError("torch is not installed") from None
    parent = Path(platformdirs.user_cache_dir("loadmaster")) / "lab-checkpoints"
    kept = parent / f"torch-{version}-steps-{steps.start}-{steps.stop}-{steps.step}"
    if kept.is_dir():
        return kept
    parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=parent))
    try:
        _save_steps(building, steps)
        try:
            building.rename(kept)  # whole or not at all; only ever made by this rename
        except OSError:
            if not kept.is_dir():
                raise
            shutil.rmtree(building)  # another lab up kept the same saves first
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return kept


def _save_steps(folder: Path, steps: range) -> None:
    """One DCP save of the model and its AdamW state per step, into ``folder/step-N``."""
    import torch
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in steps:
        model(torch.randn(4, 64)).sum().backward()
        optim.step()
        optim.zero_grad()
        with warnings.catch_warnings():  # single-process save: no process group, by design
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(
                {"model": model.state_dict(), "optim": optim.state_dict()}, checkpoint_id=str(folder / f"step-{step}")
            )
    os.environ.pop("TORCH_DISTRIBUTED_DEBUG", None)


def seeded_lines(
    bucket: str, dataset: dict[str, int] | None, steps: list[int] | None, *, in_flight: int | None = 12000
) -> list[str]:
    """What the sandbox holds, one line per place with its ``s3://`` URL (``lab up`` prints it)."""
    from backend.textfmt import align_columns
    from backend.units import bytes_text

    rows: list[list[str]] = []
    if dataset:
        rows.append(
            [
                f"s3://{bucket}/{DATASET_PREFIX}/raw/",
                f"{dataset['raw_objects'] // 2} samples (.jpg + .json: {dataset['raw_objects']} files, "
                f"{bytes_text(dataset['raw_bytes'])})",
            ]
        )
        rows.append(
            [
                f"s3://{bucket}/{DATASET_PREFIX}/shards/",
                f"{dataset['shards']} tar shards, {bytes_text(dataset['shard_bytes'])}",
            ]
        )
    if steps:
        flight = f" ({in_flight} still uploading)" if in_flight in steps else ""
        rows.append(
            [f"s3://{bucket}/{CHECKPOINT_RUN}/", f"{len(steps)} DCP checkpoints, steps {steps[0]}-{steps[-1]}{flight}"]
        )
    return ["  " + line for line in align_columns(rows)]
