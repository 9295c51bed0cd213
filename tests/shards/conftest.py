"""Small generated datasets for the shard tests (KBs, so the suite stays quick)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest


def make_dataset(
    root: Path, n: int = 60, *, seed: int = 1, jpg_size: tuple[int, int] = (300, 3000), sub: str = ""
) -> dict[str, dict[str, bytes]]:
    """Write ``n`` jpg+json samples (random bytes) under ``root``; returns key -> ext -> bytes."""
    rng = random.Random(seed)
    base = root / sub if sub else root
    base.mkdir(parents=True, exist_ok=True)
    out: dict[str, dict[str, bytes]] = {}
    for i in range(n):
        name = f"{i:06d}"
        jpg = rng.randbytes(rng.randint(*jpg_size))
        meta = json.dumps({"i": i, "label": rng.randint(0, 9)}).encode()
        (base / f"{name}.jpg").write_bytes(jpg)
        (base / f"{name}.json").write_bytes(meta)
        key = f"{sub}/{name}" if sub else name
        out[key] = {"jpg": jpg, "json": meta}
    return out


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Path, dict[str, dict[str, bytes]]]:
    """60 samples in tmp_path/src."""
    src = tmp_path / "src"
    return src, make_dataset(src)
