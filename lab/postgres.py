"""A private PostgreSQL cluster on loopback, for the tests and the lab (``lab up --postgres``).

The real Debian PostgreSQL (``initdb``, ``pg_ctl``), started the way an operator starts one: a data
dir of its own, TCP on 127.0.0.1 with SCRAM passwords, the unix socket inside the cluster's root
(peer auth, for the server's own user only). PostgreSQL refuses to run as root, so under root the
server runs as the ``postgres`` system user (``runuser``); otherwise as the current user.

Secrets: the superuser password reaches ``initdb`` through a 0600 ``--pwfile``; the application
role's password is set over a connection that reads the superuser's from the ``pgpass`` file, and
only its SCRAM verifier goes over the wire. No password is in any argv, URL or log line.

Layout of ``root``::

    data/           PGDATA (owned by the server user, 0700)
    run/            the unix socket (owned by the server user, 0700)
    postgres.log    the server log (pg_ctl -l)
    pgpass          0600, one line per role: 127.0.0.1:PORT:*:ROLE:PASSWORD
    cluster.json    port and role names (no secret)
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.errors import LoadmasterError
from lab.ports import free_port, port_free

if TYPE_CHECKING:
    import psycopg

INSTALL_HINT = "PostgreSQL not installed: apt-get install postgresql (or set LOADMASTER_PG_BINDIR)"

#: Where Debian puts the server binaries (not on PATH); the newest version wins. A module
#: attribute so tests can take a machine without PostgreSQL into account.
PG_LIB_GLOB = "/usr/lib/postgresql/*/bin"

#: The binaries this module runs.
_NEEDED = ("initdb", "pg_ctl", "postgres", "pg_isready")

#: The system user the server runs as when loadmaster runs as root (created by the Debian package).
SERVER_USER_UNDER_ROOT = "postgres"

APP_ROLE = "loadmaster"
APP_DATABASE = "loadmaster"

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_STOP_MODES = ("smart", "fast", "immediate")
# sockaddr_un.sun_path is 108 bytes on Linux, the terminating NUL included.
_SOCKET_PATH_MAX = 107


class PostgresNotInstalled(LoadmasterError):
    """The PostgreSQL server binaries were not found."""


class ClusterError(LoadmasterError):
    """The private cluster could not be created, started, stopped or used."""


def find_bindir() -> Path:
    """The PostgreSQL bin directory: ``$LOADMASTER_PG_BINDIR``, ``pg_config --bindir``, or the
    newest ``/usr/lib/postgresql/*/bin``; :class:`PostgresNotInstalled` when none has the server."""
    explicit = os.environ.get("LOADMASTER_PG_BINDIR")
    if explicit:
        path = Path(explicit).expanduser()
        missing = [b for b in _NEEDED if not os.access(path / b, os.X_OK)]
        if missing:
            raise PostgresNotInstalled(
                f"PostgreSQL not installed in LOADMASTER_PG_BINDIR={explicit} (no {missing[0]} there): "
                "apt-get install postgresql, or point LOADMASTER_PG_BINDIR at its bin directory"
            )
        return path
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=False
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        if out:
            candidates.append(Path(out))

    def version(p: str) -> tuple[int, ...]:
        digits = re.findall(r"\d+", Path(p).parent.name)
        return tuple(int(d) for d in digits)

    candidates += [Path(p) for p in sorted(glob.glob(PG_LIB_GLOB), key=version, reverse=True)]
    for cand in candidates:
        if all(os.access(cand / b, os.X_OK) for b in _NEEDED):
            return cand
    raise PostgresNotInstalled(INSTALL_HINT)


def _conf_quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _one_line(text: str, lines: int = 3) -> str:
    tail = [ln.strip() for ln in text.strip().splitlines() if ln.strip()][-lines:]
    return " | ".join(tail) if tail else "no output"


class PrivateCluster:
    """A PostgreSQL cluster of its own under ``root``, on 127.0.0.1:``port`` (free one if None).

    ``start()`` creates it the first time and starts it (again) afterwards, keeping the data;
    ``url`` is the application database (role ``loadmaster``, password in ``pgpass``)."""

    HOST = "127.0.0.1"

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = Path(root).expanduser().absolute()
        self._port = port
        self._requested_port = port
        self._admin: str | None = None

    # -- discovery -----------------------------------------------------------------------------
    @staticmethod
    def available() -> bool:
        """Are the PostgreSQL server binaries installed (see :func:`find_bindir`)?"""
        try:
            find_bindir()
        except PostgresNotInstalled:
            return False
        return True

    # -- paths and addresses ---------------------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "run"

    @property
    def log_path(self) -> Path:
        return self.root / "postgres.log"

    @property
    def pgpass(self) -> Path:
        return self.root / "pgpass"

    @property
    def _state_path(self) -> Path:
        return self.root / "cluster.json"

    @property
    def port(self) -> int:
        if self._port is None:
            self._load_state()
        if self._port is None:
            raise ClusterError(f"the PostgreSQL cluster in {self.root} was never started: no port yet")
        return self._port

    @property
    def admin_user(self) -> str:
        """The superuser: the server's own system user (so peer auth on the socket matches it)."""
        if self._admin is None:
            self._load_state()
        return self._admin or self._server_user()[0]

    @property
    def url(self) -> str:
        """The application database, as role ``loadmaster``; the password is in :attr:`pgpass`."""
        return self.database_url(APP_DATABASE)

    @property
    def admin_url(self) -> str:
        return f"postgresql://{self.admin_user}@{self.HOST}:{self.port}/postgres"

    def database_url(self, name: str) -> str:
        return f"postgresql://{APP_ROLE}@{self.HOST}:{self.port}/{name}"

    def env(self) -> dict[str, str]:
        """What a client process needs besides the URL: libpq reads the password from here."""
        return {"PGPASSFILE": str(self.pgpass)}

    def pid(self) -> int | None:
        """The postmaster's pid (first line of ``postmaster.pid``), if the file is there."""
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
        except OSError:
            return None
        return int(first) if first.strip().isdigit() else None

    # -- who runs the server -----------------------------------------------------------------------
    @staticmethod
    def _server_user() -> tuple[str, int, int]:
        """(name, uid, gid) of the user the server runs as."""
        if os.geteuid() != 0:
            entry = pwd.getpwuid(os.geteuid())
            return entry.pw_name, entry.pw_uid, entry.pw_gid
        try:
            entry = pwd.getpwnam(SERVER_USER_UNDER_ROOT)
        except KeyError:
            raise ClusterError(
                f"PostgreSQL refuses to run as root and there is no '{SERVER_USER_UNDER_ROOT}' system user: "
                "apt-get install postgresql (it creates one), or run as a normal user"
            ) from None
        return entry.pw_name, entry.pw_uid, entry.pw_gid

    def _as_server(self, args: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return args
        name = self._server_user()[0]
        runuser = shutil.which("runuser") or next(
            (p for p in ("/usr/sbin/runuser", "/sbin/runuser") if os.path.exists(p)), None
        )
        if runuser:
            return [runuser, "-u", name, "--", *args]
        setpriv = shutil.which("setpriv")
        if setpriv:
            return [setpriv, f"--reuid={name}", f"--regid={name}", "--init-groups", "--", *args]
        raise ClusterError("running as root needs runuser or setpriv (util-linux) to start PostgreSQL as postgres")

    def _run(
        self, args: list[str], *, timeout: float = 120.0, as_server: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        cmd = self._as_server(args) if as_server else args
        try:
            return subprocess.run(
                cmd,
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ClusterError(f"{Path(args[0]).name} did not finish within {timeout:.0f} s ({self.root})") from None

    def unreachable(self) -> str | None:
        """Why the server user could not reach this cluster's directory (None: it can)."""
        try:
            name, uid, gid = self._server_user()
            self._check_reachable(uid, gid, name)
        except LoadmasterError as exc:
            return str(exc)
        return None

    def _check_reachable(self, uid: int, gid: int, name: str) -> None:
        """Under root, the server user must be able to enter every directory above ``root``."""
        if os.geteuid() != 0:
            return
        groups = set(os.getgrouplist(name, gid))
        for parent in reversed(self.root.parents):
            st = parent.stat()
            if st.st_uid == uid:
                ok = bool(st.st_mode & stat.S_IXUSR)
            elif st.st_gid in groups:
                ok = bool(st.st_mode & stat.S_IXGRP)
            else:
                ok = bool(st.st_mode & stat.S_IXOTH)
            if not ok:
                raise ClusterError(
                    f"PostgreSQL runs as user '{name}', which cannot enter {parent} "
                    f"(mode {stat.S_IMODE(st.st_mode):04o}, owner {_owner(st.st_uid)}): put the cluster under a "
                    "directory it can reach (e.g. in /tmp or /var/tmp) or run as a normal user"
                )

    # -- state ---------------------------------------------------------------------------------------
    def _load_state(self) -> None:
        try:
            state = json.loads(self._state_path.read_text())
        except (OSError, ValueError):
            return
        if self._port is None and isinstance(state.get("port"), int):
            self._port = state["port"]
        if self._admin is None and isinstance(state.get("admin"), str):
            self._admin = state["admin"]

    def _save_state(self) -> None:
        tmp = self._state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"port": self.port, "admin": self.admin_user, "role": APP_ROLE}, indent=2) + "\n")
        tmp.replace(self._state_path)

    def _passwords(self) -> dict[str, str]:
        """Role -> password, from the pgpass file (whatever port its lines name)."""
        out: dict[str, str] = {}
        try:
            text = self.pgpass.read_text()
        except FileNotFoundError:
            return out
        for line in text.splitlines():
            parts = line.split(":")
            if len(parts) == 5:
                out[parts[3]] = parts[4]
        return out

    def _write_pgpass(self, passwords: dict[str, str]) -> None:
        lines = "".join(f"{self.HOST}:{self.port}:*:{role}:{pw}\n" for role, pw in passwords.items())
        tmp = self.pgpass.with_name(".pgpass.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(lines)
        tmp.replace(self.pgpass)

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> PrivateCluster:
        """Create the cluster if ``data/`` holds none, then start it (a no-op when running)."""
        bindir = find_bindir()
        name, uid, gid = self._server_user()
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            # root's own directory: the server user may pass through it, not list or write it
            os.chmod(self.root, 0o711)
        self._check_reachable(uid, gid, name)
        self._load_state()
        if self._admin is None:
            self._admin = name
        if len(str(self.socket_dir / ".s.PGSQL.65535").encode()) > _SOCKET_PATH_MAX:
            raise ClusterError(
                f"{self.socket_dir} is too long for a unix socket path: put the cluster under a shorter directory"
            )
        fresh = not (self.data_dir / "PG_VERSION").exists()
        passwords = self._passwords()
        if fresh:
            passwords = {self.admin_user: secrets.token_urlsafe(24), APP_ROLE: secrets.token_urlsafe(24)}
        elif self.admin_user not in passwords:
            raise ClusterError(
                f"{self.pgpass} has no password for {self.admin_user}: the cluster in {self.data_dir} cannot be "
                "administered; remove that directory to create a fresh one"
            )
        passwords.setdefault(APP_ROLE, secrets.token_urlsafe(24))
        for d in (self.data_dir, self.socket_dir):
            d.mkdir(exist_ok=True)
            os.chmod(d, 0o700)
            if os.geteuid() == 0:
                os.chown(d, uid, gid)
        if not self.log_path.exists():
            self.log_path.touch(0o640)
        if os.geteuid() == 0:
            os.chown(self.log_path, uid, gid)
        if fresh:
            self._initdb(bindir, passwords[self.admin_user], uid, gid)
        if self.is_running():
            if self._port is None:
                raise ClusterError(f"a server runs on {self.data_dir} but {self._state_path} names no port")
            self._write_pgpass(passwords)
        else:
            self._start_server(bindir, uid, gid, passwords, timeout)
        self._save_state()
        self._ensure_app_role(passwords[APP_ROLE])
        return self

    def _initdb(self, bindir: Path, admin_password: str, uid: int, gid: int) -> None:
        pwfile = self.root / f".initdb-pw-{secrets.token_hex(4)}"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(admin_password + "\n")
            if os.geteuid() == 0:
                os.chown(pwfile, uid, gid)
            proc = self._run(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    self.admin_user,
                    f"--pwfile={pwfile}",
                    "--auth-host=scram-sha-256",
                    "--auth-local=peer",
                    "--encoding=UTF8",
                    "--no-locale",
                    "--no-instructions",
                ]
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise ClusterError(f"initdb {self.data_dir} failed (exit {proc.returncode}): {_one_line(proc.stderr)}")
        conf = self.data_dir / "postgresql.conf"
        with conf.open("a") as f:
            f.write(
                "\n# loadmaster's private cluster: its settings (port, addresses) live here.\ninclude 'loadmaster.conf'\n"
            )

    def _write_conf(self, uid: int, gid: int) -> None:
        path = self.data_dir / "loadmaster.conf"
        path.write_text(
            "# Written by loadmaster (lab/postgres.py) at every start.\n"
            f"listen_addresses = {_conf_quote(self.HOST)}\n"
            f"port = {self.port}\n"
            f"unix_socket_directories = {_conf_quote(str(self.socket_dir))}\n"
            "unix_socket_permissions = 0700\n"
            "max_connections = 300\n"
            "shared_buffers = 32MB\n"
            "fsync = on\n"
            "synchronous_commit = on\n"
            "full_page_writes = on\n"
            "password_encryption = 'scram-sha-256'\n"
            "log_line_prefix = '%m [%p] %q%u@%d '\n"
            "log_statement = 'none'\n"
        )
        os.chmod(path, 0o600)
        if os.geteuid() == 0:
            os.chown(path, uid, gid)

    def _start_server(self, bindir: Path, uid: int, gid: int, passwords: dict[str, str], timeout: float) -> None:
        auto_port = self._requested_port is None
        for attempt in range(3):
            if self._port is None or (auto_port and not port_free(self.HOST, self._port)):
                self._port = free_port(self.HOST)
            self._write_conf(uid, gid)
            self._write_pgpass(passwords)
            size_before = self.log_path.stat().st_size
            proc = self._run(
                [
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(self.data_dir),
                    "-l",
                    str(self.log_path),
                    "-w",
                    "-t",
                    str(int(timeout)),
                    "start",
                ],
                timeout=timeout + 30,
            )
            if proc.returncode == 0:
                break
            log = self._log_since(size_before)
            if auto_port and attempt < 2 and "could not bind" in log:
                self._port = None  # lost a race for the port: take another
                continue
            raise ClusterError(
                f"PostgreSQL did not start on {self.HOST}:{self.port} (pg_ctl exit {proc.returncode}): "
                f"{_one_line(log or proc.stderr or proc.stdout)} (log: {self.log_path})"
            )
        self._wait_ready(bindir, timeout)

    def _log_since(self, offset: int) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _wait_ready(self, bindir: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            proc = self._run(
                [str(bindir / "pg_isready"), "-q", "-h", self.HOST, "-p", str(self.port), "-t", "2"],
                timeout=10,
                as_server=False,
            )
            if proc.returncode == 0:
                return
            if time.monotonic() > deadline:
                tail = self._log_since(max(0, self.log_path.stat().st_size - 2000))
                raise ClusterError(
                    f"PostgreSQL on {self.HOST}:{self.port} is not accepting connections after {timeout:.0f} s: "
                    f"{_one_line(tail)} (log: {self.log_path})"
                )
            time.sleep(0.1)

    def is_running(self) -> bool:
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        proc = self._run([str(find_bindir() / "pg_ctl"), "-D", str(self.data_dir), "status"], timeout=30)
        return proc.returncode == 0

    def stop(self, mode: str = "fast", timeout: float = 60.0) -> None:
        """Stop the server (``smart``, ``fast`` or ``immediate``); a no-op when it is not running."""
        if mode not in _STOP_MODES:
            raise ValueError(f"stop mode must be one of {', '.join(_STOP_MODES)}, got {mode!r}")
        if not self.is_running():
            return
        proc = self._run(
            [
                str(find_bindir() / "pg_ctl"),
                "-D",
                str(self.data_dir),
                "-m",
                mode,
                "-w",
                "-t",
                str(int(timeout)),
                "stop",
            ],
            timeout=timeout + 30,
        )
        if proc.returncode != 0 and self.is_running():
            raise ClusterError(
                f"PostgreSQL in {self.data_dir} did not stop (pg_ctl exit {proc.returncode}): "
                f"{_one_line(proc.stderr or proc.stdout)}"
            )

    def restart(self, mode: str = "fast") -> None:
        """Stop and start again on the same port (connections are cut; the data stays)."""
        self.stop(mode)
        self.start()

    # -- SQL -----------------------------------------------------------------------------------------
    def connect(self, dbname: str = "postgres", *, admin: bool = True, **kwargs: Any) -> psycopg.Connection[Any]:
        """A psycopg connection (autocommit) whose password libpq reads from :attr:`pgpass`."""
        import psycopg

        return psycopg.connect(
            host=self.HOST,
            port=self.port,
            user=self.admin_user if admin else APP_ROLE,
            dbname=dbname,
            passfile=str(self.pgpass),
            autocommit=True,
            connect_timeout=10,
            **kwargs,
        )

    def _ensure_app_role(self, password: str) -> None:
        from psycopg import sql

        with self.connect() as conn:
            # Only the SCRAM verifier goes over the wire: a failed statement is logged whole.
            verifier = conn.pgconn.encrypt_password(password.encode(), APP_ROLE.encode(), b"scram-sha-256").decode()
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_ROLE,)).fetchone()
            verb = "ALTER" if exists else "CREATE"
            conn.execute(
                sql.SQL("{} ROLE {} LOGIN CREATEDB PASSWORD {}").format(
                    sql.SQL(verb), sql.Identifier(APP_ROLE), sql.Literal(verifier)
                )
            )
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (APP_DATABASE,)).fetchone():
                conn.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(APP_DATABASE), sql.Identifier(APP_ROLE)
                    )
                )

    @staticmethod
    def _check_name(name: str) -> str:
        if not _NAME.match(name):
            raise ClusterError(f"database name {name!r}: use lower-case letters, digits and _ (at most 63)")
        return name

    def create_database(self, name: str) -> str:
        """A new empty database owned by ``loadmaster`` (from ``template0``); its URL."""
        from psycopg import sql

        self._check_name(name)
        with self.connect() as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {} TEMPLATE template0").format(
                    sql.Identifier(name), sql.Identifier(APP_ROLE)
                )
            )
        return self.database_url(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name`` (its open connections are terminated); no error when it is gone."""
        from psycopg import sql

        self._check_name(name)
        with self.connect() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


__all__ = [
    "ClusterError",
    "INSTALL_HINT",
    "PostgresNotInstalled",
    "PrivateCluster",
    "find_bindir",
]
