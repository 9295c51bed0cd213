"""Property test: whatever a run holds, ``retention apply --yes`` keeps what it promised.

Random runs mix real steps (torch DCP full and weights-only, ``torch.save`` full, a BF16
safetensors export) with steps in flight, corrupt steps, unknown folders, pins and milestones.
After plan + apply, the newest N complete full steps and every pinned, milestone, unknown,
in-flight and corrupt step are byte-identical to before, and the run still has a resumable step
whenever it had one.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from retention_helpers import dcp_templates  # type: ignore[import-not-found]

from backend.checkpoints.catalog import list_checkpoints
from backend.policy.retention import Pin, RetentionPolicy
from backend.retention import PinStore, apply_plan, compute_plan
from backend.retention.marks import MilestoneStore
from backend.storage import LocalStore

pytestmark = pytest.mark.usefixtures("lock_read_back_at_once")

STATES = ("dcp-full", "dcp-weights", "torch-full", "export", "in-flight", "corrupt", "unknown")


@dataclass(frozen=True)
class Templates:
    root: Path

    def step(self, state: str, dest: Path) -> None:
        src = self.root / ("dcp-full" if state in ("in-flight", "corrupt") else state)
        shutil.copytree(src, dest)
        if state == "in-flight":
            (dest / ".metadata").unlink()  # DCP writes its commit marker last
        elif state == "corrupt":
            shard = next(dest.glob("*.distcp"))
            shard.write_bytes(shard.read_bytes()[:100])  # shorter than .metadata's ranges


@pytest.fixture(scope="module")
def templates() -> Iterator[Templates]:
    import torch
    from safetensors.torch import save_file

    root = Path(tempfile.mkdtemp(prefix="lm-templates-"))
    model, opt = dcp_templates(root)
    (root / "torch-full").mkdir()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1}, root / "torch-full" / "ckpt.pt")
    (root / "export").mkdir()
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(sd, str(root / "export" / "model-00001-of-00001.safetensors"))
    (root / "export" / "model.safetensors.index.json").write_text(
        '{"metadata": {}, "weight_map": {' + ", ".join(f'"{k}": "model-00001-of-00001.safetensors"' for k in sd) + "}}"
    )
    (root / "unknown").mkdir()
    (root / "unknown" / "events.out.tfevents").write_bytes(b"\x00" * 64)
    yield Templates(root)
    shutil.rmtree(root, ignore_errors=True)


def _digest(p: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p.rglob("*")):
        if f.is_file():
            h.update(f.relative_to(p).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


runs = st.lists(st.sampled_from(STATES), min_size=1, max_size=9)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    states=runs,
    keep=st.integers(0, 3),
    every=st.sampled_from([0, 2000, 3000]),
    others=st.sampled_from(["delete", "keep-weights"]),
    pins=st.sets(st.integers(1, 9), max_size=2),
    marks=st.sets(st.integers(1, 9), max_size=2),
)
async def test_apply_keeps_every_promise(
    templates: Templates,
    local_services,
    states: list[str],
    keep: int,  # type: ignore[no-untyped-def]
    every: int,
    others: str,
    pins: set[int],
    marks: set[int],
) -> None:
    base = Path(tempfile.mkdtemp(prefix="lm-prop-"))
    try:
        run = base / "run"
        run.mkdir()
        for i, state in enumerate(states, 1):
            templates.step(state, run / f"step-{i * 1000}")
        url = str(run)
        for p in pins:
            PinStore(local_services.db).pin(url, p * 1000, "property test")
        for m in marks:
            MilestoneStore(local_services.db).mark(url, m * 1000)
        before = {p.name: _digest(p) for p in run.iterdir()}
        catalog = await list_checkpoints(LocalStore(run))
        kinds = {s.name: s.kind for s in catalog.steps}
        had_resumable = any(k == "full" for k in kinds.values())
        policy = RetentionPolicy(keep_full_latest=keep, milestone_every=every, others=others)  # type: ignore[arg-type]
        plan = await compute_plan(local_services, url, policy, now=time.time() + 10)
        report = await apply_plan(local_services, plan)
        assert report.ok, report.as_dict()

        after = {p.name: _digest(p) for p in run.iterdir() if any(p.iterdir())}
        full = [n for n in sorted(kinds, key=lambda n: int(n.split("-")[1])) if kinds[n] == "full"]
        untouchable = set(full[-keep:] if keep else []) | {f"step-{p * 1000}" for p in pins}
        untouchable |= {n for n, k in kinds.items() if k in ("incomplete", "corrupt", "unknown")}
        numbered = sorted(kinds, key=lambda n: int(n.split("-")[1]))
        untouchable.add(numbered[-1])  # the newest artifact of the run
        for name in untouchable & set(kinds):
            assert after.get(name) == before[name], f"{name} ({kinds[name]}) changed"
        for m in marks:  # a milestone is never deleted: it stays, full or as BF16 weights
            name = f"step-{m * 1000}"
            if name in kinds and kinds[name] in ("full", "weights"):
                assert name in after, f"milestone {name} was deleted"
        if had_resumable:
            fresh = await list_checkpoints(LocalStore(run))
            assert any(s.kind == "full" for s in fresh.steps), "the run lost its last resumable step"
    finally:
        shutil.rmtree(base, ignore_errors=True)
        local_services.db.execute("DELETE FROM retention_pins")
        local_services.db.execute("DELETE FROM retention_milestones")


def test_pins_are_one_per_step() -> None:
    assert RetentionPolicy(pins=(Pin(1, "a"), Pin(1, "b"))).pins == (Pin(1, "b"),)
