"""Checkpoint retention: the ``[retention]`` policy and the plan (what is planned, hashed, saved).

The planner that applies the policy is :mod:`backend.policy.retention_planner`
(``plan = plan_retention(steps, policy, now=..., in_flight=...)``): every input is passed in,
nothing is read from the network, the disk or the state DB, so a plan can be computed, reviewed,
saved as JSON (with a content hash) and later re-checked against a fresh listing by recomputing it.

Per step exactly one action:

* ``keep-full``        -- one of the latest ``keep_full_latest`` *complete* full checkpoints, or pinned.
* ``strip-to-weights`` -- a milestone (or, with ``others = "keep-weights"``, any older step):
  export BF16 safetensors into the step folder, verify, then remove the optimizer/training state.
* ``keep-weights``     -- already weights-only and still wanted.
* ``delete``           -- neither recent, milestone nor pinned (``others = "delete"``).
* ``skip``             -- never touched: in flight, corrupt, unknown, too young, or refused.

Safety rails live here, so they hold for the CLI, the console and re-checks alike: only complete
``full`` checkpoints older than ``min_age`` count toward the latest N; in-flight steps (no commit
marker, or named by a running job) are never counted and never touched; corrupt and unknown steps
are never touched; the newest artifact of the run (of any kind) and its last resumable step are
never deleted; the HF Trainer's best checkpoint is kept like a pin; steps sort numerically; a
layout without a BF16 export that strip cannot write one for is refused rather than stripped. And
when a step the plan keeps full fails the deep "resumable" check (``proofs``), the plan deletes
and strips nothing at all.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from backend.errors import PolicyError
from backend.schema import parse_duration
from backend.units import bytes_text

Action = Literal["keep-full", "strip-to-weights", "delete", "keep-weights", "skip"]
ACTIONS: tuple[str, ...] = ("keep-full", "strip-to-weights", "delete", "keep-weights", "skip")
#: Actions that change the store.
DESTRUCTIVE: frozenset[str] = frozenset({"strip-to-weights", "delete"})
PLAN_SCHEMA = 2
GB = 10**9

#: Layouts whose full-precision state ``strip_step`` can turn into a BF16 export itself.
STRIPPABLE_LAYOUTS: frozenset[str] = frozenset({"dcp", "torch-save"})
KNOWN_LAYOUTS: frozenset[str] = frozenset(
    {"dcp", "hf-safetensors", "deepspeed", "torch-save", "hf-trainer", "accelerate", "lightning", "megatron"}
)
MAX_PLAN_BYTES = 64 * 1024 * 1024


def _list(v: Any) -> list[Any]:
    if not isinstance(v, list):
        raise TypeError("'actions' must be a list")
    return v


#: What ``proofs`` says of a step that passed the deep check.
VERIFIED = "verified"


@dataclass(frozen=True)
class Pin:
    """An operator's pin: the step is kept untouched, for a reason."""

    step: int
    reason: str = ""


