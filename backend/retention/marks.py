"""Operator marks on a run's steps: pins (no plan touches the step) and milestones (kept as BF16
weights at least), recorded in the state DB under the run's canonical URL, so a mark made after a
plan was computed stops that plan's action on the step.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from backend.policy.retention import Pin, RetentionPolicy

if TYPE_CHECKING:
    from backend.config import Config
    from backend.state import StateDB


class PinStore:
    """Operator pins per run, in the state DB (so a pin made after a plan stops it).

    ``url`` is a run's canonical URL (:func:`backend.retention.runs.run_url`); reads also find
    pins recorded under another spelling of the same run when ``keys`` are given.
    """

    table = "retention_pins"
    what = "pin"

    def __init__(self, db: StateDB) -> None:
        self.db = db

    def _keys(self, url: str, keys: Iterable[str] = ()) -> list[str]:
        return list(dict.fromkeys([norm_url(url), *(norm_url(k) for k in keys)]))

    def pins(self, url: str, keys: Iterable[str] = ()) -> tuple[Pin, ...]:
        """The pins recorded for the run ``url`` (and its other spellings ``keys``)."""
        ks = self._keys(url, keys)
        rows = self.db.query(
            f"SELECT step, reason FROM retention_pins WHERE url IN ({','.join('?' * len(ks))}) ORDER BY step", ks
        )
        return tuple({int(r["step"]): Pin(int(r["step"]), r["reason"]) for r in rows}.values())

    def pin(self, url: str, step: int, reason: str = "") -> None:
        """Pin ``step`` under ``url`` (``ops.retention.pin`` audits it). A pin binds every apply from the moment it is
        recorded: it is taken under the run's lock, and refused (naming the apply) while an
        apply is deleting that very step, so it is never acknowledged and then ignored."""
        from backend.state import actor

        self._record(
            url,
            step,
            "pin",
            ("delete", "strip-to-weights"),
            "INSERT INTO retention_pins (url, step, reason, who, ts) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (url, step) DO UPDATE SET reason = excluded.reason, who = excluded.who, ts = excluded.ts",
            (norm_url(url), step, reason, actor(), time.time()),
        )

    def _record(
        self, url: str, step: int, what: str, refused_during: tuple[str, ...], sql: str, params: tuple[object, ...]
    ) -> None:
        """Write a mark under the run's lock, refused while an apply's claim on the step is live."""
        from backend.errors import PolicyError

        def body(db: StateDB) -> None:
            holder = claimed_by(db, url, step, actions=refused_during)
            if holder is not None:
                raise PolicyError(
                    f"step {step} of {norm_url(url)} is being deleted right now by {holder}: the {what} is refused "
                    "(it could not stop what has begun); see 'loadmaster audit --action retention.apply'"
                )
            db.execute(sql, params)

        self.db.transact(body, lock=run_lock(url))

    def unpin(self, url: str, step: int, keys: Iterable[str] = ()) -> bool:
        """Remove a pin; False when there was none."""
        return self._remove("retention_pins", url, step, keys)

    def _remove(self, table: str, url: str, step: int, keys: Iterable[str]) -> bool:
        ks = self._keys(url, keys)
        cur = self.db.execute(f"DELETE FROM {table} WHERE step = ? AND url IN ({','.join('?' * len(ks))})", [step, *ks])
        return bool(cur.rowcount)


class MilestoneStore(PinStore):
    """Milestones an operator marked (console ``m`` or ``retention milestone``), per run."""

    def milestones(self, url: str, keys: Iterable[str] = ()) -> tuple[int, ...]:
        """The steps marked as milestones for the run ``url``."""
        ks = self._keys(url, keys)
        rows = self.db.query(f"SELECT step FROM retention_milestones WHERE url IN ({','.join('?' * len(ks))})", ks)
        return tuple(sorted({int(r["step"]) for r in rows}))

    def mark(self, url: str, step: int) -> None:
        """Mark ``step`` a milestone (``ops.retention.mark_milestone`` audits it): bound by every apply from then on, or refused
        (naming the apply) while an apply is deleting that very step."""
        from backend.state import actor

        self._record(
            url,
            step,
            "milestone mark",
            ("delete",),
            "INSERT INTO retention_milestones (url, step, who, ts) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (url, step) DO UPDATE SET who = excluded.who, ts = excluded.ts",
            (norm_url(url), step, actor(), time.time()),
        )

    def unmark(self, url: str, step: int, keys: Iterable[str] = ()) -> bool:
        """Remove a milestone mark; False when there was none."""
        return self._remove("retention_milestones", url, step, keys)


#: An apply's claim on a step it is deleting counts for this long after it was made (an apply
#: killed mid-delete leaves its claim; the next apply reconciles and finishes the step).
CLAIM_STALE_S = 600.0


def run_lock(url: str) -> str:
    """The state-DB lock that a pin and an apply's claim on the same run take, one at a time."""
    return f"retention-run:{norm_url(url)}"


def claimed_by(
    db: StateDB,
    url: str,
    step: int,
    *,
    actions: tuple[str, ...] = ("delete", "strip-to-weights"),
    stale_after: float = CLAIM_STALE_S,
) -> str | None:
    """Who is deleting ``step`` of the run ``url`` right now (an apply's live claim for one of
    ``actions``), or None."""
    import json

    rows = db.query(
        "SELECT plan_hash, detail, ts FROM retention_journal WHERE state = 'deleting' AND ts > ?",
        (time.time() - stale_after,),
    )
    for r in rows:
        try:
            d = json.loads(r["detail"])
        except (ValueError, TypeError):
            continue
        if (
            isinstance(d, dict)
            and d.get("url") == norm_url(url)
            and d.get("step") == step
            and d.get("action") in actions
        ):
            return f"the retention apply of plan {str(r['plan_hash'])[:12]} by {d.get('who', 'someone')}"
    return None


def norm_url(url: str) -> str:
    """A run URL as marks and job destinations are compared: without a trailing slash."""
    return url.rstrip("/")


def canonical_run(config: Config, ref: str) -> tuple[str, tuple[str, ...]]:
    """The run's canonical URL and every spelling its records may be stored under."""
    from backend.retention.runs import run_keys, run_url

    return run_url(config, ref), run_keys(config, ref)


def effective_policy(config: Config, db: StateDB, policy: RetentionPolicy, url: str) -> RetentionPolicy:
    """``policy`` plus the pins and milestones recorded in the state DB for the run ``url``."""
    from dataclasses import replace

    url, keys = canonical_run(config, url)
    marked = MilestoneStore(db).milestones(url, keys)
    pol = policy.with_pins(PinStore(db).pins(url, keys))
    return replace(pol, milestones=tuple(sorted(set(pol.milestones) | set(marked)))) if marked else pol
