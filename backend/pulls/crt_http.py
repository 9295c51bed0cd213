"""HEADs sent ahead through awscrt's HTTP client, many in flight, for the pull's verifier (#33).

Why: measured with ``bench/verify_cost.py`` against SeaweedFS on loopback, one signed HEAD
through ``http.client`` costs ~0.45-0.5 ms of client CPU (Python's header parsing, a Python
socket round trip each), the same HEAD through awscrt's HTTP client (C, its own event-loop thread)
~0.3 ms one at a time and ~0.15 ms with 16 in flight on 16 connections. So the verifier sends an
object's HEAD as soon as s5cmd reports the object in place (:meth:`HeadPool.send`), and the
thread that proves it takes the answer (:meth:`Pending.wait`) when it gets to it.

One request at a time per connection (no HTTP pipelining, which stores and the proxies in front
of them need not support), at most :data:`MAX_CONNECTIONS`; the rest wait in a queue. Nothing
here decides anything: a HEAD that failed, timed out or came back with more than
:data:`MAX_HEADERS` headers (``http.client``'s limit) is an error its caller answers by asking
again the plain way (:class:`backend.pulls.verify.StoreHeads`).

awscrt has no type stubs: its connections and streams are the small Protocols below, its
requests ``object`` and its modules modules.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import os
import threading
import types
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

#: Connections to the store at the most (each with one HEAD in flight).
MAX_CONNECTIONS = 16
#: More response headers than this is an error (as in http.client).
MAX_HEADERS = 100


class _Stream(Protocol):
    """What is used of ``awscrt.http.HttpClientStream``."""

    completion_future: concurrent.futures.Future[int]

    def activate(self) -> None: ...


class _Connection(Protocol):
    """What is used of ``awscrt.http.HttpClientConnection``."""

    def request(
        self, request: object, on_response: Callable[[object, int, list[tuple[str, str]]], None] | None = None
    ) -> _Stream: ...

    def close(self) -> object: ...

    def is_open(self) -> bool: ...


class HeadError(OSError):
    """A HEAD sent ahead had no usable answer (the caller asks again)."""


class Pending:
    """One HEAD sent ahead: its status and lower-cased headers once the store answered."""

    def __init__(self, request: object) -> None:
        self.request = request
        self._done = threading.Event()
        self.status = 0
        self.headers: dict[str, str] = {}
        self.error: str | None = None
        self.abandoned = False
        self.connection: _Connection | None = None

    def on_response(self, http_stream: object, status_code: int, headers: list[tuple[str, str]], **_kw: object) -> None:
        """awscrt's callback (its event-loop thread): the status line and headers."""
        try:
            if len(headers) > MAX_HEADERS:
                self.error = f"got more than {MAX_HEADERS} headers"
                return
            self.status = int(status_code)
            self.headers = {str(k).lower(): str(v) for k, v in headers}
        except Exception as exc:  # noqa: BLE001 - a header awscrt could not hand over: an error
            self.error = f"{type(exc).__name__}: {exc}"

    def finish(self, error: str | None) -> None:
        if error is not None and self.error is None:
            self.error = error
        if self.error is None and not self.status:
            self.error = "no response"
        self._done.set()

    def wait(self, timeout: float) -> tuple[int, dict[str, str]]:
        """(status, headers); :class:`HeadError` when it failed or did not answer in ``timeout`` s
        (its connection is then closed, so a stalled store holds no more HEADs)."""
        if not self._done.wait(timeout):
            self.abandoned = True
            if self.connection is not None:
                _close(self.connection)
            raise HeadError(f"timed out after {timeout:g}s")
        if self.error is not None:
            raise HeadError(self.error)
        return self.status, self.headers


def _close(connection: _Connection) -> None:
    with contextlib.suppress(Exception):
        connection.close()


def _crt() -> tuple[types.ModuleType, types.ModuleType] | None:
    try:
        from awscrt import http, io
    except ImportError:
        return None
    return http, io


def available() -> bool:
    """Whether awscrt's HTTP client can be imported here."""
    return _crt() is not None


