"""Pure units of the jobs layer: source patterns, scan parsing, progress, roll-up, the job context."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from backend.agent.context import JobContext
from backend.agent.kinds import KINDS, FunctionKind, JobKind, check_known, kind
from backend.errors import JobError, StoreError
from backend.jobs.records import JobProgress, JobRecord, fleet_rollup, progress_from_lines
from backend.jobs.remote import parse_scan
from backend.pulls.destination import TempTracker, is_s5cmd_temp_name
from backend.pulls.model import NodeEstimate, node_dest
from backend.pulls.objects import PulledObject, parse_source, s5cmd_error
from backend.units import bytes_text, duration_text


def test_parse_source_prefix_wildcard_and_single_object() -> None:
    p = parse_source("s3://b/data/")
    assert (p.url, p.base, p.pattern) == ("s3://b/data/*", "data/", "data/*")
    assert p.rel("data/sub/x.bin") == "sub/x.bin" and p.matches("data/sub/x.bin") and not p.matches("other/x")
    w = parse_source("s3://b/data/shard-*.tar")
    assert w.base == "data/" and w.matches("data/shard-001.tar") and not w.matches("data/index.json")
    assert w.rel("data/shard-001.tar") == "shard-001.tar"
    one = parse_source("s3://b/data/x.bin")
    assert one.pattern is None and one.rel("data/x.bin") == "x.bin" and one.matches("data/x.bin")
    everything = parse_source("s3://b")
    assert everything.url == "s3://b/*" and everything.base == ""
    with pytest.raises(StoreError, match="no bucket"):
        parse_source("s3:///x")


def test_node_dest_relative_goes_under_scratch() -> None:
    assert node_dest("data/run1", "/mnt/local-nvme") == "/mnt/local-nvme/data/run1"
    assert node_dest("/abs/dir/", "/mnt/x") == "/abs/dir"
    assert node_dest("~/d", "/mnt/x") == "~/d"


def test_parse_scan_reads_jobs_and_skips_half_lines() -> None:
    text = "\n".join(
        [
            "@@HOME /h/jobs",
            "@@NOW 1000.5",
            "@@JOB a",
            '@@SPEC {"id": "a", "kind": "pull", "created": 990}',
            '@@PID {"pid": 12, "pgid": 12}',
            "@@ALIVE 1",
            "@@BEAT 999.0",
            '@@PROG {"t": 995, "bytes_done": 10, "bytes_total": 100}',
            '@@PROG {"t": 997, "bytes_done": 50, "bytes_to',  # being appended right now
            "@@JOB b",
            '@@SPEC {"id": "b", "kind": "pull"}',
            '@@RESULT {"state": "succeeded"}',
            "@@JOB c",  # no spec yet: not a job
        ]
    )
    home, now, jobs = parse_scan(text)
    assert home == "/h/jobs" and now == 1000.5
    assert [j.id for j in jobs] == ["a", "b"]
    a, b = jobs
    assert a.alive and a.pidinfo == {"pid": 12, "pgid": 12} and a.beat == 999.0 and len(a.progress) == 1
    assert b.result == {"state": "succeeded"} and b.alive is None


def test_progress_rate_eta_and_fraction() -> None:
    p = progress_from_lines(
        [
            {"t": 10, "bytes_done": 0, "bytes_total": 1000},
            {"t": 12, "bytes_done": 500, "bytes_total": 1000, "items_done": 1, "items_total": 2},
        ]
    )
    assert p is not None
    assert p.rate_bps == 250 and p.eta_s == 2 and p.fraction == 0.5 and p.items_done == 1
    runner_rate = progress_from_lines([{"t": 1, "bytes_done": 5, "rate_bps": 7.0, "phase": "copy"}])
    assert runner_rate is not None and runner_rate.rate_bps == 7.0 and runner_rate.extra == {"phase": "copy"}
    assert runner_rate.fraction is None and runner_rate.eta_s is None
    assert progress_from_lines([]) is None


def _rec(state: str, done: int, total: int | None, rate: float | None) -> JobRecord:
    return JobRecord(
        id=state + str(done),
        node="n",
        kind="pull",
        state=state,
        created=0,
        launched_by="u@h",
        launched_from="h",
        progress=JobProgress(t=0, bytes_done=done, bytes_total=total, items_done=1, items_total=2, rate_bps=rate),
    )


def test_fleet_rollup_sums_and_unknown_totals() -> None:
    roll = fleet_rollup(
        [_rec("running", 100, 400, 50.0), _rec("running", 300, 400, 150.0), _rec("succeeded", 400, 400, 99.0)]
    )
    assert roll.bytes_done == 800 and roll.bytes_total == 1200 and roll.rate_bps == 200.0
    assert roll.running == 2 and roll.succeeded == 1 and roll.eta_s == 2.0
    assert fleet_rollup([_rec("running", 1, None, 1.0)]).bytes_total is None
    assert fleet_rollup([]).fraction is None


def test_context_coalesces_but_keeps_the_final_point() -> None:
    seen: list[dict] = []
    ctx = JobContext.in_process("pull", {}, on_progress=seen.append)
    for i in range(1000):
        ctx.progress(bytes_done=i, bytes_total=10_000)
    assert 1 <= len(seen) <= 3  # a burst in well under a second: coalesced
    ctx.flush()
    assert seen[-1]["bytes_done"] == 999  # the latest point is written by flush
    ctx.progress(bytes_done=10_000, bytes_total=10_000, items_done=3, items_total=3)
    assert seen[-1]["bytes_done"] == 10_000 and seen[-1]["items_total"] == 3
    assert set(seen[-1]) >= {"t", "bytes_done", "bytes_total", "items_done", "items_total"}


def test_context_on_disk_secrets_read_once_and_deleted(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / "spec.json").write_text(json.dumps({"id": "j1", "kind": "pull", "params": {"a": 1}}))
    fd = os.open(job / "secrets.json", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, json.dumps({"AWS_SECRET_ACCESS_KEY": "s3cr3t"}).encode())
    os.close(fd)
    assert stat.S_IMODE((job / "secrets.json").stat().st_mode) == 0o600
    ctx = JobContext.from_job_dir(job)
    assert ctx.job_id == "j1" and ctx.params == {"a": 1} and ctx.job_dir == job
    assert ctx.secret_env() == {"AWS_SECRET_ACCESS_KEY": "s3cr3t"}
    assert not (job / "secrets.json").exists()
    assert ctx.secret_env() == {"AWS_SECRET_ACCESS_KEY": "s3cr3t"}  # cached, not re-read
    ctx.log("hello")
    ctx.progress(bytes_done=1, bytes_total=1)
    assert "hello" in (job / "log").read_text()
    assert json.loads((job / "progress.jsonl").read_text().splitlines()[-1])["bytes_done"] == 1
    assert not ctx.cancelled
    (job / "cancel").touch()
    assert ctx.cancelled


def test_kind_registry_and_unknown_kind() -> None:
    pull = kind("pull")
    assert isinstance(pull, JobKind) and pull.name == "pull" and kind("pull") is pull
    assert type(pull).__module__ == "backend.pulls.job"
    for name in KINDS:  # every registered kind's module imports and names the kind it is registered as
        assert kind(name).name == name
    with pytest.raises(JobError, match="unknown job kind 'teleport' \\(known: pull, relay, shard, strip, upload\\)"):
        kind("teleport")
    with pytest.raises(JobError, match="unknown job kind"):
        check_known("teleport")


async def test_kind_hooks_default_to_nothing() -> None:
    calls: list[str] = []
    k = FunctionKind("demo", lambda ctx: {"ran": True}, lambda ctx: calls.append("cleanup"))
    assert k.run(None) == {"ran": True}  # type: ignore[arg-type]
    k.cleanup(None)  # type: ignore[arg-type]
    assert calls == ["cleanup"]
    assert await k.cleanup_secrets(None, {}) == {}  # type: ignore[arg-type]
    assert k.on_ended(None, None, None) is None  # type: ignore[func-returns-value,arg-type]
    # Only an upload's cleanup needs its secrets again; a local store needs none.
    assert await kind("pull").cleanup_secrets(None, {}) == {}  # type: ignore[arg-type]
    assert await kind("upload").cleanup_secrets(None, {"store": {"url": "/tmp/x"}}) == {}  # type: ignore[arg-type]


def test_a_kind_lookup_on_the_node_imports_only_that_kind() -> None:
    """``agent run`` of a pull imports the runner and the pull's node side: not the console's
    pull, the manager, the ledger, or another kind's module."""
    probe = (
        "import json, sys\nfrom backend.agent.runner import run_job\nfrom backend.agent.kinds import kind\n"
        "kind('pull')\nprint(json.dumps(sorted(sys.modules)))"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    loaded = set(json.loads(res.stdout.splitlines()[-1]))
    assert "backend.pulls.job" in loaded
    forbidden = (
        "backend.pulls.plan",
        "backend.jobs.manager",
        "backend.jobs.store",
        "backend.ledger",
        "backend.config",
        "backend.checkpoints",
        "backend.shards",
        "backend.storage",
        "backend.nodes",
        "botocore",
        "asyncio",
    )
    assert sorted(m for m in loaded if any(m == f or m.startswith(f + ".") for f in forbidden)) == []


def test_s5cmd_error_lines_count_even_with_exit_zero() -> None:
    assert s5cmd_error('{"operation":"cp","error":"NoSuchBucket: gone"}') == "cp : NoSuchBucket: gone"
    assert s5cmd_error('ERROR "cp s3://b/x y": AccessDenied') is not None
    assert s5cmd_error('{"operation":"cp","success":true,"object":{"size":1}}') is None
    assert s5cmd_error("") is None


def test_temp_names_follow_go_createtemp(tmp_path: Path) -> None:
    # os.CreateTemp(dir, name): name + decimal uint32 without leading zeros (the last "*" is
    # replaced instead when the name has one).
    assert is_s5cmd_temp_name("obj-1.bin2482161410", "obj-1.bin")
    assert is_s5cmd_temp_name("obj-1.bin0", "obj-1.bin")
    assert not is_s5cmd_temp_name("obj-1.bin02", "obj-1.bin")  # a leading zero: never Go's
    assert not is_s5cmd_temp_name("obj-1.bin4294967296", "obj-1.bin")  # above uint32
    assert is_s5cmd_temp_name("a-77.tar", "a-*.tar") and not is_s5cmd_temp_name("a-x.tar", "a-*.tar")


def test_only_look_alikes_created_after_the_snapshot_are_the_jobs(tmp_path: Path) -> None:
    objects = [PulledObject("obj-1.bin", 1), PulledObject("obj-12.bin", 1)]
    (tmp_path / "obj-1.bin").write_bytes(b"x")
    (tmp_path / "obj-1.bin5").write_bytes(b"the operator's")  # fits the scheme, but was there first
    (tmp_path / "unrelated123").write_bytes(b"x")
    tracker = TempTracker.snapshot(tmp_path, objects, tmp_path)
    (tmp_path / "obj-1.bin2482161410").write_bytes(b"partial")
    (tmp_path / "obj-12.bin").write_bytes(b"x")  # another object, never a temp of obj-1.bin
    assert [p.name for p in tracker.ours()] == ["obj-1.bin2482161410"]
    # A later cleanup (another process) reads the same snapshot from the job directory.
    assert [p.name for p in TempTracker.load(tmp_path, objects, tmp_path).ours()] == ["obj-1.bin2482161410"]
    assert TempTracker.load(tmp_path, objects, tmp_path / "no-such-job").ours() == []  # no record: nothing


def test_node_estimate_fit_and_problem() -> None:
    e = NodeEstimate(node="n1", dest="/d", free_bytes=100, present_bytes=30, line_rate_gbps=8.0, s5cmd=True)
    assert e.fits(130) and not e.fits(131) and e.problem(131) and "needs" in (e.problem(131) or "")
    assert e.eta_s(1_000_000_030) == pytest.approx(1.0)
    assert "s5cmd is not installed" in (NodeEstimate(node="n", dest="/d", free_bytes=10).problem(1) or "")


def test_formatting() -> None:
    assert bytes_text(12_600_000_000) == "12.6 GB" and bytes_text(None) == "?" and bytes_text(12) == "12 B"
    assert duration_text(3725) == "1h02m" and duration_text(185) == "3m05s" and duration_text(None) == "?"
    assert duration_text(0.14) == "<1s" and duration_text(0) == "0s"


def test_context_zero_sized_or_repeated_final_points_are_coalesced() -> None:
    seen: list[dict] = []
    ctx = JobContext.in_process("strip", {}, on_progress=seen.append)
    for i in range(200):
        ctx.progress(bytes_done=0, bytes_total=0, items_done=i)
    assert len(seen) <= 2
    for _ in range(200):
        ctx.progress(bytes_done=5, bytes_total=5, items_done=1, items_total=1)
    assert sum(1 for p in seen if p["bytes_done"] == 5) == 1


def test_runner_wakes_a_follower_blocked_on_the_done_fifo(tmp_path: Path) -> None:
    """The scan's wait reads done.fifo; the runner's open after the result ends that read at once."""
    import threading

    from backend.agent.context import done_fifo
    from backend.agent.runner import _make_done_fifo, _wake_followers
    from backend.jobs.remote import SCAN_SCRIPT

    home = tmp_path / "home"
    job = home / "jobs" / "j1"
    job.mkdir(parents=True)
    (job / "spec.json").write_text(json.dumps({"id": "j1", "kind": "pull", "params": {}}))
    fifo = done_fifo(job)
    assert fifo.parent == job.parent  # beside the job directory: reading all its files never blocks
    _make_done_fifo(fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    _wake_followers(fifo, remove=False)  # nobody waiting: returns at once, nothing blocks
    # WAIT of 10 minutes: only the FIFO can end this scan before the guard below.
    scan = subprocess.Popen(
        ["sh", "-c", SCAN_SCRIPT, "scan", "j1", "6", "6000", "j1"],
        env={**os.environ, "LOADMASTER_HOME": str(home)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:

        def finish() -> None:
            # The result lands first, then the wake-up (as in run_job); repeated until the scan
            # is reading the FIFO, since it may not have opened it yet.
            (job / "result.json").write_text(json.dumps({"id": "j1", "state": "succeeded"}) + "\n")
            while scan.poll() is None:
                _wake_followers(fifo, remove=False)
                threading.Event().wait(0.05)

        t = threading.Thread(target=finish, daemon=True)
        t.start()
        out, _ = scan.communicate(timeout=120)
    finally:
        if scan.poll() is None:
            scan.kill()
    _home, _now, jobs = parse_scan(out)
    assert [j.id for j in jobs] == ["j1"] and jobs[0].result == {"id": "j1", "state": "succeeded"}
    _wake_followers(fifo)
    assert not fifo.exists()
