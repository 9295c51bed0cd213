"""The retention planner: the ``[retention]`` policy applied to a run's steps (pure).

``plan = plan_retention(steps, policy, now=..., in_flight=...)`` and ``recheck_plan``; the policy
and the plan's model (what is planned, hashed, saved and loaded) are :mod:`backend.policy.retention`.
Every input is passed in: nothing is read from the network, the disk or the state DB.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from backend.policy.retention import (
    KNOWN_LAYOUTS,
    STRIPPABLE_LAYOUTS,
    VERIFIED,
    PlannedAction,
    RetentionPlan,
    RetentionPolicy,
    content_hash,
)
from backend.units import duration_text

#: Files a BF16 export consists of (written by ``backend.checkpoints.strip``).
_EXPORT_RE = re.compile(r"^(?:model-\d{5}-of-\d{5}\.safetensors|model\.safetensors|model\.safetensors\.index\.json)$")

# -- step facts -------------------------------------------------------------------------------


def rel_name(step: Any, key: str) -> str:
    """An object's name inside its step folder."""
    base = step.path.rstrip("/") + "/"
    return key[len(base) :] if key.startswith(base) else key


def is_export_file(name: str) -> bool:
    """Whether ``name`` (inside a step folder) belongs to a BF16 safetensors export."""
    return bool(_EXPORT_RE.match(name.rsplit("/", 1)[-1])) and "/" not in name


def step_fingerprint(step: Any) -> str:
    """A hash of the step's objects (names and sizes), ignoring BF16 export files.

    Export files are left out so that a strip interrupted after its export was written still
    matches the plan; anything else added, removed or resized changes the fingerprint.
    """
    items = sorted(
        (rel_name(step, o.key), int(o.size)) for o in step.objects if not is_export_file(rel_name(step, o.key))
    )
    return content_hash(items)[:16]


def export_fingerprint(step: Any) -> str:
    """A hash of the BF16 export files in the step folder ("" when there are none)."""
    items = sorted((rel_name(step, o.key), int(o.size)) for o in step.objects if is_export_file(rel_name(step, o.key)))
    return content_hash(items)[:16] if items else ""


def export_bytes(step: Any) -> int:
    """Bytes of the BF16 export files already in the step folder."""
    return sum(o.size for o in step.objects if is_export_file(rel_name(step, o.key)))


def _estimate_weights(step: Any, policy: RetentionPolicy) -> tuple[int, bool]:
    """Bytes a weights-only version of ``step`` keeps, and whether that is an estimate."""
    if step.has_bf16_export:
        keep = export_bytes(step)
        keep += sum(o.size for o in step.objects if rel_name(step, o.key) == policy.milestone_marker)
        return keep, False
    # Without an export yet: the BF16 bytes of the model tensors the catalog read (a single-file
    # save keeps its model), else everything but the optimizer state.
    kept = getattr(step, "weights_bytes", None)
    if kept is not None:
        return int(kept), True
    return max(0, step.total_bytes - step.optimizer_bytes), True


def _has_marker(step: Any, marker: str) -> bool:
    return bool(marker) and any(rel_name(step, o.key) == marker for o in step.objects)


_DIGITS = re.compile(r"\d+")


def step_family(step: Any) -> str:
    """The naming pattern of a step (``step-1000`` -> ``step-#``, ``global_step500`` ->
    ``global_step#``; Lightning's ``-vN`` suffix for a repeated name is ignored). Steps of two
    patterns in one folder are two runs (or one run that changed its naming): their numbers are
    never ranked against each other."""
    name = str(step.path).rstrip("/").rsplit("/", 1)[-1]
    return _DIGITS.sub("#", re.sub(r"-v\d+(?=\.ckpt$|$)", "", name))


def _sort_key(step: Any) -> tuple[int, int, str]:
    return (0, step.step, step.path) if step.step is not None else (1, 0, step.path)


