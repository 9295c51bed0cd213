"""Computing and applying retention plans against a real store, with a journal and an audit record.

Applying a plan: the listing is fetched again and the plan re-checked (the same policy recomputed
on the fresh listing must yield the same action on the same objects, or that action stops); each
destructive action is journalled in the state DB keyed by the plan hash, so re-running an
interrupted apply finishes the work without redoing or undoing anything. A milestone's training
state is deleted only after its BF16 export exists and passes verification. Deletes go through
``ObjectStore.delete_many`` (1000 keys per request) and per-key errors are reported. Every apply
writes one audit record with each action and its outcome.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from backend.errors import PolicyError, StoreError
from backend.policy.prices import PriceOverrides
from backend.policy.retention import STRIPPABLE_LAYOUTS, VERIFIED, PlannedAction, RetentionPlan, RetentionPolicy
from backend.policy.retention_planner import is_export_file, plan_retention, recheck_plan, rel_name
from backend.retention.marks import canonical_run, effective_policy, norm_url, run_lock
from backend.units import bytes_text

if TYPE_CHECKING:
    from backend.checkpoints.steps import Catalog, CheckpointStep
    from backend.config import Config
    from backend.jobs.manager import JobManager
    from backend.state import StateDB
    from backend.storage import ObjectStore, StoreRegistry

#: Files in a step folder that describe the run rather than hold its state: kept by a strip.
_KEEP_AFTER_STRIP = re.compile(r"^[^/]+\.(json|txt|yaml|yml|md|model|tiktoken)$", re.IGNORECASE)
_KEEP_MAX_BYTES = 16 * 1024 * 1024
#: Step folders processed at once during an apply.
APPLY_CONCURRENCY = 8
#: Commit markers, deleted first so a half-deleted step never looks complete to a loader.
_COMMIT_MARKERS = frozenset({".metadata", "model.safetensors.index.json", "latest"})

FaultHook = Callable[[str, PlannedAction], None]
ProgressHook = Callable[["ActionOutcome"], object]  # its return value is ignored


class RetentionServices(Protocol):
    """What planning and applying a run use, and nothing more (``backend.services.Services`` is
    one): the config, the state DB (journal, marks, audit), the stores, and the job records (a step
    a running job writes is left alone; a step loadmaster uploaded needs its upload job succeeded)."""

    @property
    def config(self) -> Config: ...

    @property
    def db(self) -> StateDB: ...

    @property
    def stores(self) -> StoreRegistry: ...

    @property
    def jobs(self) -> JobManager: ...


# -- journal ----------------------------------------------------------------------------------


class Journal:
    """Started, half-done and completed actions of one plan (keyed by its hash).

    Each row's detail names the run (``url``) and step, and the objects the step held when the
    action began, so a later apply of any plan can account for what a killed one deleted."""

    def __init__(self, db: StateDB, plan_hash: str, *, url: str = "") -> None:
        self.db = db
        self.plan_hash = plan_hash
        self.url = norm_url(url)

    def entries(self) -> dict[str, tuple[str, dict[str, Any]]]:
        rows = self.db.query("SELECT path, state, detail FROM retention_journal WHERE plan_hash = ?", (self.plan_hash,))
        return {r["path"]: (r["state"], json.loads(r["detail"])) for r in rows}

    def unfinished_for_run(self) -> dict[str, tuple[str, str, dict[str, Any]]]:
        """Path -> (plan hash, state, detail) of every unfinished action on this run, any plan."""
        marks = ",".join("?" * len(UNFINISHED))
        rows = self.db.query(
            f"SELECT plan_hash, path, state, detail, ts FROM retention_journal WHERE state IN ({marks}) ORDER BY ts",
            UNFINISHED,
        )
        out: dict[str, tuple[str, str, dict[str, Any]]] = {}
        for r in rows:
            try:
                d = json.loads(r["detail"])
            except (ValueError, TypeError):
                continue
            if isinstance(d, dict) and d.get("url") == self.url and self.url:
                out[r["path"]] = (r["plan_hash"], r["state"], d)
        return out

    def set(self, a: PlannedAction, state: str, detail: Mapping[str, Any] | None = None) -> None:
        d = {"url": self.url, "step": a.step, "action": a.action, **dict(detail or {})}
        self.db.execute(
            "INSERT INTO retention_journal (plan_hash, path, action, state, detail, ts) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (plan_hash, path) DO UPDATE SET action = excluded.action, state = excluded.state,"
            " detail = excluded.detail, ts = excluded.ts",
            (self.plan_hash, a.path, a.action, state, json.dumps(d, default=str), time.time()),
        )

    def finish(self, a: PlannedAction, freed: int) -> None:
        """The action is done: its journal row and its audit record (``retention.action``, the
        bytes it deleted) are written in one transaction, so a kill never leaves one without the
        other."""

        def body(db: StateDB) -> None:
            Journal(db, self.plan_hash, url=self.url).set(a, "done", {"bytes_freed": freed})
            db.record_audit(
                "retention.action",
                f"{self.url}#{a.path}",
                "done",
                plan_hash=self.plan_hash,
                detail={"action": a.action, "step": a.step, "bytes_freed": freed},
            )

        self.db.transact(body)

    def intent(self, a: PlannedAction) -> None:
        """The audit record written before a destructive action starts (what it will remove)."""
        self.db.record_audit(
            "retention.intent",
            f"{self.url}#{a.path}",
            "started",
            plan_hash=self.plan_hash,
            detail={"action": a.action, "step": a.step, "objects": a.object_count, "bytes": a.bytes_before},
        )

    def reconcile(self, fresh: Mapping[str, CheckpointStep]) -> int:
        """Account for what killed applies deleted: for each unfinished action on this run, the
        journalled objects now gone are audited (``retention.reconcile``) and the journal row is
        moved on to what remains. Returns the bytes accounted."""
        total = 0
        for path, (h, state, d) in self.unfinished_for_run().items():
            before = {str(n): int(sz) for n, sz in d.get("objects", []) if isinstance(n, str)}
            if not before:
                continue
            step = fresh.get(path)
            now = {rel_name(step, o.key) for o in step.objects} if step is not None else set()
            gone = {n: sz for n, sz in before.items() if n not in now}
            if not gone:
                continue
            nbytes = sum(gone.values())
            total += nbytes
            self.db.record_audit(
                "retention.reconcile",
                f"{self.url}#{path}",
                "ok",
                plan_hash=h,
                detail={
                    "action": d.get("action"),
                    "bytes_deleted": nbytes,
                    "objects_deleted": len(gone),
                    "by": d.get("who", "an interrupted apply"),
                    "state": state,
                },
            )
            d2 = {
                **d,
                "objects": [[n, sz] for n, sz in before.items() if n in now],
                "reconciled_bytes": int(d.get("reconciled_bytes", 0)) + nbytes,
            }
            self.db.execute(
                "UPDATE retention_journal SET detail = ? WHERE plan_hash = ? AND path = ?",
                (json.dumps(d2, default=str), h, path),
            )
        return total


# -- planning ---------------------------------------------------------------------------------


def storage_price(config: Config, stores: StoreRegistry, url: str) -> tuple[float | None, str]:
    """Storage $/GB-month of the store holding ``url``, and where the figure comes from."""
    _, profile = stores.profile_for(url)
    if profile is None or not profile.is_s3:
        return None, "local store: storage not priced"
    if not profile.provider:
        return None, f"store {profile.name or profile.url}: no provider configured, storage not priced"
    from backend.policy.prices import price_table

    prices = price_table(config.section(PriceOverrides)).provider(profile.provider, profile.region)
    if prices is None:
        return None, f"provider {profile.provider!r} is not in the price table: storage not priced"
    return prices.storage_gb_month, f"{prices.name} storage ${prices.storage_gb_month}/GB-month ({prices.source})"


async def prove_kept(
    jobs: JobManager | None, store: ObjectStore, catalog: Catalog, plan: RetentionPlan, url: str
) -> dict[str, str]:
    """The deep resumable check the deny-by-default rule needs: every step ``plan`` keeps full,
    then the newest committed full steps, newest first, until one is proven (``"verified"``, or
    the problem). A step loadmaster uploaded must also have a succeeded upload job on record."""
    from backend.policy.retention_planner import proof_candidates, step_family

    by_path = {s.path: s for s in catalog.steps}
    kept = [a.path for a in plan.actions if a.action == "keep-full" and a.path in by_path]
    # a strip reads what it exports: its source passes the same deep check, or it is refused
    strips = [a.path for a in plan.actions if a.action == "strip-to-weights" and by_path.get(a.path, None)]
    strips = [p for p in strips if by_path[p].kind == "full"]
    proofs = await prove_steps(jobs, store, catalog, url, kept + strips)
    # each naming pattern of the folder needs a proven step of its own (they are never ranked
    # against each other: see step_family)
    proven = {step_family(by_path[p]) for p, v in proofs.items() if p in kept and v == VERIFIED}
    for path in proof_candidates(catalog.steps, plan):
        if path not in by_path or step_family(by_path[path]) in proven:
            continue
        if path not in proofs:
            proofs.update(await prove_steps(jobs, store, catalog, url, [path]))
        if proofs[path] == VERIFIED:
            proven.add(step_family(by_path[path]))
    return proofs


async def prove_steps(
    jobs: JobManager | None, store: ObjectStore, catalog: Catalog, url: str, paths: Iterable[str]
) -> dict[str, str]:
    """The deep resumable check of the steps at ``paths`` (bounded concurrency); ``jobs`` (None:
    no job records) supplies the upload jobs a step loadmaster uploaded must have succeeded."""
    from backend.checkpoints.proof import prove_resumable

    by_path = {s.path: s for s in catalog.steps}
    kept = [p for p in paths if p in by_path]
    uploads = _upload_records(jobs, url)
    sem = asyncio.Semaphore(APPLY_CONCURRENCY)

    async def one(path: str) -> tuple[str, str]:
        rec = uploads.get(path)
        if rec is not None and rec[0] != "succeeded":
            return path, f"its upload (job {rec[1]}) is {rec[0]}, not verified"
        async with sem:
            try:
                return path, await prove_resumable(store, by_path[path])
            except (StoreError, PolicyError) as exc:
                return path, str(exc)
            except Exception as exc:  # noqa: BLE001 - a hostile file fails the proof, never the command
                return path, f"{type(exc).__name__}: {exc}"

    return dict(await asyncio.gather(*(one(p) for p in kept)))


def _upload_records(jobs: JobManager | None, url: str) -> dict[str, tuple[str, str]]:
    """Step path -> (state, job id) of the newest upload job that wrote into the run ``url``."""
    if jobs is None:
        return {}
    try:
        records = jobs.records()
    except Exception:  # noqa: BLE001 - no job manager / nodes unreachable: the file check still runs
        return {}
    base = norm_url(url) + "/"
    out: dict[str, tuple[str, str, float]] = {}
    for r in records:
        if r.kind != "upload" or not r.destination.rstrip("/").startswith(base):
            continue
        step = r.destination.rstrip("/")[len(base) :].split("/", 1)[0]
        if step not in out or r.created > out[step][2]:
            out[step] = (r.state, r.id, r.created)
    return {k: (v[0], v[1]) for k, v in out.items()}


def in_flight_from_jobs(jobs: JobManager, url: str) -> set[str]:
    """Step folders under ``url`` that unfinished jobs (uploads, saves, strips) are writing.

    A job's ``dest`` (or, for a strip, its ``src``) inside the run folder names the step it
    writes; the first path segment below ``url`` is that step folder.
    """
    records = jobs.records()
    base = norm_url(url) + "/"
    out: set[str] = set()
    for r in records:
        if r.terminal:
            continue
        targets = [r.destination] + ([r.source] if r.kind == "strip" else [])
        for t in targets:
            t = t.rstrip("/")
            if t.startswith(base):
                out.add(t[len(base) :].split("/", 1)[0])
    return out


async def fetch_catalog(store: ObjectStore, prefix: str = "") -> Catalog:
    """A fresh listing of ``store`` (the checkpoints engineer's catalog)."""
    from backend.checkpoints.catalog import list_checkpoints

    return await list_checkpoints(store, prefix)


async def compute_plan(
    services: RetentionServices,
    url: str,
    policy: RetentionPolicy,
    *,
    in_flight: Iterable[str] = (),
    now: float | None = None,
    catalog: Catalog | None = None,
) -> RetentionPlan:
    """List ``url`` afresh and plan it under ``policy`` (plus DB pins, milestones and running
    jobs); every step the plan keeps full is deep-checked, and a failure stops every delete."""
    url, _ = canonical_run(services.config, url)
    flying = set(in_flight) | in_flight_from_jobs(services.jobs, url)
    price, note = storage_price(services.config, services.stores, url)
    pol = effective_policy(services.config, services.db, policy, url)
    when = time.time() if now is None else now
    async with services.stores.open(url) as store:
        if catalog is None:
            catalog = await fetch_catalog(store)
        unfinished = unfinished_actions(services.db, url, catalog)
        plan, _ = await proven_plan(
            services.jobs,
            store,
            catalog,
            pol,
            url=url,
            now=when,
            in_flight=flying,
            unfinished=unfinished,
            usd_per_gb_month=price,
            price_note=note,
        )
        # a versioned bucket keeps what a delete removes: the plan says so instead of "saves"
        if any(a.destructive for a in plan.actions):
            plan = replace(plan, versioning=await store.versioning())
    return plan


async def proven_plan(
    jobs: JobManager | None,
    store: ObjectStore,
    catalog: Catalog,
    policy: RetentionPolicy,
    *,
    url: str,
    now: float,
    in_flight: Iterable[str],
    unfinished: Mapping[str, str],
    usd_per_gb_month: float | None = None,
    price_note: str = "",
) -> tuple[RetentionPlan, dict[str, str]]:
    """The plan of ``catalog`` under the proof rule, and the proofs it rests on: a first pass
    (never executed) picks the steps to deep-check, the second plans with their verdicts."""
    common: dict[str, Any] = {
        "now": now,
        "in_flight": in_flight,
        "url": url,
        "prefix": catalog.prefix,
        "unfinished": unfinished,
    }
    first = plan_retention(catalog.steps, policy, candidates_only=True, **common)
    proofs = await prove_kept(jobs, store, catalog, first, url)
    plan = plan_retention(
        catalog.steps, policy, proofs=proofs, usd_per_gb_month=usd_per_gb_month, price_note=price_note, **common
    )
    return plan, proofs


def unfinished_actions(db: StateDB, url: str, catalog: Catalog) -> dict[str, str]:
    """Step path -> the action an interrupted apply began on it and a new plan may finish (the
    step holds nothing it did not hold when that action began)."""
    by_path = {s.path: s for s in catalog.steps}
    out = {}
    for path, (_, _, d) in Journal(db, "", url=url).unfinished_for_run().items():
        action = d.get("action")
        if action in ("delete", "strip-to-weights") and path in by_path:
            if _consistent_with_start(by_path[path], d, str(action)) == "ok":
                out[path] = str(action)
    return out


# -- applying ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ActionOutcome:
    """What happened to one planned action."""

    index: int
    total: int
    path: str
    step: int | None
    action: str
    outcome: str  # running | done | already-done | kept | stopped | failed | would-do
    detail: str = ""
    bytes_freed: int = 0
    errors: Mapping[str, str] = field(default_factory=dict)
    #: Bytes of keys the store only hid behind a delete marker (a versioned bucket): gone from
    #: listings, still stored and billed as noncurrent versions. Never counted as freed.
    bytes_hidden: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "step": self.step,
            "action": self.action,
            "outcome": self.outcome,
            "detail": self.detail,
            "bytes_freed": self.bytes_freed,
            "bytes_hidden": self.bytes_hidden,
            "errors": dict(self.errors),
        }


