"""The plain webhook sink: each change once (firing, then resolved) in Alertmanager's payload,
queued in the state database while the webhook is down, and its URL's token never shown."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.alerts.settings import AlertSettings
from backend.alerts.watch import Watcher
from backend.config import Config, Node, StoreProfile
from backend.policy.egress import EgressSettings
from backend.services import Services
from backend.state import SQLiteState
from tests.am_fixtures import WebhookSink

GB = 10**9
DATASETS = StoreProfile(url="s3://datasets/laion", provider="aws", region="us-east-1", name="datasets")
TOKEN = "T0KEN-s3cret-9f8e7d"


class TokenSink(WebhookSink):
    """A chat-style webhook: its token is in the path."""

    PATH = f"/services/{TOKEN}"


@pytest.fixture
def sink() -> Iterator[TokenSink]:
    s = TokenSink().start()
    try:
        yield s
    finally:
        s.stop()


def closed_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/services/{TOKEN}"


def services(db_path: Path, webhook: str, budget: float) -> Services:
    cfg = Config(
        nodes=(Node(name="gpu-01", host="localhost", transport="local", site="coreweave:us-east-04"),),
        stores={"datasets": DATASETS},
        sections={
            "egress": EgressSettings(budgets={"datasets": budget}, action="warn"),
            "alerts": AlertSettings(webhook_url=webhook, conditions=("EgressBudgetExceeded",)),
        },
    )
    svc = Services(config=cfg)
    svc.__dict__["db"] = SQLiteState(db_path)
    return svc


async def rounds(svc: Services, n: int = 1):  # type: ignore[no-untyped-def]
    w = Watcher(svc)
    try:
        return [await w.round() for _ in range(n)]
    finally:
        await w.close()
        await svc.aclose()


async def test_each_change_once_queued_while_down_and_the_token_never_shown(sink: TokenSink, tmp_path: Path) -> None:
    db = tmp_path / "state.sqlite3"
    first = services(db, closed_url(), budget=50.0)
    first.egress.record_transfer(DATASETS, "coreweave:us-east-04", 1_100 * GB, job_id="j-1", note="")  # $90
    # The webhook is down: the firing change stays queued, the round says so without the token.
    (r,) = await rounds(first)
    assert [c.alertname for c in r.conditions] == ["EgressBudgetExceeded"]
    assert r.delivery is not None and r.delivery.hook_error and r.delivery.queued == 1
    assert r.degraded and "alerting degraded: webhook http://127.0.0.1:" in r.degraded and "/..." in r.degraded
    assert TOKEN not in r.degraded
    # A watcher started later (another process, the webhook back) sends the queued change, once.
    r1, r2 = await rounds(services(db, sink.url, budget=50.0), 2)
    assert r1.delivery is not None and r1.delivery.hook_sent == 1 and r2.delivery is not None
    assert r2.delivery.hook_sent == 0, "no change, nothing sent"
    (note,) = sink.notifications()
    assert note["version"] == "4" and note["status"] == "firing"
    (alert,) = note["alerts"]
    assert alert["labels"] == {
        "alertname": "EgressBudgetExceeded",
        "account": "datasets",
        "scope": "store",
        "severity": "critical",
    }
    assert alert["status"] == "firing" and "$90.00 of $50.00" in alert["annotations"]["summary"]
    # The budget raised: the condition clears, the webhook hears the resolve, once.
    (r,) = await rounds(services(db, sink.url, budget=500.0))
    assert not r.conditions and r.changes is not None and len(r.changes.resolved) == 1
    resolved = sink.notifications()[1]
    assert resolved["status"] == "resolved" and resolved["alerts"][0]["fingerprint"] == alert["fingerprint"]
    assert len(sink.notifications()) == 2 and sink.rejected == 0
