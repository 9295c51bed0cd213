"""Pack many small files into WebDataset tar shards: locally, or from/to ``s3://``.

The pipeline: list the source (paginated on S3), group files into samples, plan the shards
(:mod:`backend.shards.plan`), then one writer thread builds each shard with precomputed ustar
headers and large sequential writes while reads run ahead of it (:mod:`backend.shards.sources`:
a thread pool for local files, bounded concurrent GETs for S3). Each finished shard is renamed
into place (local) or streamed up as a multipart upload while the next is written (S3, at most
``pending_uploads`` shards spooled), then recorded in a journal with its BLAKE3 digest
(:mod:`backend.shards.sinks`), so an interrupted conversion resumes from the last completed
shard. ``manifest.json`` is written last. The same conversion as a durable node job is
:mod:`backend.shards.job`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from backend.config import Config, StoreProfile
from backend.nodes.untrusted import loads_bounded
from backend.shards import tarfmt
from backend.shards.locations import normalize_location, open_store
from backend.shards.manifest import (
    JOURNAL_MAX_BYTES,
    MANIFEST_NAME,
    Manifest,
    ShardEntry,
    get_price,
    request_arithmetic,
)
from backend.shards.model import (
    ConvertResult,
    ShardCancelled,
    ShardPreview,
    ShardProgress,
    ShardRequest,
)
from backend.shards.plan import (
    STATE_DIR,
    InputProblems,
    PlannedShard,
    ShardError,
    ShardPlan,
    group_samples,
    pattern_regex,
    plan_shards,
)
from backend.shards.sinks import JOURNAL_PREFIX, LocalSink, Output, S3Sink, Sink, TarOut
from backend.shards.sources import LocalSource, S3Source, Source, ordered, scan
from backend.storage import Credentials, LocalStore, ObjectStore, S3Store

PLAN_KEY = f"{STATE_DIR}/plan.json"
PROGRESS_EVERY = 0.25


# -- planning --------------------------------------------------------------------------------


def _dest_inside_src(req: ShardRequest) -> str | None:
    """The destination's path relative to the source when it lies inside it, else None."""
    src, dest = normalize_location(req.src), normalize_location(req.dest)
    if dest.startswith(src.rstrip("/") + "/"):
        return dest[len(src.rstrip("/")) + 1 :]
    return None


async def _plan(req: ShardRequest, src: ObjectStore) -> tuple[ShardPlan | None, InputProblems, list[str], list[str]]:
    """The plan, the input problems, errors (refusals) and warnings."""
    files, unreadable = await scan(src)
    inner = _dest_inside_src(req)
    if inner:  # shards written inside the source must never be read back as source files
        files = [f for f in files if not f.rel.startswith(inner + "/")]
        unreadable = [u for u in unreadable if not u[0].startswith(inner + "/") and u[0] != inner]
    samples, problems = group_samples(files, partner_share=req.partner_share)
    problems = dataclasses.replace(problems, unreadable=tuple(unreadable))
    errors: list[str] = []
    warnings: list[str] = []
    if not files and not unreadable:
        errors.append(f"source {req.src} is empty: no files to shard")
    lines = problems.describe()
    hard = [ln for ln in lines if "unreadable" in ln or "collision" in ln]
    soft = [ln for ln in lines if ln not in hard]
    errors += hard
    if soft:
        if req.incomplete == "error":
            errors += [
                *soft,
                "pass --incomplete skip to leave such files out, or --incomplete keep "
                "to shard incomplete samples as they are (unkeyed files are always left out)",
            ]
        else:
            warnings += soft
            warnings.append(
                f"--incomplete {req.incomplete}: "
                + (
                    "incomplete samples and unkeyed files left out"
                    if req.incomplete == "skip"
                    else "incomplete samples kept; unkeyed files left out"
                )
            )
    if req.incomplete == "skip" and problems.incomplete:
        bad = {k for k, _m in problems.incomplete}
        samples = [s for s in samples if s.key not in bad]
    if not errors and not samples:
        errors.append(f"source {req.src} has no samples left to shard")
    plan = None
    if samples:
        plan = plan_shards(samples, shard_size=req.shard_size, pattern=req.pattern, seed=req.seed)
        warnings = list(plan.warnings) + warnings
    return plan, problems, errors, warnings


