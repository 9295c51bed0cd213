"""The connection keeper (``[ssh] persist``) against the real lab: reuse, errors, secrets, lifecycle.

The rest of the suite runs with ``LOADMASTER_SSH_PERSIST=0`` (tests/conftest.py) so that no test
leaves a keeper holding lab connections; every test here turns it on and stops its keeper.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.config import Config, load_config_file
from backend.errors import (
    CommandFailed,
    CommandTimeout,
    ConfigError,
    HostKeyRefused,
    JobError,
    NodeError,
    NodeUnreachable,
    StoreError,
)
from backend.nodes.keeper import (
    KeeperClient,
    error_dict,
    error_from,
    keeper_status,
    log_path,
    socket_path,
    stop_keeper,
)
from backend.nodes.pool import NodePool
from lab import Lab
from tests.helpers import write_lab_config
from tests.jobs.conftest import SourceData
from tests.pulls_helpers import cli_here

pytestmark = pytest.mark.timeout(240)
LOADMASTER = str(Path(sys.executable).parent / "loadmaster")


def _run(cfg: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LOADMASTER, "--config", str(cfg), *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # An exited child of ours that was not reaped yet still answers: check it is not a zombie.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(cond, what: str, rounds: int = 300) -> None:  # type: ignore[no-untyped-def]
    for _ in range(rounds):
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def _node_procs(pattern: str) -> list[str]:
    """Command lines of processes on this machine (the lab's nodes) containing ``pattern``."""
    out = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if "pgrep" not in ln]


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch, jobs_config_path: Path) -> Iterator[Config]:
    """Keeper on (30 s) for the test's config; stopped afterwards."""
    monkeypatch.setenv("LOADMASTER_SSH_PERSIST", "30")
    config = load_config_file(jobs_config_path)
    yield config
    stop_keeper(config)


