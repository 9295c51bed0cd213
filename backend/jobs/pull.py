"""``loadmaster pull``: copy s3:// objects into a directory on nodes with s5cmd, as durable jobs.

This is the console side: :func:`plan_pull` lists the source for object count, bytes and ETags
(refusing any key that would land outside DEST), probes each node's free space, NIC line rate and
s5cmd, and prices the egress; :func:`launch_pull` then starts one job per node. The job itself runs
on the node (:mod:`backend.jobs.pull_runner`); both sides share :mod:`backend.jobs.pull_objects`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.credentials import Credentials
from backend.errors import (
    ConfigError,
    JobError,
    LoadmasterError,
    NodeUnreachable,
    StoreError,
)
from backend.jobs.pull_objects import (
    CREDS_FILE,
    CREDS_PROFILE,
    PulledObject,
    SourcePattern,
    check_objects,
    is_folder_marker,
    parse_s5cmd_listing,
    parse_source,
    s5cmd_error,
)
from backend.jobs.settings import JobSettings
from backend.units import bytes_text

# What only some commands need (asyncio, the S3 client, the ledger) is imported where it is used.
if TYPE_CHECKING:
    from backend.config import Config, StoreProfile
    from backend.jobs.manager import JobManager
    from backend.jobs.records import JobRecord
    from backend.services import Services

log = logging.getLogger(__name__)

#: Presets offered by the console and ``--preset``: (numworkers, concurrency, part size MiB).
PRESETS: dict[str, tuple[int, int, int]] = {
    "tuned": (256, 32, 64),  # the brief's tuned command: many objects, big parts
    "large-objects": (64, 64, 128),  # few multi-GB objects: parallelism inside each object
    "small-objects": (512, 4, 8),  # millions of small shards: parallelism across objects
    "gentle": (32, 8, 64),  # share the NIC with a running training job
}


@dataclass(frozen=True)
class NodeEstimate:
    """One destination node's pre-launch facts."""

    node: str
    dest: str
    free_bytes: int | None = None
    present_bytes: int = 0
    line_rate_gbps: float | None = None
    line_rate_known: bool = False
    s5cmd: bool = False
    error: str | None = None
    #: The destination directory already exists (files in it may count as present).
    dest_exists: bool = False
    #: The node's own addresses and the TCP ports listening there (for a relay's peers).
    addresses: tuple[str, ...] = ()
    listening: frozenset[int] = frozenset()
    #: False for a relay receiver: its data comes from a peer, not from s5cmd.
    needs_s5cmd: bool = True

    def needed(self, total: int) -> int:
        return max(0, total - self.present_bytes)

    def fits(self, total: int) -> bool:
        return self.error is None and self.free_bytes is not None and self.needed(total) <= self.free_bytes

    def eta_s(self, total: int) -> float | None:
        if not self.line_rate_gbps:
            return None
        return self.needed(total) * 8 / (self.line_rate_gbps * 1e9)

    def problem(self, total: int) -> str | None:
        """Why this node cannot take the pull, or None."""
        if self.error:
            return self.error
        if not self.s5cmd and self.needs_s5cmd:
            return f"{self.node}: s5cmd is not installed on the node (install it or set [jobs] s5cmd)"
        if not self.fits(total):
            return (
                f"{self.node}: {self.dest} has {bytes_text(self.free_bytes or 0)} free but the pull needs "
                f"{bytes_text(self.needed(total))}"
            )
        return None


