"""Deterministic services for the console's SVG snapshots and the walkthrough screenshots.

No live sampling and no clock: the fleet is a feed-only TelemetryHub fed synthetic sampler blocks
(the same door real samples use, ``hub.ingest``) at fixed hub times, ``time.time`` and the egress
ledger's "now" are frozen, the config names no temporary path, and nothing here connects to a
node or a store. Used by tests/tui/test_snapshots.py and scripts/screenshots.py.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from backend.config import Config, Node, StateSettings, StoreProfile
from backend.services import Services
from backend.telemetry.hub import TelemetryHub
from backend.telemetry.settings import TelemetrySettings
from backend.telemetry.synthetic import SyntheticNode, SyntheticPool

#: The instant every snapshot is taken at: 03:12 UTC on 17 Nov 2026 (the page went off at 03:04).
FROZEN_NOW = datetime(2026, 11, 17, 3, 12, 0, tzinfo=UTC).timestamp()

#: The fleet of the snapshots: four 8-GPU nodes, gpu-a02 starved, gpu-b01 in AWS. Their SSH
#: address is a closed port on this machine: screens that reach nodes show them as not answering
#: at once (an unroutable address costs a retried handshake per node, seconds per test).
NODES = tuple(
    replace(n, host="127.0.0.1", port=1)
    for n in (
        Node(name="gpu-a01", host="10.0.0.11", site="coreweave:us-east-04", scratch="/mnt/local-nvme"),
        Node(name="gpu-a02", host="10.0.0.12", site="coreweave:us-east-04", scratch="/mnt/local-nvme"),
        Node(name="gpu-a03", host="10.0.0.13", site="coreweave:us-east-04", scratch="/mnt/local-nvme"),
        Node(name="gpu-b01", host="10.0.1.21", site="aws:us-east-1", scratch="/mnt/local-nvme"),
    )
)
STARVED = "gpu-a02"

#: Stores the screens offer (never contacted by the snapshots: nothing is listed or pulled).
STORES = {
    "datasets": StoreProfile(url="s3://ml-datasets/laion-mini", provider="aws", region="us-east-1", name="datasets"),
    "ckpt": StoreProfile(url="s3://ml-checkpoints/llama-70b", provider="aws", region="us-east-1", name="ckpt"),
}

#: Synthetic seconds of samples fed before a snapshot (the starvation window is 60 s).
FEED_SECONDS = 90


def snapshot_config(state_dir: Path | None = None) -> Config:
    """The fixed inventory every snapshot uses (``state_dir``: a state database of its own)."""
    config = Config(nodes=NODES, stores=STORES, source="/etc/loadmaster/loadmaster.toml")
    return replace(config, state=StateSettings(dir=str(state_dir))) if state_dir is not None else config


def feed_fleet(hub: TelemetryHub, seconds: int = FEED_SECONDS) -> None:
    """Feed ``seconds`` of synthetic samples (1 per second) for every node, then publish a tick."""
    gens = [
        SyntheticNode(
            n.name,
            seed=i,
            pattern="starved" if n.name == STARVED else "training",
            rx_fraction=0.03 if n.name == STARVED else 0.2,
        )
        for i, n in enumerate(NODES, start=1)
    ]
    for t in range(seconds + 1):
        for g in gens:
            hub.ingest(g.name, g.block(float(t)), float(t))
        hub.tick(float(t))


def snapshot_services(*, readonly: bool = False, fed: bool = True, state_dir: Path | None = None) -> Services:
    """Services over the fixed config with a feed-only telemetry hub (optionally already fed)."""
    services = Services(config=snapshot_config(state_dir), readonly=readonly)
    # Each call gets a hub of its own: a copy of the one fed once per process (the same 90 s of
    # samples every time, ~0.2 s of CPU to feed, ~6 ms to copy), or a new empty one.
    hub = copy.deepcopy(_fed_hub()) if fed else _new_hub()
    services.__dict__["telemetry"] = hub  # the composition root's cached service
    return services


def _new_hub() -> TelemetryHub:
    # Hub times are synthetic seconds; the wall clock (alerts' "since") is frozen with them.
    return TelemetryHub(
        SyntheticPool(NODES),  # type: ignore[arg-type]
        TelemetrySettings(),
        clock=lambda: float(FEED_SECONDS),
        wall_clock=lambda: FROZEN_NOW,
        feed_only=True,
    )


@functools.cache
def _fed_hub() -> TelemetryHub:
    """The hub fed FEED_SECONDS of samples, built once; only ever handed out as a copy."""
    hub = _new_hub()
    feed_fleet(hub)
    return hub


def record_egress_month(services: Services) -> None:
    """A few finished pulls this month, so the Egress screen has month-to-date spend to show."""
    guard = services.egress
    day = 24 * 3600
    for days_ago, store, site, gb in (
        (12, "datasets", "coreweave:us-east-04", 4200),
        (6, "ckpt", "coreweave:us-east-04", 1960),
        (2, "datasets", "aws:us-east-1", 3100),
        (1, "ckpt", "coreweave:us-east-04", 980),
    ):
        guard.record_transfer(
            STORES[store], site, gb * 10**9, job_id=f"pull-{days_ago:02d}", when=FROZEN_NOW - days_ago * day
        )


@contextmanager
def frozen_clock(monkeypatch: Any | None = None) -> Iterator[None]:
    """Freeze ``time.time`` and the egress ledger's "now" at FROZEN_NOW, local time in UTC.

    With a pytest ``monkeypatch`` the patches are undone by it; without, on exit.
    """
    import os

    from backend.ledger import clock as ledger_clock

    saved_tz = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"  # clock times on screen must not depend on the machine's zone
    time.tzset()
    try:
        with _frozen(ledger_clock, monkeypatch):
            yield
    finally:
        if saved_tz is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = saved_tz
        time.tzset()


@contextmanager
def _frozen(ledger_clock: Any, monkeypatch: Any | None) -> Iterator[None]:
    real_now = ledger_clock.now

    def fixed_now(now: Any = None) -> datetime:
        return real_now(FROZEN_NOW if now is None else now)

    patches = [(time, "time", lambda: FROZEN_NOW), (ledger_clock, "now", fixed_now)]
    if monkeypatch is not None:
        for obj, name, value in patches:
            monkeypatch.setattr(obj, name, value)
        yield
        return
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, value in patches:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def pull_preview(
    services: Services, *, nodes: int = 16, failed: tuple[int, ...] = (), full: tuple[int, ...] = ()
) -> Any:
    """A fan-out pull's estimate to ``nodes`` nodes (no node or store contacted): the listing and
    probes as a plan would hold them, priced by the real egress guard over this month's ledger.

    ``failed``: node numbers that did not answer; ``full``: nodes whose scratch is too small.
    """
    from backend.ops import PullRequest
    from backend.ops.pull import Pulls
    from backend.pulls.fanout import egress_check
    from backend.pulls.model import NodeEstimate, PullPlan
    from backend.pulls.objects import PulledObject

    total = 1_280 * 10**9
    objects = tuple(PulledObject(f"shards/laion-{i:05d}.tar", total // 2560) for i in range(2560))
    estimates = []
    for i in range(1, nodes + 1):
        name = f"gpu-a{i:02d}"
        dest = "/mnt/local-nvme/loadmaster/scratch/datasets/laion-mini/2026-11-17"
        if i in failed:
            estimates.append(NodeEstimate(name, dest, error=f"{name}: connection refused (port 22)"))
            continue
        free = 400 * 10**9 if i in full else 6_000 * 10**9
        estimates.append(NodeEstimate(name, dest, free, 0, 100.0 if i % 4 else 200.0, i % 5 != 0, s5cmd=True))
    sites = [replace(NODES[0], name=e.node) for e in estimates]
    decision, note = egress_check(services.egress, STORES["datasets"], sites, total, len(objects), None)
    plan = PullPlan(
        src="s3://ml-datasets/laion-mini/shards/",
        dest="datasets/laion-mini/2026-11-17",
        store="datasets",
        objects=objects,
        total_bytes=total,
        nodes=tuple(estimates),
        numworkers=256,
        concurrency=32,
        part_size_mib=64,
        egress=decision,
        egress_note=note,
    )
    req = PullRequest(src=plan.src, dest=plan.dest, nodes=f"gpu-a[01-{nodes:02d}]")
    return Pulls(services)._preview(req, plan, FROZEN_NOW)


def launch_records(*, nodes: int = 4, failed: int = 3, recorded: bool = True) -> tuple[Any, ...]:
    """One pull launched to ``nodes`` nodes at 03:05 (ids share their time part), node ``failed``
    failed, the rest half way; ``recorded=False``: as the nodes report them, the database down."""
    from backend.jobs.records import JobProgress, JobRecord

    out = []
    for i in range(1, nodes + 1):
        total = 1_280 * 10**9
        state = "failed" if i == failed else "running"
        done = total // 3 if i == failed else total // 2
        out.append(
            JobRecord(
                id=f"1117-030500-{0xA1B0 + i:04x}",
                node=f"gpu-a{i:02d}",
                kind="pull",
                state=state,
                created=FROZEN_NOW - 420,
                launched_by="alice@ops",
                launched_from="bastion",
                params={
                    "src": "s3://ml-datasets/laion-mini/shards/",
                    "dest": "/mnt/local-nvme/loadmaster/scratch/datasets/laion-mini",
                },
                started=FROZEN_NOW - 415,
                error="s5cmd exited 1: connection reset by peer" if i == failed else None,
                progress=JobProgress(t=FROZEN_NOW - 1, bytes_done=done, bytes_total=total, rate_bps=1.1e9),
                recorded=recorded,
            )
        )
    return tuple(out)


class FixedJobs:
    """The job records a snapshot shows, read as the Transfers screen reads every node's jobs
    (``refresh``), with a fixed throughput history and log: no node is contacted."""

    def __init__(self, records: tuple[Any, ...]) -> None:
        self.records = records
        #: As JobManager after a refresh that read every record and wrote them to the state database.
        self.problems: list[str] = []
        self.state_down: str | None = None

    async def refresh(self) -> list[Any]:
        return list(self.records)

    def get(self, job_id: str) -> Any:
        return next(r for r in self.records if r.id == job_id)

    async def progress_history(self, job_id: str, lines: int = 120) -> list[Any]:
        from backend.jobs.records import JobProgress

        last = self.get(job_id).progress
        if last is None:
            return []
        return [
            JobProgress(
                t=last.t - 60 + i,
                bytes_done=last.bytes_done * i // 60,
                bytes_total=last.bytes_total,
                rate_bps=last.rate_bps,
            )
            for i in range(61)
        ]

    async def read_log(self, job_id: str, tail_lines: int = 12) -> tuple[str, int]:
        rec = self.get(job_id)
        return (f"s5cmd: {rec.error}" if rec.error else "s5cmd: copying shards"), 0


def services_with_jobs(records: tuple[Any, ...], *, state_dir: Path | None = None) -> Services:
    """Snapshot services whose Transfers screen reads ``records`` (the fleet fed as usual)."""
    services = snapshot_services(state_dir=state_dir)
    services.__dict__["jobs"] = FixedJobs(records)
    return services


#: Where the snapshots' 64-step run lives: a fixed path, since the run folder is on screen.
SNAPSHOT_RUNS = Path("/tmp/loadmaster-snapshot-runs")  # noqa: S108 - a fixed, shown path
#: The run's steps: every 500 up to 32000 (64 real DCP checkpoints).
RUN_STEPS = tuple(range(500, 32001, 500))


def snapshot_run(name: str = "llama-70b") -> Path:
    """A run folder of 64 real DCP checkpoints (a tiny model's weights and AdamW state, saved by
    torch), each step saved 30 minutes after the one before and the newest 10 minutes before
    FROZEN_NOW. Built once per machine (atomically: a rename), then reused."""
    import os
    import shutil
    import tempfile

    final = SNAPSHOT_RUNS / name
    if not final.exists():
        SNAPSHOT_RUNS.mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(prefix=".build-", dir=SNAPSHOT_RUNS))
        templates = _dcp_templates(build / "templates")
        for i, step in enumerate(RUN_STEPS):
            shutil.copytree(templates[i % len(templates)], build / name / f"step-{step}")
        try:
            os.rename(build / name, final)
        except OSError:
            pass  # another worker built it first: the same bytes
        shutil.rmtree(build, ignore_errors=True)
    for i, step in enumerate(RUN_STEPS):  # ages relative to the frozen clock
        when = FROZEN_NOW - 600 - (len(RUN_STEPS) - 1 - i) * 1800
        for p in (final / f"step-{step}").rglob("*"):
            os.utime(p, (when, when))
    return final


def _dcp_templates(root: Path, count: int = 4) -> list[Path]:
    """``count`` real DCP saves of a seeded tiny model after 1..count AdamW steps."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    out = []
    for i in range(count):
        model(torch.randn(4, 8)).pow(2).sum().backward()
        optim.step()
        optim.zero_grad()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "no process group" on a single-process save
            dcp.save({"model": model.state_dict(), "optim": optim.state_dict()}, checkpoint_id=str(root / str(i)))
        out.append(root / str(i))
    return out


def record_audit_trail(services: Services) -> None:
    """A few audit records, as two operators' actions leave them (a fixed actor, the frozen clock)."""
    db = services.db
    run = "s3://ml-checkpoints/llama-70b"
    db.record_audit("retention.pin", f"{run}#48000", "ok", reason="eval baseline", who="alice@bastion")
    db.record_audit("job.cancel", "1117-030500-a1b3", "ok", reason="node failed mid-pull", who="alice@bastion")
    db.record_audit(
        "retention.apply",
        run,
        "ok",
        plan_hash="4c0eec197f08a1b2c3d4e5f60718293a4b5c6d7e8f9012345678901234567890",
        detail={"actions": [{"path": "step-1000", "action": "delete"}]},
        who="bob@bastion",
    )