def plan_retention(
    steps: Sequence[Any],
    policy: RetentionPolicy,
    *,
    now: float,
    in_flight: Iterable[str] = (),
    url: str = "",
    prefix: str = "",
    usd_per_gb_month: float | None = None,
    price_note: str = "",
    proofs: Mapping[str, str] | None = None,
    unfinished: Mapping[str, str] | None = None,
    candidates_only: bool = False,
) -> RetentionPlan:
    """The retention plan for ``steps`` (CheckpointStep-like) under ``policy`` at time ``now``.

    ``in_flight`` holds step paths that running upload/save jobs are still writing. ``proofs``
    maps step paths to ``"verified"`` or the problem the deep resumable check found; a kept full
    step whose proof failed stops every destructive action of the plan. Deny by default: a step
    is deleted or stripped only when a *newer* step of the run is proven resumable.
    ``unfinished`` maps step paths to the action an interrupted apply began on them (from the
    journal): the plan finishes it, under the same protections and the same proof rule.
    ``candidates_only``: skip the proof rule, for the first pass that picks which steps to prove
    (never executed).
    """
    flying = {p.rstrip("/") for p in in_flight}
    ordered = sorted(steps, key=_sort_key)
    proofs = proofs or {}
    unfinished = unfinished or {}

    def is_in_flight(s: Any) -> bool:
        return s.kind == "incomplete" or s.path.rstrip("/") in flying

    def is_known(s: Any) -> bool:
        return s.step is not None and s.layout in KNOWN_LAYOUTS and s.kind in ("full", "weights")

    def too_young(s: Any) -> bool:
        return bool(policy.min_age) and now - s.mtime < policy.min_age

    # Each naming pattern is planned on its own (two runs, or one that changed its naming, in one
    # folder): its own latest N, its own last resumable step, its own newest artifact.
    family = {s.path: step_family(s) for s in ordered if s.step is not None}
    families = sorted(set(family.values()))
    among = (lambda s: f" of the {family[s.path]} steps") if len(families) > 1 else (lambda s: "")
    latest: set[str] = set()
    last_resumable: set[str] = set()
    newest: set[str] = set()
    for fam in families:
        complete_full = [
            s
            for s in ordered
            if family.get(s.path) == fam
            and is_known(s)
            and not is_in_flight(s)
            and s.kind == "full"
            and not too_young(s)
        ]
        if policy.keep_full_latest:
            latest |= {s.path for s in complete_full[-policy.keep_full_latest :]}
        # A run never loses its last resumable step, whatever keep_full_latest says.
        if complete_full:
            last_resumable.add(complete_full[-1].path)
        # Step numbers order a run (object mtimes tie at the store's 1 s granularity and change on copy).
        numbered = [s for s in ordered if family.get(s.path) == fam]
        if numbered:
            newest.add(numbered[-1].path)

    actions: list[PlannedAction] = []
    for s in ordered:
        fp = step_fingerprint(s)

        def act(
            action: str,
            reason: str,
            after: int | None = None,
            estimated: bool = False,
            milestone: bool = False,
            pinned: str | None = None,
            s: Any = s,
            fp: str = fp,
        ) -> None:
            actions.append(
                PlannedAction(
                    step=s.step,
                    path=s.path,
                    action=action,
                    reason=reason,
                    layout=s.layout,
                    kind=s.kind,
                    bytes_before=s.total_bytes,
                    bytes_after=s.total_bytes if after is None else after,
                    object_count=s.object_count,
                    fingerprint=fp,
                    estimated=estimated,
                    milestone=milestone,
                    pinned=pinned,
                    resumable=proofs.get(s.path) if action == "keep-full" else None,
                    export=export_fingerprint(s),
                    note=str(getattr(s, "note", "") or ""),
                )
            )

        note = getattr(s, "note", "") or ""
        if s.path in unfinished and s.step is not None:
            _finish(s, policy, unfinished[s.path], act)
            continue
        if s.step is None:
            act("skip", f"{note or 'not a step: no step number in its name'}: never touched")
            continue
        if s.kind == "corrupt":
            act("skip", f"corrupt ({note or 'files do not match the commit marker'}): never counted, never touched")
            continue
        if s.layout not in KNOWN_LAYOUTS or s.kind == "unknown":
            act("skip", f"unknown ({s.layout}{': ' + note if note else ''}): never touched")
            continue
        if is_in_flight(s):
            why = (note or "no commit marker yet") if s.kind == "incomplete" else "a running job is writing it"
            act("skip", f"in flight ({why}): never counted, never touched")
            continue
        pin = policy.pin_reason(s.step)
        milestone_why = _milestone_reason(s, policy)
        keep = "keep-full" if s.kind == "full" else "keep-weights"
        if pin is not None:
            act(keep, f"pinned: {pin}" if pin else "pinned", milestone=milestone_why is not None, pinned=pin)
            continue
        if refs := tuple(getattr(s, "referenced_by", ()) or ()):
            act(keep, f"referenced by {', '.join(refs)} (kept like a pin)", milestone=milestone_why is not None)
            continue
        if getattr(s, "best", False):
            act(keep, "the Trainer's best_model_checkpoint (kept like a pin)", milestone=milestone_why is not None)
            continue
        if s.path in latest:
            act(
                "keep-full", f"latest {policy.keep_full_latest} complete{among(s)}", milestone=milestone_why is not None
            )
            continue
        if s.path in last_resumable:
            act("keep-full", f"the run's last resumable step{among(s)}", milestone=milestone_why is not None)
            continue
        if s.path in newest:
            act(keep, f"the newest artifact of the run{among(s)}: never deleted", milestone=milestone_why is not None)
            continue
        if too_young(s):
            age = now - s.mtime
            act(
                "skip",
                f"younger than the minimum age ({duration_text(age)} < {duration_text(policy.min_age)})",
                milestone=milestone_why is not None,
            )
            continue
        if milestone_why is not None:
            if s.kind == "weights":
                act("keep-weights", f"milestone ({milestone_why}), already weights only", milestone=True)
            else:
                _strip_or_refuse(s, policy, act, f"milestone ({milestone_why})", milestone=True)
            continue
        if policy.others == "keep-weights":
            if s.kind == "weights":
                act("keep-weights", "older step, weights only kept (others = keep-weights)")
            else:
                _strip_or_refuse(s, policy, act, "older step (others = keep-weights)", milestone=False)
            continue
        act("delete", "neither recent, milestone nor pinned", after=0)
    if not candidates_only:
        actions = _deny_unproven(actions, ordered, proofs, is_known, is_in_flight)
    return RetentionPlan(
        url=url,
        prefix=prefix,
        created=now,
        policy=policy,
        actions=tuple(actions),
        in_flight=tuple(sorted(flying)),
        usd_per_gb_month=usd_per_gb_month,
        price_note=price_note,
    )