@dataclass(frozen=True)
class ApplyReport:
    """The result of one apply (or dry run)."""

    plan_hash: str
    url: str
    dry_run: bool
    outcomes: tuple[ActionOutcome, ...]
    changes: tuple[str, ...]
    audit_id: int | None = None

    @property
    def ok(self) -> bool:
        return not any(o.outcome in ("failed", "stopped") for o in self.outcomes)

    @property
    def outcome(self) -> str:
        if self.dry_run:
            return "dry-run"
        if any(o.outcome == "failed" for o in self.outcomes):
            return "failed"
        return "stopped" if any(o.outcome == "stopped" for o in self.outcomes) else "ok"

    @property
    def bytes_freed(self) -> int:
        return sum(o.bytes_freed for o in self.outcomes if o.outcome == "done")

    @property
    def bytes_hidden(self) -> int:
        """Bytes the deletes only hid (delete markers on a versioned bucket): still stored."""
        return sum(o.bytes_hidden for o in self.outcomes)

    def hidden_note(self) -> str:
        """One line when deletes left bytes stored as older versions, else ""."""
        if not self.bytes_hidden:
            return ""
        return (
            f"{bytes_text(self.bytes_hidden)} was only hidden behind delete markers: the bucket keeps versions, "
            "so it stays stored, and billed, as older versions until a lifecycle rule expires them"
        )

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes if o.outcome == outcome)

    def as_dict(self) -> dict[str, Any]:
        return {
            "plan_hash": self.plan_hash,
            "url": self.url,
            "dry_run": self.dry_run,
            "outcome": self.outcome,
            "bytes_freed": self.bytes_freed,
            "bytes_hidden": self.bytes_hidden,
            "changes": list(self.changes),
            "audit_id": self.audit_id,
            "actions": [o.as_dict() for o in self.outcomes],
        }


