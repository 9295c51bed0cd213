"""Plan and launch a pull from a test that holds a :class:`Services`, as a front end does.

``backend.pulls`` takes what it uses (the config, the node pool, the egress guard, the job
manager); these unpack a test's Services the way ``backend.ops.pull`` does, without the
operation's audit and egress reservation (the tests of those go through ``Operations(services)``).
"""

from __future__ import annotations

from typing import Any

from backend.jobs.records import JobRecord
from backend.pulls import launch, plan
from backend.pulls.model import PullPlan
from backend.services import Services


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
