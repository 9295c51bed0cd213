"""Slurm's nodes as the inventory: names and addresses from Slurm (recorded 23.02 output), the
connection details from ``[defaults]``, a ``[[nodes]]`` entry of the same name as the override,
partitions as tags; and the client-side array filter."""

from __future__ import annotations

import asyncio
from pathlib import Path

from backend.config import load_config
from backend.ops import Operations
from backend.services import Services
from backend.slurm.inventory import nodes_from_slurm
from backend.slurm.parse import parse_nodes_json

DATA = Path(__file__).parent / "data"


def test_nodes_from_slurm_with_defaults_and_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "lm.toml"
    cfg.write_text(
        '[defaults]\nuser = "ops"\nport = 2222\njump = "bastion.example"\nidentity = ["~/.ssh/fleet"]\n\n'
        '[[nodes]]\nname = "gpu-002"\nhost = "10.9.9.2"\nuser = "root"\n'
    )
    config = load_config(cfg)
    slurm_nodes, _ = parse_nodes_json((DATA / "sinfo-23.02.json").read_text())
    nodes = {n.name: n for n in nodes_from_slurm(slurm_nodes, config)}
    assert list(nodes) == ["gpu-001", "gpu-002", "gpu-003", "gpu-004"]
    n1 = nodes["gpu-001"]
    assert (n1.host, n1.user, n1.port, n1.jump) == ("10.0.0.1", "ops", 2222, "bastion.example")
    assert n1.identity and n1.identity[0].endswith("/.ssh/fleet")
    assert "partition:train" in n1.tags and "partition:debug" in n1.tags and "slurm" in n1.tags
    n2 = nodes["gpu-002"]
    assert (n2.host, n2.user) == ("10.9.9.2", "root") and "partition:train" in n2.tags


def test_array_tasks_are_filtered_on_the_client(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, data in (("sinfo", "sinfo-23.02.json"), ("squeue", "squeue-23.02.json")):
        (bin_dir / name).write_text(f"#!/bin/sh\nexec cat {DATA / data}\n")
        (bin_dir / name).chmod(0o755)
    cfg = tmp_path / "lm.toml"
    cfg.write_text(f'[[nodes]]\nname = "x"\nhost = "127.0.0.1"\n\n[slurm]\nenabled = true\nbin_dir = "{bin_dir}"\n')
    ops = Operations(Services(load_config(cfg))).slurm
    tasks = asyncio.run(ops.jobs(array="900"))
    assert [(j.job_id, j.state) for j in tasks] == [("900_5", "RUNNING"), ("900_[6-9]", "PENDING")]
    assert [j.job_id for j in asyncio.run(ops.jobs(node="gpu-004"))] == ["812"]
    assert [n.name for n in asyncio.run(ops.inventory())][:2] == ["gpu-001", "gpu-002"]