def test_commands_share_one_private_keeper_without_secrets(
    lab: Lab,
    kept: Config,
    jobs_config_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sentinel = "sentinel-secret-" + os.urandom(6).hex()
    # The command that starts the keeper has store keys in its environment (run in this process:
    # the keeper is its own process either way, and commands of other processes sharing it are
    # test_commands_started_together_share_the_one_keeper_they_start).
    with monkeypatch.context() as m:
        m.setenv("AWS_SECRET_ACCESS_KEY", sentinel)
        m.setenv("AWS_ACCESS_KEY_ID", "AKIDSENTINEL")
        first = cli_here(capsys, jobs_config_path, "jobs")
    assert first.returncode == 0, first.stderr
    report = keeper_status(kept)
    assert report is not None
    pid = report["pid"]
    assert all(n["connected"] and n["state"] == "up" for n in report["nodes"].values()), report
    second = cli_here(capsys, jobs_config_path, "jobs")  # another command: the same keeper
    assert second.returncode == 0 and second.stdout == first.stdout
    again = keeper_status(kept)
    assert again is not None and again["pid"] == pid and again["requests"] > report["requests"]

    # Only its user can reach it, and it holds no store keys and prints none.
    sock = socket_path(kept)
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert b"AWS_SECRET_ACCESS_KEY" not in environ and sentinel.encode() not in environ
    assert sentinel.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()

    status = cli_here(capsys, jobs_config_path, "keeper", "status")
    assert status.returncode == 0 and f"keeper pid {pid}" in status.stdout
    assert "node-01  up" in status.stdout
    # A client still connected when the keeper stops (a console left open) is hung up on
    # cleanly: its handler ends on EOF, and the log holds no traceback.
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    idle.connect(str(sock))
    idle.sendall(b'{"op": "hello"}\n')
    assert b"hello" in idle.recv(4096)
    stop = cli_here(capsys, jobs_config_path, "keeper", "stop")
    assert stop.returncode == 0 and f"stopped keeper pid {pid}" in stop.stdout
    _wait_for(lambda: not _alive(pid), "the keeper exits on stop")
    idle.settimeout(5)
    assert idle.recv(4096) == b"", "the keeper hangs up on a connected client when it stops"
    idle.close()
    assert not sock.exists()
    gone = cli_here(capsys, jobs_config_path, "keeper", "status")
    assert gone.returncode == 1 and "no connection keeper running" in gone.stdout
    log = log_path(sock).read_text()
    assert "stop requested" in log and "exiting: stopped" in log
    assert "Traceback" not in log and "Exception in callback" not in log, log


def test_pull_through_the_keeper_verifies_bytes_and_keeps_credentials_off_the_log(
    lab: Lab, kept: Config, jobs_config_path: Path, source: SourceData, node_dir, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    res = cli_here(capsys, jobs_config_path, "pull", source.url, "pulls/kept", "--node", "node-01", "--yes")
    assert res.returncode == 0, res.stderr
    assert "node-01: succeeded" in res.stdout
    for name in source.objects:
        got = hashlib.sha256((node_dir("node-01", "pulls/kept") / name).read_bytes()).hexdigest()
        assert got == source.digest(name)
    report = keeper_status(kept)
    assert report is not None and report["requests"] >= 3  # probe, launch, result wait all went through it
    creds = Path(os.environ["AWS_SHARED_CREDENTIALS_FILE"]).read_text()
    secret = next(ln.split("=", 1)[1].strip() for ln in creds.splitlines() if "secret" in ln)
    log = log_path(socket_path(kept)).read_text()
    assert secret not in log
    assert "s5cmd" not in log and "agent" not in log and "cat " not in log  # no command text at all


def test_errors_through_the_keeper_read_as_without_it(
    lab: Lab,
    kept: Config,
    jobs_config_path: Path,
    source: SourceData,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A changed host key: same refusal, both fingerprints, with and without the keeper.
    kh = tmp_path / "known_hosts"
    n1, n2 = lab.node("node-01"), lab.node("node-02")
    kh.write_text(lab.known_hosts.read_text().replace(n1.public_host_key(), n2.public_host_key()))
    cfg = tmp_path / "badkey.toml"
    cfg.write_text(jobs_config_path.read_text().replace(str(lab.known_hosts), str(kh)))
    args = ("pull", source.url, "pulls/badkey", "--node", "node-01", "--yes")
    kept_res = cli_here(capsys, cfg, *args)  # through the keeper (the kept fixture turned it on)
    with monkeypatch.context() as m:  # connecting on its own, in this process
        m.setenv("LOADMASTER_SSH_PERSIST", "0")
        direct = cli_here(capsys, cfg, *args)
    try:
        assert kept_res.returncode == direct.returncode == 2
        assert "CHANGED" in kept_res.stderr and "Traceback" not in kept_res.stderr
        assert kept_res.stderr == direct.stderr
    finally:
        stop_keeper(load_config_file(cfg))


def test_a_node_fixed_after_a_failure_is_retried_at_once(
    lab: Lab, kept: Config, jobs_config_path: Path, source: SourceData, capsys: pytest.CaptureFixture[str]
) -> None:
    node = lab.node("node-03")
    node.stop()
    try:
        down = cli_here(
            capsys, jobs_config_path, "pull", source.url, "pulls/retry", "--node", "node-03", "--yes", "--detach"
        )
        assert down.returncode == 2 and "node-03" in down.stderr and "Traceback" not in down.stderr
        report = keeper_status(kept)
        assert report is not None and report["nodes"]["node-03"]["state"] == "unreachable"
    finally:
        node.start()
    # The keeper's backoff from the failure does not make the next command wait for a retry.
    res = cli_here(capsys, jobs_config_path, "jobs", "--json")
    assert res.returncode == 0, res.stderr
    assert "next retry" not in res.stderr
    report = keeper_status(kept)
    assert report is not None and report["nodes"]["node-03"]["state"] == "up"


async def test_keeper_killed_mid_command_is_a_clear_error_and_the_next_command_recovers(lab: Lab, kept: Config) -> None:
    pool = NodePool(kept.nodes, keeper=KeeperClient(kept, 30))
    try:
        t = pool.transport("node-02")
        assert (await t.run("echo ready")).stdout == "ready\n"
        first = keeper_status(kept)
        assert first is not None
        task = asyncio.create_task(t.run("sleep 31.25"))
        for _ in range(200):
            if _node_procs("sleep 31.25"):
                break
            await asyncio.sleep(0.05)
        os.kill(first["pid"], signal.SIGKILL)
        with pytest.raises(NodeUnreachable, match="connection keeper"):
            await task
        # The dead keeper's SSH connection closed, so sshd and the command server ended the command.
        for _ in range(200):
            if not _node_procs("sleep 31.25"):
                break
            await asyncio.sleep(0.05)
        assert not _node_procs("sleep 31.25")
        # A stale socket is left behind; the next command starts a new keeper over it.
        assert (await t.run("echo again")).stdout == "again\n"
        second = keeper_status(kept)
        assert second is not None and second["pid"] != first["pid"]
    finally:
        await pool.close()


async def test_closing_a_stream_early_stops_the_remote_command(lab: Lab, kept: Config) -> None:
    pool = NodePool(kept.nodes, keeper=KeeperClient(kept, 30))
    try:
        t = pool.transport("node-04")
        agen = t.stream("echo first; echo second; exec sleep 47.25")
        lines = [await agen.__anext__(), await agen.__anext__()]
        assert lines == ["first", "second"]
        assert _node_procs("sleep 47.25")
        await agen.aclose()
        for _ in range(200):
            if not _node_procs("sleep 47.25"):
                break
            await asyncio.sleep(0.05)
        assert not _node_procs("sleep 47.25")
        # Stdin, binary output and exit codes cross the keeper unchanged.
        blob = bytes(range(256)) * 64
        code, out, err = await t._run_bytes("cat; echo oops >&2; exit 3", input=blob)
        assert (code, out, err) == (3, blob, b"oops\n")
        with pytest.raises(CommandTimeout):
            await t.run("sleep 5", timeout=0.3)
        with pytest.raises(CommandFailed, match="exited 4"):
            await t.run("exit 4", check=True)
    finally:
        await pool.close()


def test_keeper_refuses_another_user(
    lab: Lab, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    monkeypatch.setenv("LOADMASTER_SSH_PERSIST", "30")
    # A state dir another user can traverse (pytest's own tmp dirs are 0700), so only the keeper's
    # own directory mode and its uid check stand in the way.
    shared = Path(tempfile.mkdtemp(prefix="lm-keeper-uid-"))
    os.chmod(shared, 0o755)
    cfg = write_lab_config(lab, tmp_path / "uid.toml", shared / "state")
    kept = load_config_file(cfg)
    try:
        assert cli_here(capsys, cfg, "jobs").returncode == 0
        _refused_for_another_user(kept)
    finally:
        stop_keeper(kept)
        shutil.rmtree(shared, ignore_errors=True)


def _refused_for_another_user(kept: Config) -> None:
    sock = socket_path(kept)
    assert keeper_status(kept) is not None
    # Open the directory and socket up (as a careless admin might) to reach the uid check itself.
    # (The state dir above it is 0700 too: loadmaster keeps it private.)
    assert sock.parent.parent == kept.state_dir()
    state_mode = stat.S_IMODE(sock.parent.parent.stat().st_mode)
    dir_mode, sock_mode = stat.S_IMODE(sock.parent.stat().st_mode), stat.S_IMODE(sock.stat().st_mode)
    os.chmod(sock.parent.parent, 0o755)
    os.chmod(sock.parent, 0o755)
    os.chmod(sock, 0o666)
    try:
        probe = (
            "import os, socket, sys\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])\n"
            "try:\n"
            '    s.sendall(b\'{"op":"hello","key":null}\\n\')\n'
            "    print(repr(s.recv(100)))\n"
            "except OSError as e:\n"
            "    print('closed', e.errno)\n"
        )
        res = subprocess.run(
            ["/usr/bin/python3", "-S", "-c", probe, str(sock)], capture_output=True, text=True, timeout=30, cwd="/"
        )
    finally:
        os.chmod(sock.parent.parent, state_mode)
        os.chmod(sock.parent, dir_mode)
        os.chmod(sock, sock_mode)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() in ("b''", "closed 32", "closed 104")  # closed without a greeting
    assert "refused a client of uid 65534" in log_path(sock).read_text()
    assert keeper_status(kept) is not None  # and it keeps serving its own user


def test_idle_keeper_exits_and_a_changed_config_gets_its_own(
    lab: Lab,
    monkeypatch: pytest.MonkeyPatch,
    jobs_config_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("LOADMASTER_SSH_PERSIST", "1s")
    config = load_config_file(jobs_config_path)
    assert cli_here(capsys, jobs_config_path, "jobs").returncode == 0
    report = keeper_status(config)
    assert report is not None and report["persist"] == 1.0
    _wait_for(lambda: not _alive(report["pid"]), "the idle keeper exits", rounds=400)
    assert not socket_path(config).exists()
    assert "exiting: idle for 1s" in log_path(socket_path(config)).read_text()

    changed = write_lab_config(lab, tmp_path / "changed.toml", tmp_path / "state")
    changed.write_text(changed.read_text().replace("connect_timeout = 5.0", "connect_timeout = 7.0"))
    assert socket_path(load_config_file(changed)) != socket_path(config)
    same = write_lab_config(
        lab, tmp_path / "same.toml", tmp_path / "state", extra="\n[retention]\nkeep_full_latest = 3\n"
    )
    assert socket_path(load_config_file(same)) == socket_path(config)  # policy edits keep connections


def test_bad_persist_setting_is_named(
    lab: Lab, jobs_config_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LOADMASTER_SSH_PERSIST", "soon")
    res = cli_here(capsys, jobs_config_path, "jobs")
    assert res.returncode == 2 and "LOADMASTER_SSH_PERSIST" in res.stderr and "soon" in res.stderr
    bad = jobs_config_path.with_name("badpersist.toml")
    bad.write_text(jobs_config_path.read_text() + '\n[ssh]\npersist = "-5s"\n')
    monkeypatch.setenv("LOADMASTER_SSH_PERSIST", "")
    res = cli_here(capsys, bad, "jobs")
    assert res.returncode == 2 and "ssh.persist" in res.stderr


def test_commands_connect_directly_when_the_keeper_cannot_start(lab: Lab, kept: Config, jobs_config_path: Path) -> None:
    run_dir = socket_path(kept).parent
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    # The directory may be there already: a long state path puts every keeper's socket in the shared
    # fallback dir (under a pytest-xdist worker's basetemp it is), and earlier tests' keepers made it.
    aside = run_dir.with_name(run_dir.name + ".aside")
    if run_dir.is_dir():
        run_dir.rename(aside)
    run_dir.write_text("not a directory")  # the keeper's socket cannot go here
    try:
        res = _run(jobs_config_path, "jobs")
        assert res.returncode == 0, res.stderr
        assert "connection keeper not used" in res.stderr and str(run_dir) in res.stderr
        assert keeper_status(kept) is None
    finally:
        run_dir.unlink()
        if aside.is_dir():
            aside.rename(run_dir)


@pytest.mark.parametrize(
    "exc",
    [
        NodeUnreachable("node-07", "connection refused"),
        HostKeyRefused("node-07", "host key CHANGED", offered="SHA256:a", expected="SHA256:b"),
        CommandFailed("node-07", "false", 1, "it failed\n"),
        CommandTimeout("node-07", "command 'sleep' did not finish within 1s"),
        NodeError("node-07", "command server exited"),
        ConfigError("bad value", key="ssh.persist"),
        JobError("no job 'x'"),
        StoreError("bucket missing"),
    ],
)
def test_errors_cross_the_keeper_as_their_own_class(exc: Exception) -> None:
    back = error_from(json.loads(json.dumps(error_dict(exc))), "node-07")
    assert type(back) is type(exc) and str(back) == str(exc)
    for attr in ("node", "detail", "offered", "expected", "command", "exit_status", "stderr"):
        assert getattr(back, attr, None) == getattr(exc, attr, None)
    other = error_from(error_dict(ValueError("surprise")), "node-07")
    assert isinstance(other, NodeError) and "surprise" in str(other)


def test_a_pull_through_the_keeper_never_loads_the_ssh_stack(
    lab: Lab, kept: Config, jobs_config_path: Path, source: SourceData
) -> None:
    from tests.jobs.test_pull_startup import _PROBE, ROOT

    def start(persist: str) -> subprocess.Popen[str]:
        argv = [
            "--config",
            str(jobs_config_path),
            "pull",
            source.url,
            f"pulls/stack-{persist}",
            "--node",
            "node-01",
            "--yes",
        ]
        return subprocess.Popen(
            [sys.executable, "-c", _PROBE, *argv],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "LOADMASTER_SSH_PERSIST": persist},
        )

    def modules(proc: subprocess.Popen[str]) -> list[str]:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0 and "node-01: succeeded" in out, out + err
        line = next(x for x in out.splitlines() if x.startswith("@@MODULES "))
        return json.loads(line.removeprefix("@@MODULES "))  # type: ignore[no-any-return]

    # The two pulls (to their own destinations) run side by side: each waits mostly on its job.
    direct, kept_pull = start("0"), start("30")
    try:
        assert "asyncssh" in modules(direct)  # each command connecting on its own needs it
        kept_modules = modules(kept_pull)
    finally:
        for proc in (direct, kept_pull):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert "asyncssh" not in kept_modules and "backend.nodes.ssh" not in kept_modules
    assert "backend.nodes.keeper" in kept_modules


def test_commands_started_together_share_the_one_keeper_they_start(
    lab: Lab, kept: Config, jobs_config_path: Path
) -> None:
    procs = [
        subprocess.Popen(
            [LOADMASTER, "--config", str(jobs_config_path), "jobs", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
    assert all("keeper not used" not in err for _out, err in outs), outs  # nobody fell back
    assert len({out for out, _err in outs}) == 1
    running = [ln for ln in _node_procs("backend.nodes.keeper_server") if str(socket_path(kept)) in ln]
    assert len(running) == 1, running
    report = keeper_status(kept)
    assert report is not None and report["requests"] == 4 * len(kept.nodes)


def test_socket_path_fits_the_unix_limit_and_differs_per_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket as socketmod

    from backend.config import load_config

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    cfg = tmp_path / "deep.toml"
    cfg.write_text(f'[[nodes]]\nname = "gpu-01"\n\n[state]\ndir = "{deep}"\n')
    config = load_config(str(cfg))
    path = socket_path(config)
    assert len(os.fsencode(str(path))) <= 107
    assert path.parent == Path(tempfile.gettempdir()) / f"loadmaster-{os.geteuid()}"
    # A state dir short enough for the socket beside it (pytest's own tmp_path can be one
    # character too long, as pytest's run number grows).
    near = Path(tempfile.mkdtemp(prefix="lm-k-", dir="/tmp"))
    try:
        short = tmp_path / "short.toml"
        short.write_text(f'[[nodes]]\nname = "gpu-01"\n\n[state]\ndir = "{near / "s"}"\n')
        here = socket_path(load_config(str(short)))
        assert here.parent == near / "s" / "run"
        monkeypatch.setattr(socketmod, "gethostname", lambda: "other-login-node")
        assert socket_path(load_config(str(short))) != here
    finally:
        shutil.rmtree(near, ignore_errors=True)
