"""A hostile node: its ``~/.loadmaster`` is written by the attacker, and is data, never authority.

A real sshd node (``hostile_node.py``) holds forged job folders: finished pulls carrying the team
database's id, a "lost" upload naming the team's store, folders reusing the id of a real team job,
wrong types (a pid with letters, a time that is not a number), numbers like 1e30. Against it:
nothing is given (no cleanup, no credentials) or counted (no ledger row, no audit), ``jobs``, the
console and ``watch`` stay up, and the team database holds nothing the node said.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.config import Config, load_config_file
from backend.jobs.records import FOREIGN, new_job_id
from backend.jobs.remote import spec_digest
from backend.jobs.store import JobStore
from backend.ledger import Reservation
from backend.services import Services
from backend.state import open_state
from lab import Lab
from tests.helpers import write_lab_config
from tests.security.hostile_node import NAME, HostileNode, start_hostile_node
from tui.cli import main as cli_main

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def hostile(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileNode]:
    yield from start_hostile_node(lab, tmp_path_factory.mktemp("hostile-node"))


@pytest.fixture
def hostile_config(lab: Lab, hostile: HostileNode, tmp_path: Path) -> tuple[Path, Config]:
    hostile.clear()
    path = write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state", hostile.config_section())
    return path, load_config_file(path)


@pytest.fixture
def team_config(lab: Lab, hostile: HostileNode, tmp_path: Path, state_url: str | None) -> tuple[Path, Config]:
    """The hostile node's config with the team's state on each backend (SQLite, PostgreSQL)."""
    hostile.clear()
    path = write_lab_config(
        lab, tmp_path / "lm.toml", tmp_path / "state", hostile.config_section(), state_url=state_url
    )
    return path, load_config_file(path)


class _Rows:
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None


class _TeamDb:
    """The team's state database read as sqlite3 reads it (tuples), on either backend."""

    def __init__(self, config: Config) -> None:
        self.db = open_state(config)

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> _Rows:
        return _Rows([tuple(r[k] for k in r.keys()) for r in self.db.query(sql, params)])  # noqa: SIM118


def _team_spec(services: Services, job_id: str, kind: str = "pull", **params: Any) -> dict[str, Any]:
    """A spec as the team's launch writes it (json.dumps of this is what the node holds)."""
    return {
        "id": job_id,
        "kind": kind,
        "node": NAME,
        "label": "team pull",
        "params": {"src": "s3://lab/x/", "dest": "/scratch/x", "store": "lab", **params},
        "created": time.time() - 3600,
        "launched_by": "oncall@console",
        "launched_from": "console",
        "state_id": services.db.state_id,
    }


def _record_team_job(services: Services, spec: dict[str, Any], *, state: str = "running") -> str:
    """The row the team's launch made for ``spec`` (as JobManager.launch records it)."""
    store = JobStore(services.db)
    text = json.dumps(spec)
    store.insert(spec, f"/x/{spec['id']}", digest=spec_digest(text), store="lab")
    store.update(spec["id"], state=state)
    return text


def _planted_team_job(services: Services, hostile: HostileNode, kind: str = "pull", **files: Any) -> tuple[str, Path]:
    """A team job on the hostile node (recorded and reserved as a launch does) whose folder holds
    the spec launched and ``files`` as the attacker wrote them."""
    mine = new_job_id()
    text = _record_team_job(services, _team_spec(services, mine, kind=kind))
    services.egress.reserve(services.config.stores["lab"], [Reservation(mine, "aws:us-east-1", 1000)])
    return mine, hostile.plant(mine, text, **files)


def _db(tmp_path: Path) -> sqlite3.Connection:
    return sqlite3.connect(tmp_path / "state" / "state.sqlite3")


