"""A conversion as a durable job on a real lab node (sshd), reading from the lab's SeaweedFS."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from backend.config import load_config_file
from backend.services import Services
from backend.shards.verify import verify
from tests.helpers import write_lab_config
from tui.cli import main

pytestmark = pytest.mark.lab


async def test_shard_job_on_a_node_from_s3(lab: Any, s3: Any, tmp_path: Path) -> None:
    config = load_config_file(write_lab_config(lab, tmp_path / "loadmaster.toml", tmp_path / "state"))
    prefix = f"shardsrc-{secrets.token_hex(3)}"
    objects = {f"{prefix}/{i:04d}.cls": str(i % 7).encode() for i in range(40)}
    objects |= {f"{prefix}/{i:04d}.bin": bytes([i]) * (300 + i) for i in range(40)}
    s3.put_many(lab.bucket, objects)
    dest = lab.node("node-01").scratch / f"shards-{prefix}"
    svc = Services(config=config)
    try:
        rc = await _cli(
            svc,
            [
                "--config",
                str(tmp_path / "loadmaster.toml"),
                "shard",
                f"s3://{lab.bucket}/{prefix}",
                str(dest),
                "--shard-size",
                "4KB",
                "--node",
                "node-01",
                "--json",
            ],
        )
        assert rc["rc"] == 0, rc
        job_id = json.loads(rc["out"])["job"]
        final = await svc.jobs.wait(job_id, timeout=180)
        assert final.state == "succeeded", final.error
        assert final.result and final.result["samples"] == 40 and final.result["files"] == 80
        assert final.progress is not None and final.progress.items_done == 40
        assert final.progress.extra.get("shards_done") == final.result["shards"]
        report = await verify(str(dest))
        assert report.ok, report.summary()
        log = Path(final.job_dir or "", "log").read_text()  # noqa: ASYNC240
        assert "GETs per epoch" in log
        creds = lab.s3.secret_key
        assert creds not in log and creds not in json.dumps(final.params)
        audit = [e for e in svc.db.audit_entries() if e.action == "shard.launch"]
        assert audit and audit[-1].detail["job"] == job_id
    finally:
        await svc.aclose()


async def _cli(svc: Services, argv: list[str]) -> dict[str, Any]:
    """Run the CLI in a thread (it runs its own event loop) and capture stdout."""
    import asyncio
    import contextlib
    import io

    buf = io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(buf):
            return main(argv)

    code = await asyncio.to_thread(run)
    return {"rc": code, "out": buf.getvalue()}


async def test_node_job_from_node_files_to_s3_spools_on_scratch(lab: Any, s3: Any, tmp_path: Path) -> None:
    from tests.shards.conftest import make_dataset

    config = load_config_file(write_lab_config(lab, tmp_path / "loadmaster.toml", tmp_path / "state"))
    scratch = lab.node("node-02").scratch
    src = scratch / f"raw-{secrets.token_hex(3)}"
    data = make_dataset(src, n=30)
    dest = f"s3://{lab.bucket}/shards-{secrets.token_hex(3)}"
    svc = Services(config=config)
    try:
        rc = await _cli(
            svc,
            [
                "--config",
                str(tmp_path / "loadmaster.toml"),
                "shard",
                str(src),
                dest,
                "--shard-size",
                "8KB",
                "--node",
                "node-02",
                "--json",
            ],
        )
        assert rc["rc"] == 0, rc
        final = await svc.jobs.wait(json.loads(rc["out"])["job"], timeout=180)
        assert final.state == "succeeded", final.error
        assert final.params["spool_dir"] == f"{scratch}/.loadmaster-shard-spool"
        spool = scratch / ".loadmaster-shard-spool"
        assert spool.is_dir() and not [p for p in spool.rglob("*") if p.is_file()]
        report = await verify(dest, profile=config.store_for_url(dest))
        assert report.ok and report.samples == len(data)
    finally:
        await svc.aclose()
