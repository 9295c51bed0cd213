"""Benchmark: strip a DCP checkpoint to BF16 safetensors with loadmaster vs ``dcp_to_torch_save``.

Generates a DCP checkpoint (``dcp.save({"model": ..., "optim": ...})``) of a llama-shaped model
with ``--size-gb`` GB of FP32 model weights plus AdamW state (exp_avg + exp_avg_sq, so ~3x on
disk), then runs each side in its own subprocess on the same checkpoint and reads its peak RSS
(``ru_maxrss``):

* loadmaster -- ``backend.checkpoints.strip.strip_step`` (weights only, BF16, sharded, verified);
* peer       -- ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` (the documented
  DCP -> single torch.save file converter; it loads the whole checkpoint).

Throughput is model-weight bytes (FP32 source) per second of wall time. Goal: loadmaster's peak
RSS <= 2x the largest tensor + 500 MB, and throughput >= the peer's.

Usage: .venv/bin/python bench/strip.py [--size-gb 2] [--keep] [--workdir DIR]
Needs free disk of ~5x --size-gb and RAM of ~4x --size-gb (for the peer).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore")

HIDDEN, VOCAB, FFN = 2048, 32000, 5632


def shapes(size_gb: float) -> dict[str, tuple[int, ...]]:
    """Llama-style parameter shapes whose FP32 bytes reach ``size_gb`` GB."""
    out: dict[str, tuple[int, ...]] = {
        "tok_embeddings.weight": (VOCAB, HIDDEN),
        "output.weight": (VOCAB, HIDDEN),
        "norm.weight": (HIDDEN,),
    }
    per_layer = 4 * HIDDEN * HIDDEN + 3 * FFN * HIDDEN + 2 * HIDDEN
    base = 2 * VOCAB * HIDDEN + HIDDEN
    layers = max(1, round((size_gb * 1e9 / 4 - base) / per_layer))
    for i in range(layers):
        p = f"layers.{i}."
        out.update(
            {
                p + "attention.wq.weight": (HIDDEN, HIDDEN),
                p + "attention.wk.weight": (HIDDEN, HIDDEN),
                p + "attention.wv.weight": (HIDDEN, HIDDEN),
                p + "attention.wo.weight": (HIDDEN, HIDDEN),
                p + "feed_forward.w1.weight": (FFN, HIDDEN),
                p + "feed_forward.w2.weight": (HIDDEN, FFN),
                p + "feed_forward.w3.weight": (FFN, HIDDEN),
                p + "attention_norm.weight": (HIDDEN,),
                p + "ffn_norm.weight": (HIDDEN,),
            }
        )
    return out


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def generate(path: Path, size_gb: float) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    g = torch.Generator().manual_seed(0)
    model, optim = {}, {}
    for name, shape in shapes(size_gb).items():
        model[name] = torch.randn(shape, generator=g) * 0.02
        optim[name] = {
            "step": torch.tensor(100.0),
            "exp_avg": torch.randn(shape, generator=g) * 1e-3,
            "exp_avg_sq": torch.rand(shape, generator=g) * 1e-6,
        }
    dcp.save(
        {"model": model, "optim": {"state": optim, "param_groups": [{"lr": 3e-4, "params": list(model)}]}},
        checkpoint_id=str(path),
    )


def worker(which: str, src: Path, out: Path) -> None:
    t0 = time.perf_counter()
    if which == "loadmaster":
        import asyncio

        from backend.checkpoints.strip import strip_step
        from backend.storage import LocalStore

        res = asyncio.run(strip_step(LocalStore(src.parent), src.name, out_store=LocalStore(out), out_prefix=""))
        extra = {"shards": len(res.shards), "out_bytes": res.weight_bytes, "verified": res.check.ok}
    else:
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        dcp_to_torch_save(str(src), str(out / "full.pt"))
        extra = {"out_bytes": (out / "full.pt").stat().st_size}
    secs = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": secs, "peak_rss": rss, **extra}))


def run_side(which: str, src: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    p = subprocess.run(
        [sys.executable, __file__, "--worker", which, "--src", str(src), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if p.returncode != 0:
        raise SystemExit(f"{which} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=2.0, help="GB of FP32 model weights (default 2)")
    ap.add_argument("--workdir", help="where to put the checkpoint (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--worker", choices=["loadmaster", "peer"], help=argparse.SUPPRESS)
    ap.add_argument("--src", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, Path(args.src), Path(args.out))
        return
    work = Path(args.workdir or tempfile.mkdtemp(prefix="lm-bench-strip-"))
    src = work / "step-100"
    try:
        sh = shapes(args.size_gb)
        weight_bytes = sum(numel(s) for s in sh.values()) * 4
        largest = max(numel(s) for s in sh.values()) * 4
        if not (src / ".metadata").exists():
            print(f"generating {weight_bytes / 1e9:.2f} GB of FP32 weights + AdamW state in {src} ...", flush=True)
            t = time.perf_counter()
            gen = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
                    f"from bench.strip import generate; from pathlib import Path; "
                    f"generate(Path({str(src)!r}), {args.size_gb})",
                ],
                cwd=ROOT,
            )
            if gen.returncode:
                raise SystemExit("generation failed")
            print(f"  done in {time.perf_counter() - t:.0f}s", flush=True)
        on_disk = sum(f.stat().st_size for f in src.iterdir())
        results = {}
        for which in ("loadmaster", "peer"):
            print(f"running {which} ...", flush=True)
            results[which] = run_side(which, src, work / f"out-{which}")
        lm, peer = results["loadmaster"], results["peer"]
        goal_rss = 2 * largest + 500e6
        print()
        print(
            f"Checkpoint: {len(sh)} tensors, {weight_bytes / 1e9:.2f} GB FP32 weights, {on_disk / 1e9:.2f} GB on "
            f"disk with AdamW state; largest tensor {largest / 1e6:.0f} MB (FP32)"
        )
        print()
        print("| tool | wall s | weights GB/s | peak RSS MB | output |")
        print("|---|---:|---:|---:|---|")
        print(
            f"| loadmaster strip | {lm['seconds']:.1f} | {weight_bytes / 1e9 / lm['seconds']:.2f} | "
            f"{lm['peak_rss'] / 1e6:.0f} | {lm['shards']} BF16 safetensors shard(s), {lm['out_bytes'] / 1e9:.2f} GB, "
            f"verified={lm['verified']} |"
        )
        print(
            f"| dcp_to_torch_save | {peer['seconds']:.1f} | {weight_bytes / 1e9 / peer['seconds']:.2f} | "
            f"{peer['peak_rss'] / 1e6:.0f} | one torch.save file (all state, FP32), {peer['out_bytes'] / 1e9:.2f} GB |"
        )
        print()
        print(f"Throughput ratio loadmaster/peer: {peer['seconds'] / lm['seconds']:.2f}x (goal >= 1)")
        print(f"Peak RSS ratio loadmaster/peer: {lm['peak_rss'] / peer['peak_rss']:.2f}")
        print(
            f"loadmaster peak RSS {lm['peak_rss'] / 1e6:.0f} MB vs goal 2 x largest tensor + 500 MB = "
            f"{goal_rss / 1e6:.0f} MB: {'met' if lm['peak_rss'] <= goal_rss else 'NOT met'}"
        )
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
        else:
            for which in ("loadmaster", "peer"):
                shutil.rmtree(work / f"out-{which}", ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    main()
