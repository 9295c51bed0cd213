"""``loadmaster ckpt size|list|strip|inspect|backlog`` and ``loadmaster upload``.

Sizes: GB = 10^9 bytes (GiB = 2^30 shown alongside). A step is named by a store name plus path
(``lab/run1/step-100``), an ``s3://bucket/run1/step-100`` URL, or a local directory.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from backend.ops import Operations
from backend.ops.checkpoints import (
    DEFAULT_CONCURRENCY,
    DEFAULT_MAX_SHARD_BYTES,
    DEFAULT_PART_SIZE,
    CheckpointError,
    Done,
    StripRequest,
    StripResult,
    UploadRequest,
    UploadResult,
    UploadSettings,
    footprint,
    footprint_table,
    url_join,
)
from backend.services import Services
from backend.textfmt import align_columns, safe_text
from backend.units import age_of, bytes_gib_text, bytes_text, gbps_text
from tui.cli.argtypes import duration_arg, size_arg


def _params(text: str) -> float:
    t = text.strip().upper().replace("_", "")
    mult = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}.get(t[-1:], 1.0) if t else 1.0
    try:
        v = float(t[:-1] if mult != 1.0 else t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a parameter count like 70e9 or 70B, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"parameter count must be positive, got {text!r}")
    return v


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``ckpt`` (size, list, strip, inspect, backlog) and ``upload``."""
    p = sub.add_parser("ckpt", help="checkpoints: footprint math, list steps, strip to BF16, inspect")
    cs = p.add_subparsers(dest="ckpt_command", metavar="SUBCOMMAND", required=True)

    s = cs.add_parser("size", help="BF16 weights vs full AdamW state for a model size (GB = 10^9 bytes)")
    s.add_argument("--params", required=True, type=_params, metavar="N", help="parameter count, e.g. 70e9 or 70B")
    s.add_argument("--retained", type=int, default=1, metavar="N", help="number of retained checkpoints (default 1)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_size)

    ls = cs.add_parser("list", help="one row per step of a run prefix: layout, kind, size, age, export")
    ls.add_argument("url", metavar="URL", help="store name[/prefix], s3://bucket/prefix, or a local directory")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=cmd_list)

    st = cs.add_parser("strip", help="write a step's model weights as BF16 safetensors shards (+ index), verified")
    st.add_argument("src", metavar="SRC", help="the step folder (store/run/step-N, s3://..., or a directory)")
    st.add_argument("--out", metavar="DEST", help="output folder (default: into the step folder itself)")
    st.add_argument(
        "--model-prefix",
        default="auto",
        help="state-dict key prefix of the weights (default auto: found by structure, e.g. model., app.model., module., or torchtitan's flat keys)",
    )
    st.add_argument(
        "--max-shard-size",
        type=size_arg,
        default=DEFAULT_MAX_SHARD_BYTES,
        metavar="SIZE",
        help="largest shard (default 5GB)",
    )
    st.add_argument("--node", metavar="NAME", help="run as a durable job on this node instead of here")
    st.add_argument(
        "--allow-over-budget",
        metavar="REASON",
        help="with --node and a step in an s3:// store: start although the egress guard asks for "
        "confirmation (recorded with REASON)",
    )
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(func=cmd_strip)

    ins = cs.add_parser("inspect", help="tensor table of a step (safetensors headers / DCP metadata only)")
    ins.add_argument("src", metavar="STEP")
    ins.add_argument("--json", action="store_true", help="machine-readable output")
    ins.set_defaults(func=cmd_inspect)

    bl = cs.add_parser("backlog", help="alert when an upload is still running when the next checkpoint is due")
    bl.add_argument(
        "--interval",
        type=duration_arg,
        metavar="DURATION",
        help="checkpoint interval (default: inferred from recent upload jobs)",
    )
    bl.add_argument("--json", action="store_true", help="machine-readable output")
    bl.set_defaults(func=cmd_backlog)

    up = sub.add_parser("upload", help="upload a local checkpoint step folder to a store (verified, .metadata last)")
    up.add_argument("local_dir", metavar="LOCAL_DIR")
    up.add_argument("url", metavar="URL", help="destination folder: store/run/step-N, s3://..., or a directory")
    up.add_argument("--node", metavar="NAME", help="run as a durable job on this node (LOCAL_DIR is on the node)")
    up.add_argument("--part-size", type=size_arg, default=DEFAULT_PART_SIZE, metavar="SIZE", help="default 32MiB")
    up.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, metavar="N", help="parts in flight")
    up.add_argument("--step", type=int, metavar="N", help="step number shown in progress")
    up.add_argument(
        "--overwrite",
        action="store_true",
        help="replace what the destination already holds (refused without it; audited)",
    )
    up.add_argument("--json", action="store_true", help="machine-readable output")
    up.set_defaults(func=cmd_upload)


# -- resolving names ------------------------------------------------------------------------------


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


# -- commands --------------------------------------------------------------------------------------


