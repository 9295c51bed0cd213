"""Three classes of loss the plan must refuse, on checkpoints saved by the libraries themselves.

* two runs in one folder (``step-N`` and ``global_stepN``): names of different patterns are never
  ranked against each other; each pattern keeps its own newest resumable steps and needs its own
  proven step;
* a strip that would lose floating-point state that is neither the exported model nor optimizer
  state (EMA shadow weights, a second model), in a DCP save, a torch.save file or a file beside
  the model: refused, with the tensor or file it would lose;
* a step that a symlink (in the run, in a step, in the parent or a sibling run) or a pointer file
  names: kept, "referenced by <link>".

The property at the end generates run folders of all three and checks the plan the console shows.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.checkpoints.catalog import list_checkpoints
from backend.policy.retention import RetentionPolicy
from backend.retention.apply import proven_plan
from backend.storage import LocalStore

#: template -> (resumable in truth, holds state beside the model and optimizer)
STATES = {
    "full": (True, False),
    "weights": (False, False),
    "dcp-ema": (True, True),
    "pt-ema": (True, True),
    "pt-full": (True, False),
    "file-ema": (True, True),
}


@pytest.fixture(scope="module")
def templates() -> Iterator[Path]:
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    root = Path(tempfile.mkdtemp(prefix="lm-links-"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    ema = torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.99))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    ema.update_parameters(model)
    msd, esd = model.state_dict(), ema.module.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": msd, "optim": opt.state_dict()}, checkpoint_id=str(root / "full"))
        dcp.save({"model": msd}, checkpoint_id=str(root / "weights"))
        dcp.save({"model": msd, "ema": esd, "optim": opt.state_dict()}, checkpoint_id=str(root / "dcp-ema"))
    (root / "pt-ema").mkdir()
    torch.save({"model": msd, "ema": esd, "optimizer": opt.state_dict(), "step": 7}, root / "pt-ema" / "ckpt.pt")
    (root / "pt-full").mkdir()
    torch.save({"model": msd, "optimizer": opt.state_dict(), "step": 7}, root / "pt-full" / "ckpt.pt")
    # the model and optimizer in torch.save files, the EMA beside them as safetensors
    (root / "file-ema").mkdir()
    torch.save(msd, root / "file-ema" / "model.pt")
    torch.save(opt.state_dict(), root / "file-ema" / "optimizer.pt")
    save_file({k: v.contiguous() for k, v in esd.items()}, str(root / "file-ema" / "ema.safetensors"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _plan(root: Path, policy: RetentionPolicy, run: str = "run"):  # type: ignore[no-untyped-def]
    async def go():  # type: ignore[no-untyped-def]
        store = LocalStore(root)
        cat = await list_checkpoints(store, run)
        plan, _ = await proven_plan(
            None, store, cat, policy, url=str(root / run), now=time.time() + 10**6, in_flight=(), unfinished={}
        )
        return cat, plan

    return asyncio.run(go())


def _destroyed(plan) -> set[str]:  # type: ignore[no-untyped-def]
    return {a.path.rsplit("/", 1)[-1] for a in plan.actions if a.destructive}


def _why(plan) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    return [(a.path, a.action, a.reason) for a in plan.actions]


def _run(tmp: Path, templates: Path, layout: dict[str, str], run: str = "run") -> Path:
    for name, state in layout.items():
        shutil.copytree(templates / state, tmp / run / name)
    return tmp


# -- 1. two runs in one folder ----------------------------------------------------------------


@pytest.mark.parametrize("others", ["delete", "keep-weights"])
def test_two_naming_patterns_in_one_folder_are_never_ranked_together(
    tmp_path: Path, templates: Path, others: str
) -> None:
    names = ("step-1000", "step-2000", "global_step500", "global_step600")
    root = _run(tmp_path, templates, dict.fromkeys(names, "full"))
    cat, plan = _plan(root, RetentionPolicy(keep_full_latest=1, others=others))
    assert {s.name for s in cat.steps} == set(names)  # the catalog lists all four
    destroyed = _destroyed(plan)
    assert "global_step600" not in destroyed and "step-2000" not in destroyed, _why(plan)
    assert destroyed == {"step-1000", "global_step500"}, _why(plan)
    kept = {a.path.rsplit("/", 1)[-1]: a.reason for a in plan.actions if a.action == "keep-full"}
    assert "global_step#" in kept["global_step600"], kept


def test_a_pattern_without_a_proven_step_loses_nothing(tmp_path: Path, templates: Path) -> None:
    """global_step600 is weights only: the global_step run has no resumable step, and step-2000
    (another pattern) proves nothing about it."""
    layout = {"step-1000": "full", "step-2000": "full", "global_step500": "full", "global_step600": "weights"}
    root = _run(tmp_path, templates, layout)
    _, plan = _plan(root, RetentionPolicy(keep_full_latest=1))
    assert "global_step500" not in _destroyed(plan), _why(plan)


# -- 2. state beside the model and the optimizer ------------------------------------------------


@pytest.mark.parametrize("state", ["dcp-ema", "pt-ema", "file-ema"])
def test_a_strip_that_would_lose_ema_weights_is_refused(tmp_path: Path, templates: Path, state: str) -> None:
    root = _run(tmp_path, templates, {"step-100": state, "step-200": "full", "step-300": "full"})
    cat, plan = _plan(root, RetentionPolicy(keep_full_latest=1, others="keep-weights"))
    row = next(s for s in cat.steps if s.name == "step-100")
    assert row.kind == "full" and "ema" in row.strip_loses, (row.kind, row.note, row.strip_loses)
    a = next(a for a in plan.actions if a.path.endswith("step-100"))
    assert a.action == "skip" and "ema" in a.reason, _why(plan)
    assert "step-200" in _destroyed(plan)  # the plain DCP step still strips
    # delete (others = delete) removes the whole old step, as the policy says: that is no strip
    _, plan = _plan(root, RetentionPolicy(keep_full_latest=1))
    assert {"step-100", "step-200"} <= _destroyed(plan)


def test_model_and_optimizer_only_still_strip(tmp_path: Path, templates: Path) -> None:
    root = _run(tmp_path, templates, {"step-100": "pt-full", "step-200": "full", "step-300": "full"})
    cat, plan = _plan(root, RetentionPolicy(keep_full_latest=1, others="keep-weights"))
    assert all(not s.strip_loses for s in cat.steps), [(s.name, s.strip_loses) for s in cat.steps]
    assert {"step-100", "step-200"} == _destroyed(plan), _why(plan)


# -- 3. links and pointers ------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["run", "step", "parent", "sibling", "file", "file-other-pattern"])
def test_a_step_a_link_or_pointer_names_is_kept(tmp_path: Path, templates: Path, where: str) -> None:
    root = _run(tmp_path, templates, {f"step-{n}": "full" for n in (100, 200, 300, 400)})
    run = root / "run"
    target = "step-100"
    if where == "run":
        os.symlink("step-100", run / "best")
        who = "best"
    elif where == "step":
        os.symlink("../step-100", run / "step-400" / "prev")
        who = "step-400/prev"
    elif where == "parent":
        os.symlink("run/step-100", root / "best-of-run")
        who = "../best-of-run"
    elif where == "sibling":
        (root / "other").mkdir()
        os.symlink("../run/step-100", root / "other" / "best")
        who = "../other/best"
    elif where == "file":
        (run / "latest").write_text("step-100\n")
        who = "latest"
    else:  # a pointer naming a step outside the run's pattern
        shutil.copytree(templates / "full", run / "best_ckpt_0")
        shutil.copytree(templates / "full", run / "best_ckpt_1")
        (run / "last_good").write_text("best_ckpt_0\n")
        target, who = "best_ckpt_0", "last_good"
    cat, plan = _plan(root, RetentionPolicy(keep_full_latest=1))
    assert target not in _destroyed(plan), _why(plan)
    a = next(a for a in plan.actions if a.path.endswith(f"/{target}"))
    assert a.action.startswith("keep") and f"referenced by {who}" in a.reason, _why(plan)
    assert "best" not in {s.name for s in cat.steps}  # a link is never a step of its own


def test_a_link_named_like_a_step_is_not_a_step(tmp_path: Path, templates: Path) -> None:
    """``step-900 -> step-100``: deleting it through the store would delete step-100's files."""
    root = _run(tmp_path, templates, {f"step-{n}": "full" for n in (100, 200, 300)})
    os.symlink("step-100", root / "run" / "step-900")
    cat, plan = _plan(root, RetentionPolicy(keep_full_latest=1))
    assert "step-900" not in {s.name for s in cat.steps}
    assert "step-100" not in _destroyed(plan), _why(plan)


