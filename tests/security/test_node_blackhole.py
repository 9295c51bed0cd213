"""A node behind a link that stops forwarding (a black hole: no RST, no FIN, nothing) is marked
unreachable within keepalive interval x count, named, and the other nodes' results still come
back: on a direct pool and through the connection keeper (a first ``jobs`` starts the keeper;
``jobs`` and ``top`` again as its clients, through it). Every command here runs in the test
process (the keeper is its own process either way), so no interpreter start-up is waited on.

No real router misbehaves on demand, so a tiny asyncio TCP proxy in front of a real lab sshd
plays the link: it forwards, then swallows every byte in both directions and keeps the sockets.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.config import load_config_file
from backend.errors import NodeUnreachable
from backend.nodes.keeper import keeper_status, stop_keeper
from backend.nodes.pool import NodePool
from lab import Lab
from tests.pulls_helpers import cli_here

KEEPALIVE_S = 0.5  # x 4: a loaded test machine still answers healthy keepalives within 2 s
KEEPALIVE_COUNT = 4


class BlackHoleProxy:
    """127.0.0.1:<port> -> ``target`` until :meth:`black_hole`; then every byte is swallowed."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.holed = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True, name="blackhole-proxy")
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.base_events.Server | None = None

    def __enter__(self) -> BlackHoleProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(10)
        self._thread.join(10)

    def black_hole(self) -> None:
        self.holed.set()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()
        self.loop.close()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in self._writers:
            w.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.loop.call_soon(self.loop.stop)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers.append(up_writer)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                if not self.holed.is_set():
                    dst.write(data)
                    await dst.drain()
            # EOF from one side is swallowed too: a black hole never closes anything.

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)


@pytest.fixture
def proxied(lab: Lab, tmp_path: Path) -> Iterator[tuple[BlackHoleProxy, Path]]:
    """A proxy in front of node-01's sshd, and a known_hosts that knows node-01 at its address."""
    n1 = lab.node("node-01")
    with BlackHoleProxy(n1.ip, n1.port) as proxy:
        kh = tmp_path / "known_hosts"
        kh.write_text(lab.known_hosts.read_text() + f"[127.0.0.1]:{proxy.port} ssh-ed25519 {n1.public_host_key()}\n")
        yield proxy, kh


async def test_a_black_holed_node_is_unreachable_after_keepalives_and_others_answer(
    lab: Lab, proxied: tuple[BlackHoleProxy, Path]
) -> None:
    proxy, kh = proxied
    n1 = dataclasses.replace(
        lab.config.node("node-01"), host="127.0.0.1", port=proxy.port, known_hosts=str(kh), connect_timeout=2.0
    )
    nodes = [n1, lab.config.node("node-02"), lab.config.node("node-03")]
    pool = NodePool(nodes, keepalive_interval=KEEPALIVE_S, keepalive_count=KEEPALIVE_COUNT)

    async def who(t):  # type: ignore[no-untyped-def]
        return (await t.run("echo $LOADMASTER_NODE")).stdout.strip()

    try:
        assert await pool.fanout(who) == {"node-01": "node-01", "node-02": "node-02", "node-03": "node-03"}
        proxy.black_hole()
        # No per-node timeout here: only the keepalives can end node-01's wait.
        results = await pool.fanout(who)
        assert results["node-02"] == "node-02" and results["node-03"] == "node-03"
        assert isinstance(results["node-01"], NodeUnreachable)
        assert "not responding to keepalive" in str(results["node-01"])
        status = pool.status("node-01")
        assert status.state == "unreachable" and "not responding to keepalive" in (status.last_error or "")
        assert list(pool.unread()) == ["node-01"]
        # A fresh connection into the black hole costs the connect timeout, not forever.
        again = await pool.fanout(who, ["node-01"])
        assert isinstance(again["node-01"], NodeUnreachable)
        assert "no SSH answer within 2s" in str(again["node-01"]) or "next retry" in str(again["node-01"])
    finally:
        await pool.close()


def test_jobs_and_top_through_the_keeper_name_the_black_holed_node(
    lab: Lab,
    proxied: tuple[BlackHoleProxy, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    proxy, kh = proxied
    n1 = lab.node("node-01")
    text = lab.config_text(
        f'\n[ssh]\nkeepalive_interval = "{KEEPALIVE_S}s"\nkeepalive_count = {KEEPALIVE_COUNT}\n'
        "\n[telemetry]\ninterval = 1\n"
    )
    text = text.replace(f'host = "{n1.ip}"', f'host = "127.0.0.1"\nport = {proxy.port}\nknown_hosts = "{kh}"', 1)
    text = text.replace(f'dir = "{lab.root / "state"}"', f'dir = "{tmp_path / "state"}"')
    # A reconnect into the black hole (``top`` after ``jobs``) costs the connect timeout: 3 s
    # (the lab's default is 5 s), still ample for a handshake with a healthy loopback node.
    text = text.replace("connect_timeout = 5.0", "connect_timeout = 3.0", 1)
    cfg = tmp_path / "lm.toml"
    cfg.write_text(text)
    monkeypatch.setenv("LOADMASTER_SSH_PERSIST", "60s")  # through the connection keeper
    try:
        first = cli_here(capsys, cfg, "jobs")  # starts the keeper (its own process)
        assert first.returncode == 0, first.stderr
        config = load_config_file(cfg)
        assert config.node("node-01").connect_timeout == 3.0 and keeper_status(config) is not None
        proxy.black_hole()
        # The next commands are clients of the keeper the first one started.
        res = cli_here(capsys, cfg, "jobs")
        assert res.returncode == 4, res.stderr
        [line] = [ln for ln in res.stderr.splitlines() if ln.startswith("loadmaster:")]
        assert line.startswith("loadmaster: could not read 1 of 4 node(s): node-01 (")
        assert "their jobs may be missing or out of date" in line and "Traceback" not in res.stderr
        assert res.stdout.strip()  # the other nodes' view is printed ("no jobs" or the table)
        top = cli_here(capsys, cfg, "top", "--once")
        assert top.returncode == 4, top.stderr
        assert "could not read 1 of 4 node(s): node-01 (unreachable" in top.stderr
        rows = {ln.split()[0]: ln.split()[1] for ln in top.stdout.splitlines() if ln.startswith("node-")}
        assert rows == {"node-01": "unreachable", "node-02": "up", "node-03": "up", "node-04": "up"}
    finally:
        stop_keeper(load_config_file(cfg))


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('keepalive_interval = "0.05s"', "ssh.keepalive_interval: expected a duration between 0.2s and 300s"),
        ("keepalive_count = 0", "ssh.keepalive_count: expected a whole number between 1 and 100"),
    ],
)
def test_keepalive_settings_are_checked(tmp_path: Path, text: str, needle: str) -> None:
    from backend.errors import ConfigError

    cfg = tmp_path / "lm.toml"
    cfg.write_text(f'[[nodes]]\nname = "here"\ntransport = "local"\n\n[ssh]\n{text}\n')
    with pytest.raises(ConfigError, match=needle):
        load_config_file(cfg)


def test_the_pool_takes_its_keepalives_from_the_config(tmp_path: Path) -> None:
    cfg = tmp_path / "lm.toml"
    cfg.write_text(
        '[[nodes]]\nname = "n1"\nhost = "10.0.0.1"\n\n[ssh]\nkeepalive_interval = "2s"\nkeepalive_count = 4\n'
    )
    pool = NodePool.from_config(load_config_file(cfg))
    t = pool.transport("n1")
    assert (t._keepalive, t._keepalive_count) == (2.0, 4)  # type: ignore[attr-defined]