async def preview(
    req: ShardRequest,
    *,
    config: Config | None = None,
    src_profile: StoreProfile | None = None,
    dest_profile: StoreProfile | None = None,
) -> ShardPreview:
    """Sample count, shard count and GET reduction of a conversion, from the listing alone."""
    req.validate()
    src = open_store(req.src, src_profile)
    dest = open_store(req.dest, dest_profile)
    try:
        plan, problems, errors, warnings = await _plan(req, src)
        # The destination too: a busy or unreachable one is refused before anything runs.
        refusal = _busy_refusal(req, *await _existing(dest, req.pattern))
        if refusal:
            errors.append(refusal)
    finally:
        await src.close()
        await dest.close()
    price, source = get_price(config, dest_profile, src_profile)
    files = plan.files if plan else 0
    shards = len(plan.shards) if plan else 0
    return ShardPreview(
        src=req.src,
        dest=req.dest,
        files=files,
        samples=plan.samples if plan else 0,
        source_bytes=plan.source_bytes if plan else 0,
        shards=shards,
        largest_shard=max((s.nbytes for s in plan.shards), default=0) if plan else 0,
        requests=request_arithmetic(files, shards, price, source),
        warnings=tuple(warnings),
        errors=tuple(errors),
        problems=problems,
        plan=plan,
        request=req,
    )


def _write_error(path: str, exc: OSError) -> ShardError:
    """A failed write (a full disk, a quota) as one line naming the file and what to do."""
    hint = ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = ": free space there, then rerun with --resume (completed shards are kept)"
    return ShardError(f"cannot write {exc.filename or path}: {exc.strerror or exc}{hint}")


# -- writing ---------------------------------------------------------------------------------


class _Progress:
    def __init__(
        self, plan: ShardPlan, done: Sequence[PlannedShard], callback: Callable[[ShardProgress], None] | None
    ) -> None:
        self.callback = callback
        self.samples_total = plan.samples
        self.bytes_total = plan.total_bytes
        self.shards_total = len(plan.shards)
        self.samples_done = sum(len(s.samples) for s in done)
        self.bytes_done = sum(s.nbytes for s in done)
        self.shards_done = len(done)
        self.source_read = 0
        self._base_samples, self._base_bytes = self.samples_done, self.bytes_done
        self.started = time.monotonic()
        self._last = 0.0

    def snapshot(self, *, final: bool = False, phase: str = "writing") -> ShardProgress:
        el = max(time.monotonic() - self.started, 1e-9)
        return ShardProgress(
            self.samples_done,
            self.samples_total,
            self.bytes_done,
            self.bytes_total,
            self.shards_done,
            self.shards_total,
            el,
            (self.samples_done - self._base_samples) / el,
            (self.bytes_done - self._base_bytes) / el / 1e6,
            phase,
            final,
            self.source_read,
        )

    def tick(self, *, force: bool = False, final: bool = False) -> None:
        if self.callback is None:
            return
        now = time.monotonic()
        if force or final or now - self._last >= PROGRESS_EVERY:
            self._last = now
            self.callback(self.snapshot(final=final, phase="done" if final else "writing"))


def _check_cancel(cancelled: Callable[[], bool], written: int) -> None:
    if cancelled():
        raise ShardCancelled(
            f"conversion cancelled after {written} new shard(s); completed shards "
            "are kept: rerun with --resume to continue"
        )


def _write_shards(
    todo: Sequence[PlannedShard],
    source: Source,
    sink: Sink,
    progress: _Progress,
    cancelled: Callable[[], bool] | None,
    *,
    threaded_output: bool = True,
) -> list[ShardEntry]:
    """Write every shard in ``todo`` (runs in a thread); returns their journal entries."""
    entries: list[ShardEntry] = []
    last_check = time.monotonic()
    out: TarOut | None = None
    output = Output(threaded=threaded_output)
    bytes_before = progress.bytes_done

    def finish() -> None:
        nonlocal out
        assert out is not None
        try:
            digest = out.finish()
        finally:
            out.close()
        shard = out.shard
        if out.written != shard.nbytes:
            raise ShardError(f"internal error: {shard.name} is {out.written} bytes, planned {shard.nbytes}")
        entry = ShardEntry(shard.name, out.written, len(shard.samples), out.files, digest, output.algorithm)
        sink.commit(entry, out.path)
        out = None  # committed: no longer ours to remove on failure
        entries.append(entry)
        progress.shards_done += 1
        progress.source_read += sum(s.nbytes for s in shard.samples)
        progress.bytes_done = bytes_before + shard.nbytes  # members plus the end-of-archive
        progress.tick(force=True)

    try:
        for shard, chunk, fut in ordered(source, todo):
            if out is None or out.shard is not shard:
                if out is not None:
                    finish()
                if cancelled is not None:
                    _check_cancel(cancelled, len(entries))  # at every shard boundary, and every 0.2 s
                bytes_before = progress.bytes_done
                out = TarOut(shard, sink.temp_path(shard.name), output)
            if fut is None:  # one member too big for a buffer: header, streamed data, padding
                head, rel, size = chunk.members[0]
                out.emit([head])
                for piece in source.stream(rel, size):
                    out.emit(*piece)
                if size % tarfmt.BLOCK:
                    out.emit([bytes(-size % tarfmt.BLOCK)])
            else:
                out.emit(*fut.result())
            out.files += len(chunk.members)
            progress.samples_done += chunk.samples
            progress.bytes_done = bytes_before + out.written
            progress.tick()
            now = time.monotonic()
            if cancelled is not None and now - last_check >= 0.2:
                last_check = now
                _check_cancel(cancelled, len(entries))
        if out is not None:
            finish()
        sink.finish()
    except BaseException as exc:
        path = out.path if out is not None else ""
        if out is not None:
            output.close()  # nothing may still be writing to the file as it is closed and removed
            out.close()
            sink.abandon(out.path)
        if isinstance(exc, OSError):  # reads raise ShardError: this is a write (ENOSPC, EIO)
            raise _write_error(path, exc) from None
        raise
    finally:
        source.close()
        output.close()
    return entries


