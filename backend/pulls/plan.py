"""``loadmaster pull``, console side: the plan shown before a pull starts.

:func:`plan_pull` lists the source for object count, bytes and ETags (refusing any key that would
land outside DEST, :mod:`backend.pulls.listing`), probes each node's free space, NIC line rate and
s5cmd, prices the egress and chooses the fan-out (:mod:`backend.pulls.fanout`);
:func:`backend.pulls.launch.launch_pull` then starts one job per node. The job itself runs on the
node (:mod:`backend.pulls.job`); both sides share :mod:`backend.pulls.objects`.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING

from backend.errors import ConfigError, LoadmasterError, NodeUnreachable, StoreError
from backend.pulls.fanout import egress_check, may_relay, with_fanout
from backend.pulls.listing import list_source
from backend.pulls.model import NodeEstimate, PullPlan, node_dest, node_s5cmd
from backend.pulls.objects import parse_source
from backend.pulls.settings import PullSettings

# What only some commands need (asyncio, the S3 client, the ledger) is imported where it is used.
if TYPE_CHECKING:
    from backend.config import Config, StoreProfile
    from backend.ledger import EgressGuard
    from backend.nodes.pool import NodePool
    from backend.nodes.transport import Transport

log = logging.getLogger(__name__)


#: The probe of a destination node, one ``sh`` and as few processes as it can (each fork costs a
#: few ms on a busy node, and the probe is on the plan's critical path): free space from ``stat -f``
#: (``df`` where that fails), shell builtins for the rest. ``$3`` = 1 adds the node's addresses
#: and the ports in use, which only a relay needs (where each node listens).
_PROBE = r"""
D="$1"; case "$D" in "~"*) D="$HOME${D#\~}";; esac
d="$D"
while [ ! -d "$d" ]; do case "$d" in */*) d="${d%/*}"; d="${d:-/}";; *) d=.;; esac; done
set -- "$@" $(stat -f -c '%a %S' "$d" 2>/dev/null)
if [ $# -eq 5 ] && case "$4$5" in "" | *[!0-9]*) false;; esac; then
  echo "@@DF $(( $4 * $5 / 1024 ))"
else
  echo "@@DF $(df -Pk "$d" | tail -n 1 | awk '{print $4}')"
fi
for i in /sys/class/net/*; do [ -e "$i/device" ] && { s=; read -r s < "$i/speed"; echo "@@SPEED $s"; } 2>/dev/null; done
command -v "$2" >/dev/null 2>&1 && echo "@@S5CMD 1"
present=0
[ -d "$D" ] && echo "@@DEST 1"
if [ -d "$D" ]; then
  while IFS= read -r f; do [ -f "$D/$f" ] && present=$((present + $(stat -c %s "$D/$f"))); done
fi
echo "@@PRESENT $present"
[ "$3" = 1 ] || exit 0
for a in $( (ip -o addr show 2>/dev/null | awk '{print $4}'; hostname -I 2>/dev/null) ); do echo "@@ADDR ${a%/*}"; done
awk 'FNR > 1 { n = split($2, a, ":"); print "@@PORT " a[n] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
"""


async def probe_node(
    transport: Transport, dest: str, rels: list[str], s5cmd: str, *, peers: bool = True
) -> NodeEstimate:
    """Free space at ``dest``, NIC line rate, s5cmd presence and bytes already there, on one node;
    with ``peers``, also its addresses and the TCP ports in use (what a relay chooses from)."""
    res = await transport.run(
        # exec: the shell the node runs the command in becomes the probe's (one process fewer).
        f"exec sh -c {shlex.quote(_PROBE)} probe {shlex.quote(dest)} {shlex.quote(s5cmd)} {int(peers)}",
        input="\n".join(rels) + "\n",
        timeout=120,
    )
    free = None
    speeds: list[int] = []
    s5 = False
    present = 0
    dest_exists = False
    addrs: list[str] = []
    taken: set[int] = set()
    for line in res.stdout.splitlines():
        tag, _, v = line.partition(" ")
        v = v.strip()
        if tag == "@@DF" and v.isdigit():
            free = int(v) * 1024
        elif tag == "@@SPEED" and v.lstrip("-").isdigit() and int(v) > 0:
            speeds.append(int(v))
        elif tag == "@@S5CMD":
            s5 = True
        elif tag == "@@PRESENT" and v.isdigit():
            present = int(v)
        elif tag == "@@DEST":
            dest_exists = True
        elif tag == "@@ADDR" and v and v not in addrs:
            addrs.append(v)
        elif tag == "@@PORT":
            with contextlib.suppress(ValueError):
                taken.add(int(v, 16))
    err = None if free is not None else f"{transport.name}: cannot read free space at {dest}: {res.stderr.strip()}"
    return NodeEstimate(
        node=transport.name,
        dest=dest,
        free_bytes=free,
        present_bytes=present,
        line_rate_gbps=max(speeds) / 1000 if speeds else None,
        line_rate_known=bool(speeds),
        s5cmd=s5,
        error=err,
        dest_exists=dest_exists,
        addresses=tuple(addrs),
        ports_taken=frozenset(taken),
    )


def resolve_store(config: Config, src: str, store: str | None) -> StoreProfile | None:
    """The store profile that supplies endpoint, region and credentials for ``src``."""
    if store:
        prof = config.store(store)
        if not prof.is_s3:
            raise ConfigError(f"store {store!r} is a local directory; pull needs an s3:// store")
        return prof
    return config.store_for_url(src)


def _probe_again(first: NodeEstimate | Exception, names: bool) -> bool:
    """Whether a node's first probe (no object names) is probed again: it failed but the node was
    reached, or it has the destination already and the names are known (to count what is there)."""
    if isinstance(first, NodeUnreachable):
        return False
    return isinstance(first, BaseException) or bool(first.error) or (first.dest_exists and names)


async def plan_pull(
    config: Config,
    pool: NodePool,
    guard: Callable[[], EgressGuard],
    src: str,
    dest: str,
    nodes: list[str],
    *,
    store: str | None = None,
    numworkers: int | None = None,
    concurrency: int | None = None,
    part_size_mib: int | None = None,
    allow_over_budget: str | None = None,
    fanout: str | None = None,
    seeds: int | None = None,
    degree: int | None = None,
    prepare: Callable[[], object] | None = None,
) -> PullPlan:
    """List the source, probe each node over ``pool`` and price the egress: the plan shown before
    launch. ``guard`` gives the egress guard and ``prepare`` readies what the launch needs next
    (the job manager); both are called in a worker thread while the store and the nodes answer
    (each may import the ledger and open the state database), and the quote is made once the
    listing is in."""
    import asyncio

    settings = config.section(PullSettings)
    pattern = parse_source(src)
    profile = resolve_store(config, src, store)
    mode = fanout
    # Addresses and ports in use are only read where a relay may be chosen (a few ms a node).
    peers = may_relay(config, fanout, nodes)

    async def early(t: Transport) -> NodeEstimate:
        n = config.node(t.name)
        est = await probe_node(t, node_dest(dest, n.scratch), [], node_s5cmd(n, settings.s5cmd), peers=peers)
        log.debug("plan: %s connected and probed", t.name)
        return est

    # The listing subprocess is spawned first; connecting to and probing the nodes overlaps it. A
    # node whose destination does not exist yet has nothing present, so that first probe is its
    # whole answer; the others (and any node that failed) are probed again below with the object
    # names, to count what is there.
    log.debug("plan: listing + connecting")
    listing = asyncio.ensure_future(list_source(pattern, profile, credentials=True))
    await asyncio.sleep(0)
    probing = asyncio.ensure_future(pool.fanout(early, nodes, timeout=120))

    def ready() -> EgressGuard:
        egress = guard()
        if prepare is not None:
            prepare()
        return egress

    # The egress guard and the job manager are readied off the event loop, so the probes'
    # replies are read while they import and open the database (CPU work, the store's and the
    # nodes' waits).
    readying = asyncio.ensure_future(asyncio.to_thread(ready))
    try:
        # A listing error (no such bucket, bad credentials) is raised at once, as before.
        objects, creds = await listing
        log.debug("plan: listed %d objects", len(objects))
        if not objects:
            raise StoreError(f"no objects match {src}")
        total = sum(o.size for o in objects)
        # The egress quote needs only the listing's total, so it is priced while the nodes answer.
        decision, note = egress_check(
            await readying,
            profile,
            [config.node(n) for n in nodes],
            total,
            len(objects),
            allow_over_budget,
            src,
        )
        log.debug("plan: egress priced")
        first = await probing
    except BaseException:
        for task in (listing, probing, readying):
            task.cancel()
        await asyncio.gather(listing, probing, readying, return_exceptions=True)
        raise
    log.debug("plan: probed")
    rels = [o.rel for o in objects] if len(objects) <= settings.max_spec_objects else []

    async def probe(t: Transport) -> NodeEstimate:
        n = config.node(t.name)
        return await probe_node(t, node_dest(dest, n.scratch), rels, node_s5cmd(n, settings.s5cmd), peers=peers)

    # A node that could not be reached at all is not probed again: in a one-shot command the
    # second try only meets the connection backoff ("next retry in 0.9s") and says nothing new.
    again = [n for n in nodes if _probe_again(first[n], bool(rels))]
    probes = {**first, **(await pool.fanout(probe, again, timeout=120) if again else {})}
    log.debug("plan: probed (%d again)", len(again))
    ests = []
    for name in nodes:
        r = probes[name]
        if isinstance(r, BaseException):
            msg = str(r) if isinstance(r, LoadmasterError) else f"{type(r).__name__}: {r}"
            ests.append(
                NodeEstimate(
                    node=name,
                    dest=node_dest(dest, config.node(name).scratch),
                    error=msg if msg.startswith(name) else f"{name}: {msg}",
                )
            )
        else:
            if not r.line_rate_known:
                r = NodeEstimate(**{**r.__dict__, "line_rate_gbps": settings.nic_gbps})
            ests.append(r)
    plan = PullPlan(
        src=pattern.url,
        dest=dest,
        store=profile.name if profile else None,
        objects=tuple(objects),
        total_bytes=total,
        nodes=tuple(ests),
        numworkers=numworkers or settings.numworkers,
        concurrency=concurrency or settings.concurrency,
        part_size_mib=part_size_mib or settings.part_size_mib,
        endpoint_url=profile.endpoint_url if profile else None,
        region=profile.region if profile else None,
        profile=profile.profile if profile else None,
        egress=decision,
        egress_note=note,
        credentials=creds,
    )
    return with_fanout(
        config, guard(), plan, profile, fanout=mode, seeds=seeds, degree=degree, allow_over_budget=allow_over_budget
    )
