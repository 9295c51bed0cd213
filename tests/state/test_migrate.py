"""``loadmaster state migrate --to URL``: the local SQLite state, written by the real stores (jobs,
events, the egress guard's reservations and settled transfers, pins, milestones, audit, a retention
journal, the budget lock), copied into a real PostgreSQL database row for row, in one transaction;
refusals (a database in use, unreachable, a login refused, a password in the URL, read-only mode)
are one line and write nothing."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from backend.alerts.conditions import Condition
from backend.alerts.store import AlertStore
from backend.config import StoreProfile, load_config_file
from backend.jobs.store import JobStore
from backend.ledger import EgressGuard, Reservation, record_fanout_saving
from backend.policy.retention import PlannedAction
from backend.retention.apply import Journal
from backend.retention.marks import MilestoneStore, PinStore
from backend.services import Services
from backend.state import SQLiteState, StateDB
from backend.state.copy import migrate_state
from backend.state.migrations import ID_TABLES, LATEST, TABLES
from backend.state.postgres import PostgresState
from lab.postgres import PrivateCluster
from tui.cli import main

DEST = "coreweave:us-east-04"
DATASETS = StoreProfile(url="s3://datasets/laion", provider="aws", region="us-east-1", name="datasets")
GB = 10**9


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    """A config file: one local node, the state dir under tmp_path."""
    path = tmp_path / "lm.toml"
    path.write_text(f'[[nodes]]\nname = "here"\ntransport = "local"\n\n[state]\ndir = "{tmp_path / "state"}"\n')
    return path


def local_state(cfg: Path) -> Path:
    return load_config_file(cfg).state_dir() / "state.sqlite3"


def spec(db: StateDB, job_id: str, created: float) -> dict[str, Any]:
    return {
        "id": job_id,
        "node": "here",
        "kind": "pull",
        "label": f"pull {job_id}",
        "params": {"store": "datasets", "src": f"s3://datasets/laion/{job_id}/", "dest": "/data"},
        "created": created,
        "launched_by": "op@host",
        "launched_from": "cli",
        "state_id": db.state_id,
    }


def fill(cfg: Path) -> Services:
    """The local state as the real code writes it (the caller closes ``services.db``)."""
    services = Services(load_config_file(cfg))
    db = services.db
    jobs = JobStore(db)
    guard = EgressGuard(services.config, db)
    for i in range(4):
        job_id = f"pull-{i}"
        jobs.insert(spec(db, job_id, 1_700_000_000.0 + i), f"/home/op/.loadmaster/jobs/{job_id}")
        jobs.event(job_id, "launch", "here")
        guard.reserve(DATASETS, [Reservation(job_id, DEST, (i + 1) * 300 * GB, objects=10)])
    jobs.update("pull-0", state="running", pid=4242, started=1_700_000_010.5)
    jobs.update("pull-1", state="succeeded", result={"bytes": 250 * GB}, finished=1_700_000_100.25)
    guard.record_transfer(DATASETS, DEST, 250 * GB, job_id="pull-1", note="")
    guard.record_transfer(DATASETS, None, 7 * GB, job_id=None, note="a transfer from before jobs")
    pins, marks = PinStore(db), MilestoneStore(db)
    pins.pin("s3://ckpt/run-a", 1000, "eval baseline")
    pins.pin("s3://ckpt/run-a", 2000)
    marks.mark("s3://ckpt/run-a", 1500)
    for i in range(3):
        db.record_audit("retention.apply", f"s3://ckpt/run-a/step-{i}", "ok", detail={"i": i, "unicode": "é✓"})
    journal = Journal(db, "plan-hash-1")
    for step, state in ((1000, "done"), (1100, "started")):
        action = PlannedAction(
            step, f"s3://ckpt/run-a/step-{step}", "delete", "older than 7d", "dcp", "full", 10 * GB, 0, 12, "fp"
        )
        journal.set(action, state, {"objects": 12})
    record_fanout_saving(guard, DATASETS, DEST, 300 * GB, job_id="pull-relay-1", group="g1", note="from node-01")
    alerts = AlertStore(db)
    alerts.sync([Condition("GPUStarved", {"node": "node-02"}, "node-02: GPU starved", "why")], now=1_700_000_200.0)
    alerts.acknowledge("am", alerts.pending("am"), now=1_700_000_201.0)
    return services


def rows(db: StateDB, table: str) -> list[dict[str, Any]]:
    """Every row of ``table`` as a dict, in a backend-independent order."""
    return sorted((dict(r) for r in db.query(f"SELECT * FROM {table}")), key=lambda r: json.dumps(r, default=str))


def cli(capsys: pytest.CaptureFixture[str], cfg: Path, *argv: str) -> tuple[int, str, str]:
    rc = main(["--config", str(cfg), *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tables_in(cluster: PrivateCluster, url: str) -> list[str]:
    """The tables of the database at ``url`` (read as its owner, not through loadmaster)."""
    with cluster.connect(url.rsplit("/", 1)[1]) as conn:
        found = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1"
        ).fetchall()
    return [str(r[0]) for r in found]


@pytest.fixture
def filled(cfg: Path) -> dict[str, list[dict[str, Any]]]:
    """Fill the local state; every table's rows, and the state id under ``"id"``."""
    services = fill(cfg)
    try:
        snapshot = {t: rows(services.db, t) for t in TABLES}
    finally:
        services.db.close()
    assert all(snapshot[t] for t in TABLES), {t: len(v) for t, v in snapshot.items()}
    return snapshot


