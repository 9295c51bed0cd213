"""The ``/metrics`` server's web config file: TLS and basic auth, the way Prometheus exporters add them.

The file is the Prometheus exporter toolkit's ``--web.config.file`` (YAML; JSON is YAML too)::

    tls_server_config:
      cert_file: /etc/loadmaster/metrics.crt
      key_file: /etc/loadmaster/metrics.key
      client_ca_file: /etc/loadmaster/scraper-ca.crt        # optional: client certificates
      client_auth_type: RequireAndVerifyClientCert          # NoClientCert (default) | VerifyClientCertIfGiven
      min_version: TLS12                                    # TLS12 (default) | TLS13
    basic_auth_users:
      prometheus: $2y$10$...                                # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':')

prometheus_client serves TLS itself (``start_http_server(certfile=, keyfile=, client_cafile=,
client_auth_required=)``) but has no basic auth and reads no such file: :func:`load_web_config`
reads it strictly (an unknown key is refused with its path, as in the exporter toolkit) and
:func:`serve_wsgi` serves prometheus_client's own WSGI app behind TLS and the password check.
Passwords are bcrypt hashes, checked with the ``bcrypt`` package or the C library's crypt(3)
(glibc's libxcrypt knows bcrypt); with neither, a file naming users is refused in one line.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import socket
import ssl
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.exposition import ThreadingWSGIServer

from backend.errors import ConfigError

_TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version"}
_CLIENT_AUTH = {"NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"}
_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


@dataclass(frozen=True)
class WebConfig:
    """What the file says: TLS (None: plain HTTP) and the users allowed in (empty: no password)."""

    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    users: dict[str, str] = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        return self.cert_file is not None


def load_web_config(path: str | Path) -> WebConfig:
    """The web config file at ``path``; :class:`ConfigError` naming the file and the key."""
    where = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the metrics web config {where}: {exc.strerror}") from None
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"reading the metrics web config {where} needs PyYAML (pip install pyyaml)") from None
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        raise ConfigError(f"the metrics web config {where} is not YAML") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"the metrics web config {where} is not a mapping of settings")
    unknown = sorted(str(k) for k in doc if k not in ("tls_server_config", "basic_auth_users"))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: tls_server_config, basic_auth_users)")
    tls = doc.get("tls_server_config") or {}
    users = doc.get("basic_auth_users") or {}
    if not isinstance(tls, dict) or not isinstance(users, dict):
        raise ConfigError(f"{where}: tls_server_config and basic_auth_users are mappings")
    bad = sorted(str(k) for k in tls if k not in _TLS_KEYS)
    if bad:
        raise ConfigError(f"{where}: unknown key 'tls_server_config.{bad[0]}' (known: {', '.join(sorted(_TLS_KEYS))})")
    if not all(isinstance(v, str) and v for v in tls.values()):
        raise ConfigError(f"{where}: every tls_server_config value is a non-empty string")
    if tls and not (tls.get("cert_file") and tls.get("key_file")):
        raise ConfigError(f"{where}: tls_server_config needs both cert_file and key_file")
    auth = tls.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise ConfigError(f"{where}: tls_server_config.client_auth_type {auth!r} is not one of {sorted(_CLIENT_AUTH)}")
    if auth != "NoClientCert" and not tls.get("client_ca_file"):
        raise ConfigError(f"{where}: client_auth_type {auth} needs tls_server_config.client_ca_file")
    if tls.get("min_version", "TLS12") not in _VERSIONS:
        raise ConfigError(f"{where}: tls_server_config.min_version is TLS12 or TLS13")
    for user, hashed in users.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise ConfigError(f"{where}: basic_auth_users has a user name that is not text without ':'")
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(f"{where}: basic_auth_users.{user} is not a bcrypt hash ($2y$...)")
    if users and _bcrypt_checker() is None:
        raise ConfigError(f"{where}: basic_auth_users needs bcrypt (pip install bcrypt); or use client certificates")
    base = Path(path).parent

    def file(key: str) -> str | None:
        v = tls.get(key)
        return None if v is None else str(base / v) if not Path(v).is_absolute() else v

    return WebConfig(
        cert_file=file("cert_file"),
        key_file=file("key_file"),
        client_ca_file=file("client_ca_file"),
        client_auth_type=auth,
        min_version=tls.get("min_version", "TLS12"),
        users=dict(users),
    )


def _bcrypt_checker() -> Callable[[str, str], bool] | None:
    """A bcrypt check (password, hash) -> bool: the ``bcrypt`` package, else crypt(3)."""
    try:
        import bcrypt

        return lambda pw, hashed: bool(bcrypt.checkpw(pw.encode(), hashed.encode()))
    except ImportError:
        pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt
    except ImportError:
        return None
    probe = "$2b$04$" + "a" * 22
    if not (crypt.crypt("x", probe) or "").startswith("$2b$04$"):
        return None  # this C library has no bcrypt

    def check(pw: str, hashed: str) -> bool:
        got = crypt.crypt(pw, hashed)
        return got is not None and hmac.compare_digest(got, hashed)

    return check


def ssl_context(web: WebConfig) -> ssl.SSLContext:
    """The server's TLS context: its certificate, the minimum version, client certificates."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _VERSIONS[web.min_version]
    assert web.cert_file is not None and web.key_file is not None
    try:
        ctx.load_cert_chain(web.cert_file, web.key_file)
        if web.client_ca_file:
            ctx.load_verify_locations(web.client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"metrics TLS: cannot load the certificate, key or CA ({exc})") from None
    ctx.verify_mode = {
        "NoClientCert": ssl.CERT_NONE,
        "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
        "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
    }[web.client_auth_type]
    return ctx


def with_basic_auth(app: Callable[..., Iterable[bytes]], users: dict[str, str]) -> Callable[..., Iterable[bytes]]:
    """``app`` behind HTTP basic auth for ``users`` (name -> bcrypt hash); anything else is 401."""
    check = _bcrypt_checker()
    assert check is not None
    lock = threading.Lock()
    good: set[tuple[str, str]] = set()  # pairs already checked (bcrypt is slow on purpose)

    def allowed(header: str) -> bool:
        scheme, _, b64 = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, pw = base64.b64decode(b64, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = users.get(user)
        if not sep or hashed is None:
            return False
        with lock:
            if (user, pw) in good:
                return True
        ok = check(pw, hashed)
        if ok:
            with lock:
                good.add((user, pw))
        return ok

    def auth_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if allowed(environ.get("HTTP_AUTHORIZATION", "")):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized", [("WWW-Authenticate", 'Basic realm="loadmaster"'), ("Content-Type", "text/plain")]
        )
        return [b"Unauthorized\n"]

    return auth_app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass


def serve_wsgi(
    host: str, port: int, app: Callable[..., Iterable[bytes]], web: WebConfig
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``app`` on ``host:port`` from a daemon thread, behind the web config's TLS and users
    (as prometheus_client's ``start_http_server`` does, plus the password check)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    if web.users:
        app = with_basic_auth(app, web.users)
    ctx = ssl_context(web) if web.tls else None
    httpd = make_server(host, port, app, Server, handler_class=_QuietHandler)
    if ctx is not None:
        # The handshake happens in the request's own thread, on its first read: a client that
        # connects and says nothing holds that thread alone, not the accept loop.
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True, do_handshake_on_connect=False)
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return httpd, thread
