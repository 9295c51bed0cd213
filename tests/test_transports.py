"""Transports against real sshd nodes (the lab) and local subprocesses: one contract, two implementations."""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend.config import Node
from backend.errors import CommandFailed, CommandTimeout, HostKeyRefused, NodeError, NodeUnreachable
from backend.nodes import ssh as ssh_module
from backend.nodes.pool import NodePool, NodeStatus
from backend.nodes.ssh import SshTransport
from backend.nodes.transport import LocalTransport, Transport
from lab import Lab


def fingerprint_of(pub: Path) -> str:
    """OpenSSH's own fingerprint of a public key file (independent of asyncssh)."""
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)], check=True, capture_output=True, text=True
    ).stdout
    return out.split()[1]


def lab_node(lab: Lab, name: str, **changes: object) -> Node:
    return dataclasses.replace(lab.config.node(name), **changes)  # type: ignore[arg-type]


@pytest.fixture(params=["ssh", "ssh-channels", "local"])
async def transport(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Transport]:
    """ssh: commands through the per-connection command server; ssh-channels: one SSH channel
    (and login shell) per command; local: subprocesses."""
    if request.param.startswith("ssh"):
        lab: Lab = request.getfixturevalue("lab")
        t: Transport = SshTransport(lab.config.node("node-01"), command_server=request.param == "ssh")
    else:
        t = LocalTransport(Node(name="local", host="localhost", transport="local", scratch=str(tmp_path)))
    try:
        yield t
    finally:
        await t.close()


async def pid_alive(t: Transport, pid: int) -> bool:
    return (await t.run(f"kill -0 {pid} 2>/dev/null")).ok


async def started_here(command: str, limit: float = 60.0) -> None:
    """Wait until ``command`` runs on a lab node (the nodes' processes are this machine's): a
    command is then in flight, however long the machine's load made its start take."""
    deadline = asyncio.get_running_loop().time() + limit
    needle = command.encode()
    while asyncio.get_running_loop().time() < deadline:
        for proc in Path("/proc").iterdir():
            try:
                if needle in (proc / "cmdline").read_bytes().replace(b"\0", b" "):
                    return
            except OSError:
                continue
        await asyncio.sleep(0.02)
    raise AssertionError(f"{command!r} never started")


