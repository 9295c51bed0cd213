"""Each of loadmaster's alert conditions, from the real inputs the watcher reads: job records as the
job store makes them, a fleet from the hub fed sampler blocks, the egress report of a real ledger,
the retention journal the apply writes. Labels are the alert's identity: each is checked."""

from __future__ import annotations

from datetime import UTC, datetime

from backend.alerts.conditions import StallTracker, evaluate
from backend.alerts.settings import CONDITIONS, AlertSettings
from backend.alerts.store import interrupted_applies
from backend.config import Config, Node, StoreProfile
from backend.jobs.records import JobProgress, JobRecord
from backend.ledger import EgressGuard
from backend.policy.egress import EgressSettings
from backend.policy.retention import PlannedAction
from backend.retention.apply import Journal
from backend.state import SQLiteState
from backend.telemetry.hub import TelemetryHub
from backend.telemetry.settings import TelemetrySettings
from backend.telemetry.synthetic import SyntheticPool, synthetic_fleet

NOW = datetime(2026, 11, 20, 12, tzinfo=UTC).timestamp()
S = AlertSettings(stall_after=300.0, held_for=3600.0)
GB = 10**9
DATASETS = StoreProfile(url="s3://datasets/laion", provider="aws", region="us-east-1", name="datasets")


def job(job_id: str, state: str, *, kind: str = "pull", node: str = "gpu-01", **kw: object) -> JobRecord:
    base: dict[str, object] = {
        "created": NOW - 1000,
        "launched_by": "alice@laptop",
        "launched_from": "laptop",
        "params": {"src": "s3://datasets/laion/", "dest": "/scratch/laion"},
    }
    return JobRecord(id=job_id, node=node, kind=kind, state=state, **{**base, **kw})  # type: ignore[arg-type]


def names(conds: list) -> list[tuple[str, dict[str, str]]]:  # type: ignore[type-arg]
    return sorted((c.alertname, dict(c.labels)) for c in conds)


def test_lost_jobs_and_failed_verifications_fire_for_held_for() -> None:
    records = [
        job("lost-1", "lost", finished=NOW - 60, error="the runner died without a result"),
        job(
            "bad-1",
            "failed",
            finished=NOW - 30,
            error="verification failed: 1 of 4 objects wrong (removed): shard-000.bin: size 5 != 7",
        ),
        job("fail-1", "failed", finished=NOW - 30, error="s5cmd exited 1: AccessDenied"),  # not a verification
        job("old-1", "lost", finished=NOW - 7200),  # past held_for
        job("ok-1", "succeeded", finished=NOW - 10),
    ]
    conds = evaluate(S, fleet=None, records=records, stalled={}, egress=None, warn_at=0.8, now=NOW)
    assert names(conds) == [
        ("JobLost", {"node": "gpu-01", "job_id": "lost-1"}),
        ("VerificationFailed", {"node": "gpu-01", "job_id": "bad-1", "store": "s3://datasets"}),
    ]
    bad = next(c for c in conds if c.alertname == "VerificationFailed")
    assert bad.severity == "critical" and bad.ref == "job:bad-1" and bad.since == NOW - 30


def test_a_transfer_stalls_when_its_bytes_stop_not_when_its_progress_lines_stop() -> None:
    tracker = StallTracker()
    run = job("p-1", "running", started=NOW - 1000, progress=JobProgress(t=NOW - 5, bytes_done=10 * GB))
    assert tracker.observe([run], NOW) == {"p-1": 5.0}
    # Progress lines keep coming with the same bytes: the stall grows.
    later = job("p-1", "running", started=NOW - 1000, progress=JobProgress(t=NOW + 400, bytes_done=10 * GB))
    stalled = tracker.observe([later], NOW + 400)
    assert stalled == {"p-1": 405.0}
    conds = evaluate(S, fleet=None, records=[later], stalled=stalled, egress=None, warn_at=0.8, now=NOW + 400)
    assert names(conds) == [("TransferStalled", {"node": "gpu-01", "job_id": "p-1", "store": "s3://datasets"})]
    # Bytes move again: the clock restarts, the condition is gone.
    moved = job("p-1", "running", started=NOW - 1000, progress=JobProgress(t=NOW + 410, bytes_done=11 * GB))
    assert tracker.observe([moved], NOW + 410) == {"p-1": 0.0}
    assert tracker.observe([], NOW + 420) == {} and not tracker.seen, "ended jobs are forgotten"


def test_upload_backlog_names_the_run_s_oldest_upload() -> None:
    ups = [
        job(f"up-{i}", "succeeded" if i < 3 else "running", kind="upload", created=NOW - 3000 + 600 * i,
            started=NOW - 3000 + 600 * i, finished=(NOW - 2900 + 600 * i) if i < 3 else None,
            params={"run": f"s3://ckpt/run-a/step-{1000 * i}", "step": 1000 * i})
        for i in range(4)
    ]  # fmt: skip
    # The running upload started 1,200 s ago; checkpoints come every 600 s.
    conds = evaluate(S, fleet=None, records=ups, stalled={}, egress=None, warn_at=0.8, now=NOW)
    assert names(conds) == [("UploadBacklog", {"node": "gpu-01", "job_id": "up-3", "store": "s3://ckpt"})]


