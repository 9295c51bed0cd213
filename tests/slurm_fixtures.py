"""Slurm for the tests: the real slurmctld and slurmd 22.05 on loopback (lab/slurm.py).

``slurm_lab`` (module scope: one cluster per test file, started in about a second) runs slurmctld
and three slurmd, ``node-01``..``node-03`` on 127.0.0.1-3, each with four GPU GRES backed by
``/dev/null`` links. ``slurm`` is the same cluster for one test: every job cancelled and every
node resumed and idle first. Tests talk to it with ``SLURM_CONF`` (``slurm.env()``), never through
the process environment, so nothing else a test starts inherits this cluster.

Wired by tests/slurm/conftest.py. A machine without Slurm fails these tests with the install hint.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab.slurm import SLURM_INSTALL_HINT, SlurmLab, SlurmNotInstalled

SLURM_NODES = [("node-01", "127.0.0.1"), ("node-02", "127.0.0.2"), ("node-03", "127.0.0.3")]


@pytest.fixture(scope="module")
def slurm_lab() -> Iterator[SlurmLab]:
    root = Path(tempfile.mkdtemp(prefix="lm-slurm-"))
    lab = SlurmLab(root, SLURM_NODES, gpus=4)
    try:
        lab.up()
    except SlurmNotInstalled:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"Slurm missing: {SLURM_INSTALL_HINT} (scripts/test.sh installs it)")
    try:
        yield lab
    finally:
        lab.down()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def slurm(slurm_lab: SlurmLab) -> SlurmLab:
    """The module's cluster with no jobs and every node idle."""
    slurm_lab.cancel_all()
    slurm_lab.resume_all()
    slurm_lab.wait_idle()
    return slurm_lab


def wait_for(what: str, cond: Callable[[], object], timeout: float = 90.0, every: float = 0.2) -> object:
    """Poll ``cond`` until it returns something true; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(every)


def node_state(lab: SlurmLab, node: str) -> str:
    """What sinfo says of ``node`` (``draining``, ``drained``, ``idle``, ``mixed``, ...)."""
    return lab.command(["sinfo", "-h", "-N", "-n", node, "-o", "%T"]).stdout.strip()


def job_state(lab: SlurmLab, job_id: str) -> str:
    return lab.command(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False).stdout.strip()
