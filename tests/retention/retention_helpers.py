"""Helpers for the retention tests: a real run of tiny DCP checkpoints (torch on CPU)."""

from __future__ import annotations

import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

#: The run: steps 1000..12000 complete, 13000 in flight (no commit marker yet).
STEPS = tuple(range(1000, 13001, 1000))
IN_FLIGHT = 13000


@dataclass(frozen=True)
class DcpRun:
    """A template run folder and the BF16 model weights of every step (for checking exports)."""

    root: Path
    weights: dict[int, dict[str, object]]  # step -> {tensor name: bf16 tensor}

    def copy_to(self, dest: Path) -> Path:
        shutil.copytree(self.root, dest)
        return dest

    def upload(self, s3, bucket: str, prefix: str = "run1") -> str:  # type: ignore[no-untyped-def]
        files = sorted(p for p in self.root.rglob("*") if p.is_file())
        s3.put_many(bucket, {f"{prefix}/{p.relative_to(self.root).as_posix()}": p.read_bytes() for p in files})
        return f"s3://{bucket}/{prefix}"


def save_step(model, optim, dest: Path) -> None:  # type: ignore[no-untyped-def]
    """One real DCP save of model + optimizer state."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group" notice on single-process saves
        dcp.save({"model": model.state_dict(), "optim": optim.state_dict()}, checkpoint_id=str(dest))


def dcp_templates(root: Path):  # type: ignore[no-untyped-def]
    """A tiny model after one AdamW step, saved by DCP under ``root`` as ``dcp-full`` (model and
    optimizer) and ``dcp-weights`` (model only); returns (model, optimizer) for more saves."""
    import torch
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=str(root / "dcp-full"))
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(root / "dcp-weights"))
    return model, opt
