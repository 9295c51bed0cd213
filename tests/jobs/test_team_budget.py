"""The budget holds under concurrency: operators launching many pulls at once against one `block`
budget start no more than it allows, and every started pull is counted once.

PostgreSQL: two operators (two HOMEs, two users, two configs naming one database), 50 concurrent
pulls each. SQLite: one operator, 50 concurrent pulls. Real parts throughout: each operator is a
separate loadmaster process running the pull operation (listing SeaweedFS, probing the sshd node,
reserving, launching the real job); the jobs run s5cmd on the node and settle when they end.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.config import load_config_file
from backend.services import Services
from lab import Lab
from tests.helpers import write_lab_config

pytestmark = pytest.mark.timeout(420)

PULLS = 50
#: $1 a pull: one object of 1,000,000 bytes at a negotiated $1,000/GB, no free tier.
OBJECT = 1_000_000
#: Ten pulls fit ($10 of bytes, plus the GET requests: a fraction of a cent); the eleventh does not.
BUDGET = 10.5
PRICES = f"""
[prices.providers.aws]
internet_tiers = [{{usd_per_gb = 1000.0}}]

[egress]
budgets = {{ lab = {BUDGET} }}
action = "block"
"""

OPERATOR = r"""
import asyncio, json, os, sys, time
from pathlib import Path
from backend.config import load_config_file
from backend.errors import LoadmasterError
from backend.ops import Operations
from backend.ops.pull import PullRequest
from backend.services import Services

cfg, src, tag, n, go = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), Path(sys.argv[5])

async def main() -> None:
    services = Services(load_config_file(Path(cfg)))
    services.db  # open the state (and migrate it) before the start signal
    go.with_name(f"ready-{tag}").touch()
    while not go.exists():
        time.sleep(0.02)

    async def one(i: int) -> list[object]:
        req = PullRequest(src=src, dest=f"pulls/team-{tag}-{i}", nodes="node-01")
        try:
            started = await Operations(services).pulls.start(req)
            return ["started", [r.id for r in started.records]]
        except LoadmasterError as exc:
            return ["refused", str(exc)]

    out = await asyncio.gather(*(one(i) for i in range(n)))
    await services.aclose()
    print(json.dumps(out))

asyncio.run(main())
"""


def _source(lab: Lab, s3) -> str:  # type: ignore[no-untyped-def]
    assert lab.bucket
    prefix = f"team/{os.urandom(3).hex()}"
    s3.client().put_object(Bucket=lab.bucket, Key=f"{prefix}/one.bin", Body=os.urandom(OBJECT))
    return f"s3://{lab.bucket}/{prefix}/"


def _operators(
    lab: Lab, tmp_path: Path, src: str, names: list[str], state_url: str | None
) -> tuple[Path, list[list[list[object]]]]:
    go = tmp_path / "go"
    procs = []
    cfg = tmp_path / "shared.toml"
    for name in names:
        home = tmp_path / name
        home.mkdir()
        cfg = write_lab_config(lab, home / "loadmaster.toml", tmp_path / "state", extra=PRICES, state_url=state_url)
        env = {
            **os.environ,
            "HOME": str(home),
            "USER": name,
            "LOGNAME": name,
            "LOADMASTER_DATA_DIR": str(home / "data"),
            "LOADMASTER_CONFIG_DIR": str(home / "config"),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", OPERATOR, str(cfg), src, name, str(PULLS), str(go)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    # Once every operator has imported loadmaster and opened its state: then all at once.
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready-{name}").exists() for name in names):
        assert time.monotonic() < deadline, [p.poll() for p in procs]
        assert all(p.poll() is None for p in procs), [p.communicate()[1][-3000:] for p in procs if p.poll() is not None]
        time.sleep(0.02)
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return cfg, results


async def _settled(cfg: Path, job_ids: list[str]) -> Services:
    services = Services(load_config_file(cfg))
    deadline = time.monotonic() + 180
    while True:
        await services.jobs.refresh(["node-01"])
        states = {jid: services.jobs.get(jid).state for jid in job_ids}
        if all(s in ("succeeded", "failed", "cancelled", "lost") for s in states.values()):
            break
        assert time.monotonic() < deadline, states
        await asyncio.sleep(0.5)
    assert set(states.values()) == {"succeeded"}, states
    return services


@pytest.mark.parametrize(
    "backend,operators", [("postgresql", ["alice", "bob"]), ("sqlite", ["alice"])], ids=["postgresql", "sqlite"]
)
async def test_concurrent_pulls_never_start_past_a_block_budget(
    request: pytest.FixtureRequest, lab: Lab, s3, tmp_path: Path, backend: str, operators: list[str]
) -> None:  # type: ignore[no-untyped-def]
    url = request.getfixturevalue("pg_url") if backend == "postgresql" else None
    src = _source(lab, s3)
    cfg, results = _operators(lab, tmp_path, src, operators, url)
    started = [jid for res in results for kind, what in res if kind == "started" for jid in what]  # type: ignore[union-attr]
    refused = [what for res in results for kind, what in res if kind == "refused"]
    assert len(started) + len(refused) == PULLS * len(operators)
    # $1 each against $10.50: exactly ten start, whoever launched them.
    assert len(started) == 10, refused[:3]
    assert all("blocks this pull" in str(r) for r in refused), refused[:3]

    services = await _settled(cfg, started)
    try:
        rows = services.db.query("SELECT job_id, state, bytes, usd, who FROM egress_ledger ORDER BY id")
        assert sorted(r["job_id"] for r in rows) == sorted(started)  # nothing else, nothing twice
        assert {r["state"] for r in rows} == {"settled"} and {int(r["bytes"]) for r in rows} == {OBJECT}
        assert sum(float(r["usd"]) for r in rows) == pytest.approx(10.0)
        launches = services.db.audit_entries(action="pull.launch")
        assert sorted(j for e in launches for j in e.detail["jobs"]) == sorted(started)
        if len(operators) > 1:
            # Both operators' launches are in the one audit log, under their own names.
            assert {e.actor.split("@")[0] for e in launches} <= set(operators)
            assert {r["who"].split("@")[0] for r in rows} <= set(operators)
    finally:
        await services.aclose()