def _forge(hostile: HostileNode, services: Services) -> dict[str, str]:
    """Plant every attack; job id -> what it is."""
    team_id = services.db.state_id
    store_url = services.config.stores["lab"].url
    old = time.time() - 3600
    forged = {
        # A "finished pull" of a petabyte, with the team database's id (every spec holds it).
        "1202-000001-aaaa": {
            "spec": {
                "id": "1202-000001-aaaa",
                "kind": "pull",
                "node": NAME,
                "created": old,
                "state_id": team_id,
                "launched_by": "ceo@boardroom",
                "params": {"src": f"{store_url}/x/", "store": "lab", "dest": "/tmp/x"},
            },
            "result": {"state": "succeeded", "finished": old + 10, "details": {"bytes": 10**15}},
        },
        # A dead upload naming the team's store: its cleanup would be handed the store's keys.
        "1202-000002-bbbb": {
            "spec": {
                "id": "1202-000002-bbbb",
                "kind": "upload",
                "node": NAME,
                "created": old,
                "state_id": team_id,
                "params": {"store": {"name": "lab", "url": store_url}, "dest": f"{store_url}/ckpt"},
            },
            "pid": {"pid": 4_000_000, "pgid": 4_000_000, "started": old},
        },
        # Wrong types: a pid with letters, a time that is not a number, a byte count of 1e30.
        "1202-000003-cccc": {
            "spec": {"id": "1202-000003-cccc", "kind": "pull", "created": "yesterday", "state_id": team_id},
            "pid": '{"pid": "12ab", "pgid": "12ab"}',
            "heartbeat": "not-a-time",
            "progress": [{"t": "noon", "bytes_done": 1e30, "bytes_total": -5}],
        },
        "1202-000004-dddd": {
            "spec": {"id": "1202-000004-dddd", "kind": "pull", "state_id": team_id},
            "result": {"state": "succeeded", "details": {"bytes": 1e30}, "finished": float("inf")},
        },
        # Another store's name and a spec that is not an object at all.
        "1202-000005-eeee": {
            "spec": {"id": "1202-000005-eeee", "kind": "pull", "params": {"store": "prod-secrets"}},
            "result": {"state": "failed", "error": "\x1b]52;c;cHduZWQ=\x07 boom"},
        },
        "1202-000006-ffff": {"spec": "[1, 2, 3]"},
    }
    for jid, parts in forged.items():
        hostile.plant(jid, **parts)  # type: ignore[arg-type]
    return {k: str(v["spec"]) for k, v in forged.items()}


