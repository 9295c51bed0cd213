"""PostgreSQL faults, against the real server: unreachable, a connection killed inside a
transaction, the server restarted while a pull runs. Nothing launches unguarded, nothing is
recorded half or twice, nothing is lost.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import pytest

from backend.config import load_config_file
from backend.ops import Operations
from backend.services import Services
from backend.state import StateDB, StateUnavailable, postgres
from backend.state.postgres import PostgresState
from lab import Lab, PrivateCluster
from tests.helpers import write_lab_config
from tests.jobs.conftest import SourceData
from tui.cli import main as cli_main

pytestmark = pytest.mark.timeout(300)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_database_refuses_every_guarded_action_in_one_line(
    lab: Lab, source: SourceData, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"postgresql://loadmaster@127.0.0.1:{_closed_port()}/loadmaster"
    cfg = str(write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state", state_url=url))
    # Monitoring goes on: the fleet is read from the nodes.
    # (rc 4 would be nodes not read in time on a loaded machine: about the nodes, not the state.)
    assert cli_main(["--config", cfg, "top", "--json", "--count", "1", "--nodes", "node-01"]) in (0, 4)
    out, err = capsys.readouterr()
    assert json.loads(out.splitlines()[0])["nodes"] and "state database" not in err
    # Every action that must be recorded is refused, with the database named, and nothing starts.
    for argv in (
        ["pull", source.url, "pulls/unguarded", "--node", "node-01", "--yes"],
        ["retention", "pin", str(tmp_path / "run"), "1000:keep"],
        ["audit"],
    ):
        rc = cli_main(["--config", cfg, *argv])
        err = capsys.readouterr().err.strip()
        assert rc != 0 and "Traceback" not in err, err
        assert len(err.splitlines()) == 1 and f"127.0.0.1:{url.split(':')[2].split('/')[0]}" in err, err
        assert "unreachable" in err
    assert not (lab.node("node-01").scratch / "pulls/unguarded").exists()


def test_a_connection_killed_inside_a_transaction_is_retried_whole(pg_cluster: PrivateCluster, pg_url: str) -> None:
    db = PostgresState(pg_url)
    attempts: list[int] = []

    def kill_my_session() -> None:
        with pg_cluster.connect() as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (pg_url.rsplit("/", 1)[1],),
            )

    def body(tx: StateDB) -> int:
        attempts.append(1)
        tx.record_audit("test.first", "t", "ok")
        if len(attempts) == 1:
            kill_my_session()  # the connection dies between the two statements
        tx.record_audit("test.second", "t", "ok")
        return len(attempts)

    assert db.transact(body) == 2
    assert sorted(e.action for e in db.audit_entries()) == ["test.first", "test.second"]  # once each

    def always_killed(tx: StateDB) -> None:
        tx.record_audit("test.never", "t", "ok")
        kill_my_session()
        tx.record_audit("test.never", "t", "ok")

    with pytest.raises(StateUnavailable, match="nothing was recorded"):
        db.transact(always_killed)
    assert not db.audit_entries(action="test.never")  # no attempt left half a record
    db.close()


async def test_postgresql_restarted_while_a_pull_runs_loses_nothing(
    lab: Lab,
    source: SourceData,
    pg_cluster: PrivateCluster,
    pg_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A failed connection stands RECONNECT_AFTER_S (3 s) before the next try, to keep a console
    # responsive; the test waits for the reconnect itself, not for that pause.
    monkeypatch.setattr(postgres, "RECONNECT_AFTER_S", 0.2)
    cfg = write_lab_config(
        lab,
        tmp_path / "lm.toml",
        tmp_path / "state",
        "\n[prices.providers.aws]\ninternet_tiers = [{usd_per_gb = 100.0}]\n",
        state_url=pg_url,
    )
    services = Services(load_config_file(cfg))
    from backend.ops.pull import PullRequest

    try:
        started = await Operations(services).pulls.start(
            PullRequest(src=source.url, dest="pulls/restart", nodes="node-01")
        )
        (job,) = started.records
        assert services.egress.ledger.for_job(job.id).state == "reserved"  # type: ignore[union-attr]
        pg_cluster.stop()
        try:
            # The pull finishes on the node while the database is down: the console keeps reading
            # the node and says why it cannot record; the end is not lost.
            deadline = time.monotonic() + 120
            while True:
                seen = {r.id: r for r in await services.jobs.refresh(["node-01"])}
                assert "not recorded" in (seen[job.id].note or "") and "unreachable" in (seen[job.id].note or "")
                assert not seen[job.id].recorded
                if seen[job.id].state == "succeeded":
                    break
                assert time.monotonic() < deadline, seen[job.id]
                await asyncio.sleep(0.5)
            assert seen[job.id].result and seen[job.id].result["bytes"] == source.total
            # A guarded action meanwhile is refused, and says why.
            with pytest.raises(StateUnavailable, match="unreachable"):
                await Operations(services).pulls.start(
                    PullRequest(src=source.url, dest="pulls/restart2", nodes="node-01")
                )
        finally:
            pg_cluster.start()
        # the handle tries again once its back-off (shortened above) has passed: wait for that
        deadline = time.monotonic() + 60
        while services.db.available() is not None:
            assert time.monotonic() < deadline, services.db.available()
            await asyncio.sleep(0.1)
        deadline = time.monotonic() + 60
        while services.jobs.get(job.id).state != "succeeded":
            await services.jobs.refresh(["node-01"])
            assert time.monotonic() < deadline
            await asyncio.sleep(0.3)
        entry = services.egress.ledger.for_job(job.id)
        assert entry is not None and entry.state == "settled" and entry.bytes == source.total
        assert len(services.egress.ledger.entries(entry.month)) == 1
    finally:
        await services.aclose()
