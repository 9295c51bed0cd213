"""PostgreSQL for the tests: one real private cluster per session, a fresh database per test.

Registered by tests/conftest.py (``pytest_plugins``). The cluster starts only when a test asks for
it (``pg_cluster``, ``pg_url``, or ``state_url``'s ``postgresql`` case); a machine without
PostgreSQL fails those tests with the install hint (CI installs it, scripts/test.sh too).
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.errors import LoadmasterError
from backend.state import SQLiteState, StateDB
from backend.state.postgres import PostgresState
from lab.postgres import PostgresNotInstalled, PrivateCluster


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PrivateCluster]:
    """A started :class:`PrivateCluster` in a temp dir, stopped (and removed) at session end."""
    root = Path(tempfile.mkdtemp(prefix="lm-pg-"))
    cluster = PrivateCluster(root)
    try:
        cluster.start()
    except PostgresNotInstalled as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(str(exc), pytrace=False)
    except LoadmasterError as exc:
        cluster.stop(mode="immediate")
        pytest.fail(str(exc), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop(mode="fast")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_cluster: PrivateCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """URL of a fresh empty database (owner ``loadmaster``), dropped after the test; ``PGPASSFILE``
    points at the cluster's pgpass so libpq finds the password (the URL carries none)."""
    monkeypatch.setenv("PGPASSFILE", str(pg_cluster.pgpass))
    name = f"t_{secrets.token_hex(6)}"
    url = pg_cluster.create_database(name)
    try:
        yield url
    finally:
        if pg_cluster.is_running():
            pg_cluster.drop_database(name)


@pytest.fixture(params=["sqlite", "postgresql"], ids=["sqlite", "postgresql"])
def state_url(request: pytest.FixtureRequest) -> str | None:
    """The ``[state] url`` a test runs against: None (the embedded SQLite default) or a fresh
    PostgreSQL database (see ``pg_url``)."""
    if request.param == "sqlite":
        return None
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def state_db(state_url: str | None, tmp_path: Path) -> Iterator[StateDB]:
    """An open state database on each backend: a SQLite file under ``tmp_path``, or a fresh
    PostgreSQL database."""
    db: StateDB = SQLiteState(tmp_path / "state.sqlite3") if state_url is None else PostgresState(state_url)
    try:
        yield db
    finally:
        db.close()
