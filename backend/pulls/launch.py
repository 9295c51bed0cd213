"""``loadmaster pull``, console side: starting a planned pull's jobs, one per node (``pull``),
or one per node of a relay, parents before children (``relay``); each job's secrets go into its
0600 secrets file, never onto a command line.

The launch takes what it uses: the job manager that starts the jobs, the config (stores, nodes,
``[pull]``) and the egress guard that releases the reservation of a job that did not start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backend.credentials import Credentials
from backend.errors import JobError
from backend.pulls.model import NodeEstimate, PullPlan, Upstreams, node_s5cmd
from backend.pulls.objects import parse_source
from backend.pulls.settings import PullSettings

if TYPE_CHECKING:
    from backend.config import Config
    from backend.jobs.manager import JobManager
    from backend.jobs.records import JobRecord
    from backend.ledger import EgressGuard
    from backend.pulls.relay.planner import RelayTopology


async def launch_pull(
    jobs: JobManager,
    config: Config,
    guard: EgressGuard,
    plan: PullPlan,
    *,
    label: str = "",
    job_ids: dict[str, str] | None = None,
    upstreams: Upstreams | None = None,
) -> list[JobRecord]:
    """Start one pull job per node of the plan (credentials via each job's 0600 secrets file).

    ``job_ids`` (node -> id) are the ids the egress reservations were made under; a node whose job
    does not start has its reservation, and those of the nodes after it, released.
    """
    if plan.problems:
        raise JobError("; ".join(plan.problems))
    if plan.topology is not None:
        return await launch_relay(
            jobs, config, guard, plan, plan.topology, label=label, job_ids=job_ids, upstreams=upstreams
        )
    creds = await _plan_credentials(config, plan)
    secrets = creds.as_env()
    settings = config.section(PullSettings)
    expected = [list(o) for o in plan.objects] if len(plan.objects) <= settings.max_spec_objects else None
    out = []
    ids = job_ids or {}
    for i, est in enumerate(plan.nodes):
        params = {**_pull_params(config, plan, est), "expected": expected}
        try:
            out.append(
                await jobs.launch(
                    est.node,
                    "pull",
                    params,
                    secrets=secrets,
                    label=label or f"pull {plan.src} -> {est.dest}",
                    job_id=ids.get(est.node),
                )
            )
        except BaseException as exc:
            for later in plan.nodes[i:]:
                if later.node in ids:
                    guard.release(ids[later.node], f"not started: {type(exc).__name__}: {exc}"[:300])
            raise
    return out


async def _relay_checksums(config: Config, plan: PullPlan) -> tuple[list[str | None], list[int | None]]:
    """The store's full-object checksum of each listed object, for the receivers' proofs (they hold
    no credentials and take nothing from a peer on trust): one HEAD per object with ChecksumMode,
    a few at a time (``backend.pulls.relay.checksums``); None where the store keeps none. And,
    for a multipart object with none, its part size (a HEAD of part 1), so its multipart ETag
    proves it."""
    from backend.pulls.relay.checksums import listing_checksums, listing_part_sizes
    from backend.storage import S3Store

    pattern = parse_source(plan.src)
    store = S3Store(f"s3://{pattern.bucket}", config.stores.get(plan.store) if plan.store else None)
    keys = [pattern.key_of(o.rel) for o in plan.objects]
    try:
        sums = await listing_checksums(store, keys)
        parts = await listing_part_sizes(store, keys, [o.etag for o in plan.objects], sums)
        return sums, parts
    finally:
        await store.close()


async def _plan_credentials(config: Config, plan: PullPlan) -> Credentials:
    """The credentials the plan's listing used, else the store's, resolved again."""
    if plan.credentials is not None:
        return plan.credentials
    from backend.storage import S3Store

    store = S3Store(f"s3://{parse_source(plan.src).bucket}", config.stores.get(plan.store) if plan.store else None)
    try:
        return await store.credentials()
    finally:
        await store.close()


def _pull_params(config: Config, plan: PullPlan, est: NodeEstimate) -> dict[str, object]:
    """What a node's job needs to know of the plan (its spec's params; no secret)."""
    settings = config.section(PullSettings)
    return {
        "src": plan.src,
        "dest": est.dest,
        "store": plan.store,
        "endpoint_url": plan.endpoint_url,
        "region": plan.region,
        "numworkers": plan.numworkers,
        "concurrency": plan.concurrency,
        "part_size_mib": plan.part_size_mib,
        "s5cmd": node_s5cmd(config.node(est.node), settings.s5cmd),
        "bytes_total": plan.total_bytes,
        "objects_total": len(plan.objects),
    }


async def launch_relay(
    jobs: JobManager,
    config: Config,
    guard: EgressGuard,
    plan: PullPlan,
    topo: RelayTopology,
    *,
    label: str = "",
    job_ids: dict[str, str] | None = None,
    upstreams: Upstreams | None = None,
) -> list[JobRecord]:
    """Start one "relay" job per node of ``topo`` (the plan's topology), parents before children:
    seeds get the store's credentials and the relay secret, receivers the relay secret alone (each
    in its job's 0600 secrets file). ``upstreams`` (relay-ssh: the console's forwarded loopback
    ports) replaces where each node finds the nodes above it."""
    from backend.jobs.records import new_job_id
    from backend.pulls.relay.planner import seed_flags
    from backend.pulls.relay.protocol import SECRET_ENV, new_secret

    settings = config.section(PullSettings)
    creds = await _plan_credentials(config, plan)
    secret = new_secret()
    ids = dict(job_ids or {})
    for est in plan.nodes:
        ids.setdefault(est.node, new_job_id())
    group = "relay-" + ids[topo.seeds[0]]
    by_name = {n.node: n for n in plan.nodes}
    order = sorted(by_name, key=lambda n: len(topo.chain(n)))
    expected = [list(o) for o in plan.objects]
    checksums, part_sizes = await _relay_checksums(config, plan)
    out = []
    for i, name in enumerate(order):
        est = by_name[name]
        seed = name in topo.seeds
        relay: dict[str, object] = {
            "group": group,
            "role": "seed" if seed else "receiver",
            "node": name,
            "listen": list(plan.relay_listen[name]),
            "upstreams": (upstreams or {}).get(name) or [[a, *plan.relay_listen[a]] for a in topo.ancestors(name)],
            "children": list(topo.children.get(name, ())),
            "chain_len": len(topo.chain(name)),
            "topology": {k: v for k, v in topo.parent.items()},
            "jobs": ids,
            "chunk_mib": settings.relay_chunk_mib,
            "grace_s": settings.relay_grace,
            "reattach_s": settings.relay_reattach,
            "silence_s": settings.relay_silence,
            "max_gbps": settings.relay_max_gbps,
            "checksums": checksums,
            "part_sizes": part_sizes,
        }
        params = {**_pull_params(config, plan, est), "expected": expected, "relay": relay}
        if seed:
            nw, cc, ps = seed_flags(
                plan.total_bytes, len(plan.objects), plan.numworkers, plan.concurrency, plan.part_size_mib
            )
            params.update(numworkers=nw, concurrency=cc, part_size_mib=ps)
        secrets = {SECRET_ENV: secret, **(creds.as_env() if seed else {})}
        try:
            out.append(
                await jobs.launch(
                    name,
                    "relay",
                    params,
                    secrets=secrets,
                    label=label or f"relay {plan.src} -> {est.dest}",
                    job_id=ids[name],
                )
            )
        except BaseException as exc:
            for later in order[i:]:
                if job_ids and later in job_ids:
                    guard.release(job_ids[later], f"not started: {type(exc).__name__}: {exc}"[:300])
            raise
    return out
