"""What a shard conversion is asked, reports and returns: the request, progress, preview, result.

:class:`ShardRequest` is JSON-able (it travels to a node as a ``shard`` job's params);
:class:`ShardPreview` is computed from the source listing alone (:func:`backend.shards.convert.preview`);
:class:`ConvertResult` is what :func:`backend.shards.convert.convert` returns. Errors are
:class:`~backend.shards.plan.ShardError` (a one-line message for the operator) and
:class:`ShardCancelled`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from backend.shards.locations import normalize_location
from backend.shards.manifest import MANIFEST_NAME, Manifest, RequestArithmetic
from backend.shards.plan import InputProblems, ShardError, ShardPlan
from backend.shards.settings import ShardSettings

IncompletePolicy = Literal["error", "skip", "keep"]


class ShardCancelled(ShardError):
    """The conversion was cancelled; completed shards stay and ``--resume`` continues."""


@dataclass(frozen=True)
class ShardRequest:
    """Everything one conversion needs; JSON-able (it travels to a node as job params)."""

    src: str
    dest: str
    shard_size: int = ShardSettings.shard_size
    pattern: str = ShardSettings.pattern
    seed: int | None = None
    workers: int = ShardSettings.workers
    overwrite: bool = False
    resume: bool = False
    incomplete: IncompletePolicy = "error"
    fetch_concurrency: int = ShardSettings.fetch_concurrency
    upload_part_size: int = ShardSettings.upload_part_size
    pending_uploads: int = ShardSettings.pending_uploads
    spool_dir: str | None = None
    partner_share: float = ShardSettings.partner_share

    @classmethod
    def from_settings(cls, settings: ShardSettings, src: str, dest: str, **overrides: Any) -> ShardRequest:
        """A request with the ``[shards]`` defaults, ``overrides`` (None values ignored) on top."""
        base: dict[str, Any] = {
            "shard_size": settings.shard_size,
            "pattern": settings.pattern,
            "workers": settings.workers,
            "fetch_concurrency": settings.fetch_concurrency,
            "upload_part_size": settings.upload_part_size,
            "pending_uploads": settings.pending_uploads,
            "spool_dir": settings.spool_dir,
            "partner_share": settings.partner_share,
        }
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(src=src, dest=dest, **base)  # type: ignore[arg-type]

    def as_params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> ShardRequest:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in params.items() if k in names})

    def validate(self) -> None:
        """Refuse nonsensical settings with a message naming the option."""
        if self.incomplete not in ("error", "skip", "keep"):
            raise ShardError(f"--incomplete must be error, skip or keep, not {self.incomplete!r}")
        if self.workers < 0:
            raise ShardError("--workers must be 0 (read in the writer thread) or more")
        if self.overwrite and self.resume:
            raise ShardError("choose one of --overwrite and --resume")
        if self.shard_size <= 0:
            raise ShardError("--shard-size must be positive (e.g. 512MB)")
        if normalize_location(self.src) == normalize_location(self.dest):
            raise ShardError("source and destination are the same place; write shards elsewhere")


@dataclass(frozen=True)
class ShardProgress:
    """A progress snapshot of a running conversion."""

    samples_done: int
    samples_total: int
    bytes_done: int
    bytes_total: int
    shards_done: int
    shards_total: int
    elapsed: float
    samples_per_s: float
    mb_per_s: float
    phase: str = "writing"
    final: bool = False
    #: Source bytes this run has read (the samples of the shards it committed).
    source_bytes_read: int = 0


@dataclass(frozen=True)
class ShardPreview:
    """What a conversion would do, computed from the listing alone (no data read)."""

    src: str
    dest: str
    files: int
    samples: int
    source_bytes: int
    shards: int
    largest_shard: int
    requests: RequestArithmetic
    warnings: tuple[str, ...]
    errors: tuple[str, ...]
    problems: InputProblems = field(default_factory=InputProblems)
    #: The plan behind the preview (handed to :func:`convert` so the source is listed once).
    plan: ShardPlan | None = field(default=None, repr=False, compare=False)
    request: ShardRequest | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return not self.errors

    def as_dict(self) -> dict[str, Any]:
        return {
            "src": self.src,
            "dest": self.dest,
            "files": self.files,
            "samples": self.samples,
            "source_bytes": self.source_bytes,
            "shards": self.shards,
            "largest_shard": self.largest_shard,
            "requests": self.requests.as_dict(),
            "warnings": list(self.warnings),
            "errors": list(self.errors),
            "problems": self.problems.as_dict(),
        }


@dataclass(frozen=True)
class ConvertResult:
    """A finished conversion: its manifest and what this run did."""

    manifest: Manifest
    dest: str
    written: tuple[str, ...]
    resumed: tuple[str, ...]
    elapsed: float
    warnings: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "dest": self.dest,
            "manifest": f"{self.dest.rstrip('/')}/{MANIFEST_NAME}",
            "shards": len(m.shards),
            "samples": m.samples,
            "files": m.files,
            "bytes": m.bytes,
            "written": len(self.written),
            "resumed": len(self.resumed),
            "elapsed_s": round(self.elapsed, 3),
            "requests": m.requests.as_dict(),
            "warnings": list(self.warnings),
        }
