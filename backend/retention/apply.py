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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from backend.errors import PolicyError, StoreError
from backend.policy.prices import PriceOverrides
from backend.policy.retention import STRIPPABLE_LAYOUTS, PlannedAction, RetentionPlan, RetentionPolicy
from backend.policy.retention_planner import is_export_file, plan_retention, recheck_plan, rel_name
from backend.retention.marks import canonical_run, effective_policy, norm_url

if TYPE_CHECKING:
    from backend.checkpoints.steps import Catalog, CheckpointStep
    from backend.services import Services
    from backend.state import StateDB
    from backend.storage import ObjectStore

#: Files in a step folder that describe the run rather than hold its state: kept by a strip.
_KEEP_AFTER_STRIP = re.compile(r"^[^/]+\.(json|txt|yaml|yml|md|model|tiktoken)$", re.IGNORECASE)
_KEEP_MAX_BYTES = 16 * 1024 * 1024
#: Step folders processed at once during an apply.
APPLY_CONCURRENCY = 8
#: Commit markers, deleted first so a half-deleted step never looks complete to a loader.
_COMMIT_MARKERS = frozenset({".metadata", "model.safetensors.index.json", "latest"})

FaultHook = Callable[[str, PlannedAction], None]
ProgressHook = Callable[["ActionOutcome"], object]  # its return value is ignored


# -- journal ----------------------------------------------------------------------------------


class Journal:
    """Completed and started actions of one plan (keyed by its hash)."""

    def __init__(self, db: StateDB, plan_hash: str) -> None:
        self.db = db
        self.plan_hash = plan_hash

    def entries(self) -> dict[str, tuple[str, dict[str, Any]]]:
        rows = self.db.query("SELECT path, state, detail FROM retention_journal WHERE plan_hash = ?", (self.plan_hash,))
        return {r["path"]: (r["state"], json.loads(r["detail"])) for r in rows}

    def set(self, a: PlannedAction, state: str, detail: Mapping[str, Any] | None = None) -> None:
        self.db.execute(
            "INSERT INTO retention_journal (plan_hash, path, action, state, detail, ts) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (plan_hash, path) DO UPDATE SET action = excluded.action, state = excluded.state,"
            " detail = excluded.detail, ts = excluded.ts",
            (self.plan_hash, a.path, a.action, state, json.dumps(dict(detail or {}), default=str), time.time()),
        )


# -- planning ---------------------------------------------------------------------------------


def storage_price(services: Services, url: str) -> tuple[float | None, str]:
    """Storage $/GB-month of the store holding ``url``, and where the figure comes from."""
    _, profile = services.stores.profile_for(url)
    if profile is None or not profile.is_s3:
        return None, "local store: storage not priced"
    if not profile.provider:
        return None, f"store {profile.name or profile.url}: no provider configured, storage not priced"
    from backend.policy.prices import price_table

    prices = price_table(services.config.section(PriceOverrides)).provider(profile.provider, profile.region)
    if prices is None:
        return None, f"provider {profile.provider!r} is not in the price table: storage not priced"
    return prices.storage_gb_month, f"{prices.name} storage ${prices.storage_gb_month}/GB-month ({prices.source})"


async def prove_kept(
    services: Services | None, store: ObjectStore, catalog: Catalog, plan: RetentionPlan, url: str
) -> dict[str, str]:
    """The deep resumable check of every step ``plan`` keeps full: ``"verified"`` or the problem.

    A step loadmaster uploaded must also have a succeeded (verified) upload job on record.
    """
    by_path = {s.path: s for s in catalog.steps}
    kept = [a.path for a in plan.actions if a.action == "keep-full" and a.path in by_path]
    return await prove_steps(services, store, catalog, url, kept)


async def prove_steps(
    services: Services | None, store: ObjectStore, catalog: Catalog, url: str, paths: Iterable[str]
) -> dict[str, str]:
    """The deep resumable check of the steps at ``paths`` (bounded concurrency)."""
    from backend.checkpoints.proof import prove_resumable

    by_path = {s.path: s for s in catalog.steps}
    kept = [p for p in paths if p in by_path]
    uploads = _upload_records(services, url)
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


def _upload_records(services: Services | None, url: str) -> dict[str, tuple[str, str]]:
    """Step path -> (state, job id) of the newest upload job that wrote into the run ``url``."""
    if services is None:
        return {}
    try:
        records = services.jobs.records()
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