def test_migrate_copies_every_table_row_for_row_and_says_what_to_set(
    cfg: Path, filled: dict[str, list[dict[str, Any]]], pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = cli(capsys, cfg, "state", "migrate", "--to", pg_url)
    assert rc == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == len(TABLES) + 1
    for table, line in zip(TABLES, lines, strict=False):
        n = len(filled[table])
        verb = "1 replaced" if table == "state_meta" else f"{n} copied"
        assert line.startswith(f"{table}: {n} local row(s), "), line
        assert verb in line and f"; {n} in the target" in line, line
    assert f'set [state] url = "{pg_url}" in {cfg.absolute()} ' in lines[-1]
    target = PostgresState(pg_url)
    try:
        for table in TABLES:
            got = rows(target, table)
            if table == "audit":  # the migrate's own record follows the copied ones (ops.state)
                assert got[-1]["action"] == "state.migrate" and got[-1]["target"] == pg_url
                got = got[:-1]
            assert got == filled[table], table
        source_id = filled["state_meta"][0]["value"]
        assert target.state_id == source_id
        # Jobs launched from the local state carry its id: the shared ledger counts them.
        assert {r["state_id"] for r in rows(target, "jobs")} == {source_id}
        reserved = target.query("SELECT job_id FROM egress_ledger WHERE state = 'reserved' ORDER BY job_id")
        assert [r["job_id"] for r in reserved] == ["pull-0", "pull-2", "pull-3"]
    finally:
        target.close()


def test_identity_sequences_continue_after_the_copied_ids(
    cfg: Path, filled: dict[str, list[dict[str, Any]]], pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(capsys, cfg, "state", "migrate", "--to", pg_url)[0] == 0
    target = PostgresState(pg_url)
    try:
        top = {t: max(r["id"] for r in filled[t]) for t in ID_TABLES}
        # + 2: the migrate's own record took the first id after the copied ones
        assert target.record_audit("state.test", "after-migrate", "ok") == top["audit"] + 2
        JobStore(target).event("pull-0", "after-migrate")
        (event,) = target.query("SELECT id FROM job_events WHERE event = 'after-migrate'")
        assert event["id"] == top["job_events"] + 1
        guard = EgressGuard(load_config_file(cfg), target)
        entry = guard.record_transfer(DATASETS, DEST, GB, job_id="pull-after")
        assert entry.id == top["egress_ledger"] + 1
    finally:
        target.close()


def test_a_second_migrate_is_refused_naming_the_tables(
    cfg: Path, filled: dict[str, list[dict[str, Any]]], pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(capsys, cfg, "state", "migrate", "--to", pg_url)[0] == 0
    target = PostgresState(pg_url)
    before = target.counts(TABLES)
    rc, out, err = cli(capsys, cfg, "state", "migrate", "--to", pg_url)
    assert rc == 1 and out == ""
    line = one_line(err)
    assert line.startswith("loadmaster: error: state database postgresql://loadmaster@127.0.0.1:")
    for table in ("jobs", "job_events", "egress_ledger", "audit", "retention_pins", "retention_milestones"):
        n = len(filled[table]) + (table == "audit")  # and the first migrate's own record
        assert f"{table} ({n})" in line
    assert "state_meta" not in line and "--merge" in line
    assert target.counts(TABLES) == before
    target.close()


def test_dry_run_checks_the_copy_and_writes_nothing(
    cfg: Path, filled: dict[str, list[dict[str, Any]]], pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = cli(capsys, cfg, "state", "migrate", "--to", pg_url, "--dry-run", "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert report["dry_run"] and not report["migrated"]
    assert report["tables"]["audit"] == {
        "source": len(filled["audit"]),
        "copied": len(filled["audit"]),
        "skipped": 0,
        "replaced": 0,
        "target": len(filled["audit"]),
    }
    target = PostgresState(pg_url)
    try:
        counts = target.counts(TABLES)
        assert {t: n for t, n in counts.items() if n} == {"state_meta": 1}
        assert target.state_id != filled["state_meta"][0]["value"]  # its own fresh id, untouched
    finally:
        target.close()
    # The real migrate still goes through after a dry run.
    assert cli(capsys, cfg, "state", "migrate", "--to", pg_url)[0] == 0


def test_many_rows_cross_batches_and_match(cfg: Path, pg_url: str) -> None:
    path = local_state(cfg)
    db = SQLiteState(path)
    n = 12_345
    db.executemany(
        "INSERT INTO audit (ts, actor, action, target, outcome, plan_hash, reason, detail) VALUES (?,?,?,?,?,?,?,?)",
        [
            (1.5 + i, "op@host", "retention.apply", f"s3://b/r/{i}", "ok", None, None, json.dumps({"i": i}))
            for i in range(n)
        ],
    )
    source = rows(db, "audit")
    db.close()
    report = migrate_state(path, pg_url, batch=1000)
    assert {t.table: t.copied for t in report.tables}["audit"] == n
    target = PostgresState(pg_url)
    try:
        assert rows(target, "audit") == source
        assert target.record_audit("state.test", "next", "ok") == n + 1  # ids go on after the copied ones
    finally:
        target.close()


def test_unreachable_target_is_one_line_and_nothing_is_written(
    cfg: Path, filled: dict[str, list[dict[str, Any]]], capsys: pytest.CaptureFixture[str]
) -> None:
    path = local_state(cfg)
    before = path.read_bytes(), path.stat().st_mtime_ns
    url = f"postgresql://loadmaster@127.0.0.1:{free_port()}/loadmaster"
    rc, out, err = cli(capsys, cfg, "state", "migrate", "--to", url)
    assert rc == 1 and out == ""
    line = one_line(err)
    assert line.startswith(f"loadmaster: error: state database {url} is unreachable (")
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


def test_login_refused_is_one_line_and_nothing_is_written(
    cfg: Path,
    filled: dict[str, list[dict[str, Any]]],
    pg_url: str,
    pg_cluster: PrivateCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    empty = tmp_path / "pgpass-empty"
    empty.write_text("")
    os.chmod(empty, 0o600)
    monkeypatch.setenv("PGPASSFILE", str(empty))
    monkeypatch.delenv("PGPASSWORD", raising=False)
    rc, out, err = cli(capsys, cfg, "state", "migrate", "--to", pg_url)
    assert rc == 1 and out == ""
    line = one_line(err)
    assert line.startswith(f"loadmaster: error: state database {pg_url} refused the login of loadmaster: ")
    assert tables_in(pg_cluster, pg_url) == []


def test_a_url_with_a_password_is_refused_and_never_printed(
    cfg: Path, filled: dict[str, list[dict[str, Any]]], pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "s3cr3t-Pw"
    for url in (
        pg_url.replace("loadmaster@", f"loadmaster:{secret}@"),
        f"{pg_url}?password={secret}",
        pg_url.replace("postgresql://", "mysql://").replace("loadmaster@", f"loadmaster:{secret}@"),
    ):
        rc, out, err = cli(capsys, cfg, "state", "migrate", "--to", url)
        assert rc == 2 and out == ""
        line = one_line(err)
        assert line.startswith("loadmaster: error: --to: "), line
        assert secret not in out + err


def test_read_only_mode_refuses(
    cfg: Path,
    filled: dict[str, list[dict[str, Any]]],
    pg_url: str,
    pg_cluster: PrivateCluster,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out, err = cli(capsys, cfg, "--readonly", "state", "migrate", "--to", pg_url)
    assert rc == 2 and out == ""
    assert one_line(err) == "loadmaster: error: read-only mode: cannot migrate the state database (drop --readonly)"
    assert tables_in(pg_cluster, pg_url) == []


def test_no_local_state_is_one_line(cfg: Path, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = cli(capsys, cfg, "state", "migrate", "--to", pg_url)
    assert rc == 0, err
    assert one_line(out) == f"no local state at {local_state(cfg)}: nothing to migrate"
    assert not local_state(cfg).exists()


def test_merge_keeps_the_targets_rows_and_adds_the_local_ones(
    cfg: Path, filled: dict[str, list[dict[str, Any]]], pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The shared database is in use: a job of the same id, a pin on the same step, its own audit.
    target = PostgresState(pg_url)
    own_id = target.state_id
    JobStore(target).insert({**spec(target, "pull-1", 1.0), "label": "the team's pull-1"}, "/elsewhere")
    PinStore(target).pin("s3://ckpt/run-a", 1000, "the team's reason")
    before = target.counts(TABLES)
    target.close()
    rc, out, err = cli(capsys, cfg, "state", "migrate", "--to", pg_url)
    assert rc == 1 and "--merge" in one_line(err)
    rc, out, err = cli(capsys, cfg, "state", "migrate", "--to", pg_url, "--merge", "--json")
    assert rc == 0, err
    report = json.loads(out)
    source_id = filled["state_meta"][0]["value"]
    assert report["state_id"] == own_id and report["source_id"] == source_id
    per = report["tables"]
    assert per["jobs"]["skipped"] == 1 and per["jobs"]["copied"] == len(filled["jobs"]) - 1
    assert per["retention_pins"]["skipped"] == 1
    assert per["audit"]["skipped"] == 0 and per["audit"]["copied"] == len(filled["audit"])
    # pull-1's ledger row is the target's to keep only if it has one; it has none: all copied.
    assert per["egress_ledger"]["copied"] == len(filled["egress_ledger"])
    target = PostgresState(pg_url)
    try:
        after = target.counts(TABLES)
        for table in TABLES:
            t = per[table]
            assert t["source"] == t["copied"] + t["skipped"] + t["replaced"], table
            extra = 1 if table == "state_meta" else 0  # the merge's note
            record = 1 if table == "audit" else 0  # the migrate's own record, written after the copy
            assert after[table] == before[table] + t["copied"] + extra + record == t["target"] + record, table
        assert target.state_id == own_id
        (kept,) = target.query("SELECT label, job_dir FROM jobs WHERE id = 'pull-1'")
        assert dict(kept) == {"label": "the team's pull-1", "job_dir": "/elsewhere"}
        (pin,) = target.query("SELECT reason FROM retention_pins WHERE url = 's3://ckpt/run-a' AND step = 1000")
        assert pin["reason"] == "the team's reason"
        # Every local audit record is there (under new ids), content for content.
        strip = [{k: v for k, v in r.items() if k != "id"} for r in filled["audit"]]
        got = [{k: v for k, v in r.items() if k != "id"} for r in rows(target, "audit")]
        assert all(r in got for r in strip)
        # The local jobs now settle in the target's ledger.
        assert {r["state_id"] for r in target.query("SELECT state_id FROM jobs")} == {own_id}
    finally:
        target.close()
    rc, out, err = cli(capsys, cfg, "state", "migrate", "--to", pg_url, "--merge")
    assert rc == 1 and "already merged" in one_line(err)


def test_check_and_repair_with_a_url(tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "pg.toml"
    cfg.write_text(f'[[nodes]]\nname = "here"\ntransport = "local"\n\n[state]\nurl = "{pg_url}"\n')
    rc, out, err = cli(capsys, cfg, "state", "check")
    assert rc == 0, err
    assert one_line(out) == f"{pg_url}: ok (schema version {LATEST})"
    rc, out, err = cli(capsys, cfg, "state", "repair")
    assert rc == 1 and out == ""
    assert "repair is for the local SQLite file" in one_line(err)
    down = f"postgresql://loadmaster@127.0.0.1:{free_port()}/loadmaster"
    cfg.write_text(f'[[nodes]]\nname = "here"\ntransport = "local"\n\n[state]\nurl = "{down}"\n')
    rc, out, err = cli(capsys, cfg, "state", "check")
    assert rc == 1
    assert one_line(out).startswith(f"state database {down} is unreachable (")


def test_a_row_postgresql_refuses_rolls_everything_back(
    cfg: Path, filled: dict[str, list[dict[str, Any]]], pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # SQLite keeps a NUL in TEXT; PostgreSQL refuses it: the audit table fails after jobs, events
    # and the ledger were written in the same transaction.
    db = SQLiteState(local_state(cfg))
    db.record_audit("retention.apply", "s3://b/odd\x00name", "ok")
    db.close()
    rc, out, err = cli(capsys, cfg, "state", "migrate", "--to", pg_url)
    assert rc == 1 and out == ""
    line = one_line(err)
    assert line.startswith(f"loadmaster: error: copying audit into {pg_url} failed (")
    assert line.endswith("; nothing was written")
    target = PostgresState(pg_url)
    try:
        assert {t: n for t, n in target.counts(TABLES).items() if n} == {"state_meta": 1}
        assert target.state_id != filled["state_meta"][0]["value"]
    finally:
        target.close()
