"""Cleanup removes only what the job created. Files like ``part-10`` and ``part-11`` fit s5cmd's
temporary-name scheme for ``part-1`` (Go's os.CreateTemp: the name + a decimal uint32), so a
name never proves a file is the job's: what was in DEST before s5cmd started survives success,
failure, cancel and a lost runner. Real jobs and the real s5cmd; the lab's SeaweedFS, and for a
download stuck mid-flight (HEAD answered, GET held) the hostile responder.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.ops import Operations
from backend.pulls.destination import TempTracker, is_s5cmd_temp_name
from backend.pulls.objects import PulledObject
from backend.services import Services
from lab import Lab
from tests.jobs.test_pull_lab import quick_lost
from tests.pulls_helpers import launch_pull, plan_pull
from tests.security.hostile_s3 import HostileS3

pytestmark = pytest.mark.timeout(300)
MiB = 1024 * 1024

# -- the rule, as a property ----------------------------------------------------------------------

_names = st.sampled_from(["part-1", "part-2", "shard-000.tar", "a*b"])
_uint32 = st.integers(min_value=0, max_value=2**32 - 1)


@settings(max_examples=150, deadline=None)
@given(
    targets=st.lists(_names, min_size=1, max_size=3, unique=True),
    operator=st.lists(st.tuples(_names, st.text("0123456789", min_size=1, max_size=11)), max_size=8),
    created=st.lists(st.tuples(_names, _uint32), max_size=6),
)
def test_files_present_before_the_job_always_survive(
    targets: list[str], operator: list[tuple[str, str]], created: list[tuple[str, int]]
) -> None:
    def go_temp(target: str, n: int) -> str:
        pos = target.rfind("*")
        return f"{target[:pos]}{n}{target[pos + 1 :]}" if pos >= 0 else f"{target}{n}"

    with tempfile.TemporaryDirectory() as d:
        dest = Path(d)
        objects = [PulledObject(t, 1) for t in targets]
        before = {}
        for base, digits in operator:  # the operator's files, many of them look-alikes
            name = base.replace("*", digits) if "*" in base else base + digits
            (dest / name).write_bytes(b"operator")
            before[name] = b"operator"
        tracker = TempTracker.snapshot(dest, objects, None)
        ours = set()
        for target, n in created:  # what s5cmd creates afterwards, by Go's own scheme
            if target in targets:
                name = go_temp(target, n)
                assert is_s5cmd_temp_name(name, target)
                if name not in before:
                    (dest / name).write_bytes(b"partial")
                    ours.add(name)
        assert {p.name for p in tracker.ours()} == ours
        tracker.remove()
        for name, body in before.items():
            assert (dest / name).read_bytes() == body
        assert not any((dest / n).exists() for n in ours)


# -- real pulls -------------------------------------------------------------------------------

OPERATOR_FILES = {
    "part-10": b"operator ten",
    "part-11": b"operator eleven",
    "part-2999": b"look-alike of part-2",
    "part-1x": b"not a look-alike",
}


@pytest.fixture
def parts(lab: Lab, s3) -> tuple[str, dict[str, bytes]]:  # type: ignore[no-untyped-def]
    prefix = "sec-parts-" + secrets.token_hex(3)
    bodies = {"part-1": os.urandom(12 * MiB), "part-2": os.urandom(12 * MiB + 7)}
    client = s3.client()
    for name, body in bodies.items():
        client.put_object(Bucket=lab.bucket, Key=f"{prefix}/{name}", Body=body)
    return f"s3://{lab.bucket}/{prefix}/", bodies


@pytest.fixture
async def svc(lab: Lab, tmp_path: Path) -> Services:  # type: ignore[misc]
    from backend.config import load_config_file
    from tests.helpers import write_lab_config

    s = Services(config=load_config_file(write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state")))
    yield s
    await s.aclose()


def _dest_with_operator_files(lab: Lab) -> Path:
    dest = lab.node("node-01").scratch / f"pulls/sec-cleanup-{secrets.token_hex(3)}"
    dest.mkdir(parents=True)
    for name, body in OPERATOR_FILES.items():
        (dest / name).write_bytes(body)
    return dest


def _assert_operator_files_intact(dest: Path) -> None:
    for name, body in OPERATOR_FILES.items():
        assert (dest / name).read_bytes() == body, f"{name} was touched"


def _temps(dest: Path) -> list[str]:
    return [p.name for p in dest.iterdir() if p.name not in OPERATOR_FILES and p.name not in ("part-1", "part-2")]


async def test_success_and_failures_leave_the_operators_files(
    lab: Lab, svc: Services, parts: tuple[str, dict[str, bytes]]
) -> None:
    url, bodies = parts
    dest = _dest_with_operator_files(lab)
    plan = await plan_pull(svc, url, str(dest), ["node-01"])
    [rec] = await launch_pull(svc, plan)
    final = await svc.jobs.wait(rec.id, timeout=120)
    assert final.state == "succeeded", final.error
    _assert_operator_files_intact(dest)
    assert (dest / "part-1").read_bytes() == bodies["part-1"] and _temps(dest) == []

    # s5cmd fails (one object of the spec is missing from the bucket): the same files survive.
    expected = [[o.rel, o.size, o.etag] for o in plan.objects] + [["part-3", 5, None]]
    params = {
        "src": url,
        "dest": str(dest),
        "endpoint_url": plan.endpoint_url,
        "region": plan.region,
        "numworkers": 4,
        "concurrency": 2,
        "part_size_mib": 5,
        "expected": expected,
    }
    rec = await svc.jobs.launch("node-01", "pull", params, secrets=plan.credentials.as_env())
    final = await svc.jobs.wait(rec.id, timeout=120)
    assert final.state == "failed" and "part-3" in (final.error or ""), final.error
    _assert_operator_files_intact(dest)
    assert _temps(dest) == []

    # Verification fails (the spec says another size): the wrong file goes, nothing else does.
    expected = [["part-1", len(bodies["part-1"]), None], ["part-2", 5, None]]
    rec = await svc.jobs.launch("node-01", "pull", {**params, "expected": expected}, secrets=plan.credentials.as_env())
    final = await svc.jobs.wait(rec.id, timeout=120)
    assert final.state == "failed" and "part-2 is" in (final.error or ""), final.error
    _assert_operator_files_intact(dest)
    assert not (dest / "part-2").exists() and (dest / "part-1").read_bytes() == bodies["part-1"]


async def _held_with_a_temp(svc: Services, hostile: HostileS3, dest: Path):  # type: ignore[no-untyped-def]
    """Launch a pull whose GETs the store holds: s5cmd has HEADed the objects and created its
    temporary files, and waits for their bytes (a download stuck mid-flight, on cue)."""
    for name in ("part-1", "part-2"):
        hostile.put("evil", f"data/{name}", os.urandom(12 * MiB))
    plan = await plan_pull(svc, "s3://evil/data/", str(dest), ["node-01"], store="hostile")
    hostile.hold_gets()
    [rec] = await launch_pull(svc, plan)
    job_dir = Path(rec.job_dir or "")
    while not (len(_temps(dest)) == 2 and hostile.held == 2 and (job_dir / "pid").exists()):
        await asyncio.sleep(0.05)  # bounded by the test's timeout
    temps = _temps(dest)
    assert all(is_s5cmd_temp_name(t, t[:6]) for t in temps), temps
    return rec, job_dir, temps


async def test_cancel_removes_its_temporaries_only(lab: Lab, hostile_s3: HostileS3, hostile_services: Services) -> None:
    dest = _dest_with_operator_files(lab)
    try:
        rec, _job_dir, temps = await _held_with_a_temp(hostile_services, hostile_s3, dest)
        final = await Operations(hostile_services).jobs.cancel(rec.id, reason="security test")
    finally:
        hostile_s3.release()
    assert final.state == "cancelled", final.error
    _assert_operator_files_intact(dest)
    assert not any((dest / t).exists() for t in temps)


async def test_a_lost_runners_cleanup_removes_its_temporaries_only(
    lab: Lab, hostile_s3: HostileS3, hostile_services: Services
) -> None:
    dest = _dest_with_operator_files(lab)
    try:
        rec, job_dir, temps = await _held_with_a_temp(hostile_services, hostile_s3, dest)
        # The runner only: s5cmd dies with it (PDEATHSIG) and leaves its temporaries behind.
        os.kill(json.loads((job_dir / "pid").read_text())["pid"], signal.SIGKILL)  # noqa: ASYNC240
        quick_lost(hostile_services)
        final = await hostile_services.jobs.wait(rec.id, timeout=120)
    finally:
        hostile_s3.release()
    assert final.state == "lost", final.error
    _assert_operator_files_intact(dest)
    assert not any((dest / t).exists() for t in temps), _temps(dest)
    assert "removed 2 partial file(s)" in (job_dir / "log").read_text()  # noqa: ASYNC240
