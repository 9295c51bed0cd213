"""The manifest names its hash: new shards are BLAKE3, manifests written before are sha256, and
``shard verify`` checks each shard with the algorithm its manifest names. A torn member (bytes
overwritten in place, sizes unchanged) and swapped members (two members' bytes exchanged, the
tar still readable with every sample) are caught under each algorithm; a manifest whose shards
are hashed otherwise than it says, or that carries no digest it knows, is refused."""

from __future__ import annotations

import asyncio
import hashlib
import json
import tarfile
from pathlib import Path

import blake3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.shards.convert import convert_sync
from backend.shards.manifest import FORMAT, HASH, MANIFEST_NAME, Manifest, ShardEntry
from backend.shards.model import ShardRequest
from backend.shards.plan import ShardError
from backend.shards.verify import VerifyReport, verify
from tests.shards.conftest import make_dataset

KB = 1000
ALGORITHMS = {"blake3": lambda b: blake3.blake3(b).hexdigest(), "sha256": lambda b: hashlib.sha256(b).hexdigest()}


def _convert(tmp_path: Path) -> Path:
    src, dest = tmp_path / "src", tmp_path / "out"
    make_dataset(src, n=40, jpg_size=(1500, 3000))
    convert_sync(ShardRequest(str(src), str(dest), shard_size=16 * KB))
    return dest


def _as_written_by(dest: Path, algo: str) -> dict:
    """The manifest as the given algorithm's loadmaster wrote it: sha256 is the old format
    (``loadmaster-shards/1``, no ``hash`` field, every shard's ``sha256``)."""
    doc = json.loads((dest / MANIFEST_NAME).read_text())
    if algo == "sha256":
        doc["format"] = "loadmaster-shards/1"
        del doc["hash"]
        for s in doc["shards"]:
            del s["blake3"]
            s["sha256"] = ALGORITHMS["sha256"]((dest / s["name"]).read_bytes())
        (dest / MANIFEST_NAME).write_text(json.dumps(doc, indent=1))
    return doc


def _check(dest: Path) -> VerifyReport:
    return asyncio.run(verify(str(dest)))