@dataclass(frozen=True)
class PullPlan:
    """Everything shown before a pull starts: what, where, how big, whether it fits, what it costs."""

    src: str
    dest: str
    store: str | None
    objects: tuple[PulledObject, ...]
    total_bytes: int
    nodes: tuple[NodeEstimate, ...]
    numworkers: int
    concurrency: int
    part_size_mib: int
    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    egress: Any = None  # backend.policy.egress.GuardDecision when the guard is available
    egress_note: str | None = None
    #: The store's resolved credentials for the jobs' secrets files (never shown or serialised).
    credentials: Any = field(default=None, repr=False, compare=False)
    #: ``direct`` (every node from the store), ``relay`` or ``relay-ssh`` (seeds from the store).
    fanout: str = "direct"
    #: Who feeds whom (backend.relay.planner.RelayTopology) for a relay, else None.
    topology: Any = None
    #: node -> (address, port) its relay listens on.
    relay_listen: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: What the store would send (bytes, $) to every node directly, and what it sends in this plan.
    direct_cost: tuple[int, float | None] | None = None
    store_cost: tuple[int, float | None] | None = None
    #: Why the fan-out is what it is (auto's choice), one line.
    fanout_note: str = ""
    #: Problems of the plan as a whole (no seed at a site, no relay address), one line each.
    plan_problems: tuple[str, ...] = ()

    @property
    def problems(self) -> list[str]:
        return [*self.plan_problems, *(p for n in self.nodes if (p := n.problem(self.total_bytes)))]

    @property
    def store_nodes(self) -> list[str]:
        """The nodes the store sends the data to: every node, or a relay's seeds."""
        if self.topology is None:
            return [n.node for n in self.nodes]
        return list(self.topology.seeds)

    @property
    def saved_usd(self) -> float | None:
        if self.direct_cost is None or self.store_cost is None:
            return None
        if self.direct_cost[1] is None or self.store_cost[1] is None:
            return None
        return max(0.0, self.direct_cost[1] - self.store_cost[1])

    @property
    def eta_s(self) -> float | None:
        etas = [e for n in self.nodes if (e := n.eta_s(self.total_bytes)) is not None]
        return max(etas) if etas else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "src": self.src,
            "dest": self.dest,
            "store": self.store,
            "objects": len(self.objects),
            "bytes": self.total_bytes,
            "numworkers": self.numworkers,
            "concurrency": self.concurrency,
            "part_size_mib": self.part_size_mib,
            "eta_s": self.eta_s,
            "problems": self.problems,
            "nodes": [
                {
                    "node": n.node,
                    "dest": n.dest,
                    "free_bytes": n.free_bytes,
                    "fits": n.fits(self.total_bytes),
                    "line_rate_gbps": n.line_rate_gbps,
                    "line_rate_known": n.line_rate_known,
                    "eta_s": n.eta_s(self.total_bytes),
                    "error": n.error,
                }
                for n in self.nodes
            ],
            "egress": self.egress.as_dict() if self.egress is not None and hasattr(self.egress, "as_dict") else None,
            "egress_note": self.egress_note,
            "fanout": self.fanout,
            "fanout_note": self.fanout_note,
            "relay": None
            if self.topology is None
            else {
                "seeds": list(self.topology.seeds),
                "parent": dict(self.topology.parent),
                "listen": {k: list(v) for k, v in self.relay_listen.items()},
            },
            "store_bytes": self.store_cost[0] if self.store_cost else None,
            "store_usd": self.store_cost[1] if self.store_cost else None,
            "direct_bytes": self.direct_cost[0] if self.direct_cost else None,
            "direct_usd": self.direct_cost[1] if self.direct_cost else None,
            "saved_usd": self.saved_usd,
        }


def node_dest(dest: str, scratch: str) -> str:
    """DEST as the node sees it: absolute, ``~/...``, or relative to the node's scratch dir."""
    if dest.startswith("/") or dest.startswith("~"):
        return dest.rstrip("/") or "/"
    return f"{scratch.rstrip('/')}/{dest.strip('/')}"


_PROBE = r"""
D="$1"; case "$D" in "~"*) D="$HOME${D#\~}";; esac
d="$D"; while [ ! -d "$d" ]; do d=$(dirname "$d"); done
echo "@@DF $(df -Pk "$d" | tail -n 1 | awk '{print $4}')"
for i in /sys/class/net/*; do [ -e "$i/device" ] && echo "@@SPEED $(cat "$i/speed" 2>/dev/null)"; done
command -v "$2" >/dev/null 2>&1 && echo "@@S5CMD 1"
present=0
[ -d "$D" ] && echo "@@DEST 1"
if [ -d "$D" ]; then
  while IFS= read -r f; do [ -f "$D/$f" ] && present=$((present + $(stat -c %s "$D/$f"))); done
fi
echo "@@PRESENT $present"
for a in $( (ip -o addr show 2>/dev/null | awk '{print $4}'; hostname -I 2>/dev/null) ); do echo "@@ADDR ${a%/*}"; done
awk 'FNR > 1 && $4 == "0A" { n = split($2, a, ":"); print "@@LISTEN " a[n] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
"""