class HeadPool:
    """Up to :data:`MAX_CONNECTIONS` awscrt connections to one ``scheme://host``, each sending one
    queued request at a time. Its own event-loop thread; :attr:`cpu_s` is that thread's CPU."""

    def __init__(self, scheme: str, host: str, timeout_s: float) -> None:
        crt = _crt()
        if crt is None:
            raise HeadError("awscrt is not installed")
        self._http, io = crt
        u = urllib.parse.urlsplit(f"//{host}")
        self.host_name = u.hostname or host
        self.port = u.port or (443 if scheme == "https" else 80)
        before = _loop_threads()
        self._group = io.EventLoopGroup(1)
        self._threads = _loop_threads() - before
        self._bootstrap = io.ClientBootstrap(self._group, io.DefaultHostResolver(self._group))
        self._socket = io.SocketOptions()
        self._socket.connect_timeout_ms = int(timeout_s * 1000)
        self._tls: object = None
        if scheme == "https":
            tls = io.ClientTlsContext(io.TlsContextOptions()).new_connection_options()
            tls.set_server_name(self.host_name)
            self._tls = tls
        self._lock = threading.Lock()
        self._idle: list[_Connection] = []
        self._open = 0
        self._queue: collections.deque[Pending] = collections.deque()
        self._closed = False

    @property
    def cpu_s(self) -> float:
        """CPU seconds of this pool's event-loop thread so far (what its sends cost in C)."""
        return _threads_cpu(self._threads)

    def send(self, request: object) -> Pending:
        """Queue ``request`` (a signed ``awscrt.http.HttpRequest``); it goes out on the first free
        connection (a new one while there are fewer than :data:`MAX_CONNECTIONS`)."""
        p = Pending(request)
        conn: _Connection | None = None
        connect = False
        with self._lock:
            if self._closed:
                p.finish("closed")
                return p
            if self._idle:
                conn = self._idle.pop()
            else:
                self._queue.append(p)
                if self._open < MAX_CONNECTIONS:
                    self._open += 1
                    connect = True
        if conn is not None:
            self._start(conn, p)
        elif connect:
            self._connect()
        return p

    def close(self) -> None:
        """Close the idle connections (a busy one closes once its request ends, or its waiter's
        timeout closes it); what is still queued fails."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            queued = list(self._queue)
            self._queue.clear()
        for c in idle:
            _close(c)
        for p in queued:
            p.finish("closed")

    # -- on awscrt's event-loop thread -------------------------------------------------------------

    def _connect(self) -> None:
        try:
            future: concurrent.futures.Future[_Connection] = self._http.HttpClientConnection.new(
                host_name=self.host_name,
                port=self.port,
                bootstrap=self._bootstrap,
                socket_options=self._socket,
                tls_connection_options=self._tls,
            )
        except Exception as exc:  # noqa: BLE001
            self._connect_failed(f"{type(exc).__name__}: {exc}")
            return
        future.add_done_callback(self._connected)

    def _connected(self, future: concurrent.futures.Future[_Connection]) -> None:
        try:
            conn = future.result()
        except Exception as exc:  # noqa: BLE001
            self._connect_failed(f"cannot connect to {self.host_name}:{self.port}: {type(exc).__name__}: {exc}")
            return
        self._next(conn)

    def _connect_failed(self, why: str) -> None:
        """A connection could not be opened: with none left open, what waits fails (the caller
        asks again the plain way); with some, they serve it."""
        with self._lock:
            self._open -= 1
            failed = list(self._queue) if self._open == 0 else []
            if failed:
                self._queue.clear()
        for p in failed:
            p.finish(why)

    def _next(self, conn: _Connection, dead: bool = False) -> None:
        """``conn`` is free: send the next queued request on it, else keep it idle (or drop it:
        ``dead``, closed)."""
        while True:
            with self._lock:
                if dead or self._closed or not conn.is_open():
                    self._open -= 1
                    drop = True
                    p = None
                else:
                    drop = False
                    p = self._queue.popleft() if self._queue else None
                    if p is None:
                        self._idle.append(conn)
            if drop:
                _close(conn)
                self._refill()
                return
            if p is None:
                return
            if not p.abandoned:
                self._start(conn, p)
                return
            p.finish("abandoned")

    def _refill(self) -> None:
        """A connection went away while requests wait: open another for them."""
        with self._lock:
            connect = bool(self._queue) and not self._closed and self._open < MAX_CONNECTIONS
            if connect:
                self._open += 1
        if connect:
            self._connect()

    def _start(self, conn: _Connection, p: Pending) -> None:
        p.connection = conn
        try:
            stream = conn.request(p.request, on_response=p.on_response)
            stream.activate()
        except Exception as exc:  # noqa: BLE001 - a connection the store closed meanwhile
            p.finish(f"{type(exc).__name__}: {exc}")
            _close(conn)
            self._next(conn, dead=True)
            return

        def done(future: concurrent.futures.Future[int]) -> None:
            try:
                future.result()
            except Exception as exc:  # noqa: BLE001
                p.finish(f"{type(exc).__name__}: {exc}")
                _close(conn)
                self._next(conn, dead=True)
                return
            p.finish(None)
            self._next(conn, dead=p.abandoned)

        stream.completion_future.add_done_callback(done)


def _loop_threads() -> set[int]:
    """Ids of this process's threads (the event loop's is told apart by :func:`_threads_cpu`: it
    names itself once it runs)."""
    with contextlib.suppress(OSError):
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    return set()


def _threads_cpu(tids: set[int]) -> float:
    """CPU seconds the awscrt event-loop threads among ``tids`` have run (the scheduler's count)."""
    total = 0
    for tid in tids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            if Path(f"/proc/self/task/{tid}/comm").read_text().startswith("AwsEventLoop"):
                total += int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
    return total / 1e9
