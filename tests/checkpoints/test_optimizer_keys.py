"""Which flat DCP keys are optimizer state (``key_paths_optimizer``): retention strips and keeps by
it, so its fast form must say exactly what the rule says. Generated keys, against the rule written
plainly: a key under a prefix that has both ``state`` and ``param_groups`` below it (a torch
optimizer state dict, wherever it sits, the root included), a leaf only optimizers write, an entry
frameworks store optimizers under, or a numbered ``optimizer_N``/``optim_N``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from backend.checkpoints.torchfile import OPTIMIZER_ENTRIES, OPTIMIZER_LEAVES, key_paths_optimizer

PARTS = st.sampled_from(
    ["state", "param_groups", "model", "app", "optim", "optimizer_0", "optim_x", "layers", "0", "1", "weight",
     "exp_avg", "step", "lr", *sorted(OPTIMIZER_ENTRIES)[:3], *sorted(OPTIMIZER_LEAVES)[:3]]
)  # fmt: skip
KEYS = st.lists(st.lists(PARTS, min_size=1, max_size=5).map(".".join), max_size=25, unique=True)


def _plain(keys: list[str]) -> list[str]:
    state, groups = set(), set()
    for k in keys:
        parts = k.split(".")
        for i, p in enumerate(parts):
            if p == "state":
                state.add(".".join(parts[:i]))
            elif p == "param_groups":
                groups.add(".".join(parts[:i]))
    roots = state & groups
    out = []
    for k in keys:
        parts = k.split(".")
        if (
            any(".".join(parts[:i]) in roots for i in range(len(parts)))
            or any(p in OPTIMIZER_LEAVES for p in parts)
            or any(p in OPTIMIZER_ENTRIES for p in parts[:-1])
            or any(p.startswith(("optimizer_", "optim_")) and p.split("_", 1)[1].isdigit() for p in parts[:-1])
        ):
            out.append(k)
    return out


@settings(max_examples=400, deadline=None)
@given(KEYS)
def test_the_optimizer_keys_are_what_the_rule_says(keys: list[str]) -> None:
    assert key_paths_optimizer(keys) == _plain(keys)
