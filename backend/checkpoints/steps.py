"""What the checkpoint catalog says about a step: its layout, its kind, and why.

A step's *kind* is decided by its contents, never by names alone (see :mod:`backend.checkpoints.classify`):

* ``full``       -- resumable: optimizer state is present (anywhere: DCP keys at any depth,
  ``torch.save`` dicts, DeepSpeed/Megatron/HF/accelerate optimizer files), commit marker present;
* ``weights``    -- committed, and its contents prove there is no optimizer state;
* ``incomplete`` -- in flight: the layout's commit marker is not written yet;
* ``corrupt``    -- committed, but its files do not match the marker (a ``.distcp`` shorter than a
  range ``.metadata`` gives it, a shard the index names is missing, zero-byte or truncated files,
  a rank's file missing);
* ``unknown``    -- anything that cannot be proven. Listed, never deleted, stripped or counted.

Also here: the file names the listing, the classifiers, the deep check and the strip all read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from backend.checkpoints.dcp import CheckpointError
from backend.storage import ObjectInfo, join_key

Layout = Literal[
    "dcp", "hf-trainer", "accelerate", "lightning", "megatron", "deepspeed", "hf-safetensors", "torch-save", "unknown"
]
Kind = Literal["full", "weights", "incomplete", "corrupt", "unknown"]
KINDS: tuple[str, ...] = ("full", "weights", "incomplete", "corrupt", "unknown")

INDEX_FILE = "model.safetensors.index.json"
MAX_INDEX_BYTES = 64 * 1024 * 1024

DEEPSPEED_LATEST = "latest"
MEGATRON_LATEST = "latest_checkpointed_iteration.txt"
TRAINER_STATE = "trainer_state.json"

#: torch.save file names that are training state (what a strip frees), HF Trainer and plain.
TRAINING_STATE_FILES = re.compile(
    r"^(optimizer(_\d+)?|optim|scheduler(_\d+)?|lr_scheduler|rng_state(_\d+)?|scaler|trainer_state|"
    r"random_states_\d+|sampler(_\d+)?|training_args)\.(pt|pth|bin|json|pkl)$"
)
MODEL_FILES = re.compile(r"^(model|pytorch_model|consolidated(\.\d+)?)\.(pt|pth|bin)$")
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


@dataclass(frozen=True)
class CheckpointStep:
    """One step of a run: layout, kind (by content), why, sizes, and whether a BF16 export exists."""

    step: int | None
    path: str  # step dir (or file) relative to the store root, e.g. "run1/step-48000"
    layout: Layout
    kind: Kind
    total_bytes: int
    object_count: int
    mtime: float  # newest object
    has_bf16_export: bool  # model.safetensors.index.json + all its shards present in the step dir
    objects: tuple[ObjectInfo, ...]
    optimizer_bytes: int  # bytes that are optimizer/training state (what a strip frees)
    note: str = ""  # why: the file at fault for corrupt/unknown, the missing marker for incomplete
    marker: str | None = None  # the commit marker this kind rests on (relative to the run)
    best: bool = False  # the HF Trainer's best_model_checkpoint: protected like a pin
    flags: tuple[str, ...] = field(default=())  # e.g. "zero3-placeholders": weights live in the optimizer
    weights_bytes: int | None = None  # BF16 bytes of the model tensors a strip keeps (None: not read)
    export_note: str = ""  # a safetensors index that is no BF16 export: why (FP32 shards, incomplete)
    #: What a strip to weights would lose (a tensor or file that is neither the exported model nor
    #: optimizer state: EMA, a second model); "" when nothing. A strip of such a step is refused.
    strip_loses: str = ""
    #: The links and pointers of the run (or its parent) that name this step: it is kept.
    referenced_by: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def is_file(self) -> bool:
        """A step that is one object (Lightning's ``epoch=E-step=S.ckpt`` file)."""
        return len(self.objects) == 1 and self.objects[0].key == self.path

    def as_dict(self) -> dict[str, object]:
        """JSON-ready summary (without the object list)."""
        return {
            "step": self.step,
            "path": self.path,
            "layout": self.layout,
            "kind": self.kind,
            "total_bytes": self.total_bytes,
            "object_count": self.object_count,
            "mtime": self.mtime,
            "has_bf16_export": self.has_bf16_export,
            "optimizer_bytes": self.optimizer_bytes,
            "note": self.note,
            "marker": self.marker,
            "best": self.best,
            "flags": list(self.flags),
            "weights_bytes": self.weights_bytes,
            "export_note": self.export_note,
        }


@dataclass(frozen=True)
class Catalog:
    """Every step under a run prefix, in numeric step order (unknown folders included)."""

    url: str
    prefix: str
    steps: tuple[CheckpointStep, ...]

    def bytes_by_kind(self) -> dict[str, int]:
        """Total bytes per kind (full / weights / incomplete / corrupt / unknown)."""
        out: dict[str, int] = {}
        for s in self.steps:
            out[s.kind] = out.get(s.kind, 0) + s.total_bytes
        return out

    def step(self, ref: str | int) -> CheckpointStep:
        """The step with this number, folder name or path."""
        for s in self.steps:
            if str(s.step) == str(ref) or s.name == str(ref) or s.path == str(ref):
                return s
        raise CheckpointError(f"no step {ref!r} under {join_key(self.url, self.prefix) or self.url}")


@dataclass(frozen=True)
class RunMarkers:
    """The run-level files that commit steps: DeepSpeed ``latest``, Megatron's iteration file,
    and the HF Trainer's best checkpoint (from the newest ``trainer_state.json``)."""

    deepspeed_latest: str | None = None
    megatron_latest: int | None = None
    megatron_release: bool = False
    best_checkpoint: str | None = None  # folder name
    #: Resume pointers of the run: (the pointer's name, the step entry it names). A ``latest``
    #: file (DeepSpeed's, or a trainer's own ``latest_checkpoint.txt``) or a ``latest``/``last``
    #: symlink: a resume reads the step it names, and a newer step of its pattern is not committed
    #: by it (see :func:`backend.checkpoints.classify.pointer_problem`).
    pointers: tuple[tuple[str, str], ...] = ()
    #: Every link or pointer file in the run folder, its steps or its parent that names an entry of
    #: the run: (what refers, the entry's name). A step named here is never deleted or stripped.
    references: tuple[tuple[str, str], ...] = ()


def step_number(name: str) -> int | None:
    """The step number in a folder or file name (step-48000, global_step48000, checkpoint-500,
    iter_0000100, epoch=0-step=100.ckpt, 000123); None for names that are not steps (version_0,
    fp32). Whether an entry of a run folder *is* a step also depends on its siblings: see
    :mod:`backend.checkpoints.step_names`."""
    from backend.checkpoints.step_names import step_number as by_rule

    return by_rule(name)
