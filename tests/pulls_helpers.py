"""Plan and launch a pull from a test that holds a :class:`Services`, as a front end does.

``backend.pulls`` takes what it uses (the config, the node pool, the egress guard, the job
manager); these unpack a test's Services the way ``backend.ops.pull`` does, without the
operation's audit and egress reservation (the tests of those go through ``Operations(services)``).
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest

from backend.jobs.records import JobRecord
from backend.pulls import launch, plan
from backend.pulls.model import PullPlan
from backend.services import Services
from tui.cli import main as cli_main


async def plan_pull(services: Services, src: str, dest: str, nodes: list[str], **options: Any) -> PullPlan:
    """:func:`backend.pulls.plan.plan_pull` with ``services``' collaborators."""
    return await plan.plan_pull(
        services.config,
        services.pool,
        lambda: services.egress,
        src,
        dest,
        nodes,
        prepare=lambda: services.jobs,
        **options,
    )


async def launch_pull(services: Services, pull_plan: PullPlan, **options: Any) -> list[JobRecord]:
    """:func:`backend.pulls.launch.launch_pull` with ``services``' collaborators."""
    return await launch.launch_pull(services.jobs, services.config, services.egress, pull_plan, **options)


def cli_here(capsys: pytest.CaptureFixture[str], cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``loadmaster --config CFG ARGS`` run in this process: the executable's parser, ``guarded``
    (one-line errors) and command code, without its ~1 s start-up (interpreter, imports, SSH
    handshakes). For reads and refusals; what must be its own process (signals, the keeper, a
    terminal) runs the real executable. Standard input is pytest's, never a terminal."""
    capsys.readouterr()
    code = cli_main(["--config", str(cfg), *args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out, err)


async def cli_here_async(capsys: pytest.CaptureFixture[str], cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """:func:`cli_here` from a test's event loop (the command runs its own, in a thread)."""
    return await asyncio.to_thread(cli_here, capsys, cfg, *args)