# -- the property ---------------------------------------------------------------------------------

FAMILIES = ("step-{n}", "global_step{n}")
LINK_PLACES = ("run", "step", "parent", "sibling", "pointer")


@st.composite
def folders(draw):  # type: ignore[no-untyped-def]
    layout: dict[str, str] = {}
    order: dict[str, tuple[str, int]] = {}
    for fmt in draw(st.lists(st.sampled_from(FAMILIES), min_size=1, max_size=2, unique=True)):
        count = draw(st.integers(1, 4))
        numbers = sorted(draw(st.lists(st.integers(1, 30), min_size=count, max_size=count, unique=True)))
        for n in numbers:
            name = fmt.format(n=n * 100)
            layout[name] = draw(st.sampled_from(sorted(STATES)))
            order[name] = (fmt, n)
    names = sorted(layout)
    links = draw(
        st.lists(st.tuples(st.sampled_from(LINK_PLACES), st.sampled_from(names)), max_size=2, unique_by=lambda t: t[0])
    )
    policy = RetentionPolicy(
        keep_full_latest=draw(st.integers(0, 2)), others=draw(st.sampled_from(["delete", "keep-weights"]))
    )
    return layout, order, links, policy


def _link(root: Path, place: str, target: str, layout: dict[str, str]) -> None:
    run = root / "run"
    if place == "run":
        os.symlink(target, run / "best")
    elif place == "step":
        holder = next((n for n in sorted(layout) if n != target), None)
        if holder is not None:
            os.symlink(f"../{target}", run / holder / "prev")
    elif place == "parent":
        os.symlink(f"run/{target}", root / "keep-this")
    elif place == "sibling":
        (root / "other").mkdir(exist_ok=True)
        os.symlink(f"../run/{target}", root / "other" / "best")
    else:
        (run / "last_checkpoint").write_text(target + "\n")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=folders())