async def probe_node(transport: Any, dest: str, rels: list[str], s5cmd: str) -> NodeEstimate:
    """Free space at ``dest``, NIC line rate, s5cmd presence and bytes already there, on one node."""
    res = await transport.run(
        f"sh -c {shlex.quote(_PROBE)} probe {shlex.quote(dest)} {shlex.quote(s5cmd)}",
        input="\n".join(rels) + "\n",
        timeout=120,
    )
    free = None
    speeds: list[int] = []
    s5 = False
    present = 0
    dest_exists = False
    addrs: list[str] = []
    listening: set[int] = set()
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
        elif tag == "@@LISTEN":
            with contextlib.suppress(ValueError):
                listening.add(int(v, 16))
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
        listening=frozenset(listening),
    )


def resolve_store(config: Config, src: str, store: str | None) -> StoreProfile | None:
    """The store profile that supplies endpoint, region and credentials for ``src``."""
    if store:
        prof = config.store(store)
        if not prof.is_s3:
            raise ConfigError(f"store {store!r} is a local directory; pull needs an s3:// store")
        return prof
    return config.store_for_url(src)


def _console_s5cmd() -> str | None:
    """s5cmd on the console machine: the console's own install first, else PATH."""
    import shutil
    import sys

    own = Path(sys.executable).parent / "s5cmd"
    return str(own) if own.exists() else shutil.which("s5cmd")


def _botocore_credentials(profile: StoreProfile | None) -> Credentials:
    """The store's credentials through botocore's own chain (no aiohttp client: cheap to import)."""
    import botocore.session

    session = botocore.session.Session()
    if profile and profile.profile:
        session.set_config_variable("profile", profile.profile)
    creds = session.get_credentials()
    if creds is None:
        raise StoreError("no credentials")
    frozen = creds.get_frozen_credentials()
    return Credentials(frozen.access_key, frozen.secret_key, frozen.token)


async def _list_with_s5cmd(
    src: SourcePattern, profile: StoreProfile | None, s5cmd: str
) -> tuple[list[PulledObject], Credentials] | None:
    """List with the tool and flags the job copies with, under the credentials it will get.

    None when anything goes wrong (or nothing matches): the caller then lists through the
    S3 client, which either succeeds or says precisely what to fix.
    """
    import asyncio

    from backend.jobs.awscreds import static_credentials

    # Plain keys are read directly (no botocore import in the way of spawning the listing);
    # anything else goes through botocore's own chain.
    creds = static_credentials(profile.profile if profile and profile.profile else None)
    if creds is None:
        try:
            creds = await asyncio.to_thread(_botocore_credentials, profile)
        except Exception:  # noqa: BLE001 - the client path reports credential problems properly
            return None
    log.debug("credentials resolved")
    env = dict(os.environ)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(k, None)
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    if profile and profile.region and profile.region != "auto":
        env["AWS_REGION"] = profile.region
    cmd = [s5cmd, "--json"]
    if profile and profile.endpoint_url:
        cmd += ["--endpoint-url", profile.endpoint_url]
    cmd += ["ls", src.url]
    with tempfile.TemporaryDirectory(prefix="lm-ls-") as d:  # 0700; the file inside is 0600
        path = Path(d) / CREDS_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(creds.shared_credentials_file(CREDS_PROFILE))
        env["AWS_SHARED_CREDENTIALS_FILE"] = str(path)
        env["AWS_PROFILE"] = CREDS_PROFILE
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(), 600)
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                raise
        except (OSError, TimeoutError):
            return None
    if proc.returncode != 0 or any(map(s5cmd_error, err.decode(errors="replace").split("\n"))):
        return None
    text = out.decode(errors="surrogateescape")
    for line in text.split("\n"):
        if line.strip():
            try:
                if json.loads(line).get("error"):
                    return None
            except ValueError:
                return None
    objects = parse_s5cmd_listing(src, text)
    return (objects, creds) if objects else None


