"""The Alertmanager API v2 client against the real Alertmanager (tests/am_fixtures.py), checked with
the real amtool and a real webhook: posting, one page per label set, resolving, silences, refusals,
the server going away and coming back, and a hostile responder that never makes it raise anything
but AlertmanagerUnavailable."""

from __future__ import annotations

import asyncio
import os
import re
import string
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from backend.alerts.alertmanager import (
    LABEL_LIMIT,
    TEXT_LIMIT,
    AlertmanagerClient,
    AlertmanagerRefused,
    AlertmanagerUnavailable,
    AmAlert,
    Matcher,
    format_time,
    parse_time,
)
from backend.errors import ConfigError
from backend.textfmt import safe_text
from lab import alertmanager as lab_am
from tests.am_fixtures import TEST_GROUP_INTERVAL, AlertmanagerLab, unique

pytestmark = [pytest.mark.timeout(120)]

#: Long enough for several group flushes: a second page, if there were one, would have come.
QUIET = TEST_GROUP_INTERVAL * 4


async def quiet_since(posted: float) -> None:
    """Until :data:`QUIET` has passed since ``posted`` (``time.monotonic()`` of the last post)."""
    await asyncio.sleep(max(0.0, QUIET - (time.monotonic() - posted)))


def now() -> datetime:
    return datetime.now(UTC)


def one_line(msg: str, url: str) -> None:
    assert "\n" not in msg and msg.isprintable(), repr(msg)
    assert url in msg, msg
    assert len(msg) < 600, msg


@pytest.fixture
async def client(am_lab: AlertmanagerLab) -> AsyncIterator[AlertmanagerClient]:
    async with AlertmanagerClient(am_lab.url, timeout=5) as c:
        yield c


async def test_a_posted_alert_is_what_amtool_sees(am_lab: AlertmanagerLab, client: AlertmanagerClient) -> None:
    node = unique("node")
    labels = {"alertname": "LmTestPosted", "node": node, "severity": "page"}
    t0 = now()
    await client.post_alerts([AmAlert(labels, {"summary": f"{node} is starved"}, generator_url="http://lm.test/x")])
    [got] = await client.alerts(filter=[Matcher("node", node)])
    assert got.labels == labels
    assert got.annotations == {"summary": f"{node} is starved"}
    assert got.state == "active" and got.silenced_by == () and got.inhibited_by == ()
    assert got.receivers == ("loadmaster",)
    assert got.generator_url == "http://lm.test/x"
    assert got.starts_at is not None and got.ends_at is not None
    assert abs((got.starts_at - t0).total_seconds()) < 5
    # No endsAt posted: it ends resolve_timeout (5 m by default) after the post unless posted again.
    assert 240 < (got.ends_at - t0).total_seconds() < 360

    [seen] = am_lab.amtool_json("alert", "query", f"node={node}")
    assert seen["labels"] == labels and seen["fingerprint"] == got.fingerprint
    assert seen["status"]["state"] == "active"
    table = am_lab.amtool("alert", "query", f"node={node}")
    assert "LmTestPosted" in table and f"{node} is starved" in table


async def test_the_same_labels_twice_from_two_clients_is_one_alert_and_one_page(am_lab: AlertmanagerLab) -> None:
    node = unique("node")
    labels = {"alertname": "LmTestOnce", "node": node}
    async with AlertmanagerClient(am_lab.url) as first, AlertmanagerClient(am_lab.url) as second:
        await first.post_alerts([AmAlert(labels, {"summary": "down"})])
        await second.post_alerts([AmAlert(labels, {"summary": "down"})])
        [page] = am_lab.webhook.wait_pages(1, node=node)
        await second.post_alerts([AmAlert(labels, {"summary": "down"})])  # after the page: no new one
        await first.post_alerts([AmAlert(labels, {"summary": "down"})])
        posted = time.monotonic()
        got = await first.alerts(filter=[f'node="{node}"'])
        assert got == await second.alerts(filter=[f'node="{node}"'])
    assert len(got) == 1
    await quiet_since(posted)
    assert len(am_lab.webhook.pages(node=node)) == 1
    assert page["status"] == "firing" and page["receiver"] == "loadmaster"
    assert [a["labels"] for a in page["alerts"]] == [labels]
    assert page["alerts"][0]["fingerprint"] == got[0].fingerprint


