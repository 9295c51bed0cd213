"""The alerts table: one row per condition, start times kept, resolves, per-sink queues (both backends)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.alerts.conditions import Condition
from backend.alerts.store import AlertStore, fingerprint
from backend.state import SQLiteState, StateDB

BOTH = pytest.mark.parametrize("state_url", ["sqlite", "postgresql"], indirect=True)


def cond(name: str, node: str, since: float | None = None) -> Condition:
    return Condition(name, {"node": node}, f"{node}: {name}", "why", "warning", f"node:{node}", since)


@BOTH
def test_a_held_condition_keeps_its_start_and_a_gone_one_resolves(state_db: StateDB) -> None:
    store = AlertStore(state_db)
    ch = store.sync([cond("GPUStarved", "node-02", since=90.0)], now=100.0)
    assert [a.labels["node"] for a in ch.fired] == ["node-02"] and ch.fired[0].starts_at == 90.0
    ch = store.sync([cond("GPUStarved", "node-02"), cond("NodeUnreachable", "node-03")], now=115.0)
    assert [a.alertname for a in ch.fired] == ["NodeUnreachable"] and not ch.resolved
    (starved,) = [a for a in store.firing() if a.alertname == "GPUStarved"]
    assert starved.starts_at == 90.0, "the same condition keeps its first start: Alertmanager sees one alert"
    ch = store.sync([cond("NodeUnreachable", "node-03")], now=130.0)
    assert [(a.alertname, a.state, a.ends_at) for a in ch.resolved] == [("GPUStarved", "resolved", 130.0)]
    # Back again: a new firing row with a new start (a new page, as it should be).
    ch = store.sync([cond("GPUStarved", "node-02"), cond("NodeUnreachable", "node-03")], now=200.0)
    assert [(a.alertname, a.starts_at) for a in ch.fired] == [("GPUStarved", 200.0)]


@BOTH
def test_what_a_round_cannot_judge_stays_firing(state_db: StateDB) -> None:
    store = AlertStore(state_db)
    store.sync([cond("GPUStarved", "node-02")], now=100.0)
    ch = store.sync([], now=110.0, unknown=lambda row: row.labels["node"] == "node-02")
    assert not ch.resolved and [a.alertname for a in store.firing()] == ["GPUStarved"]
    ch = store.sync([], now=120.0, unknown=lambda row: False)
    assert [a.alertname for a in ch.resolved] == ["GPUStarved"]


@BOTH
def test_each_sink_has_its_own_queue_and_a_change_since_the_read_stays_queued(state_db: StateDB) -> None:
    store = AlertStore(state_db)
    store.sync([cond("GPUStarved", "node-02")], now=100.0)
    am = store.pending("am")
    assert [a.state for a in am] == ["firing"] and store.queued() == {"am": 1, "hook": 1}
    store.acknowledge("am", am, now=101.0)
    assert store.queued() == {"am": 0, "hook": 1}
    hook = store.pending("hook")
    store.sync([], now=102.0)  # resolved after the webhook's batch was read, before it was taken
    store.acknowledge("hook", hook, now=103.0)
    assert store.queued() == {"am": 1, "hook": 1}, "the resolve is still owed to both sinks"
    store.acknowledge("am", store.pending("am"))
    store.acknowledge("hook", store.pending("hook"))
    assert store.queued() == {"am": 0, "hook": 0}


@BOTH
def test_two_watchers_on_one_database_make_one_row(state_db: StateDB, tmp_path: Path) -> None:
    a, b = AlertStore(state_db), AlertStore(state_db)
    a.sync([cond("GPUStarved", "node-02", since=50.0)], now=100.0)
    ch = b.sync([cond("GPUStarved", "node-02", since=95.0)], now=101.0)
    assert not ch.fired, "the second watcher sees the first one's alert"
    rows = state_db.query("SELECT COUNT(*) AS n FROM alerts")
    assert rows[0]["n"] == 1 and a.firing()[0].starts_at == 50.0


labels = st.dictionaries(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8),
    st.text(max_size=12),
    max_size=5,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(one=labels, other=labels)
def test_fingerprints_are_the_label_sets(one: dict[str, str], other: dict[str, str]) -> None:
    assert fingerprint(one) == fingerprint(dict(reversed(list(one.items()))))
    assert (fingerprint(one) == fingerprint(other)) == (one == other)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=st.lists(st.sets(st.sampled_from(["node-01", "node-02", "node-03"])), min_size=1, max_size=8))
def test_any_sequence_of_rounds_leaves_exactly_the_last_round_firing(
    rounds: list[set[str]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    db = SQLiteState(tmp_path_factory.mktemp("alerts") / "s.sqlite3")
    try:
        store = AlertStore(db)
        starts: dict[str, float] = {}
        for i, nodes in enumerate(rounds):
            store.sync([cond("GPUStarved", n) for n in sorted(nodes)], now=float(i))
            for n in list(starts):
                if n not in nodes:
                    del starts[n]
            for n in nodes:
                starts.setdefault(n, float(i))
        firing = {a.labels["node"]: a.starts_at for a in store.firing()}
        assert firing == starts
    finally:
        db.close()
