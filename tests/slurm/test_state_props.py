"""Properties of the Slurm readers: hostlist expressions against Slurm's grammar (``hostlist.c``,
slurm.conf(5) "NodeName": ranges with zero padding, several bracketed ranges in one name,
comma lists, suffixes), and node/job state lists as ``data_parser`` prints them (v0.0.39+
``PARSER_FLAG_ARRAY(NODE_STATES)`` / ``(JOB_STATE)``): deny by default, every shape alike."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.slurm.model import WORKING_FLAGS
from backend.slurm.parse import JOB_BASE_STATES, JOB_FLAG_WORDS, expand_nodes, node_state, parse_jobs_json

# -- hostlists ------------------------------------------------------------------------------------

PREFIX = st.from_regex(r"[a-z][a-z0-9\-]{0,6}", fullmatch=True).filter(lambda s: not s[-1].isdigit())
SUFFIX = st.sampled_from(["", "-ib", "-bmc", "x", ".lab"])


@st.composite
def ranges(draw: st.DrawFn) -> tuple[str, list[str]]:
    """One bracket: ``[001-003,010]`` and the numbers it stands for, each zero padded to its width."""
    width = draw(st.integers(1, 4))
    top = 10**width - 1
    parts: list[str] = []
    nums: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        lo = draw(st.integers(0, min(top, 200)))
        hi = draw(st.integers(lo, min(top, lo + 12)))
        parts.append(f"{lo:0{width}d}" + (f"-{hi:0{width}d}" if hi != lo else ""))
        nums.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
    return "[" + ",".join(parts) + "]", nums


@st.composite
def host_items(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A name with one or two bracketed ranges (``rack[1-2]-gpu[01-02]``) or none."""
    n = draw(st.integers(0, 2))
    expr_parts, choices = [], []
    for i in range(n):
        pre = draw(PREFIX) if i == 0 else draw(st.sampled_from(["-gpu", "-n", "_blade", "x"]))
        br, nums = draw(ranges())
        expr_parts.append(pre + br)
        choices.append([pre + x for x in nums])
    suffix = draw(SUFFIX)
    if n == 0:
        name = draw(PREFIX) + draw(st.sampled_from(["", "1", "07"]))
        return name + suffix, [name + suffix]
    names = ["".join(combo) + suffix for combo in itertools.product(*choices)]
    return "".join(expr_parts) + suffix, names


@settings(max_examples=150, deadline=None)
@given(st.lists(host_items(), min_size=1, max_size=4))
def test_expansion_equals_the_generated_hosts(items: list[tuple[str, list[str]]]) -> None:
    expr = ",".join(e for e, _ in items)
    want = list(dict.fromkeys(n for _, names in items for n in names))
    assert list(expand_nodes(expr)) == want


MALFORMED = st.one_of(
    st.sampled_from(
        [
            "n[1-2",
            "n1-2]",
            "n[]",
            "n[3-1]",
            "n[a-b]",
            "n[1-2]]",
            "n[[1-2]]",
            "n[1-99999999]",
            "n[١-٣]",  # Arabic-Indic digits: int() reads them, Slurm does not
            "n 1,n2",
            "n[1-2];rm",
            "gpu-[001-004]\x1b[2J",
            "../etc",
            "-n1",
        ]
    ),
    st.text(alphabet="n0123456789[],- ;\x00é", min_size=1, max_size=20).filter(
        lambda t: any(c in t.strip() for c in " ;\x00é") or t.count("[") != t.count("]")
    ),
)


@settings(max_examples=150, deadline=None)
@given(MALFORMED)
def test_a_malformed_expression_is_refused_in_one_line(expr: str) -> None:
    with pytest.raises(ValueError) as exc:
        expand_nodes(expr)
    assert "\n" not in str(exc.value) and "\x1b" not in str(exc.value)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_any_text_expands_to_plain_names_or_one_line(expr: str) -> None:
    try:
        names = expand_nodes(expr)
    except ValueError as exc:
        assert "\n" not in str(exc)
        return
    assert all(n.isascii() and n[0].isalnum() for n in names)


