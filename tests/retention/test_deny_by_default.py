"""Deny by default, as a property: generated run trees, pins from another process during the
apply, and SIGKILL at random action boundaries followed by a rerun.

The trees mix what real teams keep in a run folder: steps of one trainer family (``step-N``,
``checkpoint-N``, ``global_stepN``, ``iter_NNNNNNN``) saved by torch itself (DCP full and
weights-only, a single ``torch.save`` file, a DCP checkpoint nested in a sub-folder beside a
trainer-state side file, a full step that also holds its model as FP32 safetensors shards), saves
still in flight in every layout, corrupt and torn steps (whole
files whose bytes fail the deep check), and folders that are not steps: sibling runs with steps of
their own (``version_0``, ``run1``, a sweep's ``sweep_1`` and ``sweep_2``), and consolidated
weights named after their precision (``fp32``).

After any apply, and after a crash plus a rerun:

* every run keeps its newest proven-resumable step, byte-identical;
* the newest ``keep_full_latest`` committed full steps (by what was saved, not by what the
  catalog says) are byte-identical;
* nothing changed outside the steps the plan named;
* the journal and the audit log account for every deleted byte;
* a pin acknowledged before an action is honoured (nothing its step held is removed), and so is
  a milestone mark (the step is never deleted outright).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from retention_helpers import dcp_templates  # type: ignore[import-not-found]

from backend.checkpoints.catalog import list_checkpoints
from backend.checkpoints.proof import prove_resumable
from backend.config import load_config
from backend.errors import PolicyError
from backend.ops import Operations
from backend.policy.retention import RetentionPolicy
from backend.retention import PinStore, apply_plan, compute_plan
from backend.retention.marks import MilestoneStore
from backend.retention.runs import LOCK_KEY
from backend.services import Services
from backend.storage import LocalStore

pytestmark = pytest.mark.usefixtures("lock_read_back_at_once")

#: state -> what the catalog must call it (what the library's own loader would make of it)
KIND = {
    "dcp-full": "full",
    "dcp-weights": "weights",
    "torch-full": "full",
    "nested-full": "full",
    "nested-weights": "weights",
    "torn": "full",
    "full-fp32-shards": "full",
    "inflight-dcp": "incomplete",
    "inflight-nested": "incomplete",
    "inflight-torch": "incomplete",
    "corrupt": "corrupt",
}
#: state -> (committed full in truth, proven by the deep check in truth)
STATES = {
    "dcp-full": (True, True),
    "dcp-weights": (False, False),
    "torch-full": (True, True),
    "nested-full": (True, True),
    "nested-weights": (False, False),
    "torn": (True, False),
    "full-fp32-shards": (True, True),
    "inflight-dcp": (False, False),
    "inflight-nested": (False, False),
    "inflight-torch": (False, False),
    "corrupt": (False, False),
}
#: Shrinking re-runs whole applies (seconds each): a failure is reported as generated.
PHASES = (Phase.explicit, Phase.reuse, Phase.generate)
FAMILIES = ("step-{n}", "checkpoint-{n}", "global_step{n}", "iter_{n:07d}")
DISTRACTORS = ("version_0", "run1", "fp32", "sweep_1", "sweep_2")


@dataclass(frozen=True)
class Templates:
    root: Path

    def step(self, state: str, dest: Path) -> None:
        shutil.copytree(self.root / state, dest)


@pytest.fixture(scope="module")
def templates() -> Iterator[Templates]:
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    root = Path(tempfile.mkdtemp(prefix="lm-deny-"))
    model, opt = dcp_templates(root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind, sd in (
            ("nested-full", {"model": model.state_dict(), "optim": opt.state_dict()}),
            ("nested-weights", {"model": model.state_dict()}),
        ):
            dcp.save(sd, checkpoint_id=str(root / kind / "checkpoint"))
            # the trainer's side file: RNG state and counters, beside the nested checkpoint
            torch.save({"rng": torch.get_rng_state(), "step": 7, "epoch": 1}, root / kind / "trainer_state.pt")
    (root / "torch-full").mkdir()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1}, root / "torch-full" / "ckpt.pt")
    shutil.copytree(root / "dcp-full", root / "torn")
    for shard in (root / "torn").glob("*.distcp"):  # whole files whose records are not there
        shard.write_bytes(b"\0" * shard.stat().st_size)
    shutil.copytree(root / "dcp-full", root / "inflight-dcp")
    (root / "inflight-dcp" / ".metadata").unlink()  # DCP writes its commit marker last
    shutil.copytree(root / "nested-full", root / "inflight-nested")
    (root / "inflight-nested" / "checkpoint" / ".metadata").unlink()
    (root / "inflight-torch").mkdir()
    (root / "inflight-torch" / "ckpt.pt.tmp").write_bytes((root / "torch-full" / "ckpt.pt").read_bytes()[:500])
    shutil.copytree(root / "dcp-full", root / "corrupt")
    shard = next((root / "corrupt").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    # what is not a step: sibling runs with steps of their own, weights named after a precision
    # (a sweep's runs share a pattern of digits, like steps do; each holds steps of its own)
    runs = {"version_0": ("step-100", "step-200"), "run1": ("checkpoint-5",), "sweep_1": ("step-100",)}
    runs["sweep_2"] = ("step-100", "step-300")
    for name, inner in runs.items():
        for s in inner:
            shutil.copytree(root / "dcp-full", root / name / s)
    # a full step that also holds its model as FP32 safetensors shards: model weights, no BF16 export
    shutil.copytree(root / "dcp-full", root / "full-fp32-shards")
    fp32 = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    save_file(fp32, str(root / "full-fp32-shards" / "model-00001-of-00001.safetensors"))
    index = {"metadata": {}, "weight_map": {k: "model-00001-of-00001.safetensors" for k in fp32}}
    (root / "full-fp32-shards" / "model.safetensors.index.json").write_text(json.dumps(index))
    (root / "fp32").mkdir()
    save_file({k: v.detach().float().contiguous() for k, v in model.state_dict().items()}, root / "fp32" / "m.st")
    (root / "fp32" / "m.st").rename(root / "fp32" / "model.safetensors")
    yield Templates(root)
    shutil.rmtree(root, ignore_errors=True)


def _files(root: Path) -> dict[str, tuple[int, str]]:
    out = {}
    for f in sorted(root.rglob("*")):
        if f.is_file() and f.name != LOCK_KEY:
            out[f.relative_to(root).as_posix()] = (f.stat().st_size, hashlib.sha256(f.read_bytes()).hexdigest())
    return out


def _under(files: dict[str, tuple[int, str]], folder: str) -> dict[str, tuple[int, str]]:
    return {k: v for k, v in files.items() if k.startswith(folder + "/")}


KILL_SCRIPT = r"""
import asyncio, json, os, signal, sys, traceback
from backend.config import load_config
from backend.policy.retention import RetentionPlan
from backend.retention import apply_plan
from backend.services import Services
# what a strip loads (torch, safetensors), paid once here instead of in every killed apply
import backend.checkpoints.strip, backend.checkpoints.strip.source, safetensors.torch, torch


