"""Job kind "relay": one node of a relay pull, seed or receiver (launched by :mod:`backend.pulls.plan`).

A seed runs the direct pull's runner (:func:`backend.pulls.job.run_pull_job`: s5cmd, the
same checks and the same verification) and serves each object to its children as soon as s5cmd
has it in place. A receiver makes the same checks of DEST (paths, symlinks, free space), receives
from its upstream (:class:`backend.pulls.relay.node.Receiver`) and serves its own children while it
receives. Either ends once its copy is verified and every child is done (or gone longer than the
grace, to be retried by the console). The job's spec names its role, listen address, upstreams
(nearest first) and children; the relay secret comes in its 0600 secrets file.

Node side: imports nothing of the console's (``on_ended`` imports the ledger when it runs).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from backend.agent.context import JobContext
from backend.errors import JobError, StoreError
from backend.pulls.destination import TempTracker, check_space, outside_dest
from backend.pulls.job import CopyHooks, PullKind, cleanup, run_pull_job
from backend.pulls.objects import PulledObject, check_objects, parse_expected, parse_source
from backend.pulls.relay.node import (
    SILENCE_S,
    Cancelled,
    FatalUpstream,
    Holdings,
    Receiver,
    RelayServer,
    Upstream,
    listing_digest,
    receiver_proofs,
)
from backend.pulls.relay.protocol import SECRET_ENV

if TYPE_CHECKING:
    from backend.config import Config
    from backend.jobs.records import JobRecord
    from backend.state import StateDB


class _SeedHooks(CopyHooks):
    def __init__(self, holdings: Holdings, server: RelayServer) -> None:
        self.h = holdings
        self.server = server

    def object_done(self, index: int, obj: PulledObject) -> None:
        self.h.publish(index, obj.size, self.h.dest / obj.rel, complete=True)

    def progress_extra(self) -> dict[str, object]:
        return {"role": "seed", "upstream": None, "served": self.server.served()}


def _checked_objects(ctx: JobContext, dest: Path) -> list[PulledObject]:
    """The spec's objects, refused again here like a direct pull's (keys, symlinks, space)."""
    p = ctx.params
    src = parse_source(str(p["src"]))
    expected = parse_expected(p["expected"])
    try:
        check_objects(src, expected)
    except StoreError as exc:
        raise JobError(str(exc)) from None
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise JobError(f"cannot create destination {dest}: {exc.strerror}") from None
    escaped = outside_dest(dest, expected)
    if escaped:
        rel, why = escaped[0]
        raise JobError(f"refusing to write {dest / rel}: it {why}; nothing was pulled")
    check_space(dest, expected, sum(o.size for o in expected), ctx)
    return expected


def run_relay_job(ctx: JobContext) -> dict[str, object]:
    p = ctx.params
    r = p["relay"]
    role, me, group = str(r["role"]), str(r["node"]), str(r["group"])
    dest = Path(os.path.expanduser(str(p["dest"])))
    secret = ctx.secret_env().get(SECRET_ENV)
    if not secret:
        raise JobError("the relay secret is missing from the job's secrets file; launch the pull again")
    if not isinstance(p.get("expected"), list) or not p["expected"]:
        raise JobError("a relay job's spec must list its objects")
    # The server comes up before the checks of DEST, so a node that refuses its DEST can tell its
    # children at once (they re-attach above it) instead of leaving them to wait for it.
    expected = parse_expected(p["expected"])
    total = sum(o.size for o in expected)
    digest = listing_digest(expected)
    h = Holdings(dest, expected)
    addr, port = str(r["listen"][0]), int(r["listen"][1])
    server = RelayServer(
        h,
        ctx,
        secret=secret,
        group=group,
        listen=(addr, port),
        planned=[str(c) for c in r.get("children", [])],
        chunk_size=int(r.get("chunk_mib", 4)) << 20,
        grace_s=float(r.get("grace_s", 15.0)),
        max_bps=float(r.get("max_gbps", 0.0)) * 1e9 / 8,
    )
    server.start()
    ctx.log(f"relay {role}: listening on {addr}:{port} for {', '.join(r.get('children', [])) or 'no planned child'}")
    recv: Receiver | None = None
    started = time.time()
    stop_progress = threading.Event()
    details: dict[str, object] = {}
    try:
        if role == "seed":
            details = run_pull_job(ctx, _SeedHooks(h, server))
        else:
            _checked_objects(ctx, dest)
            TempTracker.snapshot(dest, expected, ctx.job_dir)
            ups = [Upstream(str(n), str(a), int(pt)) for n, a, pt in r["upstreams"]]
            recv = Receiver(
                h,
                ctx,
                secret=secret,
                group=group,
                me=me,
                upstreams=ups,
                reattach_s=float(r.get("reattach_s", 60.0)),
                silence_s=float(r.get("silence_s", SILENCE_S)),
                chain_len=int(r.get("chain_len", len(ups))),
                # The store's full-object checksums where the console listed them (HEAD with
                # checksum mode), one per object; else the MD5 ETags of single-part objects.
                # A multipart object without one: its ETag over the part size the console read.
                proofs=receiver_proofs(expected, r.get("checksums"), r.get("part_sizes")),
            )
            recv.on_done_below = server.done_elsewhere
            threading.Thread(
                target=_report, args=(ctx, h, recv, server, stop_progress), name="relay-progress", daemon=True
            ).start()
            recv.prepare_empty()
            recv.run()
            _verify_receiver(h, recv, digest)
            recv.watch()
            elapsed = time.time() - started
            details = {
                "objects": len(expected),
                "bytes": total,
                "seconds": round(elapsed, 3),
                "dest": str(dest),
                "gbps": round(total * 8 / 1e9 / max(elapsed, 1e-6), 3),
                # Every byte by SHA-256 on each hop; each object here against the listing's
                # full-object checksum, else a single-part object's MD5 (the seed checked its
                # copy against a fresh listing too).
                "md5_verified": recv.md5_verified,
                "verification": dict(sorted(recv.verified.items())),
            }
        md5_verified = details.get("md5_verified", 0)  # a count, from the seed's copy or this receiver's
        h.finish(
            {
                "by": me,
                "listing": digest,
                "objects": len(expected),
                "bytes": total,
                "md5_verified": md5_verified if isinstance(md5_verified, int) else 0,
            }
        )
        server.ready_at = time.time()
        ctx.log(f"relay: copy verified ({len(expected)} objects); serving until every child is done")
        while not server.subtree_done():
            if ctx.cancelled:
                raise Cancelled("cancelled")
            _progress(ctx, h, recv, server, total)
            # Woken at once when a child is done or leaves; the grace of a child that left is
            # measured by the same wake-ups.
            server.changed.wait(0.5)
            server.changed.clear()
        if recv is not None:
            recv.send({"t": "done"})
        abandoned = server.abandoned()
        if abandoned:
            ctx.log(
                f"relay: {', '.join(abandoned)} went away before finishing here "
                "(re-attached to another node, or died: the console retries those)"
            )
    except BaseException as exc:
        if ctx.cancelled or isinstance(exc, Cancelled):
            ctx.request_cancel()
            h.cancel()
            if recv is not None:
                recv.send({"t": "cancel"})
        else:
            msg = str(exc) if isinstance(exc, JobError) else f"{type(exc).__name__}: {exc}"
            h.fail(("seed: " if role == "seed" else "") + msg, fatal=role == "seed" or isinstance(exc, FatalUpstream))
        _let_children_hear(server)
        if recv is not None:
            recv.remove_temps()
        raise
    finally:
        stop_progress.set()
        server.stop()
        if recv is not None:
            recv.close()
    _progress(ctx, h, recv, server, total, final=True)
    details["relay"] = {
        "role": role,
        "upstream": recv.upstream if recv else None,
        "store_bytes": total if role == "seed" else 0,
        "peer_bytes": 0 if role == "seed" else total,
        "served": server.served(),
        "attachments": recv.attachments if recv else [],
        "abandoned": server.abandoned(),
    }
    return details


def _verify_receiver(h: Holdings, recv: Receiver, digest: str) -> None:
    """The upstream's copy was verified against the same listing; ours has every byte, in place."""
    end = recv.end or {}
    if end.get("listing") != digest:
        raise JobError(
            f"upstream {recv.upstream} verified a different listing of the source (changed during the pull?)"
        )
    bad = []
    for o in h.objects:
        try:
            size = (h.dest / o.rel).stat().st_size
        except OSError:
            bad.append(f"{o.rel} missing")
            continue
        if size != o.size:
            bad.append(f"{o.rel} is {size} bytes, the listing says {o.size}")
    if bad:
        for o in h.objects:
            with contextlib.suppress(OSError):
                if (h.dest / o.rel).stat().st_size != o.size:
                    (h.dest / o.rel).unlink()
        raise JobError(f"verification failed: {len(bad)} of {len(h.objects)} objects wrong (removed): {bad[0]}")


