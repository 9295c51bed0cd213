"""The private PostgreSQL cluster (lab/postgres.py): the real Debian server, started as an
unprivileged user, passwords only in the pgpass file."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from lab import PrivateCluster
from lab import postgres as pgmod
from lab.postgres import INSTALL_HINT, ClusterError, PostgresNotInstalled


@dataclass
class ArgvWatch:
    """Every process's argv (``ps -eww -o args``), sampled in a loop while something runs."""

    snapshots: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True, check=False).stdout
            self.snapshots.append(out)

    def __enter__(self) -> ArgvWatch:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=10)

    def saw(self, word: str) -> bool:
        return any(word in snap for snap in self.snapshots)


@dataclass
class Fresh:
    cluster: PrivateCluster
    start_argv: ArgvWatch


@pytest.fixture(scope="module")
def fresh() -> Iterator[Fresh]:
    """A cluster of this module's own (the lifecycle tests stop it), created while argv is watched."""
    root = Path(tempfile.mkdtemp(prefix="lm-pg-own-"))
    cluster = PrivateCluster(root)
    try:
        with ArgvWatch() as watch:
            cluster.start()
        yield Fresh(cluster, watch)
    finally:
        cluster.stop(mode="immediate")
        shutil.rmtree(root, ignore_errors=True)


def _passwords(cluster: PrivateCluster) -> list[str]:
    lines = cluster.pgpass.read_text().splitlines()
    assert len(lines) == 2, "one line for the superuser, one for loadmaster"
    return [line.rsplit(":", 1)[1] for line in lines]


def test_password_is_in_no_argv_url_or_log(fresh: Fresh) -> None:
    cluster = fresh.cluster
    watch = fresh.start_argv
    # The watch did see the start (else its silence would prove nothing).
    assert watch.saw("initdb") and watch.saw("pg_ctl"), "ps never caught initdb/pg_ctl running"
    passwords = _passwords(cluster)
    assert all(len(p) >= 24 for p in passwords)
    for pw in passwords:
        assert not watch.saw(pw), "a password showed in a process's argv"
        assert pw not in cluster.url and pw not in cluster.admin_url
        assert pw not in cluster.log_path.read_text()
        assert pw not in (cluster.root / "cluster.json").read_text()
        assert pw not in (cluster.data_dir / "loadmaster.conf").read_text()
    assert os.stat(cluster.pgpass).st_mode & 0o777 == 0o600
    assert not list(cluster.root.glob(".initdb-pw-*")), "initdb's password file outlived initdb"
    assert cluster.url == f"postgresql://loadmaster@127.0.0.1:{cluster.port}/loadmaster"
    assert cluster.env() == {"PGPASSFILE": str(cluster.pgpass)}


def test_server_runs_unprivileged_with_the_settings(fresh: Fresh) -> None:
    cluster = fresh.cluster
    pid = cluster.pid()
    assert pid is not None
    uid = next(
        int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:")
    )
    assert uid != 0, "the postmaster runs as root"
    if os.geteuid() == 0:
        assert uid == pwd.getpwnam("postgres").pw_uid
        assert cluster.data_dir.stat().st_uid == uid
    else:
        assert uid == os.geteuid()
    with cluster.connect() as conn:
        settings = dict(conn.execute("SELECT name, setting FROM pg_settings").fetchall())
        rolpw = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = 'loadmaster'").fetchone()
        hba = conn.execute("SELECT type, auth_method FROM pg_hba_file_rules").fetchall()
    assert int(settings["max_connections"]) >= 300
    assert settings["listen_addresses"] == "127.0.0.1"
    assert settings["fsync"] == "on"
    assert settings["unix_socket_directories"] == str(cluster.socket_dir)
    assert (cluster.socket_dir / f".s.PGSQL.{cluster.port}").exists()
    assert rolpw is not None and rolpw[0].startswith("SCRAM-SHA-256$")
    assert {m for t, m in hba if t == "host"} == {"scram-sha-256"}
    assert {m for t, m in hba if t == "local"} == {"peer"}


