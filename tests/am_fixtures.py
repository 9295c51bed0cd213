"""Alertmanager for the tests: the real Alertmanager, notifying a real webhook in the test process.

``alertmanager_lab`` (session) starts a :class:`WebhookSink` (a small HTTP server on loopback
recording every notification Alertmanager POSTs to it) and an :class:`AlertmanagerServer` routing
everything to it, with short timers: ``group_by: [...]`` (every label set is its own group, so one
test's alerts never share a notification with another's), ``group_wait`` 0.2 s, ``group_interval``
0.5 s, ``repeat_interval`` 1 h (a page arrives once; a second one is a new page, not a repeat),
``send_resolved``. ``am_lab`` is the same object for one test, started if an earlier test left it
stopped, with every silence expired and the recorded notifications cleared.

Alertmanager has no API to delete an alert: alerts live until they are resolved (``endsAt`` past)
or time out, so they outlast the test that posted them. Tests use unique label values (a per-test
``node``/``job`` id, :func:`unique`) and look only at their own alerts and pages. A page for an
earlier test's alert can still arrive after the clear (resolved, or retried); tests filter by
their own labels, never count all notifications.

A machine without Alertmanager fails these tests with the install hint.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from backend.errors import LoadmasterError
from lab.alertmanager import AlertmanagerServer
from tests.loopback_http import LoopbackHTTPServer, serve

#: The test timers (seconds).
TEST_GROUP_WAIT = 0.2
TEST_GROUP_INTERVAL = 0.5
TEST_REPEAT_INTERVAL = 3600.0


def unique(prefix: str = "t") -> str:
    """A label value no other test (or earlier run against the same server) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class WebhookSink:
    """A real HTTP server on ``ip`` recording the JSON body of every POST to ``/hook`` (Alertmanager's
    webhook notifications: ``status``, ``receiver``, ``groupLabels``, ``alerts[]`` with ``status``,
    ``labels``, ``annotations``, ``startsAt``, ``endsAt``, ``fingerprint``)."""

    PATH = "/hook"

    def __init__(self, ip: str = "127.0.0.1") -> None:
        self._lock = threading.Lock()
        self._bodies: list[dict[str, Any]] = []
        self.rejected = 0  # POSTs that were not JSON objects
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    doc = json.loads(raw)
                except ValueError:
                    doc = None
                with sink._lock:
                    if isinstance(doc, dict) and self.path == sink.PATH:
                        sink._bodies.append(doc)
                    else:
                        sink.rejected += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
                pass

        self.server = LoopbackHTTPServer((ip, 0), Handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}{self.PATH}"

    def start(self) -> WebhookSink:
        self._thread = serve(self.server, "am-webhook")
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def clear(self) -> None:
        with self._lock:
            self._bodies.clear()
            self.rejected = 0

    def notifications(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._bodies)

    def pages(self, status: str | None = None, **labels: str) -> list[dict[str, Any]]:
        """The notifications holding an alert with all of ``labels`` (and that alert ``status``:
        firing or resolved), in arrival order."""

        def hit(alert: Any) -> bool:
            if not isinstance(alert, dict) or (status is not None and alert.get("status") != status):
                return False
            have = alert.get("labels") or {}
            return all(have.get(k) == v for k, v in labels.items())

        return [n for n in self.notifications() if any(hit(a) for a in n.get("alerts") or ())]

    def wait_pages(
        self, count: int = 1, *, timeout: float = 15.0, status: str | None = None, **labels: str
    ) -> list[dict[str, Any]]:
        """Wait until at least ``count`` notifications match (:meth:`pages`); them, or an
        AssertionError saying what arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.pages(status, **labels)
            if len(got) >= count:
                return got
            time.sleep(0.05)
        raise AssertionError(
            f"{count} {status or 'any'} page(s) for {labels} not in {timeout:g}s; got {self.pages(status, **labels)}"
        )


class AlertmanagerLab:
    """The session's Alertmanager (``server``: an :class:`AlertmanagerServer`, ``.url``,
    ``.amtool(...)``, ``.stop()``/``.start()``) and its webhook (``webhook``: a :class:`WebhookSink`)."""

    def __init__(self, server: AlertmanagerServer, webhook: WebhookSink) -> None:
        self.server = server
        self.webhook = webhook

    @property
    def url(self) -> str:
        return self.server.url

    def amtool(self, *args: str) -> str:
        return self.server.amtool(*args)

    def amtool_json(self, *args: str) -> Any:
        """``amtool ARGS -o json``, decoded."""
        return json.loads(self.server.amtool(*args, "-o", "json"))

    def expire_all_silences(self) -> None:
        """Expire every silence that is not already expired (the API, not the client under test)."""
        with urllib.request.urlopen(f"{self.url}/api/v2/silences", timeout=10) as resp:
            silences = json.loads(resp.read())
        for s in silences:
            if s.get("status", {}).get("state") != "expired":
                req = urllib.request.Request(f"{self.url}/api/v2/silence/{s['id']}", method="DELETE")
                with urllib.request.urlopen(req, timeout=10) as resp:
                    resp.read()

    def reset(self) -> None:
        self.server.start()
        self.expire_all_silences()
        self.webhook.clear()


@pytest.fixture(scope="session")
def alertmanager_lab() -> Iterator[AlertmanagerLab]:
    """A started Alertmanager routing every alert to a :class:`WebhookSink` (see the module)."""
    root = Path(tempfile.mkdtemp(prefix="lm-am-"))
    webhook = WebhookSink().start()
    server = AlertmanagerServer(
        root,
        webhook_url=webhook.url,
        send_resolved=True,
        group_by=("...",),
        group_wait=TEST_GROUP_WAIT,
        group_interval=TEST_GROUP_INTERVAL,
        repeat_interval=TEST_REPEAT_INTERVAL,
    )

    def cleanup() -> None:
        server.stop()
        webhook.stop()
        shutil.rmtree(root, ignore_errors=True)

    try:
        server.start()
    except LoadmasterError as exc:  # AlertmanagerNotInstalled names the apt package
        cleanup()
        pytest.fail(str(exc), pytrace=False)
    try:
        yield AlertmanagerLab(server, webhook)
    finally:
        cleanup()


@pytest.fixture
def am_lab(alertmanager_lab: AlertmanagerLab) -> Iterator[AlertmanagerLab]:
    """The session's ``alertmanager_lab`` for one test: running, no silence in force, no recorded
    notification. Alertmanager cannot delete alerts: use unique label values (:func:`unique`) and
    look only at your own alerts and pages."""
    try:
        alertmanager_lab.reset()
    except (LoadmasterError, OSError) as exc:
        pytest.fail(f"could not reset the test Alertmanager: {exc}", pytrace=False)
    yield alertmanager_lab
    with contextlib.suppress(LoadmasterError):
        alertmanager_lab.server.start()  # a test that stopped it and failed before starting it again
