"""Inspect one step: a tensor table for safetensors, the key list for DCP (headers/metadata only)."""

from __future__ import annotations

from dataclasses import dataclass

from backend.checkpoints.catalog import step_catalog
from backend.checkpoints.dcp import (
    MAX_METADATA_BYTES,
    METADATA_FILE,
    CheckpointError,
    load_metadata,
    tensor_entries,
)
from backend.checkpoints.safetensors_check import SafetensorsError, read_header
from backend.checkpoints.steps import CheckpointStep
from backend.storage import ObjectStore, join_key


@dataclass(frozen=True)
class TensorRow:
    """One tensor (or pickled object, dtype "bytes") of a checkpoint."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: str


@dataclass(frozen=True)
class StepInspection:
    """A step's catalog row plus its tensors/keys, and problems met while reading headers."""

    step: CheckpointStep
    tensors: tuple[TensorRow, ...]
    problems: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        """JSON-ready view."""
        return {
            "step": self.step.as_dict(),
            "problems": list(self.problems),
            "tensors": [
                {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "bytes": t.nbytes, "file": t.file}
                for t in self.tensors
            ],
        }


async def inspect_step(store: ObjectStore, step_path: str) -> StepInspection:
    """Read only headers / metadata of a step and list its tensors."""
    step = await step_catalog(store, step_path)
    if not step.objects:
        from backend.checkpoints.strip.source import explain_missing_step

        raise await explain_missing_step(store, step_path)
    rows: list[TensorRow] = []
    problems: list[str] = [f"{step.kind}: {step.note}"] if step.kind in ("corrupt", "unknown") and step.note else []
    cut = len(step.path) + 1 if step.path else 0
    files = {step.name: step.objects[0]} if step.is_file else {o.key[cut:]: o for o in step.objects}
    if step.layout == "dcp" and METADATA_FILE in files and files[METADATA_FILE].size <= MAX_METADATA_BYTES:
        try:
            md = load_metadata(await store.get_bytes(join_key(step.path, METADATA_FILE)), light=True)
            for e in tensor_entries(md):
                rows.append(
                    TensorRow(
                        e.fqn,
                        str(e.dtype).removeprefix("torch."),
                        e.shape,
                        e.nbytes,
                        ",".join(sorted({c.file for c in e.chunks})),
                    )
                )
            for fqn, meta in md.state_dict_metadata.items():
                if not hasattr(meta, "chunks"):
                    rows.append(TensorRow(fqn, "bytes", (), 0, ""))
        except CheckpointError as exc:
            problems.append(str(exc))
    elif step.layout == "dcp" and METADATA_FILE not in files:
        problems.append(
            f"no {METADATA_FILE} yet: the step is incomplete (still being written or uploaded, "
            f"or abandoned); its keys are known only once {METADATA_FILE} is committed "
            f"({len(files)} object(s) so far)"
        )
    for name, obj in sorted(files.items()):
        if name.endswith(".safetensors"):
            try:
                hdr = await read_header(store, obj.key, obj.size)
            except SafetensorsError as exc:
                problems.append(str(exc))
                continue
            rows.extend(TensorRow(t.name, t.dtype, t.shape, t.nbytes, name) for t in hdr.tensors)
    return StepInspection(step, tuple(rows), tuple(problems))
