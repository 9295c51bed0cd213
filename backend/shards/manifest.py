"""The manifest written next to the shards, the resume journal, and the GET arithmetic.

``manifest.json`` lists every shard (name, bytes, samples, and its digest under the name of the
hash that made it: ``blake3``, or ``sha256`` in manifests written before) with totals, the hash
algorithm (``hash``), and what the conversion saves per epoch: one GET per file before, one per shard after, priced at the store's
GET price (``backend.policy.prices`` when it prices the provider; S3 Standard otherwise).
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backend.config import Config, StoreProfile
from backend.nodes.untrusted import loads_bounded
from backend.policy.prices import PriceOverrides, price_table
from backend.units import bytes_text, usd_text

MANIFEST_NAME = "manifest.json"
FORMAT = "loadmaster-shards/2"
#: Formats read back: /1 (every shard's ``sha256``) and /2 (the ``hash`` it names, per shard too).
READ_FORMATS = ("loadmaster-shards/1", FORMAT)
#: The hash new shards are written with: BLAKE3 (cryptographic, SIMD: ~4x sha256 on one core),
#: so hashing a shard costs little beside writing it (bench/shard.py, against GNU tar).
HASH = "blake3"


def _blake3() -> Any:
    import blake3  # a compiled extension, imported when a shard is hashed, not at console start

    return blake3.blake3(max_threads=1)


#: Every hash a manifest may name, with a constructor of an incremental hasher (``update``,
#: ``hexdigest``) and its digest length in hex digits.
HASHES: dict[str, tuple[Callable[[], Any], int]] = {"blake3": (_blake3, 64), "sha256": (hashlib.sha256, 64)}


def new_hasher(algorithm: str = HASH) -> Any:
    """An incremental hasher for ``algorithm`` (one of :data:`HASHES`)."""
    return HASHES[algorithm][0]()


#: A manifest is read back from a destination someone else may write: its size and nesting are
#: bounded (one shard is ~150 bytes: 256 MiB holds well over a million shards).
MANIFEST_MAX_BYTES = 256 * 1024 * 1024
#: A journal entry (one shard) is ~200 bytes.
JOURNAL_MAX_BYTES = 64 * 1024
_Bytes = bytes  # Manifest has a ``bytes`` property: the builtin under another name for its annotations
#: S3 Standard GET price, USD per 1,000 requests (https://aws.amazon.com/s3/pricing/).
DEFAULT_GET_PER_1000 = 0.0004


@dataclass(frozen=True)
class ShardEntry:
    """One finished shard as the journal and the manifest record it."""

    name: str
    bytes: int
    samples: int
    files: int
    digest: str
    #: The algorithm of ``digest``: :data:`HASH` for new shards, ``sha256`` for older ones.
    hash: str = HASH

    def as_dict(self) -> dict[str, Any]:
        """The JSON object: the digest under its algorithm's name (``"blake3": "..."``)."""
        return {
            "name": self.name,
            "bytes": self.bytes,
            "samples": self.samples,
            "files": self.files,
            self.hash: self.digest,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShardEntry:
        """An entry from its JSON object; ValueError/KeyError/TypeError when it is not one."""
        if not isinstance(d, dict):
            raise TypeError(f"a shard entry must be an object, got {type(d).__name__}")
        algos = [a for a in HASHES if a in d]
        if len(algos) != 1:
            raise ValueError(
                f"shard {str(d.get('name'))[:80]!r} must carry exactly one digest, under one of "
                f"{', '.join(HASHES)} (has {len(algos)})"
            )
        algo = algos[0]
        digest = d[algo]
        if not isinstance(digest, str) or len(digest) != HASHES[algo][1] or not set(digest) <= _HEX:
            raise ValueError(f"shard {str(d.get('name'))[:80]!r}: {algo} is not {HASHES[algo][1]} hex digits")
        return cls(
            name=str(d["name"]),
            bytes=int(d["bytes"]),
            samples=int(d["samples"]),
            files=int(d.get("files", 0)),
            digest=digest,
            hash=algo,
        )


_HEX = frozenset(string.hexdigits.lower())


@dataclass(frozen=True)
class RequestArithmetic:
    """GETs to read the dataset once, before and after sharding, and what an epoch costs."""

    gets_before: int
    gets_after: int
    get_per_1000: float
    price_source: str

    @property
    def reduction(self) -> float:
        return self.gets_before / self.gets_after if self.gets_after else 0.0

    @property
    def usd_per_epoch_before(self) -> float:
        return self.gets_before / 1000 * self.get_per_1000

    @property
    def usd_per_epoch_after(self) -> float:
        return self.gets_after / 1000 * self.get_per_1000

    def as_dict(self) -> dict[str, Any]:
        return {
            "gets_before": self.gets_before,
            "gets_after": self.gets_after,
            "reduction": round(self.reduction, 2),
            "get_per_1000_usd": self.get_per_1000,
            "price_source": self.price_source,
            "usd_per_epoch_before": round(self.usd_per_epoch_before, 6),
            "usd_per_epoch_after": round(self.usd_per_epoch_after, 6),
        }

    def summary(self) -> str:
        """One line: GETs before -> after, the reduction and $ per epoch."""
        return (
            f"GETs per epoch {self.gets_before:,} -> {self.gets_after:,} "
            f"({self.reduction:,.0f}x fewer); {usd_text(self.usd_per_epoch_before)} -> "
            f"{usd_text(self.usd_per_epoch_after)} per epoch at ${self.get_per_1000:g}/1k GETs "
            f"({self.price_source})"
        )


def get_price(config: Config | None, *profiles: StoreProfile | None) -> tuple[float, str]:
    """GET price per 1,000 for the first priced store among ``profiles`` (the read side first)."""
    if not any(p is not None and p.provider for p in profiles):
        return DEFAULT_GET_PER_1000, "S3 Standard GET price"  # nothing to look up: skip the table
    try:
        table = price_table(config.section(PriceOverrides) if config else None)
    except Exception:  # noqa: BLE001 - a bad price table must not stop a conversion
        return DEFAULT_GET_PER_1000, "S3 Standard GET price"
    for p in profiles:
        if p is None or not p.provider:
            continue
        prov = table.provider(p.provider, p.region)
        if prov is not None:
            return float(prov.get_per_1000), f"{prov.name} GET price"
    return DEFAULT_GET_PER_1000, "S3 Standard GET price"


def request_arithmetic(files: int, shards: int, get_per_1000: float, source: str) -> RequestArithmetic:
    """GETs before (one per file) and after (one per shard) reading the dataset once."""
    return RequestArithmetic(files, shards, get_per_1000, source)


@dataclass(frozen=True)
class Manifest:
    """What ``manifest.json`` holds."""

    source: str
    pattern: str
    shard_size: int
    seed: int | None
    plan_hash: str
    shards: tuple[ShardEntry, ...]
    requests: RequestArithmetic
    problems: dict[str, Any] = field(default_factory=dict)
    incomplete_policy: str = "error"

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def files(self) -> int:
        return sum(s.files for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def hash(self) -> str:
        """The manifest's ``hash``: its shards' algorithm (``blake3,sha256`` when a conversion
        begun by an older loadmaster was resumed: each shard names its own)."""
        return ",".join(sorted({s.hash for s in self.shards})) or HASH

    def to_json(self) -> str:
        """The manifest as JSON (deterministic: no timestamps, sorted shards)."""
        doc = {
            "format": FORMAT,
            "source": self.source,
            "pattern": self.pattern,
            "shard_size_target": self.shard_size,
            "seed": self.seed,
            "plan_hash": self.plan_hash,
            "hash": self.hash,
            "totals": {"shards": len(self.shards), "samples": self.samples, "files": self.files, "bytes": self.bytes},
            "requests": self.requests.as_dict(),
            "input_problems": self.problems,
            "incomplete_policy": self.incomplete_policy,
            "shards": [s.as_dict() for s in self.shards],
        }
        return json.dumps(doc, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str | _Bytes, *, where: str = MANIFEST_NAME) -> Manifest:
        """Parse a manifest; ValueError naming what is wrong (too large and too deep included)."""
        try:
            doc = loads_bounded(text, what=where, max_bytes=MANIFEST_MAX_BYTES)
        except ValueError as exc:
            raise ValueError(f"{where}: not a loadmaster shard manifest ({exc})") from None
        try:
            if not isinstance(doc, dict):
                raise TypeError(f"expected a JSON object, got {type(doc).__name__}")
            if doc.get("format") not in READ_FORMATS:
                raise ValueError(f"unknown manifest format {doc.get('format')!r}")
            req = doc["requests"]
            manifest = cls(
                source=doc["source"],
                pattern=doc["pattern"],
                shard_size=int(doc["shard_size_target"]),
                seed=doc.get("seed"),
                plan_hash=doc["plan_hash"],
                shards=tuple(ShardEntry.from_dict(s) for s in doc["shards"]),
                requests=RequestArithmetic(
                    int(req["gets_before"]),
                    int(req["gets_after"]),
                    float(req["get_per_1000_usd"]),
                    str(req["price_source"]),
                ),
                problems=doc.get("input_problems", {}),
                incomplete_policy=doc.get("incomplete_policy", "error"),
            )
            # /1 predates the field: its shards are sha256. A shard hashed otherwise than the
            # manifest says is an edited manifest, refused rather than verified by either.
            named = doc.get("hash", "sha256") if doc["format"] == READ_FORMATS[0] else doc["hash"]
            if manifest.shards and named != manifest.hash:
                raise ValueError(f"it names hash {str(named)[:40]!r} but its shards are hashed with {manifest.hash}")
            return manifest
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise ValueError(
                f"{where}: not a loadmaster shard manifest ({type(exc).__name__}: {str(exc)[:200]})"
            ) from None

    def summary(self) -> str:
        """Two lines for the CLI and the console."""
        return (
            f"{len(self.shards):,} shards, {self.samples:,} samples, {self.files:,} files, "
            f"{bytes_text(self.bytes)}\n{self.requests.summary()}"
        )
