"""backend/http.py against real servers on loopback (aiohttp's own server, and a raw socket that
answers something that is not HTTP): JSON get/post, the capped body, one-line errors that never
show the URL's secrets; and backend/backoff.py's delays (property test)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from backend.backoff import Backoff
from backend.http import HttpClient, HttpFailure
from tests.helpers import serving


@pytest.fixture
async def server() -> AsyncIterator[str]:
    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"got": dict(request.query)})

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"posted": await request.json()}, status=202)

    async def big(_request: web.Request) -> web.Response:
        return web.Response(body=b"x" * 5000)

    async def junk(_request: web.Request) -> web.Response:
        return web.Response(body=b"<html>not json</html>", status=500)

    app = web.Application()
    app.add_routes([web.get("/ok", ok), web.post("/echo", echo), web.get("/big", big), web.get("/junk", junk)])
    async with serving(app) as url:
        yield url


async def test_json_get_and_post(server: str) -> None:
    http = HttpClient(server, name="svc", timeout=5, max_body=1 << 20)
    try:
        assert await http.get_json("/ok", {"a": "1"}) == {"got": {"a": "1"}}
        answer = await http.post_json("/echo", {"b": [1, 2]})
        assert answer.status == 202 and http.decode(answer, "POST /echo") == {"posted": {"b": [1, 2]}}
        with pytest.raises(
            HttpFailure,
            match=r"^svc http://127\.0\.0\.1:\d+ answered GET /junk \(HTTP 500\) with something that is not JSON$",
        ):
            await http.get_json("/junk")
    finally:
        await http.close()


async def test_a_body_over_the_cap_is_refused_or_cut(server: str) -> None:
    http = HttpClient(server, name="svc", timeout=5, max_body=1000)
    try:
        with pytest.raises(HttpFailure, match="answered GET /big with more than 1,000 bytes; not read"):
            await http.request("GET", "/big")
        answer = await http.request("GET", "/big", cut=True)
        assert answer.status == 200 and answer.body == b"x" * 1000
    finally:
        await http.close()


async def test_unreachable_and_not_http_are_one_line_without_the_secret() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    http = HttpClient(f"http://bob:hunter22@127.0.0.1:{closed}", name="svc", timeout=5, max_body=100)
    try:
        with pytest.raises(HttpFailure) as exc:
            await http.get_json("/x")
        msg = str(exc.value)
        assert "unreachable" in msg and "hunter22" not in msg and "\n" not in msg
    finally:
        await http.close()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"SSH-2.0-OpenSSH\r\n\x1b]52;c;evil\x07\r\n\r\n")
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    token = "https://hooks.example/T0KEN-abcdefgh"
    http = HttpClient(
        f"http://127.0.0.1:{port}/{token[8:]}", name="webhook", shown="http://127.0.0.1/...", timeout=5, max_body=100
    )
    try:
        with pytest.raises(HttpFailure) as exc:
            await http.post_json("", {"a": 1})
        msg = str(exc.value)
        assert msg.startswith("webhook http://127.0.0.1/... answered POST with something that is not HTTP (")
        assert "T0KEN" not in msg and "\x1b" not in msg and "\n" not in msg
    finally:
        await http.close()
        srv.close()
        await srv.wait_closed()


@given(
    first=st.floats(0.01, 10),
    ceiling_factor=st.floats(1, 100),
    jitter=st.floats(0, 1),
    fails=st.integers(0, 40),
)
def test_backoff_grows_to_its_ceiling_and_resets(
    first: float, ceiling_factor: float, jitter: float, fails: int
) -> None:
    b = Backoff(first, first * ceiling_factor, jitter=jitter)
    plain = Backoff(first, first * ceiling_factor)
    waits = [b.failed() for _ in range(fails)]
    bases = [plain.failed() for _ in range(fails)]
    for wait, base in zip(waits, bases, strict=True):
        assert (1 - jitter) * base - 1e-9 <= wait <= base + 1e-9 <= first * ceiling_factor + 1e-9
    assert bases == sorted(bases)
    b.reset()
    assert (1 - jitter) * first - 1e-9 <= b.failed() <= first + 1e-9


def test_backoff_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="first <= ceiling"):
        Backoff(5, 1)