async def test_ends_at_in_the_past_resolves_it(am_lab: AlertmanagerLab, client: AlertmanagerClient) -> None:
    node = unique("node")
    labels = {"alertname": "LmTestResolved", "node": node}
    # Resolved from its first post (checked below): posted first, so its quiet time passes while
    # the other alert fires and resolves.
    quiet = unique("node")
    await client.post_alerts([AmAlert({"alertname": "LmTestResolved", "node": quiet}, ends_at=now())])
    posted = time.monotonic()
    await client.post_alerts([AmAlert(labels)])
    am_lab.webhook.wait_pages(1, status="firing", node=node)
    await client.post_alerts([AmAlert(labels, ends_at=now() - timedelta(seconds=1))])
    assert await client.alerts(filter=[Matcher("node", node)]) == []
    assert am_lab.amtool_json("alert", "query", f"node={node}") == []
    [resolved] = am_lab.webhook.wait_pages(1, status="resolved", node=node)
    assert resolved["status"] == "resolved" and resolved["alerts"][0]["labels"] == labels
    assert len(am_lab.webhook.pages(status="firing", node=node)) == 1

    # Resolved from its first post: never active, and nobody is paged for it.
    assert await client.alerts(filter=[Matcher("node", quiet)]) == []
    await quiet_since(posted)
    assert am_lab.webhook.pages(node=quiet) == []


async def test_a_silence_mutes_the_page_until_it_is_expired(
    am_lab: AlertmanagerLab, client: AlertmanagerClient
) -> None:
    node = unique("node")
    comment = f"draining {node} for an NVLink swap"
    matchers = [Matcher("node", node), Matcher("alertname", "LmTest.*", is_regex=True)]
    sid = await client.create_silence(matchers, now(), now() + timedelta(hours=1), "oncall-alice", comment)
    # Posted at once, so its quiet time passes while the silence is checked.
    labels = {"alertname": "LmTestSilenced", "node": node}
    await client.post_alerts([AmAlert(labels)])
    posted = time.monotonic()

    [row] = am_lab.amtool_json("silence", "query", f"node={node}")
    assert row["id"] == sid and row["createdBy"] == "oncall-alice" and row["comment"] == comment
    assert row["status"]["state"] == "active"
    table = am_lab.amtool("silence", "query", f"node={node}")
    assert sid in table and "oncall-alice" in table and "NVLink" in table
    [mine] = [s for s in await client.silences() if s.id == sid]
    assert mine.matchers == tuple(matchers) and mine.created_by == "oncall-alice" and mine.comment == comment
    assert mine.state == "active"
    assert [s.id for s in await client.silences(filter=[Matcher("node", node)])] == [sid]

    [held] = await client.alerts(filter=[Matcher("node", node)])
    assert held.state == "suppressed" and held.silenced_by == (sid,)
    assert await client.alerts(silenced=False, filter=[Matcher("node", node)]) == []
    await quiet_since(posted)
    assert am_lab.webhook.pages(node=node) == []

    await client.expire_silence(sid)
    assert am_lab.amtool_json("silence", "query", f"node={node}") == []  # amtool lists active ones
    [gone] = am_lab.amtool_json("silence", "query", "--expired", f"node={node}")
    assert gone["id"] == sid and gone["status"]["state"] == "expired"
    [mine] = [s for s in await client.silences() if s.id == sid]
    assert mine.state == "expired"
    [page] = am_lab.webhook.wait_pages(1, status="firing", node=node)  # no longer muted: paged
    assert page["alerts"][0]["labels"] == labels
    await client.expire_silence(sid)  # expiring an expired silence is fine


async def test_wrong_requests_are_refused_in_one_line(am_lab: AlertmanagerLab, client: AlertmanagerClient) -> None:
    later = now() + timedelta(hours=1)
    with pytest.raises(AlertmanagerRefused) as bad_regex:
        await client.create_silence([Matcher("alertname", "(", is_regex=True)], now(), later, "t", "bad")
    one_line(str(bad_regex.value), am_lab.url)
    assert "invalid regular expression" in str(bad_regex.value) and not bad_regex.value.retryable

    with pytest.raises(AlertmanagerRefused) as past:
        await client.create_silence(
            [Matcher("node", unique())], now() - timedelta(hours=2), now() - timedelta(hours=1), "t", ""
        )
    assert "end time can't be in the past" in str(past.value)

    with pytest.raises(AlertmanagerRefused) as bad_filter:
        await client.alerts(filter=['node=="x"'])
    one_line(str(bad_filter.value), am_lab.url)
    assert "double quote" in str(bad_filter.value)

    with pytest.raises(AlertmanagerRefused) as bad_label:
        await client.post_alerts([AmAlert({"alertname": "LmTestBad", "bad-name": unique()})])
    one_line(str(bad_label.value), am_lab.url)
    assert 'invalid name "bad-name"' in str(bad_label.value)

    with pytest.raises(AlertmanagerRefused) as unknown:
        await client.expire_silence("00000000-0000-4000-8000-000000000000")
    assert "silence not found" in str(unknown.value)
    with pytest.raises(AlertmanagerRefused) as not_an_id:
        await client.expire_silence("../alerts")
    one_line(str(not_an_id.value), am_lab.url)
    with pytest.raises(AlertmanagerRefused):
        await client.create_silence([], now(), later, "t", "no matchers")


