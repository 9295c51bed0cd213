"""``[slurm] inventory = true``: the config's nodes come from the real slurmctld (Slurm 22.05 on
loopback) through the InventorySource seam (backend/inventory/), at Slurm's NodeAddr with the
connection details of ``[defaults]``, a ``[[nodes]]`` entry of the same name overriding them; the
nodes so found are reached over SSH. A Slurm that cannot be read stops the load with one line."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.config import load_config_file, parse_config
from backend.errors import ConfigError
from backend.inventory import SOURCES, InventorySource, resolve
from backend.services import Services
from lab import Lab
from lab.slurm import SlurmLab

pytestmark = [pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def lab_slurm(lab: Lab) -> Iterator[SlurmLab]:
    """Slurm whose nodes are two of the lab's sshd nodes, at their own addresses (as lab up --slurm)."""
    root = Path(tempfile.mkdtemp(prefix="lm-slurm-inv-"))
    sl = SlurmLab(root, [(n.name, n.ip) for n in lab.nodes[:2]], gpus=2).up(timeout=90)
    try:
        yield sl
    finally:
        sl.down()
        shutil.rmtree(root, ignore_errors=True)


def config_text(lab: Lab, sl: SlurmLab, extra: str = "") -> str:
    # The lab's [defaults] (user, port, key, known_hosts) and state; no [[nodes]] but the override.
    text = lab.config_text()
    defaults = text[text.index("[defaults]") : text.index("[[nodes]]")]
    state = text[text.index("[state]") :]
    return f'{defaults}\n{extra}\n[slurm]\nenabled = true\ninventory = true\nconf = "{sl.conf}"\n\n{state}\n'


def test_every_source_satisfies_the_protocol() -> None:
    assert all(isinstance(make(), InventorySource) for make in SOURCES)


def test_nodes_come_from_slurm_and_are_reached(lab: Lab, lab_slurm: SlurmLab, tmp_path: Path) -> None:
    n2 = lab.node("node-02")
    override = f'[[nodes]]\nname = "node-02"\nhost = "{n2.ip}"\nscratch = "{n2.scratch}"\nsite = "rack-9"\n'
    cfg = tmp_path / "lm.toml"
    cfg.write_text(config_text(lab, lab_slurm, override))
    config = load_config_file(cfg)
    nodes = {n.name: n for n in config.nodes}
    assert list(nodes) == ["node-01", "node-02"]  # Slurm's nodes, not the file's fallback
    one = nodes["node-01"]
    assert one.host == lab.node("node-01").ip and one.user == "root" and one.port == lab.port
    assert "slurm" in one.tags and "partition:gpu" in one.tags
    assert nodes["node-02"].site == "rack-9" and "partition:gpu" in nodes["node-02"].tags

    async def paths() -> list[str]:
        services = Services(config=config)
        try:
            return [(await services.pool.transport(name).run("echo $PATH")).stdout for name in nodes]
        finally:
            await services.pool.close()
            services.db.close()

    # Each node answers as itself: its own sshd puts its own bin directory first on PATH.
    got = asyncio.run(paths())
    assert [str(lab.node(name).bin_dir) in out for name, out in zip(nodes, got, strict=True)] == [True, True], got


def test_slurm_unreadable_stops_the_load_with_one_line(lab: Lab, lab_slurm: SlurmLab, tmp_path: Path) -> None:
    cfg = tmp_path / "lm.toml"
    cfg.write_text(config_text(lab, lab_slurm).replace(str(lab_slurm.conf), str(tmp_path / "missing.conf")))
    with pytest.raises(ConfigError) as err:
        load_config_file(cfg)
    msg = str(err.value)
    assert "cannot read the node inventory from slurm:" in msg and "\n" not in msg
    assert str(tmp_path / "missing.conf") in msg  # names what to fix (not a timeout: Slurm retries 60 s)


def test_without_inventory_the_file_keeps_its_nodes(tmp_path: Path) -> None:
    raw = {"nodes": [{"name": "n1", "host": "10.0.0.1"}], "slurm": {"enabled": True, "conf": "/nonexistent"}}
    config = parse_config(raw, file="t.toml", base=tmp_path)
    assert resolve(config) is config
