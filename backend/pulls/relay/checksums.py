"""Console side of a relay pull's proofs: the store's full-object checksum of each listed object.

A receiver has no credentials, so it cannot ask the store; and a peer is data, not authority, so it
cannot take a checksum from its upstream. The console, which lists the source anyway, asks the
store for each object's checksums (one HEAD with ``ChecksumMode=ENABLED``, a few at a time) and
puts the full-object ones in the relay spec (``relay["checksums"]``: one ``"ALGORITHM:BASE64"``
or None per listed object). Each receiver then proves an object's bytes with the method a direct
pull would choose (``backend.pulls.relay.node.receiver_proofs``): that checksum, else a single-part
object's MD5 ETag. Composite (per-part) checksums are left out: a receiver does not know the part
boundaries. What the store answers is parsed as a direct pull parses it
(``backend.pulls.integrity.parse_checksum_value``): a malformed value is no checksum.

A multipart object without a full-object checksum is proven as a direct pull proves it: its
multipart ETag (the MD5 of its parts' MD5s) over the part size the store gives for part 1 (one
HEAD with ``PartNumber=1``, :func:`listing_part_sizes`), in ``relay["part_sizes"]``. Without
it, a peer holding the relay secret could send any bytes of the listed size for such an object.

``backend.pulls.launch.launch_relay`` reads them once per launch, before the first job starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from backend.pulls.integrity import ALGORITHMS, multipart_etag_parts, parse_checksum_value

if TYPE_CHECKING:
    from backend.storage import S3Store

#: HEADs in flight at once.
HEADS_AT_ONCE = 16


def full_object_checksum(head: Mapping[str, object]) -> str | None:
    """``"ALGORITHM:BASE64"`` of the cheapest full-object checksum in a HEAD answer (botocore's
    ``ChecksumCRC64NVME`` ... keys), or None."""
    kind = head.get("ChecksumType")
    for alg in ALGORITHMS:  # cheapest first
        value = head.get(f"Checksum{alg.upper()}")
        if isinstance(value, str):
            c = parse_checksum_value(alg, value, kind if isinstance(kind, str) else None)
            if c is not None and c.parts is None:
                return f"{alg}:{c.text()}"
    return None


async def listing_checksums(store: S3Store, keys: Sequence[str]) -> list[str | None]:
    """The full-object checksum of each of ``keys`` in ``store`` (an ``S3Store``, keys relative
    to its bucket), None where the store keeps none. A store that refuses checksum mode, or a
    HEAD that fails, gives None for that object: the receiver falls back to the MD5 ETag."""
    client = await store.client()
    gate = asyncio.Semaphore(HEADS_AT_ONCE)

    async def one(key: str) -> str | None:
        async with gate:
            try:
                head = await client.head_object(Bucket=store.bucket, Key=key, ChecksumMode="ENABLED")
            except Exception:  # noqa: BLE001 - no checksum is a weaker proof, never a failed launch
                return None
        return full_object_checksum(head)

    return list(await asyncio.gather(*(one(k) for k in keys)))


async def listing_part_sizes(
    store: S3Store, keys: Sequence[str], etags: Sequence[str | None], checksums: Sequence[str | None]
) -> list[int | None]:
    """The length of part 1 of each object with a multipart ETag and no full-object checksum
    (what a receiver needs to prove it by its ETag, as a direct pull does); None for the others,
    and where the HEAD fails or gives no whole length (that object keeps the per-hop check alone)."""
    client = await store.client()
    gate = asyncio.Semaphore(HEADS_AT_ONCE)

    async def one(key: str, etag: str | None, checksum: str | None) -> int | None:
        if checksum is not None or multipart_etag_parts(etag) is None:
            return None
        async with gate:
            try:
                head = await client.head_object(Bucket=store.bucket, Key=key, PartNumber=1)
            except Exception:  # noqa: BLE001 - no part size is a weaker proof, never a failed launch
                return None
        n = head.get("ContentLength")
        return n if type(n) is int and n > 0 else None

    return list(await asyncio.gather(*(one(k, e, c) for k, e, c in zip(keys, etags, checksums, strict=True))))
