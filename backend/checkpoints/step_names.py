"""What counts as a step of a run: a name that fits the run's own step pattern, and no run itself.

A folder (or a flat file) in a run folder is a *step* only when

1. its name fits a step pattern: a known trainer family (``step-N``, ``global_stepN``,
   ``checkpoint-N``, ``iter_NNNNNNN``, ``epoch=E-step=S``, ``stepN-unsharded``, ``ckpt-N``), or a
   pattern of digits that at least two of its siblings share and whose word is not one that
   names runs, versions or precisions (``version_N``, ``runN``, ``fpN``, ``seedN``, ...); and
2. it does not itself hold a run: no step-like folder or file below it carries another step
   number (``version_0/checkpoints/epoch=0-step=100.ckpt``, ``run1/step-100``). A sub-folder with
   the step's own number is part of the step (the HF Trainer's ``checkpoint-500/global_step500``).

Everything else in a run folder is listed as *not a step*, with the reason, and never touched.
The rule is pure (names only), so the catalog, the planner and the tests share it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: Known step families: (pattern, group holding the step number).
_FAMILIES: tuple[re.Pattern[str], ...] = (
    re.compile(r"^epoch=\d+-step=(?P<n>\d+)(?:-v\d+)?(?:\.ckpt)?$"),
    re.compile(r"^(?:global_)?step[-_=]?(?P<n>\d+)(?:[-_]unsharded)?$"),
    re.compile(r"^checkpoint[-_]?(?P<n>\d+)$"),
    re.compile(r"^iter(?:ation)?[-_]?(?P<n>\d+)$"),
    re.compile(r"^ckpt[-_]?(?P<n>\d+)(?:\.(?:ckpt|pt|pth|bin|safetensors))?$"),
    re.compile(r"^(?:[A-Za-z0-9]+[-_])*(?:step|iter|checkpoint|ckpt)[-_=]?(?P<n>\d+)(?:\.(?:ckpt|pt|pth|bin))?$"),
)
#: Words that name something other than a step when digits follow them: sibling runs, versions,
#: precisions, ranks, seeds, folds, model sizes.
NOT_STEP_WORDS: frozenset[str] = frozenset(
    {
        "version",
        "v",
        "run",
        "runs",
        "exp",
        "experiment",
        "trial",
        "seed",
        "fold",
        "attempt",
        "job",
        "fp",
        "bf",
        "float",
        "int",
        "q",
        "rank",
        "mp_rank",
        "tp",
        "pp",
        "dp",
        "node",
        "gpu",
        "shard",
        "part",
        "layer",
        "b",
        "m",
        "k",
    }
)
#: Flat files in a run folder that may be steps (a whole checkpoint in one file).
STEP_FILE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin")
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class StepName:
    """What the rule says of one entry of a run folder."""

    name: str
    step: int | None  # None: not a step
    why: str = ""  # for a non-step: the reason, shown to the operator


def template(name: str) -> str:
    """The name with every run of digits replaced by ``#`` (``step-100`` -> ``step-#``)."""
    return _DIGITS.sub("#", name)


def family_step(name: str) -> int | None:
    """The step number when ``name`` is of a known trainer family, else None."""
    for pat in _FAMILIES:
        m = pat.match(name)
        if m:
            return int(m.group("n"))
    return None


def _word(name: str) -> str:
    """The word before the last run of digits (``version_0`` -> ``version``, ``fp32`` -> ``fp``)."""
    parts = list(_DIGITS.finditer(name))
    if not parts:
        return ""
    head = name[: parts[-1].start()]
    m = re.search(r"([A-Za-z_]+?)[-_.=]*$", head)
    return m.group(1).strip("_").lower() if m else ""


#: A number the name itself marks as the step (``epoch=3-step=1000-val_loss=0.05``).
_MARKED = re.compile(r"(?:^|[-_.])(?:global_)?(?:step|iter|iteration)[-_=]?(?P<n>\d+)(?=$|[-_.])", re.IGNORECASE)


def _stem(name: str) -> str:
    return re.sub(r"\.(ckpt|pt|pth|bin|safetensors)$", "", name)


def _last_number(name: str) -> int | None:
    """The step a name outside the known families carries: the number a step word marks, else
    its only number. None when it carries several and none is marked: which one counts steps is
    a guess (``epoch=03-val_loss=0.05``: the loss's digits would order the run)."""
    stem = _stem(name)
    marked = {int(m.group("n")) for m in _MARKED.finditer(stem)}
    if len(marked) == 1:
        return marked.pop()
    parts = _DIGITS.findall(stem)
    return int(parts[0]) if len(parts) == 1 and not marked else None


def nested_steps(own: int | None, below: Iterable[str]) -> list[str]:
    """Step-like names below an entry that carry another step number (a run, not a step)."""
    out = []
    for rel in below:
        for part in rel.split("/"):
            n = family_step(part)
            if n is not None and n != own:
                out.append(part)
                break
    return out


def classify_names(entries: Mapping[str, Iterable[str]], *, files: Iterable[str] = ()) -> dict[str, StepName]:
    """Apply the rule to a run folder's entries.

    ``entries`` maps each sub-folder name to the paths of its objects (relative to it); ``files``
    are the flat files directly in the run folder (only those with a checkpoint suffix count).
    """
    files = [f for f in files if f.endswith(STEP_FILE_SUFFIXES)]
    names = list(entries) + files
    by_template: dict[str, list[str]] = {}
    for n in names:
        if _DIGITS.search(n):
            by_template.setdefault(template(n), []).append(n)
    out: dict[str, StepName] = {}
    for n in names:
        if not _DIGITS.search(n):
            out[n] = StepName(n, None, "no step number in its name")
            continue
        known = family_step(n)
        shared = len(by_template[template(n)])
        word = _word(n)
        if known is None:
            if word in NOT_STEP_WORDS:
                out[n] = StepName(n, None, f"named like a sibling run, version or precision ({word!r})")
                continue
            if shared < 2 or not _ends_in_number(n):
                out[n] = StepName(n, None, "its name fits no step pattern that its siblings share")
                continue
        step = known if known is not None else _last_number(n)
        if step is None:
            out[n] = StepName(n, None, "its name carries several numbers and none is marked as the step")
            continue
        inner = nested_steps(step, entries.get(n, ()))
        if inner:
            out[n] = StepName(n, None, f"holds a run itself ({inner[0]} inside)")
            continue
        out[n] = StepName(n, step)
    return out


def _ends_in_number(name: str) -> bool:
    return bool(re.search(r"\d$", re.sub(r"\.(ckpt|pt|pth|bin|safetensors)$", "", name)))


def step_number(name: str) -> int | None:
    """The step number a single name carries, by the rule's patterns (no siblings consulted)."""
    known = family_step(name)
    if known is not None:
        return known
    if _word(name) in NOT_STEP_WORDS or not _ends_in_number(name):
        return None
    return _last_number(name)