def _consistent_with_start(step: CheckpointStep | None, started: Mapping[str, Any], action: str) -> str:
    """'ok' when a started action's step still holds only objects it held when the action began."""
    if step is None:
        return "ok" if action == "delete" else "the step folder is gone, but its strip had not finished"
    before = {name: size for name, size in started.get("objects", [])}
    for o in step.objects:
        name = rel_name(step, o.key)
        if is_export_file(name) and action == "strip-to-weights":
            continue
        if before.get(name) != o.size:
            return f"an interrupted {action} resumed, but {name} is new or resized since it began"
    return "ok"


def strip_deletions(step: CheckpointStep, marker: str) -> list[str]:
    """Keys a strip removes: everything but the export, the milestone marker and small metadata files."""
    out = []
    for o in step.objects:
        name = rel_name(step, o.key)
        if is_export_file(name) or name == marker:
            continue
        if name not in _COMMIT_MARKERS and _KEEP_AFTER_STRIP.match(name) and o.size <= _KEEP_MAX_BYTES:
            continue
        out.append(o.key)
    return out


def _markers_first(step: CheckpointStep, keys: list[str]) -> tuple[list[str], list[str]]:
    first = [k for k in keys if rel_name(step, k) in _COMMIT_MARKERS]
    return first, [k for k in keys if k not in set(first)]