def in_flight_from_jobs(services: Services, url: str) -> set[str]:
    """Step folders under ``url`` that unfinished jobs (uploads, saves, strips) are writing.

    A job's ``dest`` (or, for a strip, its ``src``) inside the run folder names the step it
    writes; the first path segment below ``url`` is that step folder.
    """
    records = services.jobs.records()
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
    services: Services,
    url: str,
    policy: RetentionPolicy,
    *,
    in_flight: Iterable[str] = (),
    now: float | None = None,
    catalog: Catalog | None = None,
) -> RetentionPlan:
    """List ``url`` afresh and plan it under ``policy`` (plus DB pins, milestones and running
    jobs); every step the plan keeps full is deep-checked, and a failure stops every delete."""
    url, _ = canonical_run(services, url)
    flying = set(in_flight) | in_flight_from_jobs(services, url)
    price, note = storage_price(services, url)
    pol = effective_policy(services, policy, url)
    when = time.time() if now is None else now
    async with services.stores.open(url) as store:
        if catalog is None:
            catalog = await fetch_catalog(store)
        first = plan_retention(catalog.steps, pol, now=when, in_flight=flying, url=url, prefix=catalog.prefix)
        proofs = await prove_kept(services, store, catalog, first, url)
    return plan_retention(
        catalog.steps,
        pol,
        now=when,
        in_flight=flying,
        url=url,
        prefix=catalog.prefix,
        usd_per_gb_month=price,
        price_note=note,
        proofs=proofs,
    )


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

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "step": self.step,
            "action": self.action,
            "outcome": self.outcome,
            "detail": self.detail,
            "bytes_freed": self.bytes_freed,
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

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes if o.outcome == outcome)

    def as_dict(self) -> dict[str, Any]:
        return {
            "plan_hash": self.plan_hash,
            "url": self.url,
            "dry_run": self.dry_run,
            "outcome": self.outcome,
            "bytes_freed": self.bytes_freed,
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


async def _delete(store: ObjectStore, step: CheckpointStep, keys: list[str]) -> tuple[int, dict[str, str]]:
    """Delete ``keys`` (commit markers first, then the rest in 1000-key batches)."""
    sizes = {o.key: o.size for o in step.objects}
    first, rest = _markers_first(step, keys)
    freed = 0
    errors: dict[str, str] = {}
    for group in (first, rest):
        if not group:
            continue
        if errors and group is rest:
            break  # a commit marker could not be deleted: keep the state it describes
        res = await store.delete_many(group)
        freed += sum(sizes.get(k, 0) for k in res.deleted)
        errors.update(res.errors)
    return freed, errors


async def apply_plan(
    services: Services,
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
    tests). ``fault(stage, action)`` is called at ``before``/``exported``/``after`` of each
    destructive action, so a test can crash an apply part-way.
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


async def _apply_locked(
    services: Services,
    plan: RetentionPlan,
    st: ObjectStore,
    *,
    dry_run: bool,
    in_flight: Iterable[str],
    progress: ProgressHook | None,
    fault: FaultHook | None,
) -> ApplyReport:
    journal = Journal(services.db, plan.hash)
    outcomes: list[ActionOutcome] = []
    changes: tuple[str, ...] = ()
    audit_id: int | None = None
    finished = False
    try:
        catalog = await fetch_catalog(st, plan.prefix)
        fresh_by_path = {s.path: s for s in catalog.steps}
        entries = journal.entries()
        done = {p for p, (state, _) in entries.items() if state == "done"}
        resumed = {
            p: _consistent_with_start(fresh_by_path.get(p), detail, next(a.action for a in plan.actions if a.path == p))
            for p, (state, detail) in entries.items()
            if state in ("started", "failed") and any(a.path == p for a in plan.actions)
        }
        flying = set(in_flight) | in_flight_from_jobs(services, plan.url)
        policy = effective_policy(services, plan.policy, plan.url).with_pins(
            services.config.section(RetentionPolicy).pins
        )
        now = time.time()
        first = plan_retention(catalog.steps, policy, now=now, in_flight=flying, url=plan.url, prefix=plan.prefix)
        proofs = await prove_kept(services, st, catalog, first, plan.url)
        fresh = plan_retention(
            catalog.steps, policy, now=now, in_flight=flying, url=plan.url, prefix=plan.prefix, proofs=proofs
        )
        check = recheck_plan(plan, fresh, resumed=resumed, done=done)
        changes = check.changes
        total = len(plan.actions)
        results: dict[int, ActionOutcome] = {}
        sem = asyncio.Semaphore(APPLY_CONCURRENCY)

        async def run_one(i: int, a: PlannedAction) -> None:
            def emit(outcome: str, detail: str = "", freed: int = 0, errors: Mapping[str, str] | None = None) -> None:
                o = ActionOutcome(i, total, a.path, a.step, a.action, outcome, detail, freed, dict(errors or {}))
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
                journal.set(a, "done", {"note": "already absent"})
                return emit("done", "already absent")
            async with sem:
                emit("running", a.reason)
                if a.path not in resumed:
                    journal.set(a, "started", _started({}, a, step))
                if fault:
                    fault("before", a)
                if a.action == "delete":
                    freed, errors = await _delete(st, step, [o.key for o in step.objects])
                else:
                    result = await _strip(st, step, a, plan.policy, fault)
                    if isinstance(result, str):
                        journal.set(a, "failed", {"error": result, **_started(entries, a, step)})
                        return emit("failed", result)
                    freed, errors = result
                if errors:
                    shown = "; ".join(f"{rel_name(step, k)}: {v}" for k, v in sorted(errors.items())[:5])
                    more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
                    journal.set(a, "failed", {"errors": errors, **_started(entries, a, step)})
                    return emit("failed", f"{len(errors)} object(s) could not be deleted: {shown}{more}", freed, errors)
                journal.set(a, "done", {"bytes_freed": freed})
                emit("done", a.reason, freed)
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
                },
            )
    return ApplyReport(plan.hash, plan.url, dry_run, tuple(outcomes), changes, audit_id)


def _started(
    entries: Mapping[str, tuple[str, dict[str, Any]]], a: PlannedAction, step: CheckpointStep | None = None
) -> dict[str, Any]:
    """Keep the object list of the original start so a later resume can check against it."""
    if a.path in entries and "objects" in entries[a.path][1]:
        return {"objects": entries[a.path][1]["objects"]}
    if step is not None:
        return {
            "objects": [
                [rel_name(step, o.key), o.size] for o in step.objects if not is_export_file(rel_name(step, o.key))
            ]
        }
    return {}


async def _strip(
    store: ObjectStore, step: CheckpointStep, a: PlannedAction, policy: RetentionPolicy, fault: FaultHook | None
) -> tuple[int, dict[str, str]] | str:
    """Export (when needed), verify, then delete the training state; a string says why it refused."""
    from backend.checkpoints.catalog import step_catalog
    from backend.checkpoints.strip import strip_step
    from backend.checkpoints.strip_source import source_digests
    from backend.checkpoints.strip_verify import verify_export

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
    return await _delete(store, step, strip_deletions(step, policy.milestone_marker))


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
