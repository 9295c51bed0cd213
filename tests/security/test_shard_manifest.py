"""Manifests and resume journals are read back from a destination others can write: any bytes
there give a one-line refusal (manifest) or a redone shard (journal), at a bounded cost, never a
RecursionError or an AttributeError traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.nodes.untrusted import MAX_JSON_DEPTH, loads_bounded
from backend.shards.convert import convert_sync
from backend.shards.manifest import JOURNAL_MAX_BYTES, MANIFEST_NAME, Manifest
from backend.shards.model import ShardRequest
from backend.shards.sinks import JOURNAL_PREFIX
from tests.shards.conftest import make_dataset
from tui.cli import main

DEEP = "[" * 200_000 + "]" * 200_000

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=40,
)


@pytest.mark.parametrize(
    "text",
    [
        DEEP,
        '{"format": ' * 100_000 + "1" + "}" * 100_000,
        "[]",
        '"x"',
        "null",
        "1e999999",
        '{"format": "loadmaster-shards/1", "shards": "x"}',
        '{"format": "loadmaster-shards/1"}',
        '{"format": "loadmaster-shards/1", "requests": [], "source": 1, "pattern": 2, '
        '"shard_size_target": 3, "plan_hash": 4, "shards": [1]}',
        "9" * 5000,
        "\x00\x1b[2J",
        '{"a": "\\ud800"}',
    ],
)
def test_hostile_manifests_are_a_clear_refusal(text: str) -> None:
    with pytest.raises(ValueError, match=r"^out/manifest\.json: not a loadmaster shard manifest \(") as info:
        Manifest.from_json(text, where="out/manifest.json")
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=json_values)
def test_any_json_document_is_a_manifest_or_a_value_error(doc: object) -> None:
    text = json.dumps(doc)
    try:
        Manifest.from_json(text)
    except ValueError as exc:
        assert str(exc).startswith("manifest.json: not a loadmaster shard manifest")


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_bytes_are_a_manifest_or_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        Manifest.from_json(data)


def test_depth_and_size_limits_of_the_decoder() -> None:
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads_bounded(ok, what="x") is not None
    with pytest.raises(ValueError, match=f"nested more than {MAX_JSON_DEPTH} levels"):
        loads_bounded("[" + ok + "]", what="x")
    with pytest.raises(ValueError, match="nested too deeply"):
        loads_bounded(DEEP, what="x")  # the C decoder's own limit, as a ValueError
    with pytest.raises(ValueError, match="more than the 10 accepted"):
        loads_bounded(b"[1,2,3,4,5,6]", what="x", max_bytes=10)


def test_shard_verify_on_a_hostile_manifest_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, dest = tmp_path / "src", tmp_path / "out"
    make_dataset(src, n=6)
    convert_sync(ShardRequest(str(src), str(dest), shard_size=10**6))
    (dest / MANIFEST_NAME).write_text(DEEP)
    assert main(["shard", "verify", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "nested too deeply" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "entry", [DEEP, "[1]", '"x"', "{}", '{"name": [], "bytes": {}}', "x" * (JOURNAL_MAX_BYTES + 1)]
)
def test_a_hostile_journal_entry_only_means_that_shard_is_redone(tmp_path: Path, entry: str) -> None:
    src, dest = tmp_path / "src", tmp_path / "out"
    make_dataset(src, n=30)
    req = ShardRequest(str(src), str(dest), shard_size=20_000)
    first = convert_sync(req)
    victim = first.manifest.shards[1].name
    (dest / JOURNAL_PREFIX / f"{victim}.json").write_text(entry)
    again = convert_sync(ShardRequest(str(src), str(dest), shard_size=20_000, resume=True))
    assert victim in again.written and victim not in again.resumed
    assert again.manifest.shards == first.manifest.shards