@dataclass(frozen=True)
class RetentionPolicy:
    """The ``[retention]`` config section (every field defaulted); CLI flags mirror it.

    ``keep_full_latest``: how many of the newest complete full checkpoints stay full.
    ``milestone_every``: every step divisible by N is a milestone (0 = off).
    ``milestones``: explicit milestone steps. ``milestone_marker``: an object the training job
    writes into a step folder to mark it (``MILESTONE``; empty = off).
    ``others``: what happens to steps that are neither recent, milestones nor pinned.
    ``pins``: ``[{step = 48000, reason = "eval baseline"}]``. ``min_age``: ``"2h"``; younger steps
    are never touched.
    """

    keep_full_latest: int = 2
    milestone_every: int = 0
    milestones: tuple[int, ...] = ()
    milestone_marker: str = "MILESTONE"
    others: Literal["delete", "keep-weights"] = "delete"
    pins: tuple[Pin, ...] = ()
    min_age: float = field(default=0.0, metadata={"parse": parse_duration})

    def __post_init__(self) -> None:
        if self.keep_full_latest < 0:
            raise ValueError(f"keep_full_latest must be 0 or more, got {self.keep_full_latest}")
        if self.milestone_every < 0:
            raise ValueError(f"milestone_every must be 0 (off) or a positive step count, got {self.milestone_every}")
        if self.min_age < 0:
            raise ValueError(f"min_age must not be negative, got {self.min_age}")
        if self.others not in ("delete", "keep-weights"):
            raise ValueError(f"others must be 'delete' or 'keep-weights', got {self.others!r}")
        # Normalise so equal policies hash equal whatever order they were written in.
        object.__setattr__(self, "milestones", tuple(sorted(set(int(m) for m in self.milestones))))
        object.__setattr__(self, "pins", tuple(sorted({p.step: p for p in self.pins}.values(), key=lambda p: p.step)))

    def pin_reason(self, step: int | None) -> str | None:
        """The pin reason for ``step`` ("" counts as pinned), None when not pinned."""
        for p in self.pins:
            if p.step == step:
                return p.reason
        return None

    def with_pins(self, extra: Iterable[Pin]) -> RetentionPolicy:
        """This policy with more pins (an existing pin's reason is kept)."""
        have = {p.step for p in self.pins}
        return replace(self, pins=self.pins + tuple(p for p in extra if p.step not in have))

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["milestones"] = list(self.milestones)
        d["pins"] = [{"step": p.step, "reason": p.reason} for p in self.pins]
        return d

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RetentionPolicy:
        """Rebuild a policy stored in a plan file."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise PolicyError(f"plan file: unknown retention policy key {unknown[0]!r}")
        d = dict(raw)
        d["milestones"] = tuple(int(m) for m in d.get("milestones", ()))
        d["pins"] = tuple(Pin(int(p["step"]), str(p.get("reason", ""))) for p in d.get("pins", ()))
        try:
            return cls(**d)
        except (TypeError, ValueError) as exc:
            raise PolicyError(f"plan file: bad retention policy: {exc}") from None


def parse_pin(text: str) -> Pin:
    """Parse ``--pin STEP[:REASON]``."""
    step, _, reason = text.partition(":")
    try:
        return Pin(int(step.strip()), reason.strip())
    except ValueError:
        raise PolicyError(f"--pin expects STEP[:REASON] with a whole step number, got {text!r}") from None


def parse_step_list(text: str) -> tuple[int, ...]:
    """Parse ``--milestones 48000,96000``."""
    out = []
    for part in text.split(","):
        if not part.strip():
            continue
        try:
            out.append(int(part.strip()))
        except ValueError:
            raise PolicyError(f"--milestones expects whole step numbers separated by commas, got {part!r}") from None
    return tuple(out)


# -- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedAction:
    """What the plan does to one step folder, and why."""

    step: int | None
    path: str
    action: str
    reason: str
    layout: str
    kind: str
    bytes_before: int
    bytes_after: int
    object_count: int
    fingerprint: str
    estimated: bool = False
    milestone: bool = False
    pinned: str | None = None
    resumable: str | None = None  # kept full steps: "verified", or the problem the deep check found
    export: str = ""  # fingerprint of the BF16 export files (a new export after the plan stops it)
    note: str = ""  # the catalog's reason for the kind

    @property
    def bytes_freed(self) -> int:
        return self.bytes_before - self.bytes_after

    @property
    def destructive(self) -> bool:
        return self.action in DESTRUCTIVE

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["bytes_freed"] = self.bytes_freed
        return d

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PlannedAction:
        if not isinstance(raw, Mapping):
            raise TypeError("an action must be a JSON object")
        names = {f.name for f in fields(cls)}
        a = cls(**{k: v for k, v in raw.items() if k in names})
        ints = (a.bytes_before, a.bytes_after, a.object_count)
        if (
            a.action not in ACTIONS
            or not isinstance(a.path, str)
            or not isinstance(a.fingerprint, str)
            or not all(type(n) is int and n >= 0 for n in ints)
            or not (a.step is None or type(a.step) is int)
        ):
            raise ValueError(f"action for {a.path!r} has a field of the wrong type or an unknown action {a.action!r}")
        return a


@dataclass(frozen=True)
class PlanTotals:
    """Bytes before and after, what is saved, and what that is worth per month."""

    bytes_before: int
    bytes_after: int
    usd_per_gb_month: float | None

    @property
    def bytes_saved(self) -> int:
        return self.bytes_before - self.bytes_after

    @property
    def percent_saved(self) -> float:
        return saving_percent(self.bytes_before, self.bytes_after)

    @property
    def usd_month_saved(self) -> float | None:
        return monthly_cost(self.bytes_saved, self.usd_per_gb_month)

    def as_dict(self) -> dict[str, Any]:
        return {
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "bytes_saved": self.bytes_saved,
            "percent_saved": round(self.percent_saved, 3),
            "usd_per_gb_month": self.usd_per_gb_month,
            "usd_month_saved": None if self.usd_month_saved is None else round(self.usd_month_saved, 4),
        }


@dataclass(frozen=True)
class RetentionPlan:
    """A reviewable, hashable retention plan for one store root."""

    url: str
    prefix: str
    created: float
    policy: RetentionPolicy
    actions: tuple[PlannedAction, ...]
    in_flight: tuple[str, ...] = ()
    usd_per_gb_month: float | None = None
    price_note: str = ""
    #: "" when a delete in this store frees the bytes; else the bucket's versioning status
    #: (``Enabled``, ``Suspended``, ``unknown (...)``): deletes only hide keys behind delete
    #: markers and the bytes stay stored, and billed, as noncurrent versions (ObjectStore.versioning).
    versioning: str = ""

    @property
    def totals(self) -> PlanTotals:
        # no money is saved by a delete that leaves the bytes stored as older versions
        price = None if self.versioning else self.usd_per_gb_month
        return PlanTotals(sum(a.bytes_before for a in self.actions), sum(a.bytes_after for a in self.actions), price)

    def count(self, action: str) -> int:
        return sum(1 for a in self.actions if a.action == action)

    @property
    def destructive_actions(self) -> tuple[PlannedAction, ...]:
        return tuple(a for a in self.actions if a.destructive)

    def bytes_by_action(self) -> dict[str, int]:
        """Bytes after the plan per action (what stays), plus ``freed``: for the storage bar."""
        out = {a: 0 for a in ACTIONS}
        for a in self.actions:
            out[a.action] += a.bytes_after
        out["freed"] = self.totals.bytes_saved
        return out

    def body(self) -> dict[str, Any]:
        """The hashed content (everything but the hash and derived totals)."""
        return {
            "schema": PLAN_SCHEMA,
            "url": self.url,
            "prefix": self.prefix,
            "created": self.created,
            "policy": self.policy.as_dict(),
            "in_flight": list(self.in_flight),
            "usd_per_gb_month": self.usd_per_gb_month,
            "price_note": self.price_note,
            "actions": [a.as_dict() for a in self.actions],
            # only when set: a plan file written before this field keeps its hash
            **({"versioning": self.versioning} if self.versioning else {}),
        }

    @property
    def keeps_versions(self) -> bool:
        """Whether the deletes this plan makes may free nothing (see :attr:`versioning`)."""
        return bool(self.versioning)

    def versions_note(self) -> str:
        """One line for the operator when :attr:`keeps_versions`, else ""."""
        if not self.versioning:
            return ""
        hidden = bytes_text(self.totals.bytes_saved)
        if self.versioning.startswith("unknown"):
            return (
                f"the bucket's versioning is {self.versioning}: if it keeps versions, the {hidden} this plan "
                "removes stays stored, and billed, as older versions until a lifecycle rule expires them"
            )
        return (
            f"the bucket keeps versions (versioning {self.versioning}): the {hidden} this plan removes is hidden "
            "behind delete markers and stays stored, and billed, as older versions until a lifecycle rule "
            "expires them"
        )

    @property
    def hash(self) -> str:
        """sha256 of the canonical JSON of :meth:`body`."""
        return content_hash(self.body())

    def to_json(self) -> str:
        d = self.body()
        d["totals"] = self.totals.as_dict()
        d["hash"] = self.hash
        return json.dumps(d, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: str = "plan") -> RetentionPlan:
        """Load a plan file; a PolicyError when it is not one or its content was edited."""
        if len(text) > MAX_PLAN_BYTES:
            raise PolicyError(f"{source}: {len(text)} bytes is over the {MAX_PLAN_BYTES}-byte limit for a plan file")
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PolicyError(f"{source}: not a retention plan (invalid JSON: {exc})") from None
        except RecursionError:
            raise PolicyError(f"{source}: not a retention plan (nested too deeply)") from None
        if not isinstance(raw, dict) or raw.get("schema") != PLAN_SCHEMA or "actions" not in raw:
            raise PolicyError(f"{source}: not a retention plan (write one with 'loadmaster retention plan --out')")
        try:
            plan = cls(
                url=raw["url"],
                prefix=raw.get("prefix", ""),
                created=float(raw["created"]),
                policy=RetentionPolicy.from_dict(raw["policy"]),
                actions=tuple(PlannedAction.from_dict(a) for a in _list(raw["actions"])),
                in_flight=tuple(raw.get("in_flight", ())),
                usd_per_gb_month=raw.get("usd_per_gb_month"),
                price_note=raw.get("price_note", ""),
                versioning=_text(raw.get("versioning", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PolicyError(f"{source}: malformed retention plan ({exc!r})") from None
        if raw.get("hash") != plan.hash:
            raise PolicyError(
                f"{source}: the plan's content hash does not match (it was edited after it was made); "
                "compute a new plan with 'loadmaster retention plan'"
            )
        return plan


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("versioning must be a string")
    return value


def content_hash(obj: Any) -> str:
    """sha256 hex of ``obj`` as canonical JSON."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def saving_percent(before: int | float, after: int | float) -> float:
    """Percent of ``before`` that is saved by going to ``after`` (0 when nothing is stored)."""
    return 0.0 if before <= 0 else 100.0 * (before - after) / before


def monthly_cost(nbytes: int | float, usd_per_gb_month: float | None) -> float | None:
    """Storage cost of ``nbytes`` for a month (GB = 10^9 bytes); None when unpriced."""
    return None if usd_per_gb_month is None else nbytes / GB * usd_per_gb_month
