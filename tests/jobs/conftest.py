"""Fixtures for job tests: a config over the lab with short job timings, a seeded source prefix."""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from backend.config import Config, load_config_file
from backend.services import Services
from backend.state import SQLiteState
from lab import Lab
from tests.helpers import write_lab_config

MiB = 1024 * 1024


@pytest.fixture
def jobs_config_path(lab: Lab, tmp_path: Path) -> Path:
    return write_lab_config(lab, tmp_path / "loadmaster.toml", tmp_path / "state")


@pytest.fixture
def jobs_config(jobs_config_path: Path) -> Config:
    return load_config_file(jobs_config_path)


@pytest.fixture
async def services(jobs_config: Config) -> AsyncIterator[Services]:
    svc = Services(config=jobs_config)
    yield svc
    await svc.aclose()


def fresh_services(config: Config, db_path: Path | None = None) -> Services:
    """Another console of the team: its own pool (new SSH connections) and its own handle on the
    config's state database, or on another database at ``db_path`` (a console of another team,
    which sees this team's jobs as foreign)."""
    svc = Services(config=config)
    if db_path is not None:
        svc.__dict__["db"] = SQLiteState(db_path)
    return svc


@dataclass(frozen=True)
class SourceData:
    bucket: str
    prefix: str
    objects: dict[str, bytes]  # relative name -> body

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}/"

    @property
    def total(self) -> int:
        return sum(len(b) for b in self.objects.values())

    def digest(self, name: str) -> str:
        return hashlib.sha256(self.objects[name]).hexdigest()


@pytest.fixture(scope="session")
def source(lab: Lab, s3) -> SourceData:  # type: ignore[no-untyped-def]
    """A prefix of several objects in the lab bucket: two multi-part sized (12 MiB > 5 MiB parts)."""
    assert lab.bucket
    bucket = lab.bucket
    prefix = "datasets/run-" + secrets.token_hex(3)
    objects = {
        "shard-000.bin": os.urandom(12 * MiB),
        "shard-001.bin": os.urandom(12 * MiB + 12345),
        "meta/index.json": b'{"shards": 2}\n',
        "small.bin": os.urandom(700 * 1024),
    }
    client = s3.client()
    for name, body in objects.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=body)
    return SourceData(bucket, prefix, objects)


@pytest.fixture
def node_dir(lab: Lab) -> Iterator[object]:
    """``node_dir(name, rel)``: the local path of a node's scratch sub-directory (lab nodes are local)."""

    def get(name: str, rel: str) -> Path:
        return lab.node(name).scratch / rel

    yield get