async def _delete(
    store: ObjectStore,
    step: CheckpointStep,
    keys: list[str],
    *,
    markers_last: bool = False,
    between: Callable[[], None] | None = None,
) -> Removed:
    """Delete ``keys`` in 1000-key batches: a delete removes the commit markers first (a
    half-deleted step never looks complete); a strip removes them last (a half-stripped step
    keeps its marker until its state is gone, and the journal finishes it)."""
    sizes = {o.key: o.size for o in step.objects}
    markers, rest = _markers_first(step, keys)
    groups = (rest, markers) if markers_last else (markers, rest)
    freed = hidden = 0
    errors: dict[str, str] = {}
    for i, group in enumerate(groups):
        if not group:
            continue
        if errors and i == 1:
            break  # the first group failed: keep what the second describes or holds
        if i == 1 and between is not None:
            between()  # a test's fault hook: the process may die half-way
        res = await store.delete_many(group)
        freed += sum(sizes.get(k, 0) for k in res.deleted)
        hidden += sum(sizes.get(k, 0) for k in res.hidden)
        errors.update(res.errors)
    return Removed(freed, hidden, errors)


@dataclass(frozen=True)
class Removed:
    """What the deletes of one action did: bytes confirmed gone, bytes only hidden behind delete
    markers (still stored as older versions), and the keys the store refused, with why."""

    freed: int
    hidden: int
    errors: dict[str, str]


