"""``/metrics`` listens on loopback unless an address is given, and takes a Prometheus exporter web
config file: TLS (a real certificate, made by openssl) and basic auth (bcrypt hashes); a scrape
without the password gets 401, plain HTTP gets nothing; a wrong file is one line naming the key."""

from __future__ import annotations

import base64
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.alerts.metrics import MetricsHolder, close_metrics_server, parse_listen, serve_metrics
from backend.alerts.webconfig import _bcrypt_checker, load_web_config
from backend.errors import ConfigError
from tui.cli import main


def test_a_bare_port_listens_on_loopback_only() -> None:
    host, port = parse_listen(":0")
    server, thread = serve_metrics(host, port, MetricsHolder())
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        close_metrics_server(server, thread)


def _bcrypt(password: str) -> str:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))


@pytest.fixture
def tls_files(tmp_path: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 and its key (openssl, as an operator would)."""
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", str(tmp_path / "m.key"), "-out", str(tmp_path / "m.crt"),
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return tmp_path


@pytest.fixture
def secured(tls_files: Path) -> Iterator[tuple[int, ssl.SSLContext]]:
    if _bcrypt_checker() is None:
        pytest.skip("neither the bcrypt package nor a crypt(3) with bcrypt is here")
    web = tls_files / "web.yml"
    web.write_text(
        "tls_server_config:\n  cert_file: m.crt\n  key_file: m.key\n"
        f"basic_auth_users:\n  prometheus: '{_bcrypt('s3cret-scrape')}'\n"
    )
    server, thread = serve_metrics("127.0.0.1", 0, MetricsHolder(), load_web_config(web))
    ctx = ssl.create_default_context(cafile=str(tls_files / "m.crt"))
    try:
        yield server.server_port, ctx
    finally:
        close_metrics_server(server, thread)


def _get(url: str, ctx: ssl.SSLContext | None, user: str | None = None, pw: str = "") -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if user is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode())
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_tls_and_basic_auth_guard_the_export(secured: tuple[int, ssl.SSLContext]) -> None:
    port, ctx = secured
    url = f"https://127.0.0.1:{port}/metrics"
    status, body = _get(url, ctx, "prometheus", "s3cret-scrape")
    assert status == 200 and b"loadmaster_info" in body
    assert _get(url, ctx)[0] == 401
    assert _get(url, ctx, "prometheus", "wrong")[0] == 401
    assert _get(url, ctx, "mallory", "s3cret-scrape")[0] == 401
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP is not served
        _get(f"http://127.0.0.1:{port}/metrics", None, "prometheus", "s3cret-scrape")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tls_server_config:\n  cert_file: a\n", "needs both cert_file and key_file"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  ciphers: x\n", "'tls_server_config.ciphers'"),
        ("basic_auth: {}\n", "unknown key 'basic_auth'"),
        ("basic_auth_users:\n  alice: plaintext\n", "basic_auth_users.alice is not a bcrypt hash"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAndVerifyClientCert\n",
            "needs tls_server_config.client_ca_file",
        ),
        ("- a list\n", "not a mapping"),
    ],
)
def test_a_wrong_web_config_is_one_line_naming_the_key(tmp_path: Path, text: str, says: str) -> None:
    f = tmp_path / "web.yml"
    f.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_web_config(f)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_watch_refuses_a_web_config_without_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "lm.toml"
    cfg.write_text(f'[[nodes]]\nname = "n"\nhost = "127.0.0.1"\n\n[state]\ndir = "{tmp_path / "state"}"\n')
    assert main(["--config", str(cfg), "watch", "--once", "--metrics-web-config", str(tmp_path / "w.yml")]) == 2
    err = capsys.readouterr().err
    assert "--metrics-web-config: needs --metrics HOST:PORT" in err and len(err.strip().splitlines()) == 1
