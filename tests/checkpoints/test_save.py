"""save_and_upload: real DCP async_save of a model + AdamW, background upload to SeaweedFS."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from backend.checkpoints.catalog import list_checkpoints
from backend.checkpoints.save import save_and_upload
from backend.checkpoints.strip import strip_step
from backend.storage import S3Store
from lab import Lab
from tests.checkpoints.conftest import state, trained


def test_save_and_upload_to_s3(lab: Lab, s3, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    bucket = s3.new_bucket("save")
    profile = dataclasses.replace(lab.config.stores["lab"], url=f"s3://{bucket}")
    model, opt = trained(seed=7)
    sd = state(model, opt)
    home = tmp_path / "home"
    handles = []
    for step in (9, 10):
        h = save_and_upload(sd, step, tmp_path / "nvme", f"s3://{bucket}/run1", profile=profile, jobs_home=home)
        assert h.staged_seconds >= 0 and h.job_dir is not None
        handles.append(h)
    # the training loop may mutate its weights after staging: the saved step keeps the staged copy
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    results = [h.result(timeout=120) for h in handles]
    assert all(r.bytes > 0 for r in results)
    assert "uploaded" in handles[1].status_line() and "step 10: staged" in handles[1].status_line()
    job = handles[1].job_dir
    assert job is not None
    spec = json.loads((job / "spec.json").read_text())
    assert spec["kind"] == "upload" and spec["params"]["step"] == 10
    result = json.loads((job / "result.json").read_text())
    assert result["state"] == "succeeded" and result["progress"]["bytes_done"] == results[1].bytes
    lines = [json.loads(x) for x in (job / "progress.jsonl").read_text().splitlines()]
    assert lines[-1]["bytes_done"] == lines[-1]["bytes_total"] and lines[-1]["step"] == 10

    async def check() -> None:
        async with S3Store(f"s3://{bucket}", profile) as store:
            cat = await list_checkpoints(store, "run1")
            assert [(s.step, s.kind) for s in cat.steps] == [(9, "full"), (10, "full")]
            await strip_step(store, "run1/step-10")
            from safetensors.torch import load

            raw = await store.get_bytes("run1/step-10/model-00001-of-00001.safetensors")
            got = load(raw)
            trained_again, _ = trained(seed=7)  # the weights as they were when saved
            for k, v in trained_again.state_dict().items():
                assert torch.equal(got[k], v.to(torch.bfloat16)), k

    asyncio.run(check())