async def apply_plan(
    services: RetentionServices,
    plan: RetentionPlan,
    *,
    dry_run: bool = False,
    in_flight: Iterable[str] = (),
    store: ObjectStore | None = None,
    progress: ProgressHook | None = None,
    fault: FaultHook | None = None,
) -> ApplyReport:
    """Re-check ``plan`` against a fresh listing and execute what still holds.

    ``store`` overrides the store opened from the plan's URL (used to inject failing stores in
    tests). ``fault(stage, action)`` is called at ``before``/``exported``/``deleting`` (between the
    two groups of deletions)/``after`` of each destructive action, so a test can crash an apply
    part-way.
    """
    owned = store is None
    st = store or services.stores.open(plan.url)
    try:
        if dry_run:
            return await _apply_locked(
                services, plan, st, dry_run=True, in_flight=in_flight, progress=progress, fault=fault
            )
        from backend.retention.runs import ApplyLock

        async with ApplyLock(st, plan.prefix, run=plan.url, plan=plan.hash):
            return await _apply_locked(
                services, plan, st, dry_run=False, in_flight=in_flight, progress=progress, fault=fault
            )
    finally:
        if owned:
            await st.close()


#: Journal states of an action that began and did not finish (its process may have died).
UNFINISHED = ("started", "exported", "deleting", "failed")