async def list_source(
    src: SourcePattern, profile: StoreProfile | None, *, credentials: bool = False
) -> tuple[list[PulledObject], Credentials | None]:
    """Every object the source matches (where it lands under DEST, size, ETag), and optionally
    the credentials the same client used (for the jobs' secrets files). A key that would land
    outside DEST refuses the whole listing."""
    if credentials and src.pattern is not None and (s5cmd := _console_s5cmd()) is not None:
        # s5cmd (Go) lists in a fraction of the time it takes to import and set up the Python S3
        # client, and runs beside the node connections on another core.
        fast = await _list_with_s5cmd(src, profile, s5cmd)
        if fast is not None:
            log.debug("listed with %s", s5cmd)
            check_objects(src, fast[0])
            return fast
    from backend.storage import S3Store

    store = S3Store(f"s3://{src.bucket}", profile)
    try:
        sub = src.base.rstrip("/") if src.pattern is not None else src.base
        if src.pattern is None:
            info = await store.stat(src.base)
            if info is None:
                raise StoreError(f"{src.url}: no such object (for everything under a prefix end it with '/')")
            objects = [PulledObject(src.rel(src.base), info.size, info.etag or None)]
        else:
            objs = await store.list(sub)
            objects = [
                PulledObject(src.rel(o.key), o.size, o.etag or None)
                for o in objs
                if src.matches(o.key) and not is_folder_marker(o.key, o.size)
            ]
        check_objects(src, objects)
        creds = await store.credentials() if credentials else None
        return objects, creds
    finally:
        await store.close()


async def plan_pull(
    services: Services,
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
) -> PullPlan:
    """List the source, probe each node and price the egress: the plan shown before launch."""
    import asyncio

    config = services.config
    settings = config.section(JobSettings)
    pattern = parse_source(src)
    profile = resolve_store(config, src, store)
    mode = fanout

    async def early(t: Any) -> NodeEstimate:
        n = config.node(t.name)
        est = await probe_node(t, node_dest(dest, n.scratch), [], node_s5cmd(n, settings.s5cmd))
        log.debug("plan: %s connected and probed", t.name)
        return est

    # Connecting to and probing the nodes overlaps the listing. A node whose destination does not
    # exist yet has nothing present, so that first probe is its whole answer; the others (and any
    # node that failed) are probed again below with the object names, to count what is there.
    log.debug("plan: listing + connecting")

    # The egress quote needs only the listing's total, so it is priced while the nodes answer.
    async def list_and_price() -> tuple[list[PulledObject], Credentials | None, Any, str | None]:
        objects, creds = await list_source(pattern, profile, credentials=True)
        if not objects:
            return objects, creds, None, None
        decision, note = egress_check(
            services,
            profile,
            [config.node(n) for n in nodes],
            sum(o.size for o in objects),
            len(objects),
            allow_over_budget,
            src,
        )
        log.debug("plan: egress priced")
        _ = services.jobs  # the launch needs the job manager: import and set it up while waiting too
        return objects, creds, decision, note

    # The listing subprocess is spawned first, so it runs while this process imports the SSH
    # stack and connects (both CPU-bound here).
    listing = asyncio.ensure_future(list_and_price())
    await asyncio.sleep(0)
    try:
        probing = services.pool.fanout(early, nodes, timeout=120)
    except BaseException:
        listing.cancel()
        raise
    # A listing error (no such bucket, bad credentials) is raised at once, as before.
    (objects, creds, decision, note), first = await asyncio.gather(listing, probing)
    log.debug("plan: listed %d objects, connected", len(objects))
    if not objects:
        raise StoreError(f"no objects match {src}")
    total = sum(o.size for o in objects)
    rels = [o.rel for o in objects] if len(objects) <= settings.max_spec_objects else []

    async def probe(t: Any) -> NodeEstimate:
        n = config.node(t.name)
        return await probe_node(t, node_dest(dest, n.scratch), rels, node_s5cmd(n, settings.s5cmd))

    # A node that could not be reached at all is not probed again: in a one-shot command the
    # second try only meets the connection backoff ("next retry in 0.9s") and says nothing new.
    again = [
        n
        for n in nodes
        if not isinstance(first[n], NodeUnreachable)
        and (isinstance(first[n], BaseException) or first[n].error or (first[n].dest_exists and rels))
    ]
    probes = {**first, **(await services.pool.fanout(probe, again, timeout=120) if again else {})}
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
        services, plan, profile, fanout=mode, seeds=seeds, degree=degree, allow_over_budget=allow_over_budget
    )


# ---- fan-out: direct or relay --------------------------------------------------------------------