# -- the conversion --------------------------------------------------------------------------


async def _existing(dest: ObjectStore, pattern: str) -> tuple[list[str], bool, bool]:
    """Shard-like names already in the destination root, and whether a manifest/journal exist."""
    rx = pattern_regex(pattern)
    names: list[str] = []
    manifest = journal = False
    for obj in await dest.list(""):
        if obj.key == MANIFEST_NAME:
            manifest = True
        elif obj.key.startswith(STATE_DIR + "/"):
            journal = True
        elif "/" not in obj.key and rx.match(obj.key):
            names.append(obj.key)
    return sorted(names), manifest, journal


def _busy_refusal(req: ShardRequest, existing: list[str], has_manifest: bool, has_journal: bool) -> str:
    """Why a destination that already holds shards is refused ('' when it is not)."""
    if not (existing or has_manifest or has_journal) or req.overwrite or req.resume:
        return ""
    what = (
        f"{len(existing)} shard(s) (e.g. {', '.join(existing[:3])})" if existing else "a manifest or conversion journal"
    )
    return (
        f"destination {req.dest} already has {what}; pass --resume to continue an interrupted "
        "conversion or --overwrite to replace them"
    )


async def _read_journal(dest: ObjectStore) -> tuple[dict[str, ShardEntry], str | None]:
    entries: dict[str, ShardEntry] = {}
    plan_hash = None
    for obj in await dest.list(STATE_DIR):
        if obj.size > JOURNAL_MAX_BYTES:
            continue  # not an entry loadmaster wrote: that shard is redone, the file is not read
        raw = await dest.get_bytes(obj.key)
        try:
            doc = loads_bounded(raw, what=obj.key, max_bytes=JOURNAL_MAX_BYTES)
            if not isinstance(doc, dict):
                continue
            if obj.key == PLAN_KEY:
                plan_hash = doc.get("plan_hash")
            elif obj.key.startswith(JOURNAL_PREFIX + "/") and obj.key.endswith(".json"):
                e = ShardEntry.from_dict(doc)
                entries[e.name] = e
        except (ValueError, KeyError, TypeError, OverflowError):
            continue  # a torn journal line only means that shard is redone
    return entries, plan_hash


