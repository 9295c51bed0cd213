"""Pulls against the real lab: sshd nodes, SeaweedFS S3 and the real s5cmd."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.config import Config
from backend.errors import JobError, StoreError
from backend.ops import Operations
from backend.services import Services
from lab import Lab
from tests.helpers import write_lab_config
from tests.jobs.conftest import SourceData, fresh_services
from tests.pulls_helpers import launch_pull, plan_pull
from tui.cli import main as cli_main

pytestmark = pytest.mark.timeout(240)


def quick_lost(services: Services) -> None:
    """``[jobs] lost_after = "1s"`` for ``services`` (the lab's is 3 s), as in a user's config: for
    a job whose runner is dead or never started, so the record need not wait out 3 s after its
    last heartbeat (or its launch) to call it lost. Only such a job: a live runner is never lost,
    but one still starting on a loaded machine could be, after only 1 s."""
    services.jobs.settings = dataclasses.replace(services.jobs.settings, lost_after=1.0)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _assert_pulled(dest: Path, source: SourceData) -> None:
    for name in source.objects:
        assert (dest / name).is_file(), f"{dest / name} missing"
        assert _sha(dest / name) == source.digest(name), f"{name} differs from the source"
    leftovers = [
        p.name for p in dest.rglob("*") if p.is_file() and p.relative_to(dest).as_posix() not in source.objects
    ]
    assert leftovers == [], f"stray files in {dest}: {leftovers}"


def _procs_with(needle: str) -> list[int]:
    """Pids whose command line or environment mentions ``needle`` (a job id, a destination)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes() + b"\0" + Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle.encode() in cmd.replace(b"\0", b" "):
            out.append(int(entry))
    return out


def test_cli_pull_to_two_nodes_verifies_bytes(
    lab: Lab, source: SourceData, jobs_config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest_rel = f"pulls/{source.prefix.rsplit('/', 1)[-1]}-two"
    rc = cli_main(
        [
            "--config",
            str(jobs_config_path),
            "pull",
            source.url,
            dest_rel,
            "--nodes",
            "node-0[1-2]",
            "--part-size",
            "5",
            "--numworkers",
            "4",
            "--concurrency",
            "4",
            "--yes",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert "4 object(s)" in out
    assert "node-01: succeeded" in out and "node-02: succeeded" in out
    for node in ("node-01", "node-02"):
        _assert_pulled(lab.node(node).scratch / dest_rel, source)
        # The launch writes the job's files under umask 077, but the job itself (and what it
        # pulls) runs with the node's own umask (022 in the lab): datasets stay readable.
        assert (lab.node(node).scratch / dest_rel / "small.bin").stat().st_mode & 0o044 == 0o044

    # The CLI's records: both jobs, who launched them, their verified result.
    rc = cli_main(["--config", str(jobs_config_path), "jobs", "--json"])
    rows = json.loads(capsys.readouterr().out)
    pulls = [r for r in rows if r["kind"] == "pull" and r["params"]["dest"].endswith(dest_rel)]
    assert {r["node"] for r in pulls} == {"node-01", "node-02"}
    for r in pulls:
        assert r["state"] == "succeeded"
        assert r["result"]["objects"] == 4 and r["result"]["bytes"] == source.total
        assert r["progress"]["bytes_done"] == source.total
        assert "@" in r["launched_by"]
    # No credentials left on the nodes' job directories, and none in the logs.
    secret = _lab_secret(lab)
    for r in pulls:
        job_dir = Path(r["job_dir"])
        names = sorted(p.name for p in job_dir.iterdir())
        assert "secrets.json" not in names and "aws-credentials" not in names, names
        assert (job_dir / "spec.json").stat().st_mode & 0o077 == 0
        for p in job_dir.iterdir():
            assert secret not in p.read_text(errors="replace"), f"secret found in {p}"
    audit = [
        e
        for e in fresh_services(
            load(jobs_config_path), jobs_config_path.parent / "state" / "state.sqlite3"
        ).db.audit_entries(action="pull.launch")
    ]
    assert audit and audit[0].detail["bytes"] == source.total


def load(path: Path) -> Config:
    from backend.config import load_config_file

    return load_config_file(path)


def _lab_secret(lab: Lab) -> str:
    assert lab.s3 is not None
    return lab.s3.secret_key


@contextlib.contextmanager
def store_stalled(lab: Lab) -> Iterator[None]:
    """Freeze the SeaweedFS process (SIGSTOP): requests hang as on a stalled network path."""
    assert lab.s3 is not None and lab.s3.proc is not None
    pid = lab.s3.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def _launch_stalled(
    services: Services, lab: Lab, source: SourceData, node: str, dest_rel: str, stack: contextlib.ExitStack
):  # type: ignore[no-untyped-def]
    """Plan (listing the real store), then stall the store and launch: the job is held mid-pull.

    However fast loopback is, s5cmd is then running with requests in flight, so the test can
    drop connections, kill the runner or cancel at a known point.
    """
    plan = await plan_pull(services, source.url, dest_rel, [node], numworkers=2, concurrency=2, part_size_mib=5)
    stack.enter_context(store_stalled(lab))
    [rec] = await launch_pull(services, plan)
    job_dir = Path(rec.job_dir or "")
    deadline = time.monotonic() + 60
    pgid = None
    while time.monotonic() < deadline:
        pid_file = job_dir / "pid"
        if pid_file.exists() and (job_dir / "progress.jsonl").exists():
            pgid = json.loads(pid_file.read_text())["pgid"]  # noqa: ASYNC240
            break
        await asyncio.sleep(0.02)
    assert pgid, "job never reported progress"
    return rec, job_dir, pgid


async def test_drop_connections_job_continues_and_console_reattaches(
    lab: Lab, source: SourceData, services: Services, jobs_config: Config, tmp_path: Path
) -> None:
    dest_rel = "pulls/reattach"
    with contextlib.ExitStack() as stack:
        rec, job_dir, pgid = await _launch_stalled(services, lab, source, "node-02", dest_rel, stack)
        # Credentials never in s5cmd's argv: read the live command lines of the job's processes.
        s5 = [p for p in _procs_with(f"LOADMASTER_JOB_ID={rec.id}") if p != pgid]
        assert s5, "s5cmd is not running"
        assert lab.s3 is not None
        for pid in [*s5, pgid]:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()  # noqa: ASYNC240
            assert lab.s3.secret_key.encode() not in cmdline
            assert lab.s3.access_key.encode() not in cmdline
        assert not (job_dir / "secrets.json").exists(), "the runner must delete the secrets file"
        assert oct((job_dir / "aws-credentials").stat().st_mode & 0o777) == "0o600"

        assert lab.node("node-02").drop_connections() >= 1
        await services.pool.close()
        # A brand-new console of the team (own pool, its own handle on the team's state) finds
        # the job and its progress.
        other = fresh_services(jobs_config)
        recs = await other.jobs.refresh(["node-02"])
        mine = [r for r in recs if r.id == rec.id]
        assert mine and mine[0].state == "running", mine
        on_disk = [json.loads(x) for x in (job_dir / "progress.jsonl").read_text().splitlines()]  # noqa: ASYNC240
        assert mine[0].progress is not None
        assert mine[0].progress.bytes_done == on_disk[-1]["bytes_done"]
        assert mine[0].progress.bytes_total == source.total
        assert mine[0].progress.items_total == len(source.objects)
        assert mine[0].launched_by == rec.launched_by
    # The store is back: the job (never touched by the dropped connection) finishes and verifies.
    final = await other.jobs.wait(rec.id, timeout=120)
    await other.aclose()
    assert final.state == "succeeded", final.error
    assert final.progress is not None and final.progress.bytes_done == source.total
    _assert_pulled(lab.node("node-02").scratch / dest_rel, source)
    assert not (job_dir / "aws-credentials").exists()


async def test_kill_runner_becomes_lost_without_strays(lab: Lab, source: SourceData, services: Services) -> None:
    dest_rel = "pulls/killed"
    dest = lab.node("node-01").scratch / dest_rel
    with contextlib.ExitStack() as stack:
        rec, job_dir, pgid = await _launch_stalled(services, lab, source, "node-01", dest_rel, stack)
        assert [p for p in _procs_with(f"LOADMASTER_JOB_ID={rec.id}") if p != pgid], "s5cmd is not running"
        os.kill(pgid, signal.SIGKILL)  # the runner only; s5cmd must die with it (PDEATHSIG)
        quick_lost(services)
        final = await services.jobs.wait(rec.id, timeout=120)
    assert final.state == "lost"
    assert "no result" in (final.error or "")
    result = json.loads((job_dir / "result.json").read_text())  # noqa: ASYNC240
    assert result["state"] == "lost"
    assert _procs_with(f"LOADMASTER_JOB_ID={rec.id}") == []
    assert not _group_alive(pgid)
    _assert_no_partials(dest, source)
    assert not (job_dir / "aws-credentials").exists()


def _assert_no_partials(dest: Path, source: SourceData) -> None:
    """Complete objects may stay; nothing half-written remains to be mistaken for data."""
    for p in dest.rglob("*"):
        if p.is_file():
            rel = p.relative_to(dest).as_posix()
            assert rel in source.objects and p.stat().st_size == len(source.objects[rel]), f"partial {p}"


def _group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in process group ``pgid``."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


async def test_cancel_stops_the_job_cleans_partials_and_audits(
    lab: Lab, source: SourceData, services: Services
) -> None:
    dest_rel = "pulls/cancelled"
    dest = lab.node("node-01").scratch / dest_rel
    with contextlib.ExitStack() as stack:
        rec, job_dir, pgid = await _launch_stalled(services, lab, source, "node-01", dest_rel, stack)
        final = await Operations(services).jobs.cancel(rec.id, reason="test cancel")
    assert final.state == "cancelled"
    assert not _group_alive(pgid)
    assert _procs_with(f"LOADMASTER_JOB_ID={rec.id}") == []
    _assert_no_partials(dest, source)
    log = (job_dir / "log").read_text()  # noqa: ASYNC240
    assert "cancel" in log
    entries = services.db.audit_entries(action="job.cancel")
    assert entries and entries[0].target == f"node-01:{rec.id}" and entries[0].outcome == "cancelled"
    assert entries[0].reason == "test cancel"
    with pytest.raises(JobError, match="already ended"):
        await Operations(services).jobs.cancel(rec.id)


async def test_cancel_escalates_to_sigkill_for_a_frozen_job(lab: Lab, source: SourceData, services: Services) -> None:
    dest_rel = "pulls/frozen"
    dest = lab.node("node-01").scratch / dest_rel
    with contextlib.ExitStack() as stack:
        rec, job_dir, pgid = await _launch_stalled(services, lab, source, "node-01", dest_rel, stack)
        os.killpg(pgid, signal.SIGSTOP)  # cannot honour SIGTERM: cancel must SIGKILL after the grace
        # As [jobs] cancel_grace = "1s" would (the lab's is 2 s): the frozen group waits it out whole.
        services.jobs.settings = dataclasses.replace(services.jobs.settings, cancel_grace=1.0)
        final = await Operations(services).jobs.cancel(rec.id)
    assert final.state == "cancelled"
    assert "killed after the grace period" in (final.error or "")
    assert not _group_alive(pgid)
    _assert_no_partials(dest, source)


async def test_missing_bucket_is_a_clear_error(services: Services, lab: Lab) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        await plan_pull(services, "s3://no-such-bucket-here/data/", "pulls/x", ["node-01"], store="lab")
    assert not (lab.node("node-01").scratch / "pulls/x").exists()


async def test_no_matching_objects_is_a_clear_error(services: Services, source: SourceData) -> None:
    with pytest.raises(StoreError, match="no objects match"):
        await plan_pull(services, f"s3://{source.bucket}/{source.prefix}/nothing-*.bin", "pulls/x", ["node-01"])


async def test_bad_credentials_on_the_console_are_a_clear_error(
    lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: SourceData
) -> None:
    creds = tmp_path / "creds"
    creds.write_text("[lab]\naws_access_key_id = LABWRONGKEY\naws_secret_access_key = wrong\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    cfg = write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state")
    svc = Services(config=load(cfg))
    try:
        with pytest.raises(StoreError, match="rejected|denied"):
            await plan_pull(svc, source.url, "pulls/badcreds", ["node-01"])
    finally:
        await svc.aclose()


async def test_bad_credentials_on_the_node_fail_the_job_cleanly(
    lab: Lab, source: SourceData, services: Services
) -> None:
    plan = await plan_pull(services, source.url, "pulls/badnode", ["node-01"])
    params = {
        "src": plan.src,
        "dest": plan.nodes[0].dest,
        "endpoint_url": plan.endpoint_url,
        "region": plan.region,
        "numworkers": 4,
        "concurrency": 2,
        "part_size_mib": 5,
        "expected": [list(o) for o in plan.objects],
    }
    rec = await services.jobs.launch(
        "node-01", "pull", params, secrets={"AWS_ACCESS_KEY_ID": "LABNOPE", "AWS_SECRET_ACCESS_KEY": "nope"}
    )
    final = await services.jobs.wait(rec.id, timeout=120)
    assert final.state == "failed"
    assert "s5cmd" in (final.error or "") and (
        "Access" in final.error or "Invalid" in final.error or "Signature" in final.error or "403" in final.error
    ), final.error
    dest = lab.node("node-01").scratch / "pulls/badnode"
    assert not dest.exists() or not any(p.is_file() for p in dest.rglob("*"))
    assert "nope" not in Path(rec.job_dir or "", "log").read_text()  # noqa: ASYNC240


async def test_full_destination_refused_before_launch_and_fails_cleanly_if_forced(
    lab: Lab, source: SourceData, services: Services
) -> None:
    mnt = lab.node("node-01").scratch / "tiny"
    mnt.mkdir(exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],  # noqa: ASYNC221
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        plan = await plan_pull(services, source.url, "tiny/data", ["node-01"])
        assert not plan.nodes[0].fits(plan.total_bytes)
        with pytest.raises(JobError, match="free but the pull needs"):
            await launch_pull(services, plan)
        assert not (mnt / "data").exists()
        # Forced past the pre-check, the job itself fails on ENOSPC and leaves no partial files.
        params = {
            "src": plan.src,
            "dest": plan.nodes[0].dest,
            "endpoint_url": plan.endpoint_url,
            "region": plan.region,
            "numworkers": 4,
            "concurrency": 2,
            "part_size_mib": 5,
            "expected": [list(o) for o in plan.objects],
            "skip_space_check": True,
        }
        store_creds = await _lab_creds(services)
        rec = await services.jobs.launch("node-01", "pull", params, secrets=store_creds)
        final = await services.jobs.wait(rec.id, timeout=120)
        assert final.state == "failed"
        assert "space" in (final.error or "").lower(), final.error
        for p in (mnt / "data").rglob("*"):
            if p.is_file():
                rel = p.relative_to(mnt / "data").as_posix()
                assert rel in source.objects and p.stat().st_size == len(source.objects[rel]), f"partial {p}"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)  # noqa: ASYNC221


async def _lab_creds(services: Services) -> dict[str, str]:
    from backend.storage import S3Store

    store = S3Store(services.config.stores["lab"].url, services.config.stores["lab"])
    c = await store.credentials()
    await store.close()
    return {"AWS_ACCESS_KEY_ID": c.access_key, "AWS_SECRET_ACCESS_KEY": c.secret_key}


async def test_unreachable_node_refused_and_listed(
    lab: Lab, source: SourceData, services: Services, lab_node_down
) -> None:  # type: ignore[no-untyped-def]
    lab_node_down("node-03")
    plan = await plan_pull(services, source.url, "pulls/down", ["node-03"])
    assert plan.problems and plan.problems[0].startswith("node-03")
    with pytest.raises(JobError, match="node-03"):
        await launch_pull(services, plan)
    with pytest.raises(JobError, match="node-03"):
        await services.jobs.launch("node-03", "pull", {"src": source.url, "dest": "/tmp/x"})
    recs = await services.jobs.refresh()
    failed = [r for r in recs if r.node == "node-03"]
    assert all(r.state == "failed" for r in failed)


async def test_agent_missing_on_the_node_becomes_lost_with_a_hint(lab: Lab, source: SourceData, tmp_path: Path) -> None:
    cfg = write_lab_config(lab, tmp_path / "noagent.toml", tmp_path / "state")
    cfg.write_text(cfg.read_text().replace("[defaults]\n", '[defaults]\nagent = "no-such-loadmaster"\n', 1))
    svc = Services(config=load(cfg))
    try:
        plan = await plan_pull(svc, source.url, "pulls/noagent", ["node-01"])
        [rec] = await launch_pull(svc, plan)
        quick_lost(svc)  # it never starts: lost once its launch is older than lost_after
        final = await svc.jobs.wait(rec.id, timeout=120)
        assert final.state == "lost"
        assert "never started" in (final.error or "") and "agent" in (final.error or "")
        text, _ = await svc.jobs.read_log(rec.id)
        assert "no-such-loadmaster" in text  # the shell's "not found" is in the job log
        # The secrets file the runner never read is removed when the job is found lost.
        assert not (Path(rec.job_dir or "") / "secrets.json").exists()  # noqa: ASYNC240
    finally:
        await svc.aclose()


async def test_s5cmd_listing_matches_the_s3_client_listing(services: Services, source: SourceData) -> None:
    """The console lists with s5cmd when it has it; it must see exactly what the S3 client sees."""
    from backend.pulls.listing import _console_s5cmd, _list_with_s5cmd, list_source
    from backend.pulls.objects import parse_source
    from backend.pulls.plan import resolve_store

    s5cmd = _console_s5cmd()
    assert s5cmd is not None, "the lab needs s5cmd beside the console"
    for url in (
        source.url,
        f"s3://{source.bucket}/{source.prefix}/shard-*.bin",
        f"s3://{source.bucket}/{source.prefix}/meta/",
    ):
        pattern = parse_source(url)
        profile = resolve_store(services.config, url, None)
        fast = await _list_with_s5cmd(pattern, profile, s5cmd)
        assert fast is not None, url
        objects, creds = fast
        assert creds.access_key  # handed to the jobs' secrets files
        # The reference: the S3 client path (no credentials asked: it never takes the s5cmd path).
        slow, _ = await list_source(pattern, profile)
        assert objects == sorted(slow), url
    everything = {
        o.rel: o.size
        for o in (
            await _list_with_s5cmd(parse_source(source.url), resolve_store(services.config, source.url, None), s5cmd)
            or ([], None)
        )[0]
    }
    assert everything == {name: len(body) for name, body in source.objects.items()}