async def _apply_locked(
    services: RetentionServices,
    plan: RetentionPlan,
    st: ObjectStore,
    *,
    dry_run: bool,
    in_flight: Iterable[str],
    progress: ProgressHook | None,
    fault: FaultHook | None,
) -> ApplyReport:
    journal = Journal(services.db, plan.hash, url=plan.url)
    outcomes: list[ActionOutcome] = []
    changes: tuple[str, ...] = ()
    audit_id: int | None = None
    finished = False
    try:
        catalog = await fetch_catalog(st, plan.prefix)
        fresh_by_path = {s.path: s for s in catalog.steps}
        planned = {a.path: a for a in plan.actions}
        if not dry_run:
            journal.reconcile(fresh_by_path)
        entries = journal.entries()
        # Half-done actions of this run from any plan (an apply killed mid-way): this apply
        # accounts for what they deleted, then finishes them where its own plan agrees.
        for path, (_h, state, detail) in journal.unfinished_for_run().items():
            if path in planned and path not in entries and detail.get("action") == planned[path].action:
                entries[path] = (state, detail)
        done = {p for p, (state, _) in entries.items() if state == "done"}
        resumed = {
            p: _consistent_with_start(fresh_by_path.get(p), detail, planned[p].action)
            for p, (state, detail) in entries.items()
            if state in UNFINISHED and p in planned
        }
        flying = set(in_flight) | in_flight_from_jobs(services.jobs, plan.url)
        policy = _policy_now(services.config, services.db, plan)
        now = time.time()
        unfinished = {p: planned[p].action for p in resumed if resumed[p] == "ok"}
        fresh, proofs = await proven_plan(
            services.jobs, st, catalog, policy, url=plan.url, now=now, in_flight=flying, unfinished=unfinished
        )
        check = recheck_plan(plan, fresh, resumed=resumed, done=done)
        changes = check.changes
        total = len(plan.actions)
        results: dict[int, ActionOutcome] = {}
        sem = asyncio.Semaphore(APPLY_CONCURRENCY)
        guard = _Guard(services, st, plan, catalog, proofs)

        async def run_one(i: int, a: PlannedAction) -> None:
            def emit(
                outcome: str,
                detail: str = "",
                freed: int = 0,
                errors: Mapping[str, str] | None = None,
                hidden: int = 0,
            ) -> None:
                o = ActionOutcome(
                    i, total, a.path, a.step, a.action, outcome, detail, freed, dict(errors or {}), hidden
                )
                if outcome != "running":
                    results[i] = o
                if progress is not None:
                    progress(o)

            if a.path in done:
                return emit("already-done", "finished by an earlier apply of this plan")
            if a.path in check.stopped:
                return emit("stopped", check.stopped[a.path])
            if not a.destructive:
                return emit("kept", a.reason)
            step = fresh_by_path.get(a.path)
            if dry_run:
                return emit("would-do", a.reason, a.bytes_freed)
            if step is None:  # a planned delete whose folder is already gone
                earlier = entries.get(a.path, ("", {}))[1].get("reconciled_bytes", 0)
                journal.set(a, "done", {"note": "already absent", "reconciled_bytes": earlier})
                why = f"already absent ({earlier} bytes deleted by an interrupted apply, audited)" if earlier else ""
                return emit("done", why or "already absent")
            async with sem:
                emit("running", a.reason)
                # Protection is checked at the moment of action: pins, milestones, running jobs
                # and the newer step's proof are read again, right before anything is touched.
                stop = await guard.protected(a)
                if stop:
                    return emit("stopped", stop)
                if a.path not in resumed:
                    journal.set(a, "started", _started({}, a, step))
                    journal.intent(a)
                if fault:
                    fault("before", a)
                if a.action == "delete":
                    stop = guard.claim(journal, a, _started(entries, a, step))
                    if stop:
                        journal.set(a, "stopped", {"why": stop, **_started(entries, a, step)})
                        return emit("stopped", stop)
                    removed = await _delete(
                        st, step, [o.key for o in step.objects], between=_stage(fault, "deleting", a)
                    )
                else:
                    exported = entries.get(a.path, ("", {}))[0] in ("exported", "deleting")
                    result = await _strip(
                        st,
                        step,
                        a,
                        plan.policy,
                        fault,
                        journal=journal,
                        guard=guard,
                        entries=entries,
                        exported=exported,
                    )
                    if isinstance(result, str):
                        state = "stopped" if result.startswith("stopped: ") else "failed"
                        journal.set(a, state, {"error": result, **_started(entries, a, step)})
                        return emit(state, result.removeprefix("stopped: "))
                    removed = result
                freed, errors = removed.freed, removed.errors
                if errors:
                    shown = "; ".join(f"{rel_name(step, k)}: {v}" for k, v in sorted(errors.items())[:5])
                    more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
                    journal.set(a, "failed", {"errors": errors, **_started(entries, a, step)})
                    return emit(
                        "failed",
                        f"{len(errors)} object(s) could not be deleted: {shown}{more}",
                        freed,
                        errors,
                        removed.hidden,
                    )
                journal.finish(a, freed)
                emit("done", a.reason, freed, hidden=removed.hidden)
                if fault:
                    fault("after", a)

        # Steps are independent, so their actions run side by side (bounded); within a step the
        # order export -> verify -> delete is sequential. A failure cancels the rest: each
        # cancelled action is journalled as started and is finished by the next apply.
        tasks = [asyncio.create_task(run_one(i, a)) for i, a in enumerate(plan.actions, 1)]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            outcomes[:] = [results[k] for k in sorted(results)]
        finished = True
    finally:
        if not dry_run:
            report = ApplyReport(plan.hash, plan.url, dry_run, tuple(outcomes), changes)
            outcome = report.outcome if finished else "interrupted"
            audit_id = services.db.record_audit(
                "retention.apply",
                plan.url,
                outcome,
                plan_hash=plan.hash,
                detail={
                    "actions": [o.as_dict() for o in outcomes],
                    "changes": list(changes),
                    "planned": len(plan.actions),
                    "bytes_freed": report.bytes_freed,
                    "bytes_hidden": report.bytes_hidden,
                },
            )
    return ApplyReport(plan.hash, plan.url, dry_run, tuple(outcomes), changes, audit_id)