def test_egress_warns_at_warn_at_and_pages_past_the_budget(tmp_path) -> None:  # type: ignore[no-untyped-def]
    db = SQLiteState(tmp_path / "s.sqlite3")
    try:
        cfg = Config(
            nodes=(Node(name="gpu-01", host="localhost", transport="local", site="coreweave:us-east-04"),),
            stores={"datasets": DATASETS},
            sections={"egress": EgressSettings(budgets={"datasets": 100.0}, action="warn")},
        )
        guard = EgressGuard(cfg, db)
        guard.record_transfer(DATASETS, "coreweave:us-east-04", 1_100 * GB, job_id="j-1", note="")
        report = guard.report()  # 1,100 GB: 100 free + 1,000 x $0.09 = $90, 90% of $100
        conds = evaluate(S, fleet=None, records=[], stalled={}, egress=report, warn_at=0.8)
        assert names(conds) == [("EgressBudgetWarning", {"account": "datasets", "scope": "store"})]
        assert "$90.00 of $100.00 (90%)" in conds[0].summary
        guard.record_transfer(DATASETS, "coreweave:us-east-04", 200 * GB, job_id="j-2", note="")
        conds = evaluate(S, fleet=None, records=[], stalled={}, egress=guard.report(), warn_at=0.8)
        assert [(c.alertname, c.severity) for c in conds] == [("EgressBudgetExceeded", "critical")]
    finally:
        db.close()


def test_an_apply_left_half_done_is_interrupted_once_it_stopped_moving(tmp_path) -> None:  # type: ignore[no-untyped-def]
    db = SQLiteState(tmp_path / "s.sqlite3")
    try:
        journal = Journal(db, "f" * 64)
        for step, state in ((1000, "done"), (1100, "started"), (1200, "started")):
            a = PlannedAction(step, f"s3://ckpt/run-a/step-{step}", "delete", "older", "dcp", "full", GB, 0, 3, "fp")
            journal.set(a, state, {})
        (i,) = interrupted_applies(db)
        assert (i.paths, i.store) == (2, "s3://ckpt")
        assert not evaluate(
            S, fleet=None, records=[], stalled={}, egress=None, warn_at=0.8, interrupted=[i], now=i.last_ts + 10
        )
        conds = evaluate(
            S, fleet=None, records=[], stalled={}, egress=None, warn_at=0.8, interrupted=[i], now=i.last_ts + 301
        )
        assert names(conds) == [("RetentionApplyInterrupted", {"store": "s3://ckpt", "plan": "f" * 12})]
    finally:
        db.close()


def test_fleet_conditions_from_the_hub_and_only_the_ones_turned_on() -> None:
    nodes, gens = synthetic_fleet(4, gpus=8, starved=(2,))
    t = [0.0]
    hub = TelemetryHub(
        SyntheticPool(nodes), TelemetrySettings(starved_window=3.0), feed_only=True,
        clock=lambda: t[0], wall_clock=lambda: NOW + t[0],
    )  # fmt: skip
    xid = "@@xidbus\n0, 00000000:18:00.0\n@@xid\n[ 1.0] NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=python3\n@@xid-rc 0"
    for s in range(6):
        t[0] = float(s)
        for g in gens:
            block = g.block(t[0])
            if g.name == nodes[3].name and s >= 4:
                block += "\n" + xid
            if g.name != nodes[2].name:
                hub.ingest(g.name, block, t[0])
        hub.tick(t[0])
    hub.mark_unreachable(nodes[2].name, "connect refused", t[0])
    snap = hub.tick(t[0])
    conds = evaluate(S, fleet=snap, records=[], stalled={}, egress=None, warn_at=0.8, now=NOW + t[0])
    starved, unreachable, gone = nodes[1].name, nodes[2].name, nodes[3].name
    assert names(conds) == [
        ("GPUStarved", {"node": starved}),
        ("GPUXid", {"node": gone, "gpu": "0", "xid": "79"}),
        ("NodeUnreachable", {"node": unreachable}),
    ]
    by = {c.alertname: c for c in conds}
    assert by["GPUXid"].severity == "critical" and "fallen off the bus" in by["GPUXid"].description
    only = AlertSettings(conditions=("NodeUnreachable",))
    assert [c.alertname for c in evaluate(only, fleet=snap, records=[], stalled={}, egress=None, warn_at=0.8)] == [
        "NodeUnreachable"
    ]
    assert set(CONDITIONS) >= {c.alertname for c in conds}


def test_a_restarted_watcher_does_not_resolve_a_stall_it_has_not_watched_long_enough(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from backend.alerts.store import AlertStore
    from backend.alerts.watch import Watcher
    from backend.services import Services

    cfg = Config(
        nodes=(Node(name="gpu-01", host="localhost", transport="local", site="coreweave:us-east-04"),),
        stores={},
        sections={"alerts": S},
    )
    services = Services(config=cfg)
    services.__dict__["db"] = SQLiteState(tmp_path / "s.sqlite3")
    try:
        stalled = job("p-1", "running", started=NOW - 3000, progress=JobProgress(t=NOW - 1000, bytes_done=GB))
        # The first watcher saw the stall and sent it.
        first = StallTracker()
        first.observe([stalled], NOW - 900)
        still = first.observe([stalled], NOW)
        conds = evaluate(S, fleet=None, records=[stalled], stalled=still, egress=None, warn_at=0.8, now=NOW)
        AlertStore(services.db).sync(conds, NOW)
        (row,) = AlertStore(services.db).firing()
        # A new watcher (fresh tracker) sees the job at once: it cannot judge the stall yet.
        w = Watcher(services)
        w.stalls.observe([stalled], NOW + 10)
        assert w._unknown(None, jobs_read=True, state_read=True, now=NOW + 10)(row)
        w.stalls.observe([stalled], NOW + 10 + S.stall_after)
        assert not w._unknown(None, jobs_read=True, state_read=True, now=NOW + 10 + S.stall_after)(row)
        # The job ended: nothing to wait for.
        w.stalls.observe([], NOW + 20)
        assert not w._unknown(None, jobs_read=True, state_read=True, now=NOW + 20)(row)
    finally:
        services.db.close()