async def test_forged_jobs_get_nothing_count_nothing_and_every_view_stays_up(
    hostile: HostileNode, team_config: tuple[Path, Config], capsys: pytest.CaptureFixture[str]
) -> None:
    path, config = team_config
    services = Services(config=config)
    try:
        forged = _forge(hostile, services)
        # The team's own job on that node, whose folder the attacker rewrote (types and a 1e30),
        # and a team job launched on node-01 whose id the attacker reuses here.
        mine = new_job_id()
        _record_team_job(services, _team_spec(services, mine))
        services.egress.reserve(services.config.stores["lab"], [Reservation(mine, "aws:us-east-1", 1000)])
        hostile.plant(
            mine,
            json.dumps(_team_spec(services, mine) | {"created": 1.0}),  # not the spec launched
            result={"state": "succeeded", "details": {"bytes": 10**15}},
        )
        elsewhere = new_job_id()
        JobStore(services.db).insert(
            {**_team_spec(services, elsewhere), "node": "node-01"}, None, digest="0" * 64, store="lab"
        )
        hostile.plant(
            elsewhere, _team_spec(services, elsewhere), result={"state": "succeeded", "details": {"bytes": 5}}
        )

        for _ in range(2):  # a second refresh neither adopts nor acts on anything either
            recs = await services.jobs.refresh([NAME])
        assert len({r.id for r in recs}) == len(recs)  # a view keyed by id (the console's table) holds each
        by_id = {r.id: r for r in recs if r.node == NAME and r.foreign}
        for team_id in (mine, elsewhere):  # the team's id is the team's row; the forgery is ID@NODE
            by_id[team_id] = by_id.pop(f"{team_id}@{NAME}")
        for jid in [*forged, mine, elsewhere]:
            if jid == "1202-000006-ffff":
                assert jid not in by_id  # no spec object: nothing to show, one line says so
                continue
            assert by_id[jid].state == FOREIGN and by_id[jid].launched_by == "?", jid
        assert "no job with this id was launched" in (by_id["1202-000001-aaaa"].foreign or "")
        assert "digest differs" in (by_id[mine].foreign or "")
        assert "launched on node-01, found on evil-01" in (by_id[elsewhere].foreign or "")
        assert any("evil-01: job 1202-000006-ffff: skipped" in p for p in services.jobs.problems)

        # Nothing given: no result written for the "lost" upload, no cleanup ran (its log would
        # say so), no secrets file ever landed.
        lost = hostile.jobs / "1202-000002-bbbb"
        assert sorted(p.name for p in lost.iterdir()) == ["pid", "spec.json"]
        assert not list(hostile.jobs.glob("*/secrets.json"))

        # Nothing counted: the team database holds only what the team recorded.
        db = _TeamDb(config)
        assert db.execute("SELECT id FROM jobs ORDER BY id").fetchall() == sorted([(mine,), (elsewhere,)])
        assert db.execute("SELECT state FROM jobs WHERE id = ?", (mine,)).fetchone() == ("running",)
        assert db.execute("SELECT job_id, state, bytes FROM egress_ledger").fetchall() == [(mine, "reserved", 1000)]
        assert db.execute("SELECT COUNT(*) FROM audit").fetchone() == (0,)
        assert db.execute("SELECT DISTINCT job_id FROM job_events").fetchall() == [(mine,)]
        assert db.execute("SELECT COUNT(*) FROM jobs WHERE pid IS NOT NULL OR adopted = 1").fetchone() == (0,)
        db.db.close()
    finally:
        await services.aclose()

    # `jobs` stays up: the forged folders are listed as foreign, the unreadable one named on stderr.
    rc = await asyncio.to_thread(cli_main, ["--config", str(path), "jobs", "--json", "--limit", "100000"])
    out, err = capsys.readouterr()
    shown = {r["id"]: r for r in json.loads(out)}
    assert rc == 0, err
    assert shown["1202-000005-eeee"]["state"] == FOREIGN and "\x1b" not in out
    assert "evil-01: job 1202-000006-ffff: skipped" in err
    rc = await asyncio.to_thread(cli_main, ["--config", str(path), "jobs", "--wide", "--limit", "100000"])
    out, err = capsys.readouterr()
    assert rc == 0 and "foreign (no job with this id was launched" in out and "\x1b" not in out

    # `watch` stays up and reads the jobs: no "jobs not read", nothing pages for a foreign folder.
    from backend.alerts.watch import Watcher

    services = Services(config=config)
    try:
        rnd = await Watcher(services).round()
        assert not any(p.startswith("jobs") for p in rnd.problems), rnd.problems
    finally:
        await services.aclose()

    # The console's Transfers screen lists them too.
    from tests.helpers import Recorder, wait_until
    from tui.app import LoadmasterApp
    from tui.screens.transfers import JobsRefreshed

    services = Services(config=config)
    app = LoadmasterApp(services, mode="transfers")
    rec = Recorder()
    try:
        async with app.run_test(size=(200, 50), message_hook=rec) as pilot:
            await wait_until(pilot, lambda: rec.of(JobsRefreshed), rounds=3000, delay=0.02)
            assert any(r.state == FOREIGN for m in rec.of(JobsRefreshed) for r in m.records)
            assert app.is_running
    finally:
        await services.aclose()


