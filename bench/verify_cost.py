"""Client CPU of the verifier's two per-object costs, old path against candidates, side by side (#33).

A pull of 2,000 x 1 MiB objects proves each one with a HEAD (the store's CRC64NVME) and a read
plus CRC64NVME of the file, still in the page cache. This times each of the two in one thread,
``--n`` times, as CPU seconds of the whole process (``time.process_time``: awscrt's event-loop
threads count too) and wall, and prints the old path, each candidate and their ratio:

- HEAD: ``StoreHeads.head`` by http.client (SigV4 by awscrt), one at a time as before, against
  the same HEAD sent ahead (``StoreHeads.send_ahead``) through awscrt's own HTTP client
  (``backend.pulls.crt_http``, C on its own thread) with 1, 4 or 16 in flight, as the verifier
  sends them when s5cmd reports several objects at once;
- read + CRC64NVME of a 1 MiB file: as ``integrity.digest_file`` read before (a fresh 2 MiB
  buffer and a buffered reader per file) against ``integrity.proof_holds`` now (the thread's
  buffer, reused) and other ways: ``os.preadv``, one ``read()`` of the whole file.

Starts its own SeaweedFS (lab.seaweed) with ``--n`` small objects that carry CRC64NVME; the HEAD's
cost does not depend on the object's size. CPU, not wall, is the figure to read on a shared machine.

    .venv/bin/python bench/verify_cost.py            # 2,000 HEADs and reads
    .venv/bin/python bench/verify_cost.py --n 500 --rounds 3
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _measure(fn: Callable[[int], object], n: int) -> tuple[float, float]:
    """(CPU us, wall us) per call of ``fn(i)`` for i in range(n), the process's CPU."""
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.process_time() - c0) / n * 1e6, (time.perf_counter() - w0) / n * 1e6


Rows = list[tuple[str, list[tuple[float, float]]]]


def _heads(n: int, rounds: int, proofs: int) -> tuple[Rows, Rows]:
    from concurrent.futures import ThreadPoolExecutor

    from backend.pulls.params import read_params
    from backend.pulls.verify import StoreHeads
    from lab.seaweed import SeaweedS3
    from lab.seed import put_object

    root = Path(tempfile.mkdtemp(prefix="lm-bench-verify-"))
    s3 = SeaweedS3(root / "s3").start()
    try:
        bucket = s3.new_bucket("bench")
        client = s3.client()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: put_object(client, bucket, f"v/obj-{i:04d}.bin", os.urandom(1024)), range(n)))
        env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
        store = read_params(
            {"src": "", "dest": "", "numworkers": 1, "concurrency": 1, "part_size_mib": 1}
            | {"endpoint_url": s3.endpoint, "region": s3.region}
        )

        def key(i: int) -> str:
            return f"v/obj-{i % n:04d}.bin"

        plain = StoreHeads(store, env, bucket)
        plain.send_ahead = lambda key: None  # type: ignore[method-assign]  # today's path: http.client only
        assert "x-amz-checksum-crc64nvme" in (plain.head(key(0)) or {}), "the store gave no CRC64NVME"
        ahead = StoreHeads(store, env, bucket)

        def windowed(width: int) -> Callable[[int], object]:
            def run(i: int) -> object:
                # The verifier sends each object's HEAD as s5cmd reports it, and takes the answer
                # when a thread gets to the object: here ``width`` objects reported at once.
                if i % width == 0:
                    for j in range(i, i + width):
                        ahead.send_ahead(key(j))
                got = ahead.head(key(i))
                assert got is not None and "x-amz-checksum-crc64nvme" in got, (i, ahead.failed)
                return got

            return run

        candidates: list[tuple[str, Callable[[int], object]]] = [
            ("http.client, one at a time (before)", lambda i: plain.head(key(i))),
            ("awscrt.http sent ahead, 1 in flight", windowed(1)),
            ("awscrt.http sent ahead, 4 in flight", windowed(4)),
            ("awscrt.http sent ahead, 16 in flight", windowed(16)),
        ]
        out: list[tuple[str, list[tuple[float, float]]]] = [(name, []) for name, _ in candidates]
        for _ in range(rounds):
            for (_, fn), (_, results) in zip(candidates, out, strict=True):
                fn(0)  # connected, warm
                results.append(_measure(fn, n))
        ahead.close()
        return out, (_proofs(s3, bucket, store, env, root, proofs, rounds) if proofs else [])
    finally:
        s3.stop()
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def _proofs(s3: object, bucket: str, store: object, env: dict[str, str], root: Path, n: int, rounds: int) -> Rows:
    """One object's whole proof on one verifier thread (``PullVerifier._check``: stat, HEAD,
    read + CRC64NVME, the staged copy's rename into DEST), ``n`` objects of 1 MiB in place."""
    import shutil

    from backend.pulls.objects import PulledObject, parse_source
    from backend.pulls.staging import Staging
    from backend.pulls.verify import PullVerifier, StoreHeads
    from lab.seed import put_object

    client = s3.client()  # type: ignore[attr-defined]
    block = os.urandom(1 << 20)
    expected = []
    for i in range(n):
        body = i.to_bytes(8, "little") + block[8:]
        put_object(client, bucket, f"p/o{i:04d}.bin", body)
        expected.append(PulledObject(f"o{i:04d}.bin", len(body), None))
    out: Rows = [("HEADs one at a time (http.client)", []), ("HEADs sent ahead (awscrt)", [])]
    out += [("HEADs sent ahead + the staged rename into DEST", [])]
    for r in range(rounds):
        for label, results in out:
            dest = root / f"dest-{r}-{len(results)}-{label[:5]}"
            dest.mkdir()
            staging = Staging.create(dest, "bench", None, 0)
            for o in expected:
                (staging.path / o.rel).write_bytes(
                    int(o.rel[1:5]).to_bytes(8, "little") + block[8:]
                )  # written: in the page cache
            heads = StoreHeads(store, env, bucket)  # type: ignore[arg-type]
            if "one at a time" in label:
                heads.send_ahead = lambda key: False  # type: ignore[method-assign]

            def placed(i: int, check: object, staging: Staging = staging) -> object:
                assert staging.place(expected[i]) is None
                return check

            verifier = PullVerifier(
                parse_source(f"s3://{bucket}/p/*"),
                staging.path,
                expected,
                heads,
                workers=1,
                then=placed if "staged" in label else None,  # type: ignore[arg-type]
            )
            verifier._check(0)  # the first HEAD shows the store keeps checksums
            with verifier._lock:
                verifier._unsent.extend(range(1, n))
            check = verifier._check
            results.append(_measure(lambda i, check=check: check(i + 1), n - 1))
            assert verifier.bytes_hashed == n << 20
            heads.close()
            shutil.rmtree(dest)
    return out