def test_no_referenced_step_no_unexported_state_no_other_runs_step_is_lost(templates: Path, case) -> None:  # type: ignore[no-untyped-def]
    layout, order, links, policy = case
    with tempfile.TemporaryDirectory(prefix="lm-links-case-") as tmp:
        root = _run(Path(tmp), templates, layout)
        for place, target in links:
            _link(root, place, target, layout)
        _, plan = _plan(root, policy)
    why = _why(plan)
    destroyed = _destroyed(plan)
    stripped = {a.path.rsplit("/", 1)[-1] for a in plan.actions if a.action == "strip-to-weights"}
    # no step a link or pointer names is deleted or stripped
    assert not {t for _, t in links} & destroyed, why
    # no strip drops state beside the model and the optimizer
    assert not {n for n in stripped if STATES[layout[n]][1]}, why
    # each naming pattern keeps its own newest resumable step, and what it loses rests on a newer
    # resumable step of its own pattern that is kept
    for fmt in {f for f, _ in order.values()}:
        mine = sorted((n for n in layout if order[n][0] == fmt), key=lambda n: order[n][1])
        resumable = [n for n in mine if STATES[layout[n]][0]]
        if resumable:
            assert resumable[-1] not in destroyed, why
        for n in mine:
            if n in destroyed:
                assert any(order[k][1] > order[n][1] and k not in destroyed for k in resumable), why
