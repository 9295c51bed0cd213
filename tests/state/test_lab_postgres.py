"""``Lab(postgres=True)`` and ``loadmaster lab up --postgres``: the lab's private PostgreSQL is in its
config as ``[state] url``, its pgpass in the environment, stopped by ``down`` with the data kept."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from backend.config import load_config_file
from lab import Lab
from tui.cli import main

pytestmark = [pytest.mark.lab]


@pytest.fixture
def lab_dir() -> Iterator[Path]:
    """A lab directory the server's user can enter (pytest's tmp_path is root's own, 0700)."""
    root = Path(tempfile.mkdtemp(prefix="lm-lab-pg-"))
    root.chmod(0o711)
    try:
        yield root / "lab"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_lab_with_postgres_up_down_up_keeps_the_database(lab_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = Lab(lab_dir, nodes=1, with_s3=False, postgres=True).up()
    try:
        assert lab.postgres is not None and lab.postgres.is_running()
        assert lab.postgres.root == lab_dir / "postgres"
        url = lab.postgres.url
        state = tomllib.loads(lab.config_path.read_text())["state"]
        assert state == {"dir": str(lab_dir / "state"), "url": url}
        assert load_config_file(lab.config_path).state.url == url
        env = lab.env()
        assert env["PGPASSFILE"] == str(lab.postgres.pgpass)
        info = json.loads((lab_dir / "lab.json").read_text())
        assert info["postgres"]["url"] == url and info["postgres"]["pid"] == lab.postgres.pid()
        # A client with the lab's environment only (no password anywhere else) reaches the database.
        monkeypatch.delenv("PGPASSWORD", raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT current_user, current_database()").fetchone() == ("loadmaster", "loadmaster")
            conn.execute("CREATE TABLE survives_down (v int)")
            conn.execute("INSERT INTO survives_down VALUES (7)")
    finally:
        lab.down()
    assert not lab.postgres.is_running()
    assert not (lab_dir / "lab.json").exists()

    again = Lab(lab_dir, nodes=1, with_s3=False, postgres=True).up()
    try:
        assert again.postgres is not None and again.postgres.url == url
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT v FROM survives_down").fetchall() == [(7,)]
    finally:
        again.down()


def test_without_postgres_the_config_and_env_are_unchanged(tmp_path: Path) -> None:
    lab = Lab(tmp_path / "lab", nodes=1, with_s3=False)
    assert lab.postgres is None
    assert lab.config_text().endswith(f'[state]\ndir = "{tmp_path / "lab" / "state"}"\n')
    assert "PGPASSFILE" not in lab.env()


def test_cli_lab_up_postgres_prints_the_second_operator_line(lab_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["lab", "up", "--dir", str(lab_dir), "--nodes", "1", "--no-seed", "--postgres"])
    try:
        out, err = capsys.readouterr()
        assert rc == 0, err
        pgpass = lab_dir / "postgres" / "pgpass"
        config = lab_dir / "loadmaster.toml"
        first = out.strip().splitlines()[-1]
        assert f"PGPASSFILE={pgpass}" in first and f"--config {config}" in first
        second = next(line for line in err.splitlines() if line.startswith("a second operator"))
        assert 'HOME="$(mktemp -d)"' in second
        assert f"LOADMASTER_CONFIG={config}" in second and f"PGPASSFILE={pgpass}" in second
        # the first operator's environment, extended (nothing of it dropped)
        first_env = [w for w in first.split() if re.match(r"^[A-Z_]+=", w)]
        assert first_env and all(w in second.split() for w in first_env)
        for pw in [line.rsplit(":", 1)[1] for line in pgpass.read_text().splitlines()]:
            assert pw not in out and pw not in err

        assert main(["lab", "status", "--dir", str(lab_dir)]) == 0
        status = capsys.readouterr().out
        assert re.search(r"^postgres +postgresql://loadmaster@127\.0\.0\.1:\d+/loadmaster up ", status, re.M), status
    finally:
        assert main(["lab", "down", "--dir", str(lab_dir)]) == 0
    assert "PG_VERSION" in os.listdir(lab_dir / "postgres" / "data")  # the data stays
    assert not (lab_dir / "postgres" / "data" / "postmaster.pid").exists()