def _members(path: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(path) as tf:
        return [m for m in tf.getmembers() if m.isfile() and m.size >= 1024]


def test_new_manifests_name_blake3_and_each_shard_carries_its_digest(tmp_path: Path) -> None:
    dest = _convert(tmp_path)
    doc = json.loads((dest / MANIFEST_NAME).read_text())
    assert doc["format"] == FORMAT == "loadmaster-shards/2" and doc["hash"] == HASH == "blake3"
    assert len(doc["shards"]) >= 3
    for s in doc["shards"]:
        assert "sha256" not in s and s["blake3"] == ALGORITHMS["blake3"]((dest / s["name"]).read_bytes())
    report = _check(dest)
    assert report.ok and {c.hash for c in report.checks} == {"blake3"}, report.summary()


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_untouched_shards_verify_under_each_algorithm(tmp_path: Path, algo: str) -> None:
    dest = _convert(tmp_path)
    _as_written_by(dest, algo)
    m = Manifest.from_json((dest / MANIFEST_NAME).read_text())
    assert m.hash == algo and {s.hash for s in m.shards} == {algo}
    report = _check(dest)
    assert report.ok, report.summary()
    assert [c.digest for c in report.checks] == [s.digest for s in m.shards]
    assert {c.as_dict()["hash"] for c in report.checks} == {algo}


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_a_torn_member_is_caught_under_each_algorithm(tmp_path: Path, algo: str) -> None:
    dest = _convert(tmp_path)
    doc = _as_written_by(dest, algo)
    victim = dest / doc["shards"][1]["name"]
    member = _members(victim)[0]
    blob = bytearray(victim.read_bytes())
    # A torn write: the member's second half is zeros, the size and the tar structure unchanged.
    half = member.offset_data + member.size // 2
    blob[half : member.offset_data + member.size] = bytes(member.offset_data + member.size - half)
    victim.write_bytes(bytes(blob))
    report = _check(dest)
    bad = [c for c in report.checks if not c.ok]
    assert not report.ok and [c.name for c in bad] == [victim.name], report.summary()
    # Only the digest can see it: same size, every sample still read.
    got = bad[0].digest or ""
    want = doc["shards"][1][algo]
    assert bad[0].problems == (f"{algo} {got[:12]}..., manifest says {want[:12]}...",), bad[0].problems
    assert bad[0].hash == algo


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_swapped_members_are_caught_under_each_algorithm(tmp_path: Path, algo: str) -> None:
    dest = _convert(tmp_path)
    doc = _as_written_by(dest, algo)
    victim = dest / doc["shards"][0]["name"]
    a, b = _members(victim)[:2]
    blob = bytearray(victim.read_bytes())
    n = 1024  # the first KB of each member's data exchanged: sizes and headers as they were
    first, second = bytes(blob[a.offset_data : a.offset_data + n]), bytes(blob[b.offset_data : b.offset_data + n])
    assert first != second
    blob[a.offset_data : a.offset_data + n], blob[b.offset_data : b.offset_data + n] = second, first
    victim.write_bytes(bytes(blob))
    report = _check(dest)
    bad = [c for c in report.checks if not c.ok]
    assert [c.name for c in bad] == [victim.name] and len(bad[0].problems) == 1, report.summary()
    assert bad[0].problems[0].startswith(f"{algo} ") and bad[0].samples == doc["shards"][0]["samples"]


def test_a_resumed_older_conversion_verifies_each_shard_with_its_own_algorithm(tmp_path: Path) -> None:
    dest = _convert(tmp_path)
    doc = json.loads((dest / MANIFEST_NAME).read_text())
    old = doc["shards"][0]  # written by the older loadmaster before the resume
    del old["blake3"]
    old["sha256"] = ALGORITHMS["sha256"]((dest / old["name"]).read_bytes())
    doc["hash"] = "blake3,sha256"
    (dest / MANIFEST_NAME).write_text(json.dumps(doc))
    report = _check(dest)
    assert report.ok and [c.hash for c in report.checks][:2] == ["sha256", "blake3"], report.summary()
    victim = dest / old["name"]
    blob = bytearray(victim.read_bytes())
    blob[_members(victim)[0].offset_data] ^= 0xFF
    victim.write_bytes(bytes(blob))
    bad = [c for c in _check(dest).checks if not c.ok]
    assert [(c.name, c.hash) for c in bad] == [(old["name"], "sha256")]


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda d: d.update(hash="sha256"), "names hash 'sha256' but its shards are hashed with blake3"),
        (lambda d: d["shards"][0].update(sha256="0" * 64), "must carry exactly one digest"),
        (lambda d: d["shards"][0].pop("blake3"), "must carry exactly one digest"),
        (lambda d: d["shards"][0].update(blake3="xyz"), "blake3 is not 64 hex digits"),
        (lambda d: d.update(format="loadmaster-shards/9"), "unknown manifest format"),
        # An old-format manifest cannot smuggle in shards of another algorithm.
        (
            lambda d: (d.update(format="loadmaster-shards/1"), d.pop("hash")),
            "names hash 'sha256' but its shards are hashed with blake3",
        ),
    ],
)
def test_a_manifest_that_does_not_say_its_hash_is_refused(tmp_path: Path, edit, says: str) -> None:  # type: ignore[no-untyped-def]
    dest = _convert(tmp_path)
    doc = json.loads((dest / MANIFEST_NAME).read_text())
    edit(doc)
    (dest / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="not a loadmaster shard manifest") as err:
        Manifest.from_json((dest / MANIFEST_NAME).read_text())
    assert says in str(err.value)
    with pytest.raises(ShardError, match="not a loadmaster shard manifest"):
        _check(dest)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    algo=st.sampled_from(sorted(ALGORITHMS)),
    name=st.text(min_size=1, max_size=40),
    nbytes=st.integers(0, 2**40),
    data=st.binary(max_size=64),
)
def test_an_entry_round_trips_with_its_algorithm(algo: str, name: str, nbytes: int, data: bytes) -> None:
    entry = ShardEntry(name, nbytes, 3, 6, ALGORITHMS[algo](data), algo)
    d = entry.as_dict()
    assert d[algo] == entry.digest and not ({*ALGORITHMS} - {algo}) & d.keys()
    assert ShardEntry.from_dict(json.loads(json.dumps(d))) == entry


def test_the_manifest_names_the_hash_the_writer_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each entry's algorithm comes from the output that hashed it, not from a second constant:
    a writer set to sha256 (as bench/shard.py sets it to compare) yields a sha256 manifest."""
    from backend.shards import sinks

    monkeypatch.setattr(sinks, "HASH", "sha256")
    dest = _convert(tmp_path)
    doc = json.loads((dest / MANIFEST_NAME).read_text())
    assert doc["hash"] == "sha256"
    assert all(s["sha256"] == ALGORITHMS["sha256"]((dest / s["name"]).read_bytes()) for s in doc["shards"])
    assert _check(dest).ok