async def eventually(pred, tries: int = 100, pause: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    for _ in range(tries):
        if await pred():
            return True
        await asyncio.sleep(pause)
    return False


# -- the contract, on both transports ------------------------------------------------------------
async def test_run_captures_output_and_status(transport: Transport) -> None:
    res = await transport.run("echo out; echo err >&2; exit 3")
    assert (res.exit_status, res.stdout, res.stderr, res.ok) == (3, "out\n", "err\n", False)
    assert res.node == transport.name
    with pytest.raises(CommandFailed, match="exited 3: err"):
        await transport.run("echo err >&2; exit 3", check=True)
    assert (await transport.run("true", check=True)).ok
    # stdin is closed (empty) when no input is given, and empty input is still an EOF.
    assert (await transport.run("cat", timeout=20)).stdout == ""
    assert (await transport.run("cat", input=b"", timeout=20)).stdout == ""


async def test_secret_goes_through_stdin_not_argv(transport: Transport) -> None:
    secret = f"s3cret-{uuid.uuid4().hex}"
    # The remote side reads stdin while we look at every process's argv on the node.
    res = await transport.run('read -r s; ps -eo args | grep -c -- "$s" || true; printf %s "$s"', input=secret + "\n")
    assert res.stdout.endswith(secret)
    # Only the grep itself carries the secret in its argv (the shell builtin read does not).
    assert res.stdout.splitlines()[0] == "1"


async def test_timeout_kills_the_command(transport: Transport) -> None:
    marker = f"lm-timeout-{uuid.uuid4().hex[:8]}"
    with pytest.raises(CommandTimeout, match="did not finish within 0.5s"):
        await transport.run(f"sh -c 'sleep 30; echo {marker}' & wait", timeout=0.5)

    # Nothing left behind: the command was signalled / its channel closed.
    async def gone() -> bool:
        res = await transport.run(f"ps -eo args | grep -v grep | grep -c {marker} || true")
        return res.stdout.strip() == "0"

    assert await eventually(gone)


async def test_stream_lines_and_close_stops_command(transport: Transport, tmp_path: Path) -> None:
    lines = [line async for line in transport.stream("printf 'a\\nb\\n'; printf 'c'")]
    assert lines == ["a", "b", "c"]
    pidfile = f"/tmp/lm-stream-{uuid.uuid4().hex[:8]}.pid"
    it = transport.stream(f"echo $$ > {pidfile}; while :; do echo tick; sleep 0.1; done")
    got = []
    async for line in it:
        got.append(line)
        if len(got) == 3:
            break
    await it.aclose()  # type: ignore[attr-defined]
    assert got == ["tick"] * 3
    pid = int((await transport.read_file(pidfile)).decode().strip())

    async def stopped() -> bool:
        return not await pid_alive(transport, pid)

    assert await eventually(stopped)
    await transport.run(f"rm -f {pidfile}")


async def test_files_round_trip_with_mode(transport: Transport) -> None:
    path = f"/tmp/lm-files-{uuid.uuid4().hex[:8]}/sub/secret.bin"
    data = bytes(range(256)) * 8
    await transport.write_file(path, data, mode=0o600)
    assert await transport.read_file(path) == data
    mode = await transport.run(f"stat -c %a {shlex.quote(path)}", check=True)
    assert mode.stdout.strip() == "600"
    await transport.write_file(path, "replaced", mode=0o644)
    assert await transport.read_file(path) == b"replaced"
    assert (await transport.run(f"stat -c %a {shlex.quote(path)}")).stdout.strip() == "644"
    with pytest.raises(FileNotFoundError):
        await transport.read_file(path + ".absent")
    await transport.run(f"rm -rf {shlex.quote(str(Path(path).parent.parent))}")


# -- SSH specifics ------------------------------------------------------------------------------
async def test_changed_host_key_refused_with_both_fingerprints(lab: Lab, tmp_path: Path) -> None:
    # A known_hosts copy where node-01's line carries node-02's key: a "changed" host key.
    kh = tmp_path / "known_hosts"
    n1, n2 = lab.node("node-01"), lab.node("node-02")
    lines = lab.known_hosts.read_text().splitlines()
    kh.write_text("\n".join(ln.replace(n1.public_host_key(), n2.public_host_key()) for ln in lines) + "\n")
    before = kh.read_text()
    offered = fingerprint_of(n1.host_key.with_suffix(".pub"))
    expected = fingerprint_of(n2.host_key.with_suffix(".pub"))
    for tofu in (False, True):  # trust-on-first-use never accepts a CHANGED key
        t = SshTransport(lab_node(lab, "node-01", known_hosts=str(kh), trust_on_first_use=tofu))
        with pytest.raises(HostKeyRefused) as info:
            await t.run("true")
        await t.close()
        assert info.value.offered == offered
        assert info.value.expected == expected
        assert offered in str(info.value) and expected in str(info.value)
        assert "CHANGED" in str(info.value)
    assert kh.read_text() == before


async def test_unknown_host_refused_then_tofu_adds_it(lab: Lab, tmp_path: Path) -> None:
    kh = tmp_path / "ssh" / "known_hosts"
    offered = fingerprint_of(lab.node("node-03").host_key.with_suffix(".pub"))
    t = SshTransport(lab_node(lab, "node-03", known_hosts=str(kh)))
    with pytest.raises(HostKeyRefused) as info:
        await t.run("true")
    assert info.value.offered == offered
    assert info.value.expected == f"not in known_hosts {kh}"
    assert f"not in known_hosts {kh}" in str(info.value) and offered in str(info.value)
    assert not kh.exists()

    tofu = SshTransport(lab_node(lab, "node-03", known_hosts=str(kh), trust_on_first_use=True))
    try:
        assert (await tofu.run("echo $LOADMASTER_NODE")).stdout.strip() == "node-03"
    finally:
        await tofu.close()
    n3 = lab.node("node-03")
    assert kh.read_text() == f"[{n3.ip}]:{n3.port} ssh-ed25519 {n3.public_host_key()}\n"
    assert oct(kh.stat().st_mode & 0o777) == "0o600"
    # Now known: a strict transport (TOFU off) accepts it.
    strict = SshTransport(lab_node(lab, "node-03", known_hosts=str(kh)))
    try:
        assert (await strict.run("true")).ok
    finally:
        await strict.close()


async def test_honours_ssh_config(lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    n2 = lab.node("node-02")
    (home / ".ssh" / "config").write_text(
        f"Host lab-two\n  HostName {n2.ip}\n  Port {n2.port}\n  User root\n  IdentityFile {lab.user_key}\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    node = Node(name="lab-two", host="lab-two", known_hosts=str(lab.known_hosts))
    t = SshTransport(node)
    try:
        assert (await t.run("echo $LOADMASTER_NODE")).stdout.strip() == "node-02"
    finally:
        await t.close()


async def test_proxy_jump_through_another_node(lab: Lab, tmp_path: Path) -> None:
    n1, n4 = lab.node("node-01"), lab.node("node-04")
    jump = f"root@{n1.ip}:{n1.port}"
    t = SshTransport(lab_node(lab, "node-04", jump=jump))
    try:
        assert (await t.run("echo $LOADMASTER_NODE")).stdout.strip() == "node-04"
    finally:
        await t.close()
    # The jump host is really used, and its host key is checked as strictly as the node's own:
    # with only node-04's key known, the hop to node-01 is refused.
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{n4.ip}]:{n4.port} ssh-ed25519 {n4.public_host_key()}\n")
    t = SshTransport(lab_node(lab, "node-04", jump=jump, known_hosts=str(kh)))
    with pytest.raises(HostKeyRefused, match=rf"\[{n1.ip}\]:{n1.port} is unknown"):
        await t.run("true")
    await t.close()
    # A dead jump host makes the node unreachable and says which hop failed.
    t = SshTransport(lab_node(lab, "node-04", jump=f"root@{n1.ip}:1"))
    with pytest.raises(NodeUnreachable, match=rf"jump host root@{n1.ip}:1"):
        await t.run("true")
    await t.close()


@pytest.mark.parametrize("command_server", [True, False], ids=["server", "channels"])
async def test_thirty_parallel_commands_share_one_connection(lab: Lab, command_server: bool) -> None:
    pool = NodePool(lab.config.nodes, command_server=command_server)
    try:
        t = pool.transport("node-01")
        results = await asyncio.gather(*(t.run(f"sleep 0.2; echo {i} $SSH_CONNECTION") for i in range(30)))
        assert [r.exit_status for r in results] == [0] * 30
        assert sorted(int(r.stdout.split()[0]) for r in results) == list(range(30))
        # One connection for all: the same client port on every channel.
        assert len({r.stdout.split()[2] for r in results}) == 1
        assert pool.status("node-01").state == "up"
    finally:
        await pool.close()


@pytest.mark.parametrize("command_server", [True, False], ids=["server", "channels"])
async def test_dropped_connection_fails_running_command_then_reconnects(lab: Lab, command_server: bool) -> None:
    pool = NodePool(lab.config.nodes, command_server=command_server)
    try:
        t = pool.transport("node-02")
        assert (await t.run("true")).ok
        marker = f"sleep 20.{uuid.uuid4().int % 10**6:06d}"  # this test's own, among the suite's
        running = asyncio.create_task(t.run(marker))
        await started_here(marker)
        assert lab.node("node-02").drop_connections() > 0
        with pytest.raises(NodeUnreachable, match="connection lost"):
            await running
        assert pool.status("node-02").state == "unreachable"
        assert (await t.run("echo again")).stdout == "again\n"
        assert pool.status("node-02").state == "up"
    finally:
        await pool.close()


async def test_runs_do_not_queue_behind_streams(lab: Lab) -> None:
    t = SshTransport(lab.config.node("node-02"))
    streams = [t.stream("while :; do echo up; sleep 0.2; done") for _ in range(8)]
    try:
        # Eight long-lived streams use every ordinary channel; commands still run beside them.
        assert [await anext(s) for s in streams] == ["up"] * 8
        assert (await t.run("echo beside", timeout=30)).stdout == "beside\n"
    finally:
        for s in streams:
            await s.aclose()  # type: ignore[attr-defined]
        await t.close()


async def test_dropped_connection_ends_stream_with_unreachable(lab: Lab) -> None:
    t = SshTransport(lab.config.node("node-03"))
    try:
        it = t.stream("while :; do echo tick; sleep 0.1; done")
        assert await anext(it) == "tick"
        lab.node("node-03").drop_connections()
        with pytest.raises(NodeUnreachable, match="connection lost"):
            async for _ in it:
                pass
        assert (await t.run("echo ok")).stdout == "ok\n"
    finally:
        await t.close()


async def test_pool_marks_node_down_then_recovers(lab: Lab) -> None:
    pool = NodePool(lab.config.nodes, backoff=(0.1, 0.5))
    node = lab.node("node-02")
    try:
        node.stop()
        results = await pool.fanout(lambda t: t.run("echo $LOADMASTER_NODE"))
        assert isinstance(results["node-02"], NodeUnreachable)
        assert "connection refused" in str(results["node-02"])
        for name in ("node-01", "node-03", "node-04"):
            assert results[name].stdout.strip() == name  # type: ignore[union-attr]
        status = pool.status("node-02")
        assert isinstance(status, NodeStatus)
        assert status.state == "unreachable"
        assert status.last_error and "connection refused" in status.last_error
        with pytest.raises(dataclasses.FrozenInstanceError):
            status.state = "up"  # type: ignore[misc]
        assert pool.status("node-01").state == "up"
    finally:
        node.start()

    async def back() -> bool:
        res = await pool.fanout(lambda t: t.run("true"), nodes=["node-02"])
        return not isinstance(res["node-02"], Exception)

    try:
        assert await eventually(back)
        assert pool.status("node-02").state == "up"
        assert pool.status("node-02").last_error is None
    finally:
        await pool.close()


async def test_fanout_timeout_and_local_nodes(lab: Lab, tmp_path: Path) -> None:
    local = Node(name="here", host="localhost", transport="local", scratch=str(tmp_path))
    pool = NodePool([*lab.config.nodes[:2], local])
    try:
        assert isinstance(pool.transport("here"), LocalTransport)
        assert pool.status("here").state == "up"

        async def slow_on_node_02(t: Transport) -> str:
            await t.run("sleep 5" if t.name == "node-02" else "true")
            return t.name

        # Connected first, so the per-node limit is the commands' alone (a handshake on a loaded
        # machine must not eat into it): 1 s is ample for ``true``, and ends the ``sleep 5``.
        assert [(await pool.connect(n)).state for n in ("node-01", "node-02")] == ["up", "up"]
        res = await pool.fanout(slow_on_node_02, timeout=1)
        assert res["node-01"] == "node-01" and res["here"] == "here"
        assert isinstance(res["node-02"], CommandTimeout)
    finally:
        await pool.close()


async def test_unreachable_address_times_out_cleanly(lab: Lab) -> None:
    # 192.0.2.0/24 is TEST-NET-1: never routed, so the connect attempt hangs until connect_timeout.
    node = lab_node(lab, "node-01", host="192.0.2.1", connect_timeout=0.5)
    t = SshTransport(node)
    with pytest.raises(NodeUnreachable) as info:
        await t.run("true")
    assert "192.0.2.1" in str(info.value)
    await t.close()


async def test_falls_back_to_channels_without_command_server(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    # A node where the server cannot start (here: it exits at once, as with no usable python3).
    monkeypatch.setattr(ssh_module, "command_server_command", lambda *_limit: "echo no python3 here >&2; exit 127")
    t = SshTransport(lab.config.node("node-04"))
    try:
        assert (await t.run("echo $LOADMASTER_NODE")).stdout == "node-04\n"
        assert t.command_server_unavailable == "command server did not start: no python3 here"
        assert (await t.run("cat", input="still stdin")).stdout == "still stdin"
    finally:
        await t.close()


async def test_command_server_restarts_after_it_dies(lab: Lab) -> None:
    t = SshTransport(lab.config.node("node-04"))
    try:
        pid = int((await t.run("echo $PPID")).stdout)  # the server is the command's parent
        marker = f"sleep 20.{uuid.uuid4().int % 10**6:06d}"  # this test's own, among the suite's
        victim = asyncio.create_task(t.run(marker))
        await started_here(marker)
        (await SshTransport(lab.config.node("node-04"), command_server=False).run(f"kill -9 {pid}"))
        with pytest.raises(NodeError, match=f"command server exited while running '{marker}'"):
            await victim
        assert (await t.run("echo $PPID")).stdout.strip() != str(pid)
    finally:
        await t.close()


def test_known_hosts_append_format(tmp_path: Path) -> None:
    import asyncssh

    from backend.nodes.hostkeys import append_known_host, expected_keys, fingerprint, host_pattern

    key = asyncssh.generate_private_key("ssh-ed25519")
    pub = key.convert_to_public()
    kh = tmp_path / "dir" / "known_hosts"
    kh.parent.mkdir()
    kh.write_text("# existing, no trailing newline")
    append_known_host(kh, "gpu-01", 22, pub)
    append_known_host(kh, "10.0.0.7", 2222, pub)
    blob = pub.export_public_key("openssh").decode().split()[1]
    assert kh.read_text().splitlines() == [
        "# existing, no trailing newline",
        f"gpu-01 ssh-ed25519 {blob}",
        f"[10.0.0.7]:2222 ssh-ed25519 {blob}",
    ]
    assert host_pattern("h", None) == "h" and host_pattern("h", 22) == "h" and host_pattern("h", 2) == "[h]:2"
    assert [fingerprint(k) for k in expected_keys(kh, "10.0.0.7", "10.0.0.7", 2222)] == [fingerprint(pub)]
    assert expected_keys(kh, "10.0.0.7", "10.0.0.7", None) == []


async def test_ssh_config_proxyjump_is_checked_strictly(
    lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n1, n4 = lab.node("node-01"), lab.node("node-04")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host lab-four\n  HostName {n4.ip}\n  Port {n4.port}\n  User root\n  IdentityFile {lab.user_key}\n"
        f"  ProxyJump root@{n1.ip}:{n1.port}\n"
        # As with OpenSSH, the hop gets its own settings from the config (here: the same key).
        f"Host {n1.ip}\n  IdentityFile {lab.user_key}\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    t = SshTransport(Node(name="lab-four", host="lab-four", known_hosts=str(lab.known_hosts)))
    try:
        assert (await t.run("echo $LOADMASTER_NODE")).stdout.strip() == "node-04"
    finally:
        await t.close()
    kh = tmp_path / "only-four"
    kh.write_text(f"[{n4.ip}]:{n4.port} ssh-ed25519 {n4.public_host_key()}\n")
    t = SshTransport(Node(name="lab-four", host="lab-four", known_hosts=str(kh)))
    with pytest.raises(HostKeyRefused, match=rf"\[{n1.ip}\]:{n1.port} is unknown"):
        await t.run("true")
    await t.close()


class CountingSemaphore(asyncio.Semaphore):
    """A real semaphore that remembers how many holders it had at once."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.holders = 0
        self.most = 0

    async def acquire(self) -> bool:
        await super().acquire()
        self.holders += 1
        self.most = max(self.most, self.holders)
        return True

    def release(self) -> None:
        self.holders -= 1
        super().release()


async def test_handshakes_are_bounded_across_the_fleet(lab: Lab) -> None:
    sem = CountingSemaphore(2)
    transports = [SshTransport(n, handshakes=sem) for n in lab.config.nodes]
    try:
        results = await asyncio.gather(*(t.run("echo $LOADMASTER_NODE") for t in transports))
        assert [r.stdout.strip() for r in results] == [n.name for n in lab.config.nodes]
        assert sem.most == 2 and sem.holders == 0
    finally:
        await asyncio.gather(*(t.close() for t in transports))
