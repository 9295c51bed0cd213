"""The ``[shards]`` config section: shard size, naming, read/upload concurrency, spool location."""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.schema import parse_size

MB = 10**6


@dataclass(frozen=True)
class ShardSettings:
    """Defaults for ``loadmaster shard`` (each overridable on the command line)."""

    #: Target shard size; 256MB - 1GB keeps GETs few and shards quick to shuffle.
    shard_size: int = field(default=512 * MB, metadata={"parse": parse_size})
    #: Shard file name; one integer conversion (``%06d``) and a ``.tar`` suffix.
    pattern: str = "shard-%06d.tar"
    #: Threads reading local source files once reads are seen to wait for I/O (a network
    #: filesystem, a cold disk); files already in the page cache are read by the writer thread,
    #: where threads would only cost CPU. 0 always reads and hashes in the writer thread.
    workers: int = 4
    #: Concurrent GETs when the source is an ``s3://`` prefix.
    fetch_concurrency: int = 32
    #: Multipart part size when uploading shards to ``s3://``.
    upload_part_size: int = field(default=64 * MB, metadata={"parse": parse_size})
    #: Finished shards allowed to wait on local disk for upload (bounds spool disk use).
    pending_uploads: int = 2
    #: Where shards are spooled before upload (default: a temporary directory).
    spool_dir: str | None = None
    #: An extension is "expected" of every sample when more than this share of samples have it.
    partner_share: float = 0.5
