"""Fresh SSH connections against a real sshd that sheds load (``MaxStartups 10:30:100``, as the lab
and stock sshd set it), and an OpenSSH client config that splits hosts into ``Include``d files."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backend.config import Node
from backend.nodes.keeper import keeper_key
from backend.nodes.ssh import SshTransport
from backend.nodes.ssh_config import effective_settings, ssh_config_files
from lab import Lab


async def test_fifty_fresh_connections_to_one_node_all_succeed(lab: Lab) -> None:
    """50 commands at once, each on its own new connection (50 cron'd ``loadmaster`` runs): sshd
    drops unauthenticated connections beyond 10 at random; each dropped one is retried."""
    node = lab.config.node("node-02")
    transports = [SshTransport(node, command_server=False) for _ in range(50)]
    try:
        results = await asyncio.gather(*(t.run("echo $LOADMASTER_NODE") for t in transports), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        assert not failures, f"{len(failures)} of 50 failed, e.g. {failures[0]}"
        assert {r.stdout for r in results} == {"node-02\n"}  # type: ignore[union-attr]
    finally:
        await asyncio.gather(*(t.close() for t in transports))


@pytest.fixture
def home_with_includes(lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """~/.ssh/config that only Includes: a relative glob (conf.d/*.conf, relative to ~/.ssh as
    ssh_config(5) says) and an absolute path, nested one level further."""
    home = tmp_path / "home"
    ssh = home / ".ssh"
    (ssh / "conf.d").mkdir(parents=True)
    n3 = lab.node("node-03")
    (ssh / "config").write_text(f"Include conf.d/*.conf\nInclude {ssh / 'extra'}\n")
    (ssh / "conf.d" / "lab.conf").write_text(f"Host lab-three\n  HostName {n3.ip}\n  Include {ssh / 'port'}\n")
    (ssh / "port").write_text(f"  Port {n3.port}\n")
    (ssh / "extra").write_text(f"Host lab-*\n  User root\n  IdentityFile {lab.user_key}\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


async def test_a_host_defined_in_included_files_connects(lab: Lab, home_with_includes: Path) -> None:
    node = Node(name="lab-three", host="lab-three", known_hosts=str(lab.known_hosts))
    eff = effective_settings(node)
    assert (eff["hostname"], eff["port"], eff["user"]) == (lab.node("node-03").ip, lab.node("node-03").port, "root")
    t = SshTransport(node)
    try:
        assert (await t.run("echo $LOADMASTER_NODE")).stdout == "node-03\n"
    finally:
        await t.close()


def test_an_edit_to_an_included_file_gets_a_new_keeper(lab: Lab, home_with_includes: Path) -> None:
    """The keeper holds connections made with the old settings: a changed included file must
    not reach it (the key covers every file the config Includes, nested ones too)."""
    ssh = home_with_includes / ".ssh"
    files = ssh_config_files([str(ssh / "config")])
    assert files == [ssh / "config", ssh / "conf.d" / "lab.conf", ssh / "port", ssh / "extra"]
    cfg = lab.config
    before = keeper_key(cfg)
    (ssh / "port").write_text("  Port 1\n")
    assert keeper_key(cfg) != before