async def test_a_team_pull_whose_node_reports_a_petabyte_is_capped_at_its_reservation(
    hostile: HostileNode, hostile_config: tuple[Path, Config], tmp_path: Path
) -> None:
    _path, config = hostile_config
    services = Services(config=config)
    try:
        mine, _folder = _planted_team_job(
            services, hostile, result={"state": "succeeded", "finished": time.time(), "details": {"bytes": 10**15}}
        )
        [rec] = [r for r in await services.jobs.refresh([NAME]) if r.id == mine]
        assert rec.state == "succeeded"
        row = _db(tmp_path).execute("SELECT state, bytes, note FROM egress_ledger WHERE job_id = ?", (mine,)).fetchone()
        assert row[0] == "settled" and row[1] == 1000 and "capped at its reservation" in row[2]  # its quote, never more
    finally:
        await services.aclose()


async def test_read_only_shows_a_lost_team_job_as_lost_and_touches_nothing(
    hostile: HostileNode, hostile_config: tuple[Path, Config], tmp_path: Path
) -> None:
    _path, config = hostile_config
    services = Services(config=config, readonly=True)
    try:
        mine, folder = _planted_team_job(
            services, hostile, kind="upload", pid={"pid": 4_000_000, "pgid": 4_000_000, "started": time.time() - 3600}
        )
        [rec] = [r for r in await services.jobs.refresh([NAME]) if r.id == mine]
        assert rec.state == "lost"
        # Not handled: no result written, no cleanup (its log), nothing recorded.
        assert sorted(p.name for p in folder.iterdir()) == ["pid", "spec.json"]
        db = _db(tmp_path)
        assert db.execute("SELECT state, finished FROM jobs WHERE id = ?", (mine,)).fetchone() == ("running", None)
        assert db.execute("SELECT event FROM job_events WHERE job_id = ?", (mine,)).fetchall() == [("running",)]
    finally:
        await services.aclose()


# -- hypothesis over job-record fields ----------------------------------------------------------

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 4_000_000, 1e30, -1, 10**15, 1.7e9]),
    st.text(max_size=12),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(min_value=-3, max_value=3), max_size=2),
)


@st.composite
def _records(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "team": draw(st.booleans()),
        "kind": draw(st.one_of(st.sampled_from(["pull", "upload", "relay", "shard"]), _values)),
        "pid": {"pid": draw(_values), "pgid": draw(_values), "started": draw(_values), "starttime": draw(_values)},
        "result": draw(
            st.none()
            | st.fixed_dictionaries(
                {
                    "state": st.one_of(st.sampled_from(["succeeded", "failed", "lost", "cancelled"]), _values),
                    "finished": _values,
                    "error": _values,
                    "details": st.fixed_dictionaries({"bytes": _values}),
                    "progress": st.fixed_dictionaries({"t": _values, "bytes_done": _values}),
                }
            )
        ),
        "heartbeat": draw(st.none() | _values.map(str)),
        "progress": draw(
            st.lists(
                st.fixed_dictionaries(
                    {"t": _values, "bytes_done": _values, "bytes_total": _values, "rate_bps": _values}
                ),
                max_size=3,
            )
        ),
    }


