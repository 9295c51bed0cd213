"""A pull that stops moving bytes raises ``TransferStalled`` with its job id, in Alertmanager.

Real parts: the pull lists SeaweedFS, launches on the sshd node and runs s5cmd; SeaweedFS is then
frozen (SIGSTOP), so s5cmd waits with requests in flight and the job's bytes stop, as on a dead
network path. The watcher (the same rounds ``loadmaster watch`` runs) sees no bytes for
``stall_after`` and sends the alert; ``amtool`` shows it with the job id. The store thawed and the
job cancelled, the next rounds resolve it.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from backend.alerts.watch import Watcher
from backend.config import load_config_file
from backend.ops import Operations
from backend.services import Services
from lab import Lab
from tests.am_fixtures import AlertmanagerLab
from tests.helpers import write_lab_config
from tests.jobs.conftest import SourceData
from tests.jobs.test_pull_lab import store_stalled
from tests.pulls_helpers import launch_pull, plan_pull


async def test_a_stalled_pull_raises_transfer_stalled_with_its_job_id(
    lab: Lab, source: SourceData, am_lab: AlertmanagerLab, tmp_path: Path
) -> None:
    extra = f"""
[alerts]
alertmanager_url = "{am_lab.url}"
interval = "1s"
stall_after = "3s"
conditions = ["TransferStalled", "JobLost"]
"""
    cfg = load_config_file(write_lab_config(lab, tmp_path / "loadmaster.toml", tmp_path / "state", extra))
    services = Services(config=cfg)
    watcher = Watcher(services)
    try:
        plan = await plan_pull(services, source.url, "pulls/stall", ["node-02"], numworkers=2, concurrency=2)
        with contextlib.ExitStack() as stack:
            stack.enter_context(store_stalled(lab))
            [rec] = await launch_pull(services, plan)
            stalled = None
            for _ in range(60):
                r = await watcher.round()
                stalled = [c for c in r.conditions if c.alertname == "TransferStalled"]
                if stalled:
                    break
                await asyncio.sleep(0.5)
            assert stalled, "no TransferStalled while the store is frozen"
            (c,) = stalled
            assert c.labels["job_id"] == rec.id and c.labels["node"] == "node-02"
            assert r.delivery is not None and r.delivery.am_error is None
            got = am_lab.amtool_json("alert", "query", "alertname=TransferStalled", f"job_id={rec.id}")
            assert [a["labels"]["job_id"] for a in got] == [rec.id]
            assert got[0]["annotations"]["loadmaster_ref"] == f"job:{rec.id}"
            assert "no bytes for" in got[0]["annotations"]["summary"]
            # Cancelled while still stalled (thawed first, the small pull could end on its own
            # before the cancel reached it: seen in CI), then thawed: the condition is gone and
            # the alert resolves (Alertmanager drops it).
            await Operations(services).jobs.cancel(rec.id, reason="test: stalled pull")
        for _ in range(60):
            r = await watcher.round()
            if not am_lab.amtool_json("alert", "query", "alertname=TransferStalled", f"job_id={rec.id}"):
                break
            await asyncio.sleep(0.5)
        else:
            raise AssertionError("TransferStalled did not resolve after the cancel")
        assert not [c for c in r.conditions if c.alertname == "TransferStalled"]
    finally:
        await watcher.close()
        await services.aclose()