def _let_children_hear(server: RelayServer, wait_s: float = 5.0) -> None:
    """Keep serving a moment after a cancel or a failure, so every child hears it: those connected
    now, and planned ones not attached yet (their jobs may still be starting)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with server.lock:
            told = all(st.gone_at is not None or st.done for st in server.children.values())
            if told and not any(st.connected for st in server.children.values()):
                return
        server.changed.wait(0.1)
        server.changed.clear()


def _progress(
    ctx: JobContext, h: Holdings, recv: Receiver | None, server: RelayServer, total: int, *, final: bool = False
) -> None:
    extra: dict[str, object] = {
        "role": "receiver" if recv else "seed",
        "upstream": recv.upstream if recv else None,
        "served": server.served(),
        "rate_bps": recv.rate_bps() if recv else 0.0,
    }
    if final:
        extra["final"] = True
    done = h.bytes_done if recv else total
    ctx.progress(bytes_done=done, bytes_total=total, items_done=h.items_done, items_total=len(h.objects), **extra)


def _report(ctx: JobContext, h: Holdings, recv: Receiver, server: RelayServer, stop: threading.Event) -> None:
    total = sum(h.sizes)
    while not stop.wait(0.5):
        if all(h.complete):
            return
        _progress(ctx, h, recv, server, total)


class RelayKind(PullKind):
    """Kind "relay": :func:`run_relay_job` on the node, the direct pull's cleanup of partial files;
    on the console, a seed settles its egress reservation like a direct pull (the store sent it
    the data) and a receiver records what fan-out saved (nothing came from the store)."""

    name = "relay"

    def run(self, ctx: JobContext) -> dict[str, object]:
        return run_relay_job(ctx)

    def cleanup(self, ctx: JobContext) -> None:
        cleanup(ctx)

    def on_ended(self, config: Config, db: StateDB, record: JobRecord) -> None:
        relay = record.params.get("relay") or {}
        if relay.get("role") == "seed":
            super().on_ended(config, db, record)
            return
        from backend.pulls.relay.savings import record_receiver

        record_receiver(config, db, record)


JOB_KIND = RelayKind()