def _policy_now(config: Config, db: StateDB, plan: RetentionPlan) -> RetentionPolicy:
    """The plan's policy with the pins and milestones recorded now (state DB and config)."""
    return effective_policy(config, db, plan.policy, plan.url).with_pins(config.section(RetentionPolicy).pins)


class _Guard:
    """The checks made right before each destructive action, under the run's apply lock."""

    def __init__(
        self,
        services: RetentionServices,
        store: ObjectStore,
        plan: RetentionPlan,
        catalog: Catalog,
        proofs: Mapping[str, str],
    ) -> None:
        self.services, self.store, self.plan = services, store, plan
        self.by_path = {s.path: s for s in catalog.steps}
        self.proven = sorted(
            (s for s in catalog.steps if proofs.get(s.path) == VERIFIED and s.step is not None),
            key=lambda s: s.step or 0,
        )
        self._rechecked: dict[str, str] = {}
        self._lock = asyncio.Lock()

    async def protected(self, a: PlannedAction) -> str | None:
        """Why ``a`` may not run now (None: it may)."""
        from backend.policy.retention_planner import _milestone_reason

        policy = _policy_now(self.services.config, self.services.db, self.plan)
        pin = policy.pin_reason(a.step)
        if pin is not None:
            return f"pinned during the apply ({pin or 'no reason given'}): left alone"
        step = self.by_path.get(a.path)
        if a.action == "delete" and step is not None and _milestone_reason(step, policy) is not None:
            return "marked a milestone during the apply: not deleted"
        if a.path in in_flight_from_jobs(self.services.jobs, self.plan.url):
            return "a running job is writing it now: left alone"
        return await self._newer_proof(a)

    async def _newer_proof(self, a: PlannedAction) -> str | None:
        """The newer proven step this action rests on is still there and still proven."""
        from backend.checkpoints.catalog import step_catalog
        from backend.checkpoints.proof import prove_resumable
        from backend.policy.retention_planner import step_family, step_fingerprint

        mine = step_family(self.by_path[a.path]) if a.path in self.by_path else None
        newer = [
            s
            for s in self.proven
            if a.step is not None and (s.step or 0) > a.step and step_family(s) == mine  # its own pattern only
        ]
        if not newer:
            return "no newer step is proven resumable now: left alone"
        anchor = newer[-1]
        async with self._lock:
            if anchor.path not in self._rechecked:
                try:
                    now = await step_catalog(self.store, anchor.path)
                    same = now.kind == "full" and step_fingerprint(now) == step_fingerprint(anchor)
                    self._rechecked[anchor.path] = VERIFIED if same else await prove_resumable(self.store, now)
                except Exception as exc:  # noqa: BLE001 - a failed re-check stops the action, never the apply
                    self._rechecked[anchor.path] = f"{type(exc).__name__}: {exc}"
            verdict = self._rechecked[anchor.path]
        if verdict != VERIFIED:
            return f"the newer step it rests on ({anchor.path}) is no longer proven resumable ({verdict}): left alone"
        return None

    def claim(self, journal: Journal, a: PlannedAction, detail: Mapping[str, Any]) -> str | None:
        """Claim the step for its deletions in one state-DB transaction that also re-reads its
        pins and milestones: one made before the claim stops the action; one made after is
        refused (see :func:`claimed_by`). Returns why the action stops, or None."""
        from backend.state import actor

        def body(db: Any) -> str | None:
            from backend.policy.retention_planner import _milestone_reason

            policy = _policy_now(self.services.config, self.services.db, self.plan)
            pins = {p.step: p.reason for p in policy.pins}
            if a.step in pins:
                return f"pinned during the apply ({pins[a.step] or 'no reason given'}): left alone"
            step = self.by_path.get(a.path)
            if a.action == "delete" and step is not None and _milestone_reason(step, policy) is not None:
                return "marked a milestone during the apply: not deleted"
            Journal(db, self.plan.hash, url=self.plan.url).set(
                a, "deleting", {**detail, "who": f"{actor()}", "plan": self.plan.hash}
            )
            return None

        result: str | None = self.services.db.transact(body, lock=run_lock(self.plan.url))
        return result


def _started(
    entries: Mapping[str, tuple[str, dict[str, Any]]], a: PlannedAction, step: CheckpointStep | None = None
) -> dict[str, Any]:
    """Keep the object list of the original start so a later resume can check against it, and a
    killed apply's deletions can be accounted for (a strip writes its export files, so they are
    left out of its list; a delete removes them like everything else)."""
    if a.path in entries and "objects" in entries[a.path][1]:
        return {"objects": entries[a.path][1]["objects"]}
    if step is not None:
        keep_export = a.action == "delete"
        return {
            "objects": [
                [rel_name(step, o.key), o.size]
                for o in step.objects
                if keep_export or not is_export_file(rel_name(step, o.key))
            ]
        }
    return {}