async def convert(
    req: ShardRequest,
    *,
    config: Config | None = None,
    src_profile: StoreProfile | None = None,
    dest_profile: StoreProfile | None = None,
    on_progress: Callable[[ShardProgress], None] | None = None,
    on_log: Callable[[str], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    prepared: ShardPreview | None = None,
    credentials: Credentials | None = None,
) -> ConvertResult:
    """Convert ``req.src`` into shards at ``req.dest``; resumable, deterministic, verified by size.

    ``prepared`` is a :func:`preview` of the same request just shown to the operator: its plan is
    used as is, so what runs is exactly what was previewed and the source is listed once.
    ``credentials`` (a node job's secrets) are used for ``s3://`` locations instead of the chain.
    """
    req.validate()
    started = time.monotonic()
    log = on_log or (lambda _m: None)
    src = open_store(req.src, src_profile, credentials)
    dest = open_store(req.dest, dest_profile, credentials)
    sink: Sink | None = None
    try:
        plan: ShardPlan | None
        if prepared is not None and prepared.request == req and prepared.plan is not None:
            plan, problems = prepared.plan, prepared.problems
            errors, warnings = list(prepared.errors), list(prepared.warnings)
        else:
            plan, problems, errors, warnings = await _plan(req, src)
        if errors:
            raise ShardError(f"cannot shard {req.src}: " + "; ".join(errors))
        assert plan is not None
        for w in warnings:
            log(f"warning: {w}")
        existing, has_manifest, has_journal = await _existing(dest, req.pattern)
        done: dict[str, ShardEntry] = {}
        if existing or has_manifest or has_journal:
            if req.overwrite:
                old = [
                    *existing,
                    *([MANIFEST_NAME] if has_manifest else []),
                    *[o.key for o in await dest.list(STATE_DIR)],
                ]
                res = await dest.delete_many(old)
                if not res.ok:
                    k, why = next(iter(res.errors.items()))
                    raise ShardError(f"cannot remove old shard {k} in {req.dest}: {why}")
                log(f"--overwrite: removed {len(existing)} existing shard(s) from {req.dest}")
            elif req.resume:
                journal, old_hash = await _read_journal(dest)
                if old_hash is not None and old_hash != plan.plan_hash:
                    raise ShardError(
                        f"{req.dest} holds shards of a different conversion (the source, "
                        "shard size, pattern or seed changed); use --overwrite to replace them"
                    )
                if old_hash is None and existing:
                    raise ShardError(
                        f"{req.dest} has shards but no loadmaster journal to resume from; "
                        "use --overwrite to replace them"
                    )
                sizes = {o.key: o.size for o in await dest.list("") if "/" not in o.key}
                planned = {s.name: s for s in plan.shards}
                for name, e in journal.items():
                    s = planned.get(name)
                    if s is not None and sizes.get(name) == e.bytes == s.nbytes:
                        done[name] = e
                log(f"--resume: {len(done)} of {len(plan.shards)} shard(s) already complete")
            else:
                raise ShardError(_busy_refusal(req, existing, has_manifest, has_journal))
        await dest.put_bytes(
            PLAN_KEY,
            json.dumps({"plan_hash": plan.plan_hash, "shards": len(plan.shards), "samples": plan.samples}).encode(),
        )
        todo = [s for s in plan.shards if s.name not in done]
        progress = _Progress(plan, [s for s in plan.shards if s.name in done], on_progress)
        progress.tick(force=True)
        loop = asyncio.get_running_loop()
        if isinstance(dest, S3Store):
            sink = S3Sink(dest, loop, req)
            await sink.open()
            if req.resume or req.overwrite:
                stale = await sink.abort_stale(req.pattern)
                if stale:
                    log(f"aborted {stale} unfinished multipart upload(s) of an interrupted run")
        else:
            assert isinstance(dest, LocalStore)
            sink = LocalSink(dest, loop)
        # Written and hashed in their own thread (--workers 0: in the writer thread, with the reads).
        source: Source = (
            LocalSource(str(src.root), req.workers)
            if isinstance(src, LocalStore)
            else S3Source(src, loop, req.fetch_concurrency)  # type: ignore[arg-type]
        )
        new_entries = await asyncio.to_thread(
            _write_shards, todo, source, sink, progress, cancelled, threaded_output=req.workers > 0
        )
        by_name = {**done, **{e.name: e for e in new_entries}}
        entries = tuple(by_name[s.name] for s in plan.shards)
        # Verify what landed: every shard present with the size the journal recorded.
        sizes = {o.key: o.size for o in await dest.list("") if "/" not in o.key}
        bad = [e.name for e in entries if sizes.get(e.name) != e.bytes]
        if bad:
            raise ShardError(
                f"after writing, {len(bad)} shard(s) in {req.dest} are missing or the wrong "
                f"size (e.g. {', '.join(bad[:3])}); rerun with --resume"
            )
        price, price_source = get_price(config, dest_profile, src_profile)
        manifest = Manifest(
            source=req.src,
            pattern=req.pattern,
            shard_size=req.shard_size,
            seed=req.seed,
            plan_hash=plan.plan_hash,
            shards=entries,
            requests=request_arithmetic(plan.files, len(entries), price, price_source),
            problems=problems.as_dict(),
            incomplete_policy=req.incomplete,
        )
        await dest.put_bytes(MANIFEST_NAME, manifest.to_json().encode())
        progress.tick(final=True)
        return ConvertResult(
            manifest,
            req.dest,
            tuple(e.name for e in new_entries),
            tuple(sorted(done)),
            time.monotonic() - started,
            tuple(warnings),
        )
    except OSError as exc:  # the destination's own files (plan, journal, manifest): a full disk
        raise _write_error(req.dest, exc) from None
    finally:
        if isinstance(sink, S3Sink):
            await sink.aclose()
        await src.close()
        await dest.close()


def convert_sync(req: ShardRequest, **kwargs: Any) -> ConvertResult:
    """:func:`convert` for synchronous callers (benchmarks, job runners)."""
    return asyncio.run(convert(req, **kwargs))
