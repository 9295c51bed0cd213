"""Files hashed where they lie (backend/pulls/integrity.py ``FileBytes``): through a read-only map
of the page cache under a read lease, or read into a buffer where no lease is granted. Both give
the same digests (property test over generated bodies, part sizes and map windows); a file open
for writing is never mapped; a truncation waits for the hash instead of killing it with SIGBUS;
a lease break makes the rest be read, not mapped."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.pulls import integrity
from backend.pulls.integrity import ALGORITHMS, MD5, MD5_MULTIPART, FileBytes, choose_proof, digest_file
from backend.pulls.integrity import parse_checksum_headers as parse
from tests.jobs.test_integrity_units import headers_for, raw

ROOT = Path(__file__).resolve().parents[2]
GRAIN = mmap.ALLOCATIONGRANULARITY


def _mapped(path: Path) -> bool:
    """Whether ``path`` would be hashed through a map (a read lease granted, not empty)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = FileBytes(fd)
        mapped = data.mapped
        data.close()
        return mapped
    finally:
        os.close(fd)


@pytest.fixture
def small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Map windows of one allocation grain, so parts and pieces cross window edges, and map files
    of any size."""
    monkeypatch.setattr(integrity, "MAP_WINDOW", GRAIN)
    monkeypatch.setattr(integrity, "MAP_MIN", 1)


@pytest.mark.usefixtures("small_windows")
def test_leases_are_granted_here(tmp_path: Path) -> None:
    """The mapped path is the one the other tests exercise: it must be reachable on this machine."""
    f = tmp_path / "obj"
    f.write_bytes(b"x" * 10)
    assert integrity._leases_allowed() and _mapped(f)


@pytest.mark.usefixtures("small_windows")
@given(
    body=st.binary(max_size=5 * 4096 + 3) | st.integers(0, 6 * 4096).map(lambda n: os.urandom(n)),
    part=st.integers(min_value=1, max_value=3 * 4096),
    alg=st.sampled_from(list(ALGORITHMS)),
)
@settings(max_examples=120, deadline=None)
def test_mapped_and_read_give_the_same_digests_across_window_edges(
    body: bytes, part: int, alg: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    f = tmp_path_factory.mktemp("m") / "obj"
    f.write_bytes(body)
    assert _mapped(f) == bool(body)
    for method in (alg, f"{alg}-composite", MD5, MD5_MULTIPART):
        headers, etag = headers_for(method, body, part)
        proof = choose_proof(len(body), etag, parse(headers), part_size=part)
        if not proof.verifies_bytes or (proof.parts or 0) > 10_000:
            continue
        mapped = digest_file(f, proof)
        integrity._leases_usable = False
        try:
            read = digest_file(f, proof)
        finally:
            integrity._leases_usable = None
        assert mapped == read
        if method == alg:
            assert mapped == raw(alg, body)
        assert integrity.proof_holds(f, proof)[0]


def test_small_files_are_read_not_mapped(tmp_path: Path) -> None:
    f = tmp_path / "obj"
    f.write_bytes(os.urandom(integrity.MAP_MIN - 1))
    assert not _mapped(f)
    f.write_bytes(os.urandom(integrity.MAP_MIN))
    assert _mapped(f)


@pytest.mark.usefixtures("small_windows")
def test_a_file_open_for_writing_is_read_not_mapped(tmp_path: Path) -> None:
    f = tmp_path / "obj"
    body = os.urandom(3 * GRAIN + 5)
    f.write_bytes(body)
    with open(f, "r+b") as writer:
        assert not _mapped(f)  # the kernel refuses a read lease while anyone may write
        proof = choose_proof(len(body), None, parse(headers_for("crc64nvme", body, GRAIN)[0]))
        assert digest_file(f, proof) == raw("crc64nvme", body)
        writer.write(b"!")  # over the first byte
        writer.flush()
        assert digest_file(f, proof) != raw("crc64nvme", body)
    assert _mapped(f)


CHILD = r"""
import os, sys
from backend.pulls import integrity
integrity.MAP_WINDOW = {window}
integrity.MAP_MIN = 1
fd = os.open(sys.argv[1], os.O_RDONLY)
data = integrity.FileBytes(fd)
h = integrity.new_hasher("crc64nvme")
first = data.feed(0, {window}, h.update)
print("ready", data.mapped, flush=True)
sys.stdin.readline()  # the parent has started a truncation meanwhile
rest = data.feed(first, None, h.update)
print(h.digest().hex(), first + rest, data.mapped, flush=True)
data.close()
"""


def test_a_truncation_waits_for_the_hash_instead_of_killing_it(tmp_path: Path) -> None:
    """With the file mapped, a truncation that went ahead would end the hashing process with
    SIGBUS. Under the lease it waits until the hash has let go; the hash sees every byte, then
    reads the rest (a break is pending) instead of mapping it."""
    f = tmp_path / "obj"
    body = os.urandom(8 * GRAIN)
    f.write_bytes(body)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(window=GRAIN), str(f)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline().split() == ["ready", "True"]
        # truncate(2) by path, which waits for the lease (coreutils' truncate opens O_NONBLOCK and
        # would give up at once with EAGAIN).
        truncate = subprocess.Popen([sys.executable, "-c", "import os, sys; os.truncate(sys.argv[1], 0)", str(f)])
        deadline = time.monotonic() + 5
        while not lease_breaking(f) and time.monotonic() < deadline:
            time.sleep(0.02)  # until the kernel has the truncation waiting on the lease
        assert truncate.poll() is None, "the truncation did not wait for the lease"
        child.stdin.write("go\n")
        child.stdin.flush()
        digest, count, leased = child.stdout.readline().split()
        assert child.wait(timeout=30) == 0
        assert (bytes.fromhex(digest), int(count), leased) == (raw("crc64nvme", body), len(body), "False")
        assert truncate.wait(timeout=30) == 0
        assert f.stat().st_size == 0
    finally:
        child.kill()


def lease_breaking(path: Path) -> bool:
    """Whether /proc/locks shows the lease on ``path`` being broken (someone waits on it)."""
    ino = os.stat(path).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()  # "1: LEASE  BREAKING  UNLCK 4573 fe:00:2152152 0 EOF"
        if "LEASE" in fields and fields[-3].endswith(f":{ino}"):
            return "BREAKING" in fields
    return False