def egress_costs(
    services: Services, profile: StoreProfile | None, nodes: list[Any], total: int, objects: int, src: str = ""
) -> tuple[int, float | None]:
    """(bytes, $) the store sends when each of ``nodes`` takes ``total`` bytes from it ($ None
    when any route is unpriced)."""
    guard = services.egress
    prof = profile or egress_profile(services.config, None, src)
    by_site: dict[str | None, int] = {}
    for n in nodes:
        by_site[n.site] = by_site.get(n.site, 0) + 1
    usd: float | None = 0.0
    for site, count in by_site.items():
        q = guard.quote_transfer(prof, site, total * count, objects=objects * count)
        usd = None if usd is None or q.total_usd is None or not q.priced else usd + q.total_usd
    return total * len(nodes), usd


def _relay_address(node: Any, est: NodeEstimate, network: str) -> str:
    """Where a node's relay listens: its configured host's address, or its own address in ``network``."""
    import ipaddress
    import socket

    if network == "host":
        if node.transport == "local":
            raise ConfigError(f"{node.name}: a local node has no cluster address; relay needs SSH nodes")
        try:
            infos = socket.getaddrinfo(node.host, None, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ConfigError(
                f"{node.name}: cannot resolve {node.host} for the relay ({exc}); set [jobs] relay_network"
            ) from None
        return str(infos[0][4][0])
    net = ipaddress.ip_network(network, strict=False)
    for a in est.addresses:
        with contextlib.suppress(ValueError):
            if ipaddress.ip_address(a) in net:
                return a
    raise ConfigError(
        f"{node.name}: no address in {network} (it has {', '.join(est.addresses) or 'none'}); "
        "fix [jobs] relay_network or pull with --fanout direct"
    )


def _relay_port(est: NodeEstimate, ports: str, rng: Any) -> int:
    from backend.jobs.settings import port_range

    lo, hi = port_range(ports)
    free = [p for p in range(lo, hi + 1) if p not in est.listening]
    if not free:
        raise ConfigError(f"{est.node}: every port of [jobs] relay_ports ({ports}) is in use; widen the range")
    return int(rng.choice(free))


def with_fanout(
    services: Services,
    plan: PullPlan,
    profile: StoreProfile | None,
    *,
    fanout: str | None,
    seeds: int | None,
    degree: int | None,
    allow_over_budget: str | None,
) -> PullPlan:
    """The plan with its fan-out chosen: direct, or a relay (topology, addresses, seeds' egress)."""
    import dataclasses
    import random

    from backend.jobs.settings import FANOUTS

    config = services.config
    settings = config.section(JobSettings)
    mode = fanout or settings.fanout
    if mode not in FANOUTS:
        raise ConfigError(f"--fanout must be one of {', '.join(FANOUTS)}, got {mode!r}")
    cfg_nodes = [config.node(n.node) for n in plan.nodes]
    nobj = len(plan.objects)
    direct = egress_costs(services, profile, cfg_nodes, plan.total_bytes, nobj, plan.src)
    note = ""
    if mode == "auto":
        sites: dict[str | None, int] = {}
        for n in cfg_nodes:
            sites[n.site] = sites.get(n.site, 0) + 1
        shared = max(sites.values(), default=0) > 1
        priced = direct[1] is not None and direct[1] > 0
        mode = "relay" if shared and priced else "direct"
        note = (
            f"auto: relay ({len(cfg_nodes)} nodes take the same data over a priced route)"
            if mode == "relay"
            else "auto: direct ("
            + ("no two nodes share a site" if not shared else "the route has no egress price")
            + ")"
        )
    if mode == "direct":
        return dataclasses.replace(plan, fanout="direct", direct_cost=direct, store_cost=direct, fanout_note=note)
    from backend.relay.planner import PeerNode, plan_topology

    problems: list[str] = []
    usable = [n for n in plan.nodes if n.error is None]
    try:
        topo = plan_topology(
            [PeerNode(n.node, config.node(n.node).site, n.s5cmd) for n in usable],
            seeds=seeds or settings.relay_seeds,
            degree=degree or settings.relay_degree,
        )
    except ConfigError as exc:
        return dataclasses.replace(plan, fanout=mode, plan_problems=(str(exc),), direct_cost=direct, fanout_note=note)
    rng = random.Random()
    listen: dict[str, tuple[str, int]] = {}
    taken: set[int] = set()
    for est in usable:
        try:
            # relay-ssh: nothing listens on the network, only on each node's loopback (the hops
            # come through SSH); the ports differ from node to node (nodes that share a kernel).
            addr = (
                "127.0.0.1"
                if mode == "relay-ssh"
                else _relay_address(config.node(est.node), est, settings.relay_network)
            )
            port = _relay_port(dataclasses.replace(est, listening=est.listening | taken), settings.relay_ports, rng)
            taken.add(port)
            listen[est.node] = (addr, port)
        except ConfigError as exc:
            problems.append(str(exc))
    ests = tuple(dataclasses.replace(n, needs_s5cmd=n.node in topo.seeds) for n in plan.nodes)
    seed_nodes = [config.node(n) for n in topo.seeds]
    decision, enote = egress_check(
        services, profile, seed_nodes, plan.total_bytes, nobj, allow_over_budget, src=plan.src
    )
    return dataclasses.replace(
        plan,
        nodes=ests,
        fanout=mode,
        topology=topo,
        relay_listen=listen,
        egress=decision,
        egress_note=enote or plan.egress_note,
        direct_cost=direct,
        store_cost=egress_costs(services, profile, seed_nodes, plan.total_bytes, nobj, plan.src),
        fanout_note=note,
        plan_problems=tuple(problems),
    )


# ---- EGRESS INTEGRATION POINT ------------------------------------------------------------------
# services.egress (backend.ledger.EgressGuard) prices and decides. A plan carries the guard's
# decision (egress_check); the reservation (budget check and hold in one transaction), the gate and
# the override audit are backend.ops.pull's; the settle of an ended pull is the pull kind's
# on_ended (backend.jobs.pull_runner.PullKind).


def egress_profile(config: Config, store: str | None, src: str) -> StoreProfile:
    """The store profile a pull from ``src`` is priced by: the named store, else the bare bucket."""
    from backend.config import StoreProfile

    if store and store in config.stores:
        return config.stores[store]
    # An unconfigured bucket: quoted as unpriced ([egress] unpriced_action decides).
    return StoreProfile(url=f"s3://{parse_source(src).bucket}", name=f"s3://{parse_source(src).bucket}")


def egress_check(
    services: Services,
    profile: StoreProfile | None,
    nodes: list[Any],
    total: int,
    objects: int,
    allow_over_budget: str | None,
    src: str = "",
) -> tuple[Any, str | None]:
    """The guard's decision for pulling ``total`` bytes to each node (the strictest node decides)."""
    guard = services.egress
    prof = profile or egress_profile(services.config, None, src)
    order = {"allow": 0, "warn": 1, "confirm": 2, "block": 3}
    worst = None
    # Every node receives the whole pull; nodes at the same site are priced together, in sequence.
    by_site: dict[str | None, int] = {}
    for n in nodes:
        by_site[n.site] = by_site.get(n.site, 0) + 1
    for site, count in by_site.items():
        quote = guard.quote_transfer(prof, site, total * count, objects=objects * count)
        dec = guard.check(quote, allow_over_budget_reason=allow_over_budget)
        if worst is None or order.get(dec.action, 0) > order.get(worst.action, 0):
            worst = dec
    return worst, None


# ---- end of egress integration point -----------------------------------------------------------


async def launch_pull(
    services: Services,
    plan: PullPlan,
    *,
    label: str = "",
    job_ids: dict[str, str] | None = None,
    upstreams: dict[str, list[list[Any]]] | None = None,
) -> list[JobRecord]:
    """Start one pull job per node of the plan (credentials via each job's 0600 secrets file).

    ``job_ids`` (node -> id) are the ids the egress reservations were made under; a node whose job
    does not start has its reservation, and those of the nodes after it, released.
    """
    if plan.problems:
        raise JobError("; ".join(plan.problems))
    if plan.topology is not None:
        return await launch_relay(services, plan, label=label, job_ids=job_ids, upstreams=upstreams)
    creds = await _plan_credentials(services, plan)
    secrets = creds.as_env()
    settings = services.config.section(JobSettings)
    expected = [list(o) for o in plan.objects] if len(plan.objects) <= settings.max_spec_objects else None
    manager: JobManager = services.jobs
    out = []
    ids = job_ids or {}
    for i, est in enumerate(plan.nodes):
        params = {**_pull_params(services, plan, est), "expected": expected}
        try:
            out.append(
                await manager.launch(
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
                    services.egress.release(ids[later.node], f"not started: {type(exc).__name__}: {exc}"[:300])
            raise
    return out


async def _relay_checksums(services: Services, plan: PullPlan) -> list[str | None]:
    """The store's full-object checksum of each listed object, for the receivers' proofs (they hold
    no credentials and take nothing from a peer on trust): one HEAD per object with ChecksumMode,
    a few at a time (``backend.relay.checksums``); None where the store keeps none."""
    from backend.relay.checksums import listing_checksums
    from backend.storage import S3Store

    pattern = parse_source(plan.src)
    store = S3Store(f"s3://{pattern.bucket}", services.config.stores.get(plan.store) if plan.store else None)
    try:
        return await listing_checksums(store, [pattern.key_of(o.rel) for o in plan.objects])
    finally:
        await store.close()


async def _plan_credentials(services: Services, plan: PullPlan) -> Credentials:
    creds = plan.credentials
    if creds is None:
        from backend.storage import S3Store

        store = S3Store(
            f"s3://{parse_source(plan.src).bucket}", services.config.stores.get(plan.store) if plan.store else None
        )
        try:
            creds = await store.credentials()
        finally:
            await store.close()
    return creds  # type: ignore[no-any-return]


def _pull_params(services: Services, plan: PullPlan, est: NodeEstimate) -> dict[str, Any]:
    settings = services.config.section(JobSettings)
    return {
        "src": plan.src,
        "dest": est.dest,
        "store": plan.store,
        "endpoint_url": plan.endpoint_url,
        "region": plan.region,
        "numworkers": plan.numworkers,
        "concurrency": plan.concurrency,
        "part_size_mib": plan.part_size_mib,
        "s5cmd": node_s5cmd(services.config.node(est.node), settings.s5cmd),
        "bytes_total": plan.total_bytes,
        "objects_total": len(plan.objects),
    }


async def launch_relay(
    services: Services,
    plan: PullPlan,
    *,
    label: str = "",
    job_ids: dict[str, str] | None = None,
    upstreams: dict[str, list[list[Any]]] | None = None,
) -> list[JobRecord]:
    """Start one "relay" job per node, parents before children: seeds get the store's credentials
    and the relay secret, receivers the relay secret alone (each in its job's 0600 secrets file).
    ``upstreams`` (relay-ssh: the console's forwarded loopback ports) replaces where each node
    finds the nodes above it."""
    from backend.jobs.records import new_job_id
    from backend.relay.planner import seed_flags
    from backend.relay.protocol import SECRET_ENV, new_secret

    topo = plan.topology
    settings = services.config.section(JobSettings)
    creds = await _plan_credentials(services, plan)
    secret = new_secret()
    ids = dict(job_ids or {})
    for est in plan.nodes:
        ids.setdefault(est.node, new_job_id())
    group = "relay-" + ids[topo.seeds[0]]
    by_name = {n.node: n for n in plan.nodes}
    order = sorted(by_name, key=lambda n: len(topo.chain(n)))
    expected = [list(o) for o in plan.objects]
    checksums = await _relay_checksums(services, plan)
    manager: JobManager = services.jobs
    out = []
    for i, name in enumerate(order):
        est = by_name[name]
        seed = name in topo.seeds
        relay = {
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
            "max_gbps": settings.relay_max_gbps,
            "checksums": checksums,
        }
        params = {**_pull_params(services, plan, est), "expected": expected, "relay": relay}
        if seed:
            nw, cc, ps = seed_flags(
                plan.total_bytes, len(plan.objects), plan.numworkers, plan.concurrency, plan.part_size_mib
            )
            params.update(numworkers=nw, concurrency=cc, part_size_mib=ps)
        secrets = {SECRET_ENV: secret, **(creds.as_env() if seed else {})}
        try:
            out.append(
                await manager.launch(
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
                    services.egress.release(job_ids[later], f"not started: {type(exc).__name__}: {exc}"[:300])
            raise
    return out


def node_s5cmd(node: Any, configured: str) -> str:
    """The s5cmd a node's job runs: as configured, except that this machine (a local node) with
    the default ``s5cmd`` not on PATH runs the one installed beside loadmaster."""
    if getattr(node, "transport", None) == "local" and configured == "s5cmd":
        from backend.config import installed_s5cmd

        return installed_s5cmd()
    return configured


__all__ = [
    "PRESETS",
    "NodeEstimate",
    "PullPlan",
    "egress_check",
    "egress_costs",
    "launch_pull",
    "launch_relay",
    "list_source",
    "node_dest",
    "node_s5cmd",
    "plan_pull",
    "probe_node",
    "resolve_store",
    "with_fanout",
]