def _finish(s: Any, policy: RetentionPolicy, action: str, act: Any) -> None:
    """A step an interrupted apply began to delete or strip: finish it, unless it is protected now."""
    pin = policy.pin_reason(s.step)
    if pin is not None:
        act("skip", f"pinned ({pin or 'no reason given'}); an interrupted {action} left it part-done", pinned=pin)
    elif getattr(s, "best", False):
        act("skip", f"the Trainer's best checkpoint; an interrupted {action} left it part-done")
    elif refs := tuple(getattr(s, "referenced_by", ()) or ()):
        act("skip", f"referenced by {', '.join(refs)}; an interrupted {action} left it part-done")
    elif action != "delete" and (loses := str(getattr(s, "strip_loses", "") or "")):
        act("skip", f"refused, {loses}; an interrupted {action} left it part-done")
    elif action == "delete" and _milestone_reason(s, policy) is not None:
        act("skip", f"a milestone; an interrupted {action} left it part-done", milestone=True)
    elif action == "delete":
        act("delete", "finish the delete an interrupted apply began", after=0)
    else:
        kept = export_bytes(s) + sum(o.size for o in s.objects if rel_name(s, o.key) == policy.milestone_marker)
        act("strip-to-weights", "finish the strip an interrupted apply began", after=min(kept, s.total_bytes))


