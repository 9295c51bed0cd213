"""One rank of a tiny DeepSpeed run on CPU that saves with ``engine.save_checkpoint``.

Started by ``frameworks._deepspeed_template`` once per rank (``RANK``/``WORLD_SIZE``/``MASTER_*``
in the environment, gloo between the ranks), never imported by the tests. argv[1] is a JSON spec:
``{"out", "stage", "bf16", "steps", "gather16"}`` to save, or ``{"load", "tags", "stage", "bf16"}``
to resume with ``engine.load_checkpoint`` once per tag, in order, into the one engine (its
creation, mostly imports, is most of a launch), and print, on rank 0, one ``RESULT {json}`` line
per load with the loaded path, ``global_steps`` and the sum of every (gathered) parameter; a
load that fails ends the run there. Between two saves the engine takes one real
optimizer step; the step counter is set to the step number before each save, so the tag,
``global_steps`` and ``global_samples`` inside the files are those of a run that trained that
long (training thousands of steps to reach the number would change nothing in the files'
structure).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def main() -> None:
    spec = json.loads(sys.argv[1])
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for TinyLM

    import importlib

    import deepspeed
    import torch

    from tests.checkpoints.conftest import TinyLM

    # The CPU backend JIT-compiles an optional shared-memory allreduce kernel (~45 s of g++ on
    # the first run of a machine). It only speeds up collectives; gloo does the same work and
    # the checkpoint files are identical either way.
    # (``import deepspeed.comm.torch as m`` would bind the torch package: deepspeed.comm imports it.)
    ds_torch_comm = importlib.import_module("deepspeed.comm.torch")
    if hasattr(ds_torch_comm, "build_shm_op"):
        ds_torch_comm.build_shm_op = lambda: None

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = TinyLM()
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01, "torch_adam": True}},
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 10},
        },
        "zero_optimization": {
            "stage": spec["stage"],
            "stage3_gather_16bit_weights_on_model_save": bool(spec.get("gather16")),
        },
        "bf16": {"enabled": bool(spec["bf16"])},
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    if "load" in spec:
        for tag in spec["tags"]:
            path, _ = engine.load_checkpoint(spec["load"], tag=tag)
            params = dict(engine.module.named_parameters())
            with deepspeed.zero.GatheredParameters(list(params.values()), enabled=spec["stage"] == 3):
                sums = {name: p.detach().float().sum().item() for name, p in params.items()}
            if rank == 0:
                result = {"path": path, "global_steps": engine.global_steps, "sums": sums}
                print("RESULT " + json.dumps(result), flush=True)
        _leave()
        return
    gen = torch.Generator().manual_seed(rank)
    for step in spec["steps"]:
        tokens = torch.randint(0, 96, (2, 8), generator=gen)
        loss = engine(tokens).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
        engine.global_steps = step
        engine.global_samples = step * 2 * world
        engine.save_checkpoint(spec["out"])
        if spec["gather16"]:
            # The consolidated 16-bit weights, next to the ZeRO-3 partitions of the same step.
            engine.save_16bit_model(os.path.join(spec["out"], f"global_step{step}"))
    _leave()


def _leave() -> None:
    """Every rank done, the process group torn down while both ranks are still there.

    Left to the interpreter's exit, gloo's threads outlived the group now and then and rank 0
    died of ``terminate called without an active exception`` (SIGABRT, seen in CI after every
    file was saved), failing the build.
    """
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the files are written and closed: no exit-time teardown of DeepSpeed's threads