def test_a_long_list_is_refused_not_cut_short() -> None:
    """A list too long to read whole is refused: cut at a limit, its last name would be another
    node (``gpu-1234`` read as ``gpu-12``)."""
    names = [f"gpu-{i:05d}" for i in range(0, 200000, 2)]
    with pytest.raises(ValueError, match="characters|names"):
        expand_nodes(",".join(names))
    names = [f"gpu-{i}" for i in range(1200)]
    assert expand_nodes(",".join(names)) == tuple(names)


# -- node states ----------------------------------------------------------------------------------

BASES = st.sampled_from(["IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN"])
ALL_FLAGS = [
    "RESERVED", "UNDRAIN", "CLOUD", "RESUME", "DRAIN", "COMPLETING", "NOT_RESPONDING", "POWERED_DOWN", "FAIL",
    "POWERING_UP", "MAINTENANCE", "REBOOT_REQUESTED", "REBOOT_CANCELED", "POWERING_DOWN", "DYNAMIC_FUTURE",
    "REBOOT_ISSUED", "PLANNED", "INVALID_REG", "POWER_DOWN", "POWER_UP", "POWER_DRAIN", "DYNAMIC_NORM",
    "PERFCTRS", "?", "BLOCKED",
]  # fmt: skip
FLAGS = st.lists(st.sampled_from(ALL_FLAGS), max_size=5, unique=True)
#: What keeps new work away: such a node is never shown as its base word and never available.
OUT = {"DRAIN", "FAIL", "MAINTENANCE", "REBOOT_REQUESTED", "REBOOT_ISSUED", "INVALID_REG", "POWERING_DOWN"}


@settings(max_examples=300, deadline=None)
@given(BASES, FLAGS)
def test_every_shape_of_a_state_is_one_state(base: str, flags: list[str]) -> None:
    as_list = node_state([base, *flags])  # 23.02+
    as_word = node_state(base.lower(), flags)  # 22.05: word + state_flags
    as_text = node_state("+".join([base, *flags]))  # scontrol show node -o
    assert as_list == as_word == as_text


@settings(max_examples=300, deadline=None)
@given(BASES, FLAGS)
def test_deny_by_default(base: str, flags: list[str]) -> None:
    st_ = node_state([base, *flags])
    word = st_.label.rstrip("*")
    if set(flags) & OUT or base in ("DOWN",):
        assert word not in ("idle", "mixed", "allocated"), (base, flags, st_.label)
    if set(flags) & (OUT | {"NOT_RESPONDING", "?", "BLOCKED", "POWER_DOWN", "POWER_DRAIN"}) or base not in (
        "IDLE",
        "ALLOCATED",
        "MIXED",
    ):
        assert st_.unavailable, (base, flags)
    if "NOT_RESPONDING" in flags:
        assert st_.label.endswith("*")
    if not st_.unavailable:
        assert base in ("IDLE", "ALLOCATED", "MIXED") and set(flags) <= WORKING_FLAGS


@given(BASES, BASES.filter(lambda b: b != "IDLE"), FLAGS)
def test_two_base_states_are_refused(a: str, b: str, flags: list[str]) -> None:
    if a == b:
        return
    with pytest.raises(ValueError, match="two base states"):
        node_state([a, b, *flags])


# -- job states -----------------------------------------------------------------------------------

JOB_FLAGS = [*JOB_FLAG_WORDS, "LAUNCH_FAILED", "RECONFIG_FAIL", "POWER_UP_NODE"]


def job_state_string(base: str, flags: list[str]) -> str:
    """slurm_protocol_defs.c job_state_string, written out again for the test."""
    for f in ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
              "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING"):  # fmt: skip
        if f in flags:
            return f
    return base


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(JOB_BASE_STATES)), st.lists(st.sampled_from(JOB_FLAGS), max_size=4, unique=True))
def test_a_job_state_list_is_slurms_one_word(base: str, flags: list[str]) -> None:
    rec = {"job_id": 7, "job_state": [base, *flags], "nodes": "", "user_name": "u"}
    jobs, skipped = parse_jobs_json(json.dumps({"jobs": [rec]}))
    assert skipped == []
    assert jobs[0].state == job_state_string(base, flags)
    if "COMPLETING" in flags:
        assert not jobs[0].ended  # it still holds its nodes