def _deny_unproven(
    actions: list[PlannedAction], ordered: Sequence[Any], proofs: Mapping[str, str], is_known: Any, is_in_flight: Any
) -> list[PlannedAction]:
    """Deny by default: a step is deleted or stripped only when the run has a *newer* step that is
    proven resumable now (committed full step that passed the deep check), and no kept full step
    failed that check. Every other destructive action becomes a skip that says why."""
    proven = [
        s
        for s in ordered
        if is_known(s) and s.kind == "full" and not is_in_flight(s) and proofs.get(s.path) == VERIFIED
    ]
    # the proof a step's removal rests on is a newer step of its own naming pattern
    family = {s.path: step_family(s) for s in ordered}
    several = len({family[s.path] for s in ordered if s.step is not None}) > 1
    newest_proven: dict[str, int] = {}
    for s in proven:
        newest_proven[family[s.path]] = max(newest_proven.get(family[s.path], s.step), s.step)
    failed = [a for a in actions if a.action == "keep-full" and a.resumable not in (None, VERIFIED)]
    blanket: str | None = None
    if failed:
        f = failed[0]
        blanket = f"not resumable-proven: kept step {f.path} failed the deep check ({f.resumable}); nothing is deleted"
    tried = [(p, why) for p, why in proofs.items() if why != VERIFIED]
    because = f" ({tried[0][0]}: {tried[0][1]})" if tried else ""
    out = []
    for a in actions:
        if not a.destructive:
            out.append(a)
            continue
        fam = family.get(a.path, "")
        top = newest_proven.get(fam)
        why = blanket
        if why is None and top is None:
            what = f"no {fam} step of this folder" if several else "no step of this run"
            why = f"nothing is deleted or stripped: {what} is proven resumable{because}"
        why = why or _unproven_source(a, proofs.get(a.path))
        if why is None and (a.step is None or top is None or a.step >= top):
            among = f" {fam}" if several else ""
            why = f"no newer{among} step is proven resumable (the newest proven is step {top}): left alone"
        if why is None:
            out.append(a)
        else:
            out.append(
                replace(a, action="skip", reason=f"{a.reason}; {why}", bytes_after=a.bytes_before, estimated=False)
            )
    return out


def _unproven_source(a: PlannedAction, proof: str | None) -> str | None:
    """Why a strip may not read its step (a strip reads what it exports), or None."""
    if a.action != "strip-to-weights" or proof == VERIFIED:
        return None
    if proof is None and a.reason.startswith("finish the strip"):
        return None  # an interrupted strip: its export was verified, its source is partly gone
    if proof:
        return f"refused: its files fail the deep check ({proof}), so a strip could not read what it exports"
    return "refused: its files were not deep-checked, and a strip must read what it exports"


def proof_candidates(steps: Sequence[Any], plan: RetentionPlan, *, at_most: int = 8) -> list[str]:
    """The steps whose deep check the rule needs: those the plan keeps full, then the newest
    committed full steps (newest first, ``at_most``) so that a newer proven step can be found."""
    kept = [a.path for a in plan.actions if a.action == "keep-full"]
    flying = set(plan.in_flight)
    full = [
        s
        for s in sorted(steps, key=_sort_key, reverse=True)
        if s.kind == "full" and s.step is not None and s.path not in flying and s.layout in KNOWN_LAYOUTS
    ]
    per: dict[str, list[str]] = {}
    for s in full:  # the newest of each naming pattern: each pattern needs its own proof
        per.setdefault(step_family(s), []).append(s.path)
    newest = [p for paths in per.values() for p in paths[:at_most]]
    return list(dict.fromkeys(kept + newest))


def strip_refusal(s: Any) -> str | None:
    """Why a strip of ``s`` would be refused by apply (the plan runs the same checks), or None."""
    flags = tuple(getattr(s, "flags", ()))
    export_note = str(getattr(s, "export_note", "") or "")
    if not s.has_bf16_export and "zero3-placeholders" in flags:
        return (
            "a ZeRO-3 checkpoint keeps its only weights in the optimizer partitions; consolidate it "
            "(DeepSpeed's zero_to_fp32.py) and export BF16 first"
        )
    if getattr(s, "is_file", False):
        return "a checkpoint file in the run folder has no step folder for its export to go in; export it first"
    if not s.has_bf16_export and "nested" in flags:
        return (
            "its checkpoint sits in a sub-folder of the step and strip exports only a checkpoint at the "
            "top of a step; export it first"
        )
    loses = str(getattr(s, "strip_loses", "") or "")
    if loses:
        return f"{loses}; export it or keep the step full"
    if not s.has_bf16_export and export_note:
        return f"its safetensors files are no BF16 export ({export_note}); a strip cannot write one over them"
    if not s.has_bf16_export and s.layout not in STRIPPABLE_LAYOUTS:
        return (
            f"a {s.layout} checkpoint without a BF16 export would lose its only full-precision weights; export it first"
        )
    return None