def test_stop_start_restart_keep_the_data(fresh: Fresh) -> None:
    cluster = fresh.cluster
    port = cluster.port
    with psycopg.connect(cluster.url, passfile=str(cluster.pgpass), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (v text)")
        conn.execute("INSERT INTO kept VALUES ('before restart')")
    first_pid = cluster.pid()

    # Restarted under an open connection (a job's): that connection breaks, a new one works.
    held = psycopg.connect(cluster.url, passfile=str(cluster.pgpass), autocommit=True)
    cluster.restart()
    assert cluster.is_running() and cluster.port == port and cluster.pid() != first_pid
    with pytest.raises(psycopg.OperationalError):
        held.execute("SELECT 1")
    held.close()
    with psycopg.connect(cluster.url, passfile=str(cluster.pgpass), autocommit=True) as conn:
        assert conn.execute("SELECT v FROM kept").fetchall() == [("before restart",)]
        conn.execute("INSERT INTO kept VALUES ('before stop')")

    cluster.stop()
    assert not cluster.is_running() and cluster.pid() is None
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(cluster.url, passfile=str(cluster.pgpass), connect_timeout=3)
    cluster.stop()  # stopping a stopped cluster is a no-op

    # start() on the existing data dir: no initdb, same port, same passwords, the rows are there.
    passwords = _passwords(cluster)
    again = PrivateCluster(cluster.root)  # a new object, as `lab up` after `lab down` makes
    again.start()
    assert again.port == port and _passwords(again) == passwords
    with psycopg.connect(again.url, passfile=str(again.pgpass), autocommit=True) as conn:
        assert [r[0] for r in conn.execute("SELECT v FROM kept ORDER BY v").fetchall()] == [
            "before restart",
            "before stop",
        ]
    again.start()  # already running: a no-op
    assert again.is_running()


def test_a_connection_without_the_pgpass_file_is_refused(
    pg_cluster: PrivateCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGPASSFILE", raising=False)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.pgpass to fall back on
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(pg_cluster.url, connect_timeout=5)
    wrong = tmp_path / "wrong-pgpass"
    wrong.write_text(f"127.0.0.1:{pg_cluster.port}:*:loadmaster:not-the-password\n")
    wrong.chmod(0o600)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(pg_cluster.url, passfile=str(wrong), connect_timeout=5)
    for key, value in pg_cluster.env().items():
        monkeypatch.setenv(key, value)
    with psycopg.connect(pg_cluster.url, connect_timeout=5) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("loadmaster",)


def test_create_database_gives_an_empty_database_owned_by_loadmaster(pg_cluster: PrivateCluster, pg_url: str) -> None:
    assert pg_url.startswith(f"postgresql://loadmaster@127.0.0.1:{pg_cluster.port}/t_")
    name = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url, autocommit=True) as conn:  # PGPASSFILE comes from the fixture
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
        ).fetchone()
        owner = conn.execute(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()"
        ).fetchone()
        conn.execute("CREATE TABLE mine (i int)")
    assert tables == (0,)
    assert owner == ("loadmaster",)
    other = pg_cluster.create_database(f"{name}_b")
    with psycopg.connect(other, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('mine')").fetchone() == (None,)
    pg_cluster.drop_database(f"{name}_b")
    with pg_cluster.connect() as conn:
        assert conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (f"{name}_b",)).fetchone() is None
    with pytest.raises(ClusterError, match="database name"):
        pg_cluster.create_database("Robert'); DROP TABLE students;--")


@pytest.mark.parametrize("case", ["env", "nowhere"])
def test_missing_binaries_give_the_one_line_error(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    if case == "env":
        monkeypatch.setenv("LOADMASTER_PG_BINDIR", str(empty))
    else:
        monkeypatch.delenv("LOADMASTER_PG_BINDIR", raising=False)
        monkeypatch.setenv("PATH", str(empty))  # no pg_config
        monkeypatch.setattr(pgmod, "PG_LIB_GLOB", str(tmp_path / "postgresql" / "*" / "bin"))
    assert PrivateCluster.available() is False
    with pytest.raises(PostgresNotInstalled) as err:
        PrivateCluster(tmp_path / "cluster").start()
    message = str(err.value)
    assert "\n" not in message
    if case == "env":
        assert f"LOADMASTER_PG_BINDIR={empty}" in message and "apt-get install postgresql" in message
    else:
        assert message == INSTALL_HINT
    assert not (tmp_path / "cluster").exists(), "nothing is created before the binaries are found"


def test_the_bindir_is_found_and_named_by_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    found = pgmod.find_bindir()
    assert (found / "initdb").exists() and (found / "pg_ctl").exists()
    monkeypatch.setenv("LOADMASTER_PG_BINDIR", str(found))
    assert pgmod.find_bindir() == found and PrivateCluster.available() is True


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's parents can hide a directory from the postgres user")
def test_a_root_only_parent_gives_a_one_line_error(tmp_path: Path) -> None:
    hidden = Path(tempfile.mkdtemp(prefix="lm-pg-hidden-"))  # 0700, root's
    try:
        with pytest.raises(ClusterError) as err:
            PrivateCluster(hidden / "cluster").start()
        assert "\n" not in str(err.value)
        assert f"cannot enter {hidden}" in str(err.value)
    finally:
        shutil.rmtree(hidden)