async def test_a_stopped_alertmanager_is_unavailable_then_it_works_again(am_lab: AlertmanagerLab) -> None:
    node = unique("node")
    server = am_lab.server
    old_pid = server.pid
    assert old_pid is not None
    async with AlertmanagerClient(am_lab.url, timeout=3) as c:
        assert (await c.status()).cluster == "disabled"  # --cluster.listen-address= : no gossip
        server.stop()
        try:
            assert not server.running
            with pytest.raises(ProcessLookupError):
                os.kill(old_pid, 0)  # nothing left behind
            with pytest.raises(AlertmanagerUnavailable) as down:
                await c.post_alerts([AmAlert({"alertname": "LmTestRestart", "node": node})])
            one_line(str(down.value), am_lab.url)
            assert "unreachable" in str(down.value) and down.value.retryable
            with pytest.raises(AlertmanagerUnavailable):
                await c.status()
        finally:
            server.start()
        assert server.pid != old_pid
        status = await c.status()  # the same client, after the restart
        assert re.fullmatch(r"\d+\.\d+\.\d+", status.version) and status.uptime is not None
        await c.post_alerts([AmAlert({"alertname": "LmTestRestart", "node": node})])
        [got] = await c.alerts(filter=[Matcher("node", node)])
        assert got.labels["alertname"] == "LmTestRestart"
    am_lab.webhook.wait_pages(1, node=node)


def test_missing_binaries_name_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("lab.prometheus.BIN_DIRS", ())
    with pytest.raises(lab_am.AlertmanagerNotInstalled, match="apt-get install prometheus-alertmanager"):
        lab_am.find_alertmanager()
    with pytest.raises(lab_am.AlertmanagerNotInstalled, match="amtool is not installed"):
        lab_am.find_amtool()


@pytest.mark.parametrize(
    "url",
    [
        "http://pager:s3cret-pw@127.0.0.1:9093",
        "https://:s3cret-pw@am.example:9093/",
        "http://s3cret-pw@am.example",
    ],
)
def test_a_url_with_credentials_is_refused_without_repeating_them(url: str) -> None:
    with pytest.raises(ConfigError) as exc:
        AlertmanagerClient(url)
    msg = str(exc.value)
    assert "s3cret-pw" not in msg and "pager" not in msg and "\n" not in msg
    assert "file" in msg


# -- a hostile responder ----------------------------------------------------------------------------

Responder = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _http(status: str, body: bytes, headers: str = "Content-Type: application/json\r\n") -> bytes:
    return f"HTTP/1.1 {status}\r\n{headers}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body


def _answer(raw: bytes) -> Responder:
    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(raw)
        await writer.drain()

    return respond


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    await reader.read()  # until the client gives up and hangs up


async def _hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")


_ALERT = (
    b'{"annotations":{},"endsAt":"2030-01-01T00:00:00.000Z","fingerprint":"f","receivers":[{"name":"r"}],'
    b'"startsAt":"%s","status":{"inhibitedBy":[],"silencedBy":[],"state":"active"},'
    b'"updatedAt":"2030-01-01T00:00:00.000Z","labels":{"alertname":"X"}}'
)

HOSTILE: dict[str, Responder] = {
    "not http": _answer(b"\x00\xff\x1b[31mSSH-2.0-OpenSSH_9.2\r\n\r\n"),
    "html": _answer(_http("200 OK", b"<html><body>Sign in to continue</body></html>", "Content-Type: text/html\r\n")),
    "huge": _answer(_http("200 OK", b"[" + b'"x",' * 600_000 + b'"x"]')),
    "deep": _answer(_http("200 OK", b"[" * 200_000 + b"]" * 200_000)),
    "wrong shape": _answer(_http("200 OK", b'{"data": [1, 2, 3]}')),
    "list of numbers": _answer(_http("200 OK", b"[1, 2, 3]")),
    "bad time": _answer(_http("200 OK", b"[" + _ALERT % b"yesterday" + b"]")),
    "labels not strings": _answer(
        _http("200 OK", b"[" + (_ALERT % b"2030-01-01T00:00:00Z").replace(b'"X"', b"7") + b"]")
    ),
    "escapes in a 500": _answer(_http("500 Oops", b"\x1b]0;pwned\x07line one\nline two\x1b[2J" + b"z" * 5000)),
    "redirect": _answer(_http("302 Found", b"", "Location: http://169.254.169.254/latest/meta-data/\r\n")),
    "huge header": _answer(b"HTTP/1.1 200 OK\r\nX-Junk: " + b"a" * 100_000 + b"\r\n\r\n[]"),
    "bad length": _answer(b"HTTP/1.1 200 OK\r\nContent-Length: 99999\r\nConnection: close\r\n\r\n[]"),
    "hang up": _hang_up,
    "silent": _silent,
}