async def _strip(
    store: ObjectStore,
    step: CheckpointStep,
    a: PlannedAction,
    policy: RetentionPolicy,
    fault: FaultHook | None,
    *,
    journal: Journal | None = None,
    guard: _Guard | None = None,
    entries: Mapping[str, tuple[str, dict[str, Any]]] | None = None,
    exported: bool = False,
) -> Removed | str:
    """Export (when needed), verify, journal, claim, then delete the training state with the
    commit marker last. ``exported``: an earlier apply verified the export and began deleting;
    only its export's headers and fingerprint are checked again before the rest goes.
    A string says why it refused (``stopped: ...`` when a protection stopped it)."""
    from backend.checkpoints.catalog import step_catalog
    from backend.checkpoints.strip import strip_step
    from backend.checkpoints.strip.source import source_digests
    from backend.checkpoints.strip.verify import verify_export
    from backend.policy.retention_planner import export_fingerprint

    entries = entries or {}
    if step.strip_loses:
        return f"refused, nothing deleted: {step.strip_loses}"
    if step.referenced_by:
        return f"stopped: referenced by {', '.join(step.referenced_by)}: left alone"
    if exported:
        earlier = entries.get(a.path, ("", {}))[1].get("export")
        if earlier and export_fingerprint(step) != earlier:
            return "the BF16 export changed since an interrupted apply verified it: nothing deleted"
        check = await verify_export(store, step.path)
        if not _check_ok(check):
            return f"BF16 export did not verify, nothing deleted: {_check_problems(check)}"
    else:
        digests: dict[str, str] | None = None
        if step.has_bf16_export and step.layout in STRIPPABLE_LAYOUTS:
            # an export written before this apply: prove its values against the source before the
            # source goes (strip_step proves the exports it writes itself)
            try:
                digests = await source_digests(store, step.path)
            except Exception as exc:  # noqa: BLE001 - an unreadable source leaves everything in place
                return f"could not read the source to check the existing export, nothing deleted: {exc}"
        if not step.has_bf16_export:
            if step.layout not in STRIPPABLE_LAYOUTS:
                return (
                    f"refused: a {step.layout} checkpoint without a BF16 export would lose its only "
                    "full-precision weights; export it first"
                )
            try:
                await strip_step(store, step.path)
            except StoreError:
                raise
            except Exception as exc:  # noqa: BLE001 - a failed export must leave the state untouched
                return f"BF16 export failed, nothing deleted: {exc}"
        if fault:
            fault("exported", a)
        check = await verify_export(store, step.path, expected=await _expected_shapes(store, step), digests=digests)
        if not _check_ok(check):
            return f"BF16 export did not verify, nothing deleted: {_check_problems(check)}"
    step = await step_catalog(store, step.path)  # the listing now includes the export
    detail = _started(entries, a, step)
    if journal is not None:
        journal.set(a, "exported", {**detail, "export": export_fingerprint(step)})
    if guard is not None and journal is not None:
        stop = await guard.protected(a)
        if stop is None:
            stop = guard.claim(journal, a, {**detail, "export": export_fingerprint(step)})
        if stop:
            return f"stopped: {stop}"
    return await _delete(
        store,
        step,
        strip_deletions(step, policy.milestone_marker),
        markers_last=True,
        between=_stage(fault, "deleting", a),
    )


def _stage(fault: FaultHook | None, stage: str, a: PlannedAction) -> Callable[[], None] | None:
    return None if fault is None else (lambda: fault(stage, a))


async def _expected_shapes(store: ObjectStore, step: CheckpointStep) -> dict[str, tuple[int, ...]] | None:
    """Names and shapes of the model weights a DCP step holds (what its export must match)."""
    from backend.checkpoints.dcp import METADATA_FILE, load_metadata, tensor_entries, weight_names

    if not any(rel_name(step, o.key) == METADATA_FILE for o in step.objects):
        return None  # other layouts were checked against their source by strip_step itself
    key = f"{step.path}/{METADATA_FILE}"
    entries = tensor_entries(load_metadata(await store.get_bytes(key), where=f"{store.url}/{key}"))
    names = weight_names([e.fqn for e in entries], "auto")
    return {names[e.fqn]: e.shape for e in entries if e.fqn in names}


def _check_ok(check: Any) -> bool:
    ok = getattr(check, "ok", None)
    return bool(check) if ok is None else bool(ok)


def _check_problems(check: Any) -> str:
    for attr in ("problems", "errors", "issues"):
        v = getattr(check, attr, None)
        if v:
            return "; ".join(str(x) for x in list(v)[:5])
    return str(check)
