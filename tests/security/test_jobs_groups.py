"""Before a process group is signalled it is proven to be the job's: its leader still has the
start time the runner recorded (in the same boot), or a member carries the job's id in its
environment. After a reboot or pid reuse nothing unrelated is touched.

Each case is a job directory on a real lab node (sshd) whose pid file names a process group the
test started itself, found lost (or cancelled) by the real JobManager over SSH.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.agent.runner import _boot_id, _proc_starttime, process_identity
from backend.config import load_config_file
from backend.jobs.records import new_job_id
from backend.jobs.remote import spec_digest
from backend.jobs.store import JobStore
from backend.ops import Operations
from backend.services import Services
from lab import Lab
from tests.helpers import write_lab_config

pytestmark = pytest.mark.timeout(180)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def groups() -> Iterator[list[int]]:
    """Process groups a test starts; each is killed (by its id) afterwards."""
    started: list[int] = []
    yield started
    for g in started:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(g, signal.SIGKILL)


def _group(groups: list[int], job_env: str | None = None) -> tuple[int, int]:
    """A new session whose leader has exited, leaving one member: (group id, member pid)."""
    env = dict(os.environ)
    env.pop("LOADMASTER_JOB_ID", None)
    if job_env is not None:
        env["LOADMASTER_JOB_ID"] = job_env
    sh = subprocess.Popen(
        ["sh", "-c", "sleep 300 & echo $!"], stdout=subprocess.PIPE, text=True, start_new_session=True, env=env
    )
    assert sh.stdout is not None
    member = int(sh.stdout.readline())
    sh.wait()
    groups.append(sh.pid)
    return sh.pid, member


def _leader(groups: list[int]) -> int:
    """A live unrelated session leader (its pid is its group id)."""
    p = subprocess.Popen(["sleep", "300"], start_new_session=True)
    groups.append(p.pid)
    return p.pid


def _job_dir(lab: Lab, pidinfo: dict[str, object], *, beat_age: float, job_id: str | None = None) -> tuple[str, Path]:
    job_id = job_id or new_job_id()
    d = lab.node("node-01").home / "jobs" / job_id
    d.mkdir(parents=True)
    dest = lab.node("node-01").scratch / f"pulls/groups-{job_id}"
    spec = {
        "id": job_id,
        "kind": "pull",
        "node": "node-01",
        "label": "fabricated",
        "created": time.time() - 60,
        "launched_by": "test",
        "launched_from": "test",
        "params": {"src": "s3://b/p/", "dest": str(dest)},
    }
    (d / "spec.json").write_text(json.dumps(spec))
    _DIRS[job_id] = d
    (d / "pid").write_text(json.dumps({**pidinfo, "job_id": job_id}))
    (d / "heartbeat").write_text(f"{time.time() - beat_age:.3f}\n")
    return job_id, d


@pytest.fixture
async def svc(lab: Lab, tmp_path: Path) -> Services:  # type: ignore[misc]
    s = Services(config=load_config_file(write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state")))
    yield s
    await s.aclose()


#: job id -> its fabricated directory on node-01.
_DIRS: dict[str, Path] = {}


def _recorded(svc: Services, job_id: str) -> None:
    """The team database's record of the job, as its launch makes it (a folder no launch of this
    database recorded is foreign: shown, never signalled or cleaned)."""
    text = (_DIRS[job_id] / "spec.json").read_text()
    JobStore(svc.db).insert(json.loads(text), str(_DIRS[job_id]), digest=spec_digest(text))
    JobStore(svc.db).update(job_id, state="running")


async def _found_lost(svc: Services, job_id: str) -> None:
    _recorded(svc, job_id)
    recs = {r.id: r for r in await svc.jobs.refresh(["node-01"])}
    assert recs[job_id].state == "lost", recs[job_id]


def test_the_runner_records_what_proves_its_group() -> None:
    ident = process_identity("job-1")
    assert ident["pgid"] == os.getpgid(0) and ident["job_id"] == "job-1"
    assert ident["starttime"] == int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    assert ident["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


async def test_a_reused_pid_is_left_alone(lab: Lab, svc: Services, groups: list[int]) -> None:
    other = _leader(groups)
    st = _proc_starttime(other)
    assert st is not None
    job_id, _d = _job_dir(
        lab, {"pid": other, "pgid": other, "starttime": st + 1000, "boot_id": _boot_id()}, beat_age=60
    )
    await _found_lost(svc, job_id)
    assert _alive(other)
    events = [r["event"] for r in svc.db.query("SELECT event FROM job_events WHERE job_id = ?", (job_id,))]
    assert "group-left-alone" in events


async def test_after_a_reboot_a_group_with_that_number_is_left_alone(
    lab: Lab, svc: Services, groups: list[int]
) -> None:
    # The leader even has the recorded start time: in another boot that proves nothing.
    other = _leader(groups)
    job_id, _d = _job_dir(
        lab,
        {"pid": other, "pgid": other, "starttime": _proc_starttime(other), "boot_id": "0c0ffee0-another-boot"},
        beat_age=60,
    )
    await _found_lost(svc, job_id)
    assert _alive(other)


async def test_an_orphaned_group_of_someone_else_is_left_alone(lab: Lab, svc: Services, groups: list[int]) -> None:
    # Leader gone, one member left (the case the old "leader's pid is gone" guard SIGKILLed).
    for env in (None, "1129-000000-beef"):  # no job id at all; another job's id
        gid, member = _group(groups, env)
        job_id, _d = _job_dir(lab, {"pid": gid, "pgid": gid, "starttime": 1, "boot_id": _boot_id()}, beat_age=60)
        await _found_lost(svc, job_id)
        assert _alive(member), env


async def test_leftovers_carrying_the_job_id_are_killed(lab: Lab, svc: Services, groups: list[int]) -> None:
    job_id = new_job_id()
    gid, member = _group(groups, job_id)
    _job_dir(lab, {"pid": gid, "pgid": gid, "starttime": 1, "boot_id": _boot_id()}, beat_age=60, job_id=job_id)
    await _found_lost(svc, job_id)
    deadline = time.monotonic() + 10
    while _alive(member) and time.monotonic() < deadline:
        time.sleep(0.05)  # the kill landed; init reaps the orphan
    assert not _alive(member)


async def test_cancel_signals_only_a_proven_group(lab: Lab, svc: Services, groups: list[int]) -> None:
    other = _leader(groups)
    job_id, d = _job_dir(
        lab,
        {"pid": other, "pgid": other, "starttime": (_proc_starttime(other) or 0) + 7, "boot_id": _boot_id()},
        beat_age=0,
    )
    _recorded(svc, job_id)
    await svc.jobs.refresh(["node-01"])
    final = await Operations(svc).jobs.cancel(job_id, reason="security test")
    assert final.state == "cancelled"
    assert _alive(other)
    assert (d / "cancel").exists()  # a live runner would still see the request
    [entry] = svc.db.audit_entries(action="job.cancel")
    assert entry.detail["group_proven"] is False
