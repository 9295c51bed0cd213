"""Every operation that changes something refuses on read-only services, first and the same way.

The refusal is the operation's, not a front end's: whichever caller asks (CLI, console, a test),
nothing is launched, listed, written or audited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from backend.config import parse_config
from backend.errors import ReadOnlyRefused
from backend.ops import PullRequest, StripRequest, UploadRequest
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


def _operations(services: Services, tmp_path: Path) -> dict[str, Callable[[Any], Awaitable[Any] | Any]]:
    run = str(tmp_path / "runs" / "run-1")
    plan = asyncio.run(compute_plan(services, run, RetentionPolicy()))
    ops = services.ops
    return {
        "pull": lambda: ops.pulls.start(PullRequest("s3://datasets/laion/", "data", "gpu-01")),
        "fan-out pull": lambda: ops.pulls.start(PullRequest("s3://datasets/laion/", "data", "gpu-*")),
        "upload": lambda: ops.checkpoints.upload(UploadRequest(str(tmp_path), f"{run}/step-1")),
        "strip": lambda: ops.checkpoints.strip(StripRequest(f"{run}/step-1")),
        "shard here": lambda: ops.shards.convert_here(ShardRequest(str(tmp_path), str(tmp_path / "out"))),
        "shard on a node": lambda: ops.shards.start_on_node("gpu-01", ShardRequest(str(tmp_path), str(tmp_path / "o"))),
        "cancel": lambda: ops.jobs.cancel("0000-000000-dead"),
        "retention apply": lambda: ops.retention.apply(plan),
        "pin": lambda: ops.retention.pin(run, 100, "keep"),
        "unpin": lambda: ops.retention.unpin(run, 100),
        "milestone": lambda: ops.retention.mark_milestone(run, 100),
        "unmark milestone": lambda: ops.retention.unmark_milestone(run, 100),
        "unlock": lambda: ops.retention.unlock(run),
        "egress override": lambda: ops.egress.quote("datasets", 10**13, node="gpu-01", reason="deadline"),
        # Refused before it reads its arguments (a relay pull's dead node, fetched from the store).
        "relay retry": lambda: ops.pulls.retry_from_store(None, None),  # type: ignore[arg-type]
        "silence": lambda: ops.alerts.silence(SilenceRequest((("node", "gpu-01"),), 3600.0, "maintenance")),
        "expire a silence": lambda: ops.alerts.expire("3f1b1c0e-0000-4000-8000-000000000000"),
    }


def _call(fn: Callable[[], Any]) -> Any:
    out = fn()
    return asyncio.run(out) if asyncio.iscoroutine(out) else out


def test_every_operation_refuses_read_only_the_same_way(services: Services, tmp_path: Path) -> None:
    operations = _operations(services, tmp_path)
    services.readonly = True
    messages = {}
    for name, fn in operations.items():
        with pytest.raises(ReadOnlyRefused) as err:
            _call(fn)
        messages[name] = str(err.value)
    assert all(
        m.startswith("read-only mode: cannot ") and m.endswith(" (drop --readonly)") for m in messages.values()
    ), messages
    assert services.db.audit_entries() == []  # nothing was done, so nothing is on record
    assert services.jobs.records() == []


def test_reads_and_plans_still_work_read_only(services: Services, tmp_path: Path) -> None:
    services.readonly = True
    q = services.ops.egress.quote("datasets", 10**13, node="gpu-01")  # a quote without a reason records nothing
    assert q.decision.action == "confirm" and q.audit_id is None
    assert asyncio.run(
        services.ops.retention.apply(
            asyncio.run(compute_plan(services, str(tmp_path / "runs" / "run-1"), RetentionPolicy())), dry_run=True
        )
    )
