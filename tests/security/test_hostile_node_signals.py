"""A launch interrupted by SIGTERM or SIGHUP leaves no reservation in flight.

A real ``loadmaster pull`` process launches onto a node whose launch hangs (its ``mkdir`` of the
job directory never returns: the console has reserved the egress and recorded the job by then);
the test sends the signal there. The process ends by the signal as before, but first releases
what never started; the next refresh finds nothing reserved.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab import Lab
from tests.helpers import write_lab_config
from tests.jobs.conftest import SourceData, source  # noqa: F401 - a fixture, used by name
from tests.security.hostile_node import NAME, HostileNode, start_hostile_node

pytestmark = pytest.mark.timeout(240)
LOADMASTER = str(Path(sys.executable).parent / "loadmaster")


@pytest.fixture(scope="module")
def hostile(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> HostileNode:  # type: ignore[misc]
    yield from start_hostile_node(lab, tmp_path_factory.mktemp("hostile-launch"))


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    """Until ``path`` exists (the launch reached the node) or the process ended (it never will)."""
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the pull ended before its launch reached the node: {err or out}")
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_during_a_launch_then_a_refresh_leaves_no_reservation_in_flight(
    lab: Lab, hostile: HostileNode, request: pytest.FixtureRequest, tmp_path: Path, sig: signal.Signals
) -> None:
    data: SourceData = request.getfixturevalue("source")
    hostile.clear()
    hostile.hang_launches()
    try:
        cfg = write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state", hostile.config_section())
        env = {**os.environ, **lab.env()}
        proc = subprocess.Popen(
            [LOADMASTER, "--config", str(cfg), "pull", data.url, "pulls/sig", "--node", NAME] + ["--yes", "--detach"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_for(hostile.launch_marker, proc)
        db = sqlite3.connect(tmp_path / "state" / "state.sqlite3")
        # The reservation and the job's record were made before the node was asked to start it.
        assert db.execute("SELECT state FROM egress_ledger").fetchall() == [("reserved",)]
        proc.send_signal(sig)
        proc.communicate(timeout=120)
        assert proc.returncode == -sig  # ended by the signal, as before
        assert db.execute("SELECT state FROM egress_ledger").fetchall() == [("released",)]
    finally:
        hostile.hang_launches(on=False)
    # And a refresh afterwards keeps it so: nothing in flight, the job never started.
    res = subprocess.run(
        [LOADMASTER, "--config", str(cfg), "jobs", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode in (0, 4), res.stderr
    assert db.execute("SELECT COUNT(*) FROM egress_ledger WHERE state = 'reserved'").fetchone() == (0,)
    assert db.execute("SELECT state FROM jobs").fetchall() == [("failed",)]
