"""``loadmaster shard SRC DEST`` (pack small files into WebDataset shards) and ``shard verify DEST``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from backend.config import StoreProfile
from backend.errors import ConfigError
from backend.ops import Operations
from backend.ops.shards import ShardProgress, ShardRequest, Shards, ShardSettings
from backend.services import Services
from backend.textfmt import safe_text
from backend.units import bytes_text
from tui.cli.argtypes import size_arg

USAGE = (
    "loadmaster shard SRC DEST [--shard-size 512MB] [--pattern shard-%06d.tar] [--node NAME] "
    "[--shuffle SEED] [--workers N] [--overwrite | --resume] [--incomplete error|skip|keep] "
    "[--allow-over-budget REASON] [--dry-run] [--json]\n       loadmaster shard verify DEST [--json]"
)


def register(sub: Any) -> None:
    """Add the ``shard`` command."""
    p = sub.add_parser(
        "shard",
        usage=USAGE.replace("%", "%%"),
        help="pack many small files into WebDataset tar shards (or verify shards)",
        description="Pack a directory or s3:// prefix of small files into deterministic WebDataset tar "
        "shards with a manifest (sizes, BLAKE3 digests, GETs saved), locally or as a job on a node. "
        "'shard verify DEST' reads shards back with webdataset and checks them against the manifest.",
    )
    p.add_argument("paths", nargs="+", metavar="SRC DEST", help="source and destination (dir or s3://)")
    p.add_argument(
        "--shard-size", type=size_arg, metavar="SIZE", help="target shard size (default 512MB; 256MB-1GB advised)"
    )
    p.add_argument("--pattern", help="shard file name pattern (default shard-%%06d.tar)")
    p.add_argument("--node", metavar="NAME", help="run the conversion as a durable job on this node")
    p.add_argument(
        "--allow-over-budget",
        metavar="REASON",
        help="with --node and an s3:// source: start although the egress guard asks for confirmation "
        "(recorded with REASON)",
    )
    p.add_argument("--shuffle", type=int, metavar="SEED", help="shuffle sample order with this seed")
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="threads reading local files once reads wait on I/O (default 4; 0 reads and hashes in the writer thread)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace shards already in DEST")
    p.add_argument("--resume", action="store_true", help="continue an interrupted conversion")
    p.add_argument(
        "--incomplete",
        choices=("error", "skip", "keep"),
        default="error",
        help="samples missing a file most samples have: refuse (default), leave out, or keep",
    )
    p.add_argument("--dry-run", action="store_true", help="preview sample/shard counts and GET savings only")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_shard)


def _location(shards: Shards, text: str) -> tuple[str, StoreProfile | None]:
    return shards.location(text)


def _request(args: argparse.Namespace, services: Services, src: str, dest: str) -> ShardRequest:
    return ShardRequest.from_settings(
        services.config.section(ShardSettings),
        src,
        dest,
        shard_size=args.shard_size,
        pattern=args.pattern,
        seed=args.shuffle,
        workers=args.workers,
        overwrite=args.overwrite,
        resume=args.resume,
        incomplete=args.incomplete,
    )


def _progress_printer(enabled: bool) -> Any:
    last = [0.0]

    def show(p: ShardProgress) -> None:
        now = time.monotonic()
        if not enabled or (now - last[0] < 1.0 and not p.final):
            return
        last[0] = now
        print(
            f"\r  shards {p.shards_done}/{p.shards_total}  samples {p.samples_done:,}/{p.samples_total:,}"
            f"  {p.samples_per_s:,.0f} samples/s  {p.mb_per_s:,.1f} MB/s",
            end="\n" if p.final else "",
            file=sys.stderr,
            flush=True,
        )

    return show


async def cmd_shard(args: argparse.Namespace, services: Services) -> int:
    """Convert SRC into shards at DEST (or verify DEST)."""
    if args.paths[0] == "verify" and len(args.paths) == 2:
        return await cmd_verify(args, services)
    if len(args.paths) != 2:
        raise ConfigError(f"expected SRC and DEST (or 'verify DEST'); usage: {USAGE}")
    shards = Operations(services).shards
    (src, _), (dest, _) = (_location(shards, a) for a in args.paths)
    req = _request(args, services, src, dest)
    out = sys.stderr if args.json else sys.stdout
    if args.node:
        if args.dry_run:
            raise ConfigError("--dry-run previews on this machine; drop --node to preview")
        rec = await shards.start_on_node(args.node, req, reason=args.allow_over_budget)
        if args.json:
            print(json.dumps({"job": rec.id, "node": args.node, "src": src, "dest": dest}))
        else:
            print(
                f"started shard job {rec.id} on {args.node}: {src} -> {dest}\n"
                f"  follow it with: loadmaster job logs {rec.id} --follow\n"
                f"  its state:      loadmaster job show {rec.id}"
            )
        return 0
    pv = await shards.preview(req)
    print(
        f"{src} -> {dest}: {pv.files:,} files, {pv.samples:,} samples, "
        f"{bytes_text(pv.source_bytes)} -> {pv.shards:,} shard(s)",
        file=out,
    )
    print(f"  {pv.requests.summary()}", file=out)
    for w in pv.warnings:  # they name source files: text from outside
        print(f"warning: {safe_text(w)}", file=sys.stderr)
    if args.dry_run:
        for e in pv.errors:
            print(f"error: {safe_text(e)}", file=sys.stderr)
        if args.json:
            print(json.dumps(pv.as_dict(), indent=1))
        return 0 if pv.ok else 2
    result = await shards.convert_here(
        req, shown=pv, on_progress=_progress_printer(sys.stderr.isatty() and not args.json)
    )
    if args.json:
        print(json.dumps(result.as_dict(), indent=1))
    else:
        resumed = f" ({len(result.resumed)} resumed)" if result.resumed else ""
        print(
            f"wrote {len(result.written)} shard(s){resumed} to {dest} in {result.elapsed:.1f}s\n"
            f"  {result.manifest.summary().replace(chr(10), chr(10) + '  ')}"
        )
    return 0


async def cmd_verify(args: argparse.Namespace, services: Services) -> int:
    """Read every shard at DEST back with webdataset; check sizes, digests (the hash the manifest names) and sample counts."""
    shards = Operations(services).shards
    dest, prof = _location(shards, args.paths[1])
    report = await shards.verify(dest, profile=prof)
    if args.json:
        print(json.dumps(report.as_dict(), indent=1))
    else:
        for c in report.checks:
            if not c.ok:
                # Shard and member names come from the store: text from outside.
                print(f"  {safe_text(c.name, 300)}: " + safe_text("; ".join(c.problems)))
        print(safe_text(report.summary()))
    return 0 if report.ok else 1
