"""Every operation that changes something refuses on read-only services, first and the same way.

The refusal is the operation's, not a front end's: whichever caller asks (CLI, console, a test),
nothing is launched, listed, written or audited.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

from backend.config import parse_config
from backend.errors import ReadOnlyRefused
from backend.ops import Operations, PullRequest, StripRequest, UploadRequest
from backend.ops.alerts import SilenceRequest
from backend.policy.retention import RetentionPolicy
from backend.retention.apply import compute_plan
from backend.services import Services
from backend.shards.model import ShardRequest


@pytest.fixture
def services(tmp_path: Path) -> Services:
    (tmp_path / "runs" / "run-1").mkdir(parents=True)
    config = parse_config(
        {
            "nodes": [{"name": "gpu-01", "transport": "local", "site": "coreweave:us-east-04"}],
            "stores": {
                "datasets": {"url": "s3://datasets/laion", "provider": "aws", "region": "us-east-1"},
                "runs": {"url": str(tmp_path / "runs")},
            },
            "egress": {"budgets": {"datasets": 1}, "action": "confirm"},
            "state": {"dir": str(tmp_path / "state")},
        },
        file="test.toml",
    )
    s = Services(config=config)
    yield s
    s.db.close()


def _operations(services: Services, tmp_path: Path) -> dict[str, list[Callable[[], Awaitable[Any] | Any]]]:
    """Every operation that refuses in read-only mode, keyed ``family.method`` as it is called
    (``ops.pulls.start``), with each way of calling it the front ends use."""
    run = str(tmp_path / "runs" / "run-1")
    plan = asyncio.run(compute_plan(services, run, RetentionPolicy()))
    ops = Operations(services)
    unread: Any = None  # refused before the argument is read (a plan or record the caller fetched)
    return {
        "pulls.start": [
            lambda: ops.pulls.start(PullRequest("s3://datasets/laion/", "data", "gpu-01")),
            lambda: ops.pulls.start(PullRequest("s3://datasets/laion/", "data", "gpu-*")),  # fan-out
        ],
        # a relay pull's dead node, fetched from the store
        "pulls.retry_from_store": [lambda: ops.pulls.retry_from_store(unread, unread)],
        "checkpoints.upload": [lambda: ops.checkpoints.upload(UploadRequest(str(tmp_path), f"{run}/step-1"))],
        "checkpoints.strip": [lambda: ops.checkpoints.strip(StripRequest(f"{run}/step-1"))],
        "shards.convert_here": [lambda: ops.shards.convert_here(ShardRequest(str(tmp_path), str(tmp_path / "out")))],
        "shards.start_on_node": [
            lambda: ops.shards.start_on_node("gpu-01", ShardRequest(str(tmp_path), str(tmp_path / "o")))
        ],
        "jobs.cancel": [lambda: ops.jobs.cancel("0000-000000-dead")],
        "jobs.cancel_launch": [lambda: ops.jobs.cancel_launch("0000-000000-dead")],
        "retention.apply": [lambda: ops.retention.apply(plan)],
        "retention.pin": [lambda: ops.retention.pin(run, 100, "keep")],
        "retention.unpin": [lambda: ops.retention.unpin(run, 100)],
        "retention.mark_milestone": [lambda: ops.retention.mark_milestone(run, 100)],
        "retention.unmark_milestone": [lambda: ops.retention.unmark_milestone(run, 100)],
        "retention.unlock": [lambda: ops.retention.unlock(run)],
        "egress.quote": [lambda: ops.egress.quote("datasets", 10**13, node="gpu-01", reason="deadline")],
        "alerts.silence": [lambda: ops.alerts.silence(SilenceRequest((("node", "gpu-01"),), 3600.0, "maintenance"))],
        "alerts.expire": [lambda: ops.alerts.expire("3f1b1c0e-0000-4000-8000-000000000000")],
        "slurm.drain": [lambda: ops.slurm.drain(unread)],
        "slurm.resume": [lambda: ops.slurm.resume(unread)],
        "triage.restage": [lambda: ops.triage.restage(unread)],
        "state.repair": [lambda: ops.state.repair(), lambda: ops.state.repair(force=True)],
        "state.migrate": [
            lambda: ops.state.migrate("postgresql://loadmaster@127.0.0.1:1/nowhere"),
            lambda: ops.state.migrate("postgresql://loadmaster@127.0.0.1:1/nowhere", dry_run=True),
        ],
    }


def refusing_operations(services: Services) -> set[str]:
    """Every public method of every operation family (a property of :class:`Operations`) that
    calls ``refuse_if_readonly``: what the table above must cover, found from the code."""
    found = set()
    for family, prop in vars(Operations).items():
        if not isinstance(prop, cached_property):
            continue
        cls = type(getattr(Operations(services), family))
        for name, fn in vars(cls).items():
            if not name.startswith("_") and callable(fn) and "refuse_if_readonly(" in inspect.getsource(fn):
                found.add(f"{family}.{name}")
    return found


def test_the_table_covers_every_operation_that_refuses(services: Services, tmp_path: Path) -> None:
    """A new operation that changes something fails here until it has its read-only case above."""
    found = refusing_operations(services)
    assert {"triage.restage", "state.repair", "state.migrate", "slurm.drain", "jobs.cancel"} <= found
    assert set(_operations(services, tmp_path)) == found


def _call(fn: Callable[[], Any]) -> Any:
    out = fn()
    return asyncio.run(out) if asyncio.iscoroutine(out) else out


def test_every_operation_refuses_read_only_the_same_way(services: Services, tmp_path: Path) -> None:
    operations = _operations(services, tmp_path)
    services.readonly = True
    messages = {}
    for name, calls in operations.items():
        for i, fn in enumerate(calls):
            with pytest.raises(ReadOnlyRefused) as err:
                _call(fn)
            messages[f"{name}#{i}"] = str(err.value)
    assert all(
        m.startswith("read-only mode: cannot ") and m.endswith(" (drop --readonly)") for m in messages.values()
    ), messages
    assert services.db.audit_entries() == []  # nothing was done, so nothing is on record
    assert services.jobs.records() == []
    assert not list((tmp_path / "state").glob("state.sqlite3.damaged-*"))  # no repair moved the file


def test_reads_and_plans_still_work_read_only(services: Services, tmp_path: Path) -> None:
    services.readonly = True
    q = Operations(services).egress.quote("datasets", 10**13, node="gpu-01")  # a quote without a reason records nothing
    assert q.decision.action == "confirm" and q.audit_id is None
    assert asyncio.run(
        Operations(services).retention.apply(
            asyncio.run(compute_plan(services, str(tmp_path / "runs" / "run-1"), RetentionPolicy())), dry_run=True
        )
    )