def cmd_size(args: argparse.Namespace, services: Services) -> int:
    """Print the footprint table."""
    if args.retained < 0:
        raise CheckpointError("--retained must be >= 0")
    fp = footprint(args.params, args.retained)
    if args.json:
        _print_json(fp.as_dict())
    else:
        print(footprint_table(fp))
    return 0


async def cmd_list(args: argparse.Namespace, services: Services) -> int:
    """List steps of a run prefix."""
    cat = await Operations(services).checkpoints.listing(args.url)
    if args.json:
        _print_json(
            {
                "url": cat.url,
                "prefix": cat.prefix,
                "bytes_by_kind": cat.bytes_by_kind(),
                "steps": [s.as_dict() for s in cat.steps],
            }
        )
        return 0
    if not cat.steps:
        print(f"no step folders under {args.url}")
        return 0
    hdr = ("STEP", "FOLDER", "LAYOUT", "KIND", "SIZE", "OBJECTS", "AGE", "BF16 EXPORT", "WHY")
    rows = [
        (
            str(s.step) if s.step is not None else "-",
            s.name,
            s.layout,
            s.kind,
            bytes_text(s.total_bytes),
            str(s.object_count),
            age_of(s.mtime),
            "yes" if s.has_bf16_export else "no",
            s.note if s.kind in ("corrupt", "unknown", "incomplete") else "",
        )
        for s in cat.steps
    ]
    print("\n".join(line.rstrip() for line in align_columns([hdr, *rows])))
    totals = ", ".join(f"{k} {bytes_text(v)}" for k, v in sorted(cat.bytes_by_kind().items()))
    others = sum(1 for s in cat.steps if s.step is None)
    also = f" (+{others} not a step, never touched)" if others else ""
    print(f"\n{len(cat.steps) - others} steps{also}; by kind: {totals}")
    return 0


def _print_done(done: Done, args: argparse.Namespace) -> None:
    """A node job launched: its id (the audit record is the operation's)."""
    assert done.job is not None
    print(json.dumps({"job": done.job.id, "node": done.job.node}) if args.json else done.job.id)


async def cmd_strip(args: argparse.Namespace, services: Services) -> int:
    """Strip a step locally or as a node job."""
    done = await Operations(services).checkpoints.strip(
        StripRequest(
            src=args.src,
            node=args.node,
            out=args.out,
            model_prefix=args.model_prefix,
            max_shard_bytes=args.max_shard_size,
            reason=args.allow_over_budget,
        )
    )
    if done.job is not None:
        _print_done(done, args)
        return 0
    res = done.result
    assert isinstance(res, StripResult)
    if args.json:
        _print_json(res.as_dict())
    else:
        print(
            f"stripped {res.source} -> {url_join(res.out_url, res.out_prefix)}: {res.tensor_count} tensors, "
            f"{bytes_gib_text(res.weight_bytes)} BF16 in {len(res.shards)} shard(s), verified, {res.seconds:.1f}s"
        )
    return 0


async def cmd_inspect(args: argparse.Namespace, services: Services) -> int:
    """Show a step's tensors."""
    ins = await Operations(services).checkpoints.inspect(args.src)
    if args.json:
        _print_json(ins.as_dict())
        return 0
    s = ins.step
    print(
        f"{safe_text(s.path)}: {s.layout}, {s.kind}, {bytes_gib_text(s.total_bytes)}, {s.object_count} objects, "
        f"BF16 export: {'yes' if s.has_bf16_export else 'no'}"
    )
    for t in ins.tensors:
        # Tensor and file names come from the checkpoint's own headers: text from outside.
        print(f"  {safe_text(t.name, 300):<60} {t.dtype:<9} {list(t.shape)!s:<18} {t.nbytes:>14,}  {safe_text(t.file)}")
    for p in ins.problems:
        print(f"  problem: {safe_text(p)}", file=sys.stderr)
    return 1 if ins.problems else 0


async def cmd_backlog(args: argparse.Namespace, services: Services) -> int:
    """Print upload-backlog alerts from job records."""
    alerts = Operations(services).checkpoints.backlog(interval_s=args.interval)
    if args.json:
        _print_json([a.__dict__ for a in alerts])
    else:
        for a in alerts:
            print(f"ALERT {safe_text(a.message)}")  # names nodes and paths from job records
        if not alerts:
            print("no upload backlog")
    return 1 if alerts else 0


async def cmd_upload(args: argparse.Namespace, services: Services) -> int:
    """Upload a step folder here or as a node job."""
    settings = UploadSettings(part_size=args.part_size, concurrency=args.concurrency)
    done = await Operations(services).checkpoints.upload(
        UploadRequest(
            local_dir=args.local_dir,
            dest=args.url,
            node=args.node,
            step=args.step,
            overwrite=args.overwrite,
            settings=settings,
        )
    )
    if done.job is not None:
        _print_done(done, args)
        return 0
    res = done.result
    assert isinstance(res, UploadResult)
    if args.json:
        _print_json(res.as_dict())
    else:
        print(
            f"uploaded {len(res.objects)} objects, {bytes_gib_text(res.bytes)} in {res.seconds:.1f}s "
            f"({gbps_text(res.gbps)}), every object verified (size + checksum)"
        )
    return 0