def run(config_path, plan_path, nth, stage):
    services = Services(load_config(config_path))
    plan = RetentionPlan.from_json(open(plan_path).read())
    seen = []

    def fault(where, action):
        if where == stage:
            seen.append(action.path)
            if len(seen) == nth:
                os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(apply_plan(services, plan, fault=fault))


# One request a line: a fresh forked process runs the apply and the exit status comes back
# (a negative number: the signal that ended it). Nothing here runs torch: a fork is safe.
for line in sys.stdin:
    config_path, plan_path, nth, stage, log_path = json.loads(line)
    pid = os.fork()
    if pid == 0:
        signal.alarm(300)  # a hung apply ends (-14) instead of hanging the test
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1)
        os.dup2(log, 2)
        try:
            run(config_path, plan_path, nth, stage)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


@dataclass(frozen=True)
class Killed:
    """How a killed apply ended: its exit status (-9 when SIGKILL ended it) and its output."""

    returncode: int
    stderr: str


class Applier:
    """A process that imported the apply path once and forks a fresh process for each apply
    to be killed: a real separate process, SIGKILLed at the boundary, without paying Python's
    and torch's imports for every example."""

    proc: subprocess.Popen[str] | None = None

    def apply(self, config_file: Path, plan_file: Path, nth: int, stage: str, log: Path) -> Killed:
        if self.proc is None:  # started by the first example that kills an apply
            env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
            self.proc = subprocess.Popen(
                [sys.executable, "-c", KILL_SCRIPT], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([str(config_file), str(plan_file), nth, stage, str(log)]) + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        assert reply, f"the applier process ended (exit {self.proc.wait(timeout=60)})"
        return Killed(int(reply), log.read_text(errors="replace") if log.exists() else "")

    def close(self) -> None:
        if self.proc is None:
            return
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def applier() -> Iterator[Applier]:
    a = Applier()
    yield a
    a.close()


@settings(
    max_examples=14,
    deadline=None,
    phases=PHASES,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    states=st.lists(st.sampled_from(sorted(STATES)), min_size=1, max_size=7),
    family=st.sampled_from(FAMILIES),
    distractors=st.sets(st.sampled_from(DISTRACTORS), max_size=3),
    keep=st.integers(0, 2),
    every=st.sampled_from([0, 2000]),
    others=st.sampled_from(["delete", "keep-weights"]),
    pins_during=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 7)), max_size=2),
    pins_at_claim=st.sets(st.integers(1, 7), max_size=2),
    marks_during=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 7)), max_size=2),
    kill=st.one_of(
        st.none(),
        st.tuples(st.integers(1, 2), st.sampled_from(["deleting", "deleting", "before", "exported", "after"])),
    ),
)
@example(
    # the kill that must be reconciled: a delete killed between its commit marker and its data
    states=["dcp-full", "torch-full", "dcp-full", "dcp-full"],
    family="step-{n}",
    distractors=set(),
    keep=1,
    every=0,
    others="delete",
    pins_during=[],
    pins_at_claim=set(),
    marks_during=[],
    kill=(1, "deleting"),
)
async def test_nothing_is_deleted_without_proof(
    templates: Templates,
    applier: Applier,
    tmp_path_factory: pytest.TempPathFactory,
    states: list[str],
    family: str,
    distractors: set[str],
    keep: int,
    every: int,
    others: str,
    pins_during: list[tuple[int, int]],
    pins_at_claim: set[int],
    marks_during: list[tuple[int, int]],
    kill: tuple[int, str] | None,
) -> None:
    base = tmp_path_factory.mktemp("deny")
    run = base / "run"
    run.mkdir()
    names = {}
    for i, state in enumerate(states, 1):
        names[i] = family.format(n=i * 1000)
        templates.step(state, run / names[i])
    for d in distractors:
        templates.step(d, run / d)
    config_file = base / "loadmaster.toml"
    config_file.write_text(
        f'[[nodes]]\nname = "here"\ntransport = "local"\n\n[state]\ndir = "{base / "state"}"\n', encoding="utf-8"
    )
    services = Services(load_config(str(config_file)))
    other = Services(load_config(str(config_file)))  # another operator's process, same team state
    try:
        url = str(run)
        before = _files(run)
        # what must survive: the newest proven-resumable step of every run (nested runs are whole)
        catalog = await list_checkpoints(LocalStore(run))
        # what is a step and what it holds: by the rule and by content, as the library wrote it
        listed = {s.name: s for s in catalog.steps}
        for i, n in names.items():
            assert listed[n].step == i * 1000 and listed[n].kind == KIND[states[i - 1]], (n, listed[n].note)
            # FP32 safetensors shards are model weights, never a BF16 export
            assert not (states[i - 1] == "full-fp32-shards" and listed[n].has_bf16_export), n
        for d in distractors:
            assert listed[d].step is None, f"{d} was taken for a step: {listed[d].note}"
        proven = [
            s for s in catalog.steps if s.kind == "full" and await prove_resumable(LocalStore(run), s) == "verified"
        ]
        assert all(STATES[states[i - 1]][1] for i, n in names.items() if any(s.name == n for s in proven))
        newest_proven = max(proven, key=lambda s: s.step or 0).name if proven else None
        truly_full = [names[i] for i in sorted(names) if STATES[states[i - 1]][0] and STATES[states[i - 1]][1]]
        must_keep = set(truly_full[-keep:] if keep else [])

        policy = RetentionPolicy(keep_full_latest=keep, milestone_every=every, others=others)  # type: ignore[arg-type]
        plan = await compute_plan(services, url, policy)
        named = {a.path for a in plan.destructive_actions}
        dry = await apply_plan(services, plan, dry_run=True)
        assert {o.path for o in dry.outcomes if o.outcome == "would-do"} == named, "plan and apply --dry-run disagree"
        if not proven:
            assert not named, "a run with no proven-resumable step must have nothing deleted or stripped"

        acknowledged: dict[str, dict[str, tuple[int, str]]] = {}

        def pin(which: int) -> None:
            try:
                PinStore(other.db).pin(url, which * 1000, "held by another operator")
            except PolicyError as exc:
                assert "being deleted right now" in str(exc)
                return
            acknowledged[names[which]] = _under(_files(run), names[which])

        marked: set[str] = set()

        def mark(which: int) -> None:
            try:
                MilestoneStore(other.db).mark(url, which * 1000)
            except PolicyError as exc:
                assert "being deleted right now" in str(exc)
                return
            marked.add(names[which])

        def pin_from_elsewhere(o) -> None:  # type: ignore[no-untyped-def]
            for trigger, which in pins_during:
                if o.outcome == "running" and o.index == trigger and which in names:
                    pin(which)
            for trigger, which in marks_during:
                if o.outcome == "running" and o.index == trigger and which in names:
                    mark(which)

        def pin_at_claim(stage: str, a) -> None:  # type: ignore[no-untyped-def]
            # the tightest race: another operator pins the very step, after its checks, before
            # the deletions are claimed
            if stage in ("before", "exported") and a.step is not None and a.step // 1000 in pins_at_claim:
                pin(a.step // 1000)

        if kill is not None and named:
            plan_file = base / "plan.json"
            plan_file.write_text(plan.to_json())
            proc = applier.apply(config_file, plan_file, kill[0], kill[1], base / "killed.log")
            # killed at the boundary (-9), or it finished before reaching it: never an error
            assert proc.returncode in (0, -signal.SIGKILL), proc.stderr[-2000:]
            # the operator sees the dead apply's lock named in the refusal and removes it
            await Operations(services).retention.unlock(url)
        report = await apply_plan(services, plan, progress=pin_from_elsewhere, fault=pin_at_claim)
        assert not report.count("failed"), [o.as_dict() for o in report.outcomes if o.outcome == "failed"]

        after = _files(run)
        # the newest proven-resumable step, and the newest N committed full steps, byte-identical
        for keep_name in ({newest_proven} if newest_proven else set()) | must_keep:
            assert _under(after, keep_name) == _under(before, keep_name), f"{keep_name} changed"
        # what is not a step (sibling runs, a sweep's runs, weights named after a precision) is never touched
        for d in distractors:
            assert _under(after, d) == _under(before, d), f"{d} is not a step, but it changed"
        # and everything else the plan did not name is untouched
        for path, meta in before.items():
            top = path.split("/", 1)[0]
            if top not in named:
                assert after.get(path) == meta, f"{path} changed, but the plan never named {top}"
        for path in after:
            top = path.split("/", 1)[0]
            assert path in before or top in named, f"{path} appeared outside the steps the plan named"
        # every deleted byte is accounted for: finished applies plus reconciled interrupted ones
        deleted = sum(size for path, (size, _) in before.items() if path not in after)
        freed = sum(int(e.detail.get("bytes_freed", 0)) for e in services.db.audit_entries(action="retention.action"))
        reconciled = sum(
            int(e.detail.get("bytes_deleted", 0)) for e in services.db.audit_entries(action="retention.reconcile")
        )
        assert freed + reconciled == deleted, (freed, reconciled, deleted)
        # a milestone mark that was acknowledged is honoured: the step is never deleted outright
        for name in marked:
            held = _under(before, name)
            assert not held or _under(after, name), f"{name} was deleted after it was marked a milestone"
        # a pin that was acknowledged is honoured: nothing its step held is gone or changed
        for name, held in acknowledged.items():
            for path, meta in held.items():
                assert after.get(path) == meta, f"{path} of {name} changed after its pin was acknowledged"
    finally:
        services.db.close()
        other.db.close()
        shutil.rmtree(base, ignore_errors=True)