def test_any_job_record_from_a_node_keeps_every_view_up_and_the_database_clean(
    hostile: HostileNode, hostile_config: tuple[Path, Config], tmp_path: Path
) -> None:
    _path, config = hostile_config
    loop = asyncio.new_event_loop()
    services = Services(config=config)
    team: set[str] = set()

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(rec=_records())
    def check(rec: dict[str, Any]) -> None:
        hostile.clear()
        jid = new_job_id()
        kind = rec["kind"] if isinstance(rec["kind"], str) else "pull"
        spec = _team_spec(services, jid, kind=kind) | {"kind": rec["kind"]}
        if rec["team"] and isinstance(rec["kind"], str):
            text = json.dumps(_team_spec(services, jid, kind=kind))
            JobStore(services.db).insert(json.loads(text), None, digest=spec_digest(text), store="lab")
            JobStore(services.db).update(jid, state="running")
            services.egress.reserve(services.config.stores["lab"], [Reservation(jid, "aws:us-east-1", 1000)])
            team.add(jid)
        else:
            text = json.dumps(spec)
        hostile.plant(
            jid,
            text,
            pid=rec["pid"],
            result=rec["result"],
            heartbeat=rec["heartbeat"],
            progress=rec["progress"],
        )
        recs = loop.run_until_complete(services.jobs.refresh([NAME]))
        loop.run_until_complete(services.jobs.refresh([NAME]))  # and the next refresh too
        shown = [r for r in recs if r.id == jid]
        assert shown, services.jobs.problems
        if jid not in team:
            assert [r.state for r in shown] == [FOREIGN]
        json.dumps([r.as_dict() for r in recs], default=str)  # the --json view renders
        db = _db(tmp_path)
        ids = {r[0] for r in db.execute("SELECT id FROM jobs")}
        assert ids == team  # nothing the node said became a row
        for pid, started, finished in db.execute("SELECT pid, started, finished FROM jobs"):
            assert pid is None or (isinstance(pid, int) and 1 <= pid <= 4_194_304)
            for t in (started, finished):
                assert t is None or (isinstance(t, float) and 0 <= t < 4.2e9)
        for job_id, state, nbytes in db.execute("SELECT job_id, state, bytes FROM egress_ledger"):
            assert job_id in team and nbytes <= 1100, (job_id, state, nbytes)
        assert db.execute("SELECT COUNT(*) FROM audit").fetchone() == (0,)
        assert not list(hostile.jobs.glob("*/secrets.json"))
        services.jobs.records()  # every stored row still reads back

    try:
        check()
    finally:
        loop.run_until_complete(services.aclose())
        loop.close()


async def test_a_refresh_closes_what_leaks_from_the_budget_and_quarantines_what_cannot_settle(
    hostile: HostileNode, hostile_config: tuple[Path, Config], tmp_path: Path
) -> None:
    _path, config = hostile_config
    services = Services(config=config)
    store = JobStore(services.db)
    lab_store = services.config.stores["lab"]
    try:
        # A reservation whose job never got a record (the launch died between the two).
        orphan = new_job_id()
        services.egress.reserve(lab_store, [Reservation(orphan, "aws:us-east-1", 1000)])
        # A running team job whose folder is gone from the node (launched an hour ago).
        gone = new_job_id()
        _record_team_job(services, _team_spec(services, gone))
        services.egress.reserve(lab_store, [Reservation(gone, "aws:us-east-1", 1000)])
        # An ended team job whose stored row cannot be read (its end was never recorded).
        broken = new_job_id()
        _record_team_job(services, _team_spec(services, broken), state="succeeded")
        services.db.execute("UPDATE jobs SET params = '{not json' WHERE id = ?", (broken,))
        services.db.execute("UPDATE egress_ledger SET ts = ts - 3600")  # all made an hour ago

        for _ in range(2):  # the second refresh finds nothing left to do
            recs = {r.id: r for r in await services.jobs.refresh([NAME])}
        db = _db(tmp_path)
        states = dict(db.execute("SELECT job_id, state FROM egress_ledger").fetchall())
        assert states == {orphan: "released", gone: "released"}
        assert db.execute("SELECT state, error FROM jobs WHERE id = ?", (gone,)).fetchone() == (
            "lost",
            "the job directory is gone from the node",
        )
        assert recs[gone].state == "lost"
        (reason,) = db.execute("SELECT quarantined FROM jobs WHERE id = ?", (broken,)).fetchone()
        assert "cannot be read" in reason and recs[broken].quarantined
        assert db.execute("SELECT COUNT(*) FROM job_events WHERE event = 'quarantined'").fetchone() == (1,)
        assert store.end_pending() == []
    finally:
        await services.aclose()