@pytest.mark.parametrize("mode", list(HOSTILE))
async def test_a_hostile_answer_is_unavailable_in_one_line(mode: str) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await HOSTILE[mode](reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    calls: list[Callable[[AlertmanagerClient], Awaitable[Any]]] = [
        lambda c: c.alerts(),
        lambda c: c.silences(),
        lambda c: c.status(),
        lambda c: c.create_silence([Matcher("a", "b")], now(), now() + timedelta(hours=1), "t", "c"),
    ]
    try:
        # A silent server is waited out once per call: a shorter timeout there.
        timeout = 0.1 if mode == "silent" else 0.5
        async with AlertmanagerClient(url, timeout=timeout, max_bytes=1 << 20) as c:
            for call in calls:
                with pytest.raises(AlertmanagerUnavailable) as exc:
                    await call(c)
                one_line(str(exc.value), url)
                assert "\x1b" not in str(exc.value)
    finally:
        server.close()
        await server.wait_closed()


# -- serialisation ------------------------------------------------------------------------------------

_zones = st.builds(lambda m: timezone(timedelta(minutes=m)), st.integers(-14 * 60, 14 * 60))
_times = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=_zones)


@given(when=_times)
def test_rfc3339_round_trip(when: datetime) -> None:
    text = format_time(when)
    assert text.endswith("Z") and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", text)
    assert parse_time(text) == when
    # As Go may write it: nanoseconds and an offset.
    go = when.astimezone(timezone(timedelta(hours=-3, minutes=-30))).isoformat(timespec="microseconds")
    assert parse_time(go[:-6] + "789" + go[-6:]) == when
    assert parse_time("0001-01-01T00:00:00Z") is None
    with pytest.raises(ValueError):
        format_time(when.replace(tzinfo=None))


_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,15}", fullmatch=True).filter(
    lambda n: n not in ("alertname", "case") and not n.startswith("__")
)
#: Label values: any text, with what the matcher syntax treats specially (quotes, backslash escapes,
#: commas, braces, operators, whitespace) drawn often.
_values = st.text(
    st.one_of(st.sampled_from('\\"n\n ,{}=!~'), st.characters(exclude_categories=["Cs"])), min_size=1, max_size=40
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(  # what Go's matcher parser unescapes: a literal backslash-n, a trailing backslash, \" and \\
    labels={"v": "a\\nb", "w": "end\\", "x": 'q\\"q', "y": "b\\\\s", "z": 'say "hi",\n{ok}'},
    annotations={"summary": 'x"\\'},
    when=datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=5, minutes=30))),
)
@given(
    labels=st.dictionaries(_names, _values, min_size=1, max_size=4),
    annotations=st.dictionaries(st.text(string.ascii_letters, min_size=1, max_size=10), _values, max_size=3),
    when=st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2025, 1, 1), timezones=_zones),
)
def test_labels_and_times_round_trip_through_alertmanager(
    alertmanager_lab: AlertmanagerLab, labels: dict[str, str], annotations: dict[str, str], when: datetime
) -> None:
    case = unique("case")
    alert = AmAlert(
        {"alertname": "LmTestRoundTrip", "case": case, **labels},
        annotations,
        starts_at=when,
        ends_at=now() + timedelta(minutes=10),
    )

    async def round_trip() -> list[Any]:
        async with AlertmanagerClient(alertmanager_lab.url) as c:
            await c.post_alerts([alert])
            # Every label, by the value: our quoting of arbitrary text against Go's matcher parser.
            return await c.alerts(filter=[Matcher("case", case), *(Matcher(k, v) for k, v in labels.items())])

    [got] = asyncio.run(round_trip())
    # Found by the exact values; read back as they may be shown (the one sanitiser: line breaks
    # become spaces, controls and escape codes go), which is what the CLI and the console get.
    assert got.labels == {k: safe_text(v, LABEL_LIMIT) for k, v in alert.labels.items()}
    assert got.annotations == {k: safe_text(v, TEXT_LIMIT) for k, v in annotations.items()}
    # Alertmanager writes times with milliseconds.
    assert got.starts_at == when.replace(microsecond=when.microsecond // 1000 * 1000)
