"""A cancel waits for the job's process group to end; a member that exited but is not reaped yet
(a zombie: the runner is orphaned to the node's init, which in a container may reap late or never)
has ended. ``kill -0`` counts it as there, so a cancel used to wait out its whole grace and record
the job as killed. Real processes: a live group, a group whose only member is a zombie, no group."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from backend.jobs.remote import LIVE_SCRIPT


def _live(pgid: int) -> bool:
    res = subprocess.run(
        ["sh", "-c", f"G={pgid}\n{LIVE_SCRIPT}\nlm_live && echo live || echo gone"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip() == "live"


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def test_a_group_whose_members_are_zombies_is_gone_and_a_running_one_is_live() -> None:
    running = subprocess.Popen(["sleep", "30"], start_new_session=True)
    exited = subprocess.Popen(["sh", "-c", "exit 0"], start_new_session=True)  # never waited: a zombie
    try:
        deadline = time.monotonic() + 10
        while _state(exited.pid) != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(exited.pid, 0)  # what kill -0 says: still there
        assert _live(running.pid)
        assert not _live(exited.pid)
        assert not _live(4_194_304)  # no such group
    finally:
        running.kill()
        running.wait()
        exited.wait()