def _reads(n: int, rounds: int, size: int) -> Rows:
    from awscrt import checksums

    from backend.pulls.integrity import Proof, proof_holds

    d = Path(tempfile.mkdtemp(prefix="lm-bench-crc-"))
    path = d / "obj"
    body = os.urandom(size)
    path.write_bytes(body)
    want = checksums.crc64nvme(body).to_bytes(8, "big")
    proof = Proof("crc64nvme", "crc64nvme", want)
    buf = bytearray(2 << 20)
    view = memoryview(buf)

    def readinto(into: bytearray) -> bytes:
        crc, into_view = 0, memoryview(into)
        with open(path, "rb") as f:
            while k := f.readinto(into):
                crc = checksums.crc64nvme(into_view[:k], crc)
        return crc.to_bytes(8, "big")

    def fresh(_i: int) -> bytes:
        return readinto(bytearray(2 << 20))  # digest_file before #33: a new 2 MiB buffer per file

    def reused(_i: int) -> bytes:
        return readinto(buf)

    def pread(_i: int) -> bytes:
        crc, off = 0, 0
        fd = os.open(path, os.O_RDONLY)
        try:
            while k := os.preadv(fd, [view], off):
                crc = checksums.crc64nvme(view[:k], crc)
                off += k
        finally:
            os.close(fd)
        return crc.to_bytes(8, "big")

    def whole(_i: int) -> bytes:
        with open(path, "rb") as f:
            return checksums.crc64nvme(f.read()).to_bytes(8, "big")

    candidates: list[tuple[str, Callable[[int], object]]] = [
        ("a new 2 MiB buffer per file (before)", fresh),
        ("integrity.proof_holds (now: the thread's buffer, unbuffered file)", lambda i: proof_holds(path, proof)),
        ("readinto a reused buffer, buffered file", reused),
        ("os.preadv into a reused buffer", pread),
        ("one read() of the file", whole),
    ]
    for name, fn in candidates:
        got = fn(0)
        assert got == want or (isinstance(got, tuple) and got[0] is True), (name, got, base64.b64encode(want))
    out: list[tuple[str, list[tuple[float, float]]]] = [(name, []) for name, _ in candidates]
    for _ in range(rounds):
        for (_, fn), (_, results) in zip(candidates, out, strict=True):
            results.append(_measure(fn, n))
    path.unlink()
    d.rmdir()
    return out


def _table(title: str, rows: list[tuple[str, list[tuple[float, float]]]]) -> None:
    base = statistics.median(c for c, _ in rows[0][1])
    print(f"\n{title}\n")
    print("| path | CPU us / call (median, range) | wall us / call (median) | CPU ratio to the first row |")
    print("|---|---:|---:|---:|")
    for name, results in rows:
        cpu = [c for c, _ in results]
        wall = [w for _, w in results]
        med = statistics.median(cpu)
        print(
            f"| {name} | {med:.0f} ({min(cpu):.0f}-{max(cpu):.0f}) | {statistics.median(wall):.0f} | {med / base:.2f} |"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="HEADs and reads per round (default 2000)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--object-kib", type=int, default=1024, help="size of the file read and CRC'd (KiB)")
    ap.add_argument("--skip-heads", action="store_true", help="only the read + CRC64NVME (no SeaweedFS)")
    ap.add_argument("--proofs", type=int, default=500, help="objects of 1 MiB for the whole-proof rows (0: none)")
    args = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load0 = open("/proc/loadavg").read().split()[:3]
    reads = _reads(args.n, args.rounds, args.object_kib << 10)
    heads, proofs = ([], []) if args.skip_heads else _heads(args.n, args.rounds, args.proofs)
    load1 = open("/proc/loadavg").read().split()[:3]
    print(f"started {started}; load average {' '.join(load0)} at the start, {' '.join(load1)} at the end")
    print(f"{args.rounds} rounds of {args.n} calls each, one thread; CPU = the whole process's (time.process_time)")
    _table(f"read + CRC64NVME of a {args.object_kib} KiB file from the page cache", reads)
    if heads:
        _table("HEAD with x-amz-checksum-mode: ENABLED, SigV4-signed, against SeaweedFS on loopback", heads)
    if proofs:
        _table(f"one object's whole proof (PullVerifier._check, 1 MiB, CRC64NVME), {args.proofs} objects", proofs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
