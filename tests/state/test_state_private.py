"""The state database keeps to itself: a private dir and files, its password never in a message,
and a schema newer than this loadmaster refused on every new connection (not only the first)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.config import parse_config
from backend.errors import ConfigError
from backend.state import SQLiteState, StateError
from backend.state.migrations import LATEST
from backend.state.postgres import PostgresState, check_url, redact


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_sqlite_state_dir_is_0700_and_its_files_0600(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh" / "state"
    db = SQLiteState(fresh / "state.sqlite3")
    db.record_audit("test", "t", "ok")
    try:
        assert _mode(fresh) == 0o700
        for side in ("", "-wal", "-shm"):
            f = fresh / f"state.sqlite3{side}"
            if f.exists():
                assert _mode(f) == 0o600, side
    finally:
        db.close()

    # A state left readable by an older loadmaster (0755 dir, 0644 files) is made private on open.
    old = tmp_path / "old"
    SQLiteState(old / "state.sqlite3").close()
    os.chmod(old, 0o755)
    os.chmod(old / "state.sqlite3", 0o644)
    SQLiteState(old / "state.sqlite3").close()
    assert _mode(old) == 0o700 and _mode(old / "state.sqlite3") == 0o600


# "Pw" first: a password that is a piece of the URL around it ("loadma") is not a leak.
_password = (
    st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=4, max_size=24)
    .filter(str.isalnum)
    .map(lambda p: "Pw" + p)
)


@settings(max_examples=200, deadline=None)
@given(password=_password)
def test_a_state_url_password_is_never_in_a_message_in_any_spelling(password: str) -> None:
    spellings = [
        f"postgresql://oncall:{password}@db.internal:5432/loadmaster",
        f"postgresql://oncall:{password}%zz@db.internal/loadmaster",  # a bad percent-escape
        f"postgresql://oncall:{quote(password)}@db.internal/loadmaster?sslmode=require",
        f"postgresql://oncall@db.internal/loadmaster?password={password}",
        f"postgresql://oncall@db.internal/loadmaster?password={password}&bad",
        f"postgres+psycopg://oncall:{password}@db.internal/loadmaster",
        f"PostgreSQL://oncall:{password}@db.internal/loadmaster",
        f"host=db.internal user=oncall password={password} dbname=loadmaster",
        f"host=db.internal password='{password} x' dbname=loadmaster",
    ]
    for url in spellings:
        with pytest.raises(ConfigError) as err:
            check_url(url)
        assert password not in str(err.value), url
        assert password not in redact(f"could not connect to {url}", url)
        with pytest.raises(ConfigError) as err:  # and when the config file is read
            parse_config({"state": {"url": url}}, file="loadmaster.toml")
        assert password not in str(err.value), url


def test_a_newer_schema_is_refused_on_a_new_connection_after_an_outage(pg_url: str) -> None:
    db = PostgresState(pg_url)
    try:
        db.record_audit("before", "t", "ok")
        # Another operator's newer loadmaster moves the schema on while this console is connected.
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute(
                "INSERT INTO schema_migrations (version, name, applied) VALUES (%s, 'from the future', 0)",
                (LATEST + 1,),
            )
            other.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        # The console's next statements reconnect: refused in one line, nothing written.
        with pytest.raises(StateError) as err:
            for _ in range(3):
                db.record_audit("after", "t", "ok")
        assert f"newer than this loadmaster knows ({LATEST})" in str(err.value)
        assert "\n" not in str(err.value)
    finally:
        db.close()
    with psycopg.connect(pg_url, autocommit=True) as other:
        assert other.execute("SELECT COUNT(*) FROM audit WHERE action = 'after'").fetchone() == (0,)
