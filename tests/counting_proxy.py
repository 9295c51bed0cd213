"""A counting HTTP proxy in front of the lab's SeaweedFS S3: how many bytes the store really sent.

Tests and benchmarks point the store's ``endpoint_url`` at :attr:`CountingProxy.endpoint`; every
request is forwarded to SeaweedFS unchanged (the Host header too, so SigV4 signatures still
verify) and every response body byte is counted on its way back, per method, independently of
anything loadmaster reports. HTTP/1.1 keep-alive, streamed bodies (never held whole in memory).
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


class CountingProxy:
    """Forward to ``upstream`` (``http://host:port``), counting response body bytes."""

    def __init__(self, upstream: str, ip: str = "127.0.0.1") -> None:
        u = urlsplit(upstream)
        self.upstream_host = u.hostname or "127.0.0.1"
        self.upstream_port = u.port or 80
        self.lock = threading.Lock()
        self.body_bytes: dict[str, int] = {}
        self.requests: dict[str, int] = {}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
                return

            def _send(self, conn: http.client.HTTPConnection, body: bytes) -> http.client.HTTPResponse:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in self.headers.items():
                    if k.lower() not in _HOP:
                        conn.putheader(k, v)
                conn.endheaders(body or None)
                return conn.getresponse()

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                conn = getattr(self, "_upstream", None)
                try:
                    if conn is None:
                        raise ConnectionError("no upstream connection yet")
                    resp = self._send(conn, body)
                except (ConnectionError, http.client.HTTPException):
                    # The server closed an idle keep-alive connection: once more on a new one.
                    if conn is not None:
                        conn.close()
                    conn = self._upstream = http.client.HTTPConnection(
                        proxy.upstream_host, proxy.upstream_port, timeout=300
                    )
                    resp = self._send(conn, body)
                self.send_response_only(resp.status, resp.reason)
                bodiless = self.command == "HEAD" or resp.status in (204, 304) or resp.status < 200
                chunked = resp.getheader("Content-Length") is None and not bodiless
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP:
                        self.send_header(k, v)
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                sent = 0
                while True:
                    block = resp.read(1 << 20)
                    if not block:
                        break
                    if chunked:
                        self.wfile.write(f"{len(block):x}\r\n".encode() + block + b"\r\n")
                    else:
                        self.wfile.write(block)
                    sent += len(block)
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                with proxy.lock:
                    proxy.body_bytes[self.command] = proxy.body_bytes.get(self.command, 0) + sent
                    proxy.requests[self.command] = proxy.requests.get(self.command, 0) + 1

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward  # noqa: N815 - the stdlib's names

        self.ip = ip
        self.server = ThreadingHTTPServer((ip, 0), Handler)
        self.server.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.ip}:{self.server.server_address[1]}"

    def start(self) -> CountingProxy:
        self.thread = threading.Thread(target=self.server.serve_forever, name="counting-proxy", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reset(self) -> None:
        with self.lock:
            self.body_bytes.clear()
            self.requests.clear()

    @property
    def served(self) -> int:
        """Response body bytes sent to clients for GET requests (object data and listings)."""
        with self.lock:
            return self.body_bytes.get("GET", 0)

    def __enter__(self) -> CountingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
