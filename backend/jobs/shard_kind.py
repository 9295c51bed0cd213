"""Kind "shard" in the job registry (backend.agent.kinds): the shard runner and its cleanup.

The shard job itself lives in :mod:`backend.shards.job`; this names it as a job-kind object, and
is imported (with the shards package) only when a shard job runs or is looked up.
"""

from __future__ import annotations

from backend.agent.kinds import FunctionKind
from backend.shards.job import cleanup, run_shard_job

JOB_KIND = FunctionKind("shard", run_shard_job, cleanup)
