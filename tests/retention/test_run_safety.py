"""One identity per run, one apply per run at a time, and re-checks that hold when an apply is
resumed or an export lands between plan and apply (real DCP runs on local disk and SeaweedFS)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
from retention_helpers import DcpRun  # type: ignore[import-not-found]

from backend.errors import PolicyError
from backend.policy.retention import RetentionPolicy
from backend.retention import PinStore, apply_plan, compute_plan
from backend.retention.marks import MilestoneStore, canonical_run
from backend.retention.runs import LOCK_KEY, ApplyLock, machine_identity
from backend.storage import LocalStore
from tui.cli import main

POLICY = RetentionPolicy(keep_full_latest=2, milestone_every=4000)


class Crash(Exception):
    pass


@pytest.fixture
def store_services(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Services whose config names a local directory store ``ckpts`` (the store/run form)."""
    from backend.config import parse_config
    from backend.services import Services

    (tmp_path / "bucket").mkdir()
    config = parse_config(
        {"nodes": [{"name": "here", "transport": "local"}], "stores": {"ckpts": {"url": str(tmp_path / "bucket")}}},
        file="t.toml",
        base=tmp_path,
    )
    services = Services(config)
    yield services
    services.db.close()


async def test_every_spelling_of_a_run_is_one_run(
    tmp_path: Path,
    store_services,
    dcp_run: DcpRun,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = dcp_run.copy_to(tmp_path / "bucket" / "run1")
    monkeypatch.chdir(tmp_path / "bucket")
    forms = ["ckpts/run1", "run1", "./run1/", str(root), str(root) + "/"]
    urls = {canonical_run(store_services.config, f)[0] for f in forms}
    assert urls == {str(root)}
    # a pin made with the store/run form protects the step in a plan made from the absolute path
    PinStore(store_services.db).pin(canonical_run(store_services.config, "ckpts/run1")[0], 1000, "eval baseline")
    MilestoneStore(store_services.db).mark(canonical_run(store_services.config, "./run1")[0], 3000)
    for form in forms:
        plan = await compute_plan(store_services, form, POLICY)
        acts = {a.step: a for a in plan.actions}
        assert (acts[1000].action, acts[1000].pinned) == ("keep-full", "eval baseline"), form
        assert acts[3000].action == "strip-to-weights" and acts[3000].milestone, form
        assert plan.url == str(root)


def test_retention_cli_takes_the_store_run_form_and_relative_paths(
    tmp_path: Path, dcp_run: DcpRun, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = tmp_path / "bucket"
    dcp_run.copy_to(bucket / "run1")
    cfg = tmp_path / "lm.toml"
    cfg.write_text(
        f'[[nodes]]\nname = "here"\ntransport = "local"\n\n[stores.ckpts]\nurl = "{bucket}"\n'
        f'\n[state]\ndir = "{tmp_path / "state"}"\n'
    )
    monkeypatch.chdir(bucket)
    assert main(["--config", str(cfg), "retention", "pin", "ckpts/run1", "2000:baseline"]) == 0
    assert capsys.readouterr().out == f"pinned step 2000 under {bucket}/run1 (baseline)\n"
    assert main(["--config", str(cfg), "retention", "milestone", "run1", "5000"]) == 0
    capsys.readouterr()
    for form in ("ckpts/run1", "run1", "./run1"):
        assert main(["--config", str(cfg), "retention", "plan", form, "--json"]) == 0, form
        plan = json.loads(capsys.readouterr().out)
        acts = {a["step"]: a for a in plan["actions"]}
        assert acts[2000]["pinned"] == "baseline" and acts[5000]["milestone"], form
        assert acts[12000]["resumable"] == "verified"
    assert main(["--config", str(cfg), "retention", "unpin", "run1", "2000"]) == 0
    assert main(["--config", str(cfg), "retention", "plan", "no/such/run"]) == 2
    assert "no such directory" in capsys.readouterr().err


async def test_a_resumed_apply_rechecks_pins_for_actions_it_had_started(
    tmp_path: Path,
    local_services,  # type: ignore[no-untyped-def]
    dcp_run: DcpRun,
) -> None:
    root = dcp_run.copy_to(tmp_path / "run1")
    plan = await compute_plan(local_services, str(root), POLICY)

    def crash_on_step_2000(stage: str, a) -> None:  # type: ignore[no-untyped-def]
        if stage == "before" and a.path == "step-2000":
            raise Crash("the console lost its connection here")

    with pytest.raises(Crash):
        await apply_plan(local_services, plan, fault=crash_on_step_2000)
    assert (root / "step-2000" / ".metadata").exists()
    PinStore(local_services.db).pin(str(root), 2000, "needed after all")  # between the two runs
    report = await apply_plan(local_services, plan)
    outcome = {o.path: o for o in report.outcomes}["step-2000"]
    assert outcome.outcome == "stopped" and "protected" in outcome.detail
    assert (root / "step-2000" / ".metadata").exists() and len(list((root / "step-2000").iterdir())) >= 2


async def test_an_export_that_lands_between_plan_and_apply_stops_that_step(
    tmp_path: Path,
    local_services,  # type: ignore[no-untyped-def]
    dcp_run: DcpRun,
) -> None:
    root = dcp_run.copy_to(tmp_path / "run1")
    plan = await compute_plan(local_services, str(root), POLICY)
    assert {a.step: a.action for a in plan.actions}[4000] == "strip-to-weights"
    before = sorted(p.name for p in (root / "step-4000").iterdir())
    from backend.checkpoints.strip import strip_step

    await strip_step(LocalStore(root), "step-4000")  # someone else's export, after the plan
    report = await apply_plan(local_services, plan)
    o = {o.path: o for o in report.outcomes}["step-4000"]
    assert o.outcome == "stopped" and "BF16 export was written or changed after the plan" in o.detail
    assert set(before) <= {p.name for p in (root / "step-4000").iterdir()}  # its training state is still there


async def test_two_applies_of_one_run_at_once_one_waits_its_turn(
    tmp_path: Path,
    local_services,  # type: ignore[no-untyped-def]
    dcp_run: DcpRun,
) -> None:
    root = dcp_run.copy_to(tmp_path / "run1")
    plan = await compute_plan(local_services, str(root), POLICY)
    async with ApplyLock(LocalStore(root), "", run=str(root), plan=plan.hash):  # another apply, running
        held = json.loads((root / LOCK_KEY).read_text())
        assert held["host"] == socket.gethostname() and held["pid"] == os.getpid()
        with pytest.raises(
            PolicyError,
            match=rf"a retention apply of {root} is already running: .* \(pid "
            rf"{os.getpid()}, plan {plan.hash[:12]}, since .*\); wait for it to "
            "finish, or if it died",
        ):
            await apply_plan(local_services, plan)
        assert (root / "step-1000" / ".metadata").exists()
    assert not (root / LOCK_KEY).exists()
    # two started at the same moment: exactly one proceeds
    results = await asyncio.gather(
        *(ApplyLock(LocalStore(root), "", run=str(root), plan=plan.hash).__aenter__() for _ in range(2)),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, ApplyLock)]
    lost = [r for r in results if isinstance(r, PolicyError)]
    assert len(won) == 1 and len(lost) == 1, results
    await won[0].__aexit__(None, None, None)
    report = await apply_plan(local_services, plan)
    assert report.ok


async def test_a_stale_lock_is_taken_over_and_unlock_is_audited(
    tmp_path: Path,
    local_services,  # type: ignore[no-untyped-def]
    dcp_run: DcpRun,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = dcp_run.copy_to(tmp_path / "run1")
    plan = await compute_plan(local_services, str(root), POLICY)
    # an apply on another host that stopped refreshing its lock 11 minutes ago
    dead = {
        "holder": "alice",
        "host": "laptop-7",
        "pid": 4242,
        "plan": "ab" * 32,
        "started": time.time() - 3600,
        "refreshed": time.time() - 660,
        "token": "x",
    }
    (root / LOCK_KEY).write_text(json.dumps(dead))
    report = await apply_plan(local_services, plan)
    assert report.ok and not (root / LOCK_KEY).exists()
    # a live lock on another host is respected; `retention unlock` removes it (audited)
    (root / LOCK_KEY).write_text(json.dumps({**dead, "refreshed": time.time()}))
    with pytest.raises(PolicyError, match="already running: alice on laptop-7 "):
        await apply_plan(local_services, plan)
    # the same hostname (another container from one image), a pid that is not running here, and
    # refreshed a second ago: never taken over
    twin = {**dead, "host": socket.gethostname(), "pid": 2**22 + 12345, "refreshed": time.time() - 1}
    (root / LOCK_KEY).write_text(json.dumps(twin))
    with pytest.raises(PolicyError, match="already running"):
        await apply_plan(local_services, plan)
    # this very machine, and its process is gone: still not taken over, but the refusal says so
    gone = {**twin, "machine": machine_identity()}
    (root / LOCK_KEY).write_text(json.dumps(gone))
    with pytest.raises(PolicyError, match="its process is gone from this machine.*retention unlock"):
        await apply_plan(local_services, plan)
    # silent past the stale window: taken over
    (root / LOCK_KEY).write_text(json.dumps({**gone, "refreshed": time.time() - 660}))
    async with ApplyLock(LocalStore(root), "", run=str(root), plan=plan.hash) as lock:
        assert lock.took_over is not None and lock.took_over.pid == gone["pid"]


def test_unlock_from_the_cli(tmp_path: Path, dcp_run: DcpRun, capsys: pytest.CaptureFixture[str]) -> None:
    root = dcp_run.copy_to(tmp_path / "run1")
    (root / LOCK_KEY).write_text(
        json.dumps(
            {
                "holder": "alice",
                "host": "laptop-7",
                "pid": 1,
                "plan": "c" * 64,
                "started": 1.0,
                "refreshed": time.time(),
                "token": "t",
            }
        )
    )
    assert main(["retention", "unlock", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"removed the apply lock on {root} (held by alice on laptop-7 (pid 1, plan cccccccccccc")
    assert not (root / LOCK_KEY).exists()
    assert main(["retention", "unlock", str(root)]) == 0
    assert capsys.readouterr().out == f"{root} has no apply lock\n"


def test_upload_never_overwrites_a_step_without_overwrite(
    tmp_path: Path, dcp_run: DcpRun, capsys: pytest.CaptureFixture[str]
) -> None:
    root = dcp_run.copy_to(tmp_path / "run1")
    local = tmp_path / "nvme" / "step-12000"
    shutil.copytree(root / "step-11000", local)
    before = (root / "step-12000" / ".metadata").read_bytes()
    assert main(["upload", str(local), str(root / "step-12000")]) == 2
    err = capsys.readouterr().err
    assert f"{root}/step-12000 already holds" in err and "pass --overwrite to replace them" in err
    assert (root / "step-12000" / ".metadata").read_bytes() == before
    assert main(["upload", str(local), str(root / "step-12000"), "--overwrite", "--json"]) == 0
    capsys.readouterr()
    assert (root / "step-12000" / ".metadata").read_bytes() == (local / ".metadata").read_bytes()