def _strip_or_refuse(s: Any, policy: RetentionPolicy, act: Any, why: str, *, milestone: bool) -> None:
    refused = strip_refusal(s)
    if refused is not None:
        act("skip", f"{why}: refused, {refused}", milestone=milestone)
        return
    after, estimated = _estimate_weights(s, policy)
    act("strip-to-weights", why, after=min(after, s.total_bytes), estimated=estimated, milestone=milestone)


def _milestone_reason(s: Any, policy: RetentionPolicy) -> str | None:
    if s.step in policy.milestones:
        return "listed"
    if policy.milestone_every and s.step % policy.milestone_every == 0:
        return f"every {policy.milestone_every}"
    if _has_marker(s, policy.milestone_marker):
        return f"{policy.milestone_marker} marker"
    return None


# -- re-check ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recheck:
    """A plan compared with a fresh listing: what changed, and which actions must stop."""

    changes: tuple[str, ...]
    stopped: Mapping[str, str]  # step path -> why its action stops

    @property
    def clean(self) -> bool:
        return not self.changes and not self.stopped


def recheck_plan(
    plan: RetentionPlan,
    fresh: RetentionPlan,
    *,
    resumed: Mapping[str, str] | None = None,
    done: Iterable[str] = (),
) -> Recheck:
    """Compare ``plan`` with ``fresh`` (the same policy recomputed on a new listing).

    An action still runs only if the fresh listing yields the same action on the same objects
    and the same BF16 export. ``done`` paths finished in an earlier, interrupted apply and are not
    compared. ``resumed`` maps step paths whose action was started before to ``"ok"`` when the
    step's remaining objects are consistent with that partial progress (checked by the
    executor); a resumed action is still stopped by everything that protects a step now: a pin,
    the Trainer's best checkpoint, the latest N, the newest artifact, ``min_age``, a running job.
    """
    resumed = resumed or {}
    done_set = set(done)
    fresh_by_path = {a.path: a for a in fresh.actions}
    planned_paths = {a.path for a in plan.actions}
    changes: list[str] = []
    for a in fresh.actions:
        if a.path not in planned_paths:
            changes.append(f"new step {a.path} landed ({a.kind}, {a.layout}) after the plan was made")
    stopped: dict[str, str] = {}
    for a in plan.actions:
        if a.path in done_set:
            continue
        f = fresh_by_path.get(a.path)
        if a.path in resumed:
            if resumed[a.path] != "ok":
                why = resumed[a.path]
            elif a.destructive and f is not None and (p := _protected(f, fresh.policy)) is not None:
                why = f"an interrupted {a.action} resumed, but the step is now protected: {p}"
            else:
                continue
            stopped[a.path] = why
            changes.append(f"{a.path}: {why}")
            continue
        if f is None:
            if a.action == "delete":
                continue  # already gone: the goal is reached
            why = "the step folder is gone from the listing"
        elif f.fingerprint != a.fingerprint:
            why = (
                f"its objects changed since the plan ({a.object_count} -> {f.object_count} objects, "
                f"{a.bytes_before} -> {f.bytes_before} bytes)"
            )
        elif f.export != a.export:
            why = "a BF16 export was written or changed after the plan was made"
        elif f.pinned is not None and a.pinned is None:
            why = f"it was pinned after the plan was made ({f.pinned or 'no reason given'})"
        elif f.action != a.action:
            why = f"the fresh listing now says {f.action} ({f.reason}), the plan said {a.action}"
        else:
            continue
        stopped[a.path] = why
        changes.append(f"{a.path}: {why}")
    return Recheck(tuple(changes), stopped)


def _protected(fresh_action: PlannedAction, policy: RetentionPolicy) -> str | None:
    """Why a step may not be deleted or stripped now (from its freshly planned action), or None."""
    if fresh_action.pinned is not None or policy.pin_reason(fresh_action.step) is not None:
        return "pinned"
    if fresh_action.action in ("keep-full", "keep-weights"):
        return fresh_action.reason
    if fresh_action.action == "skip" and fresh_action.kind not in ("incomplete", "corrupt", "unknown"):
        return fresh_action.reason  # too young, running job, refused
    if fresh_action.action == "skip" and "a running job is writing it" in fresh_action.reason:
        return fresh_action.reason
    return None
