"""What a relay receiver checks each object's bytes against before it is renamed into place, chosen
as a direct pull chooses (:func:`receiver_proofs`), and the thread that computes that checksum
beside the receive loop (:class:`ProofPipe`).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import queue
import threading
from dataclasses import dataclass

from backend.errors import JobError
from backend.pulls.integrity import (
    ALGORITHMS,
    MD5,
    MD5_MULTIPART,
    ChecksumUnavailable,
    Hasher,
    new_hasher,
)
from backend.pulls.objects import PulledObject


@dataclass(frozen=True)
class ObjectProof:
    """What one received object's bytes must give: ``algorithm`` ("md5", "md5-multipart", or one
    of the store's full-object checksums) and the value as the listing writes it (MD5 hex; a
    multipart ETag ``hex-N`` over parts of ``part_size`` bytes; checksum base64)."""

    algorithm: str
    expected: str
    #: The parts' length of a multipart ETag (``md5-multipart``), from the console's HEAD of part 1.
    part_size: int | None = None


def receiver_proofs(
    objects: list[PulledObject], checksums: object, part_sizes: object = None, *, crt: bool | None = None
) -> list[ObjectProof | None]:
    """Each object's proof for a receiver, chosen as a direct pull chooses
    (``backend.pulls.integrity.choose_proof``): the store's full-object checksum where the spec
    lists one (``checksums``: one ``"ALGORITHM:BASE64"`` or None per object, from the console's
    HEADs), else the MD5 ETag of a single-part object, else a multipart ETag over the part size
    the spec gives (``part_sizes``: one int or None per object, the console's HEAD of part 1),
    else None (the per-hop SHA-256 alone: nothing of the store's proves it, as for a direct
    pull's size-only). A malformed entry is no proof: the next weaker one is used."""
    from backend.pulls.integrity import choose_proof, crt_available, parse_checksum_value

    have_crt = crt_available() if crt is None else crt
    listed = checksums if isinstance(checksums, list) and len(checksums) == len(objects) else [None] * len(objects)
    sizes = part_sizes if isinstance(part_sizes, list) and len(part_sizes) == len(objects) else [None] * len(objects)
    out: list[ObjectProof | None] = []
    for o, text, psize in zip(objects, listed, sizes, strict=True):
        found = []
        if isinstance(text, str) and ":" in text:
            alg, _, value = text.partition(":")
            c = parse_checksum_value(alg.lower(), value, "FULL_OBJECT")
            if c is not None:
                found.append(c)
        ps = psize if type(psize) is int and 0 < psize <= o.size else None
        proof = choose_proof(o.size, o.etag, found, part_size=ps, crt=have_crt)
        if proof.algorithm in ALGORITHMS and proof.parts is None and isinstance(proof.expected, bytes):
            out.append(ObjectProof(proof.algorithm, base64.b64encode(proof.expected).decode()))
        elif proof.method == MD5 and isinstance(proof.expected, str):
            out.append(ObjectProof(MD5, proof.expected))
        elif proof.method == MD5_MULTIPART and isinstance(proof.expected, str) and proof.part_size:
            out.append(ObjectProof(MD5_MULTIPART, proof.expected, proof.part_size))
        else:
            out.append(None)
    return out


class MultipartMd5:
    """The ETag S3 gives a multipart upload, over bytes fed in order: the MD5 of each
    ``part_size`` part's MD5, then ``-N`` (the parts' number)."""

    def __init__(self, part_size: int) -> None:
        self.part_size = part_size
        self.outer = hashlib.md5(usedforsecurity=False)
        self.part = hashlib.md5(usedforsecurity=False)
        self.in_part = 0
        self.parts = 0

    def update(self, data: bytes | bytearray | memoryview, /) -> None:
        view = memoryview(data)
        while len(view):
            take = min(len(view), self.part_size - self.in_part)
            self.part.update(view[:take])
            self.in_part += take
            view = view[take:]
            if self.in_part == self.part_size:
                self._close_part()

    def _close_part(self) -> None:
        self.outer.update(self.part.digest())
        self.parts += 1
        self.part = hashlib.md5(usedforsecurity=False)
        self.in_part = 0

    def text(self) -> str:
        if self.in_part or not self.parts:
            self._close_part()
        return f"{self.outer.hexdigest()}-{self.parts}"


class ProofPipe:
    """The checksum of objects' bytes on a thread of its own (MD5, or the store's full-object
    algorithm: CRC64NVME, CRC32C, CRC32, SHA-256, SHA-1), so the receive loop (SHA-256 check,
    write, forward) and the checksum each take a core; hashlib and awscrt release the GIL on
    large buffers. At most :data:`MD5_BACKLOG` chunks wait (each is its own buffer: nothing
    reuses it meanwhile)."""

    def __init__(self) -> None:
        self.q: queue.Queue[tuple[int, bytes | memoryview | None, threading.Event | None] | None] = queue.Queue(
            MD5_BACKLOG
        )
        self.hashes: dict[int, tuple[str, Hasher | MultipartMd5]] = {}
        self.done: dict[int, str] = {}
        self.thread: threading.Thread | None = None

    def start(self, index: int, algorithm: str = MD5, part_size: int | None = None) -> None:
        """Object ``index`` is hashed with ``algorithm`` from its first byte on (``md5-multipart``:
        over parts of ``part_size`` bytes)."""
        try:
            if algorithm == MD5_MULTIPART:
                if not part_size or part_size <= 0:
                    raise ChecksumUnavailable("a multipart ETag needs its part size")
                self.hashes[index] = (algorithm, MultipartMd5(part_size))
            else:
                self.hashes[index] = (algorithm, new_hasher(algorithm))
        except ChecksumUnavailable as exc:
            raise JobError(f"cannot check the received objects: {exc}") from None
        if self.thread is None:
            self.q = queue.Queue(MD5_BACKLOG)
            self.thread = threading.Thread(target=self._run, args=(self.q,), name="relay-md5", daemon=True)
            self.thread.start()

    def add(self, index: int, data: bytes | memoryview) -> None:
        if index in self.hashes:
            self.q.put((index, data, None))

    def digest(self, index: int) -> str | None:
        """The checksum of every byte added for ``index``, once hashed (MD5 as hex, the others as
        base64, as S3 writes them); None when not hashed."""
        if index not in self.hashes:
            return None
        ev = threading.Event()
        self.q.put((index, None, ev))
        while not ev.wait(1.0):
            if self.thread is None or not self.thread.is_alive():
                raise JobError("the checksum of the received objects stopped")
        self.hashes.pop(index, None)
        got = self.done.pop(index, None)
        if got is None:  # closed meanwhile: nothing proves these bytes
            raise JobError("the checksum of the received objects stopped")
        return got

    def close(self) -> None:
        if self.thread is not None and self.thread.is_alive():
            with contextlib.suppress(queue.Full):
                self.q.put(None, timeout=5)
        self.thread = None
        self.hashes.clear()

    def _run(self, q: queue.Queue[tuple[int, bytes | memoryview | None, threading.Event | None] | None]) -> None:
        while (item := q.get()) is not None:
            index, data, ev = item
            held = self.hashes.get(index)  # None once closed: what is left is dropped
            if ev is not None:
                if held is not None:
                    alg, h = held
                    if isinstance(h, MultipartMd5):
                        self.done[index] = h.text()
                    else:
                        self.done[index] = h.digest().hex() if alg == MD5 else base64.b64encode(h.digest()).decode()
                ev.set()
            elif data is not None and held is not None:
                held[1].update(data)


#: The name this had while it hashed MD5 alone.
Md5Pipe = ProofPipe


#: Chunks waiting for the MD5 thread at most (with 4 MiB chunks: 64 MiB).
MD5_BACKLOG = 16
