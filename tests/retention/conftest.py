"""Fixtures for the retention tests: a real DCP run made once per session, copied per test."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from retention_helpers import IN_FLIGHT, STEPS, DcpRun, save_step  # type: ignore[import-not-found]

from tests.jobs.conftest import source  # noqa: F401 - a fixture (the seeded source prefix), used by name


@pytest.fixture(scope="session")
def dcp_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DcpRun]:
    import torch

    root = tmp_path_factory.mktemp("dcp-run") / "run1"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    weights: dict[int, dict[str, object]] = {}
    for step in STEPS:
        model(torch.randn(4, 8)).pow(2).sum().backward()
        optim.step()
        optim.zero_grad()
        save_step(model, optim, root / f"step-{step}")
        weights[step] = {k: v.detach().to(torch.bfloat16).clone() for k, v in model.state_dict().items()}
    (root / f"step-{IN_FLIGHT}" / ".metadata").unlink()  # DCP writes .metadata last: still in flight
    # a small metadata file a trainer writes next to its state: a strip keeps it
    (root / "step-8000" / "config.json").write_text('{"hidden": 16}')
    (root / "notes").mkdir()
    (root / "notes" / "README.txt").write_text("operator notes: not a checkpoint\n")
    yield DcpRun(root, weights)


@pytest.fixture
def s3_services(lab, s3, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Services whose config has one store: a fresh SeaweedFS bucket (profile of the lab store)."""
    from backend.config import StateSettings
    from backend.services import Services

    bucket = s3.new_bucket("ret")
    profile = dataclasses.replace(lab.config.stores["lab"], url=f"s3://{bucket}", name="ckpt")
    config = dataclasses.replace(lab.config, stores={"ckpt": profile}, state=StateSettings(dir=str(tmp_path / "state")))
    services = Services(config)
    yield services
    services.db.close()
