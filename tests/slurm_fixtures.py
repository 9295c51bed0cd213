"""Slurm for the tests: the real slurmctld and slurmd 22.05 on loopback (lab/slurm.py).

``slurm_lab`` runs slurmctld and three slurmd, ``node-01``..``node-03`` on 127.0.0.1-3, each with
four GPU GRES backed by ``/dev/null`` links: one cluster per test process (a pytest-xdist worker),
started by the first test file that asks for it and stopped when the process ends, not one per
file (a start and a stop cost about 1.5 s, several more on a loaded machine). ``slurm`` is that
cluster for one test: every job cancelled and every node resumed and idle first, so no test sees
another's jobs, drains or reasons. Tests talk to it with ``SLURM_CONF`` (``slurm.env()``), never through
the process environment, so nothing else a test starts inherits this cluster.

Wired by tests/slurm/conftest.py. A machine without Slurm fails these tests with the install hint.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lab.slurm import SLURM_INSTALL_HINT, SlurmLab, SlurmNotInstalled

SLURM_NODES = [("node-01", "127.0.0.1"), ("node-02", "127.0.0.2"), ("node-03", "127.0.0.3")]


#: The test process's cluster, once a test file has asked for it.
_cluster: list[SlurmLab] = []


@pytest.fixture(scope="module")
def slurm_lab(request: pytest.FixtureRequest) -> SlurmLab:
    """The test process's cluster: started on first use, stopped (jobs cancelled, daemons and job
    processes gone, its folder removed) when pytest ends, through ``config.add_cleanup``."""
    if _cluster:
        return _cluster[0]
    root = Path(tempfile.mkdtemp(prefix="lm-slurm-"))
    lab = SlurmLab(root, SLURM_NODES, gpus=4)
    try:
        lab.up()
    except SlurmNotInstalled:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"Slurm missing: {SLURM_INSTALL_HINT} (scripts/test.sh installs it)")
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise

    def stop() -> None:
        _cluster.clear()
        try:
            lab.down()
        finally:
            shutil.rmtree(root, ignore_errors=True)

    request.config.add_cleanup(stop)
    _cluster.append(lab)
    return lab


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
