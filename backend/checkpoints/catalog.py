"""The checkpoint catalog: one row per step of a run, classified by what its files hold.

Listing is one paginated ``list_dirs`` of the run prefix (plus the run's own files: Lightning
writes ``epoch=E-step=S.ckpt`` files there, DeepSpeed ``latest``, Megatron
``latest_checkpointed_iteration.txt``), then each step listed concurrently (bounded), never one
request per object. Each step is then classified by its contents (:mod:`backend.checkpoints.classify`);
the rows and their kinds are described in :mod:`backend.checkpoints.steps`.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import replace
from pathlib import Path

from backend.checkpoints.classify import classify
from backend.checkpoints.dcp import CheckpointError
from backend.checkpoints.evidence import read_json
from backend.checkpoints.step_names import classify_names
from backend.checkpoints.steps import (
    DEEPSPEED_LATEST,
    MEGATRON_LATEST,
    TRAINER_STATE,
    Catalog,
    CheckpointStep,
    RunMarkers,
    step_number,
)
from backend.storage import LocalStore, ObjectInfo, ObjectStore, StoreError, join_key

LIST_CONCURRENCY = 16


def _sort_key(s: CheckpointStep) -> tuple[int, int, str]:
    return (0, s.step, s.path) if s.step is not None else (1, 0, s.path)


async def _root_files(store: ObjectStore, prefix: str) -> list[ObjectInfo]:
    """The objects directly in ``prefix`` (not in its sub-folders)."""
    if isinstance(store, LocalStore):
        base = store.local_path(prefix) if prefix else store.root

        def scan() -> list[ObjectInfo]:
            out = []
            if base.is_dir():
                for p in base.iterdir():
                    if p.is_file() and not p.is_symlink():
                        st = p.stat()
                        out.append(ObjectInfo(join_key(prefix, p.name), st.st_size, st.st_mtime))
            return out

        return await asyncio.to_thread(scan)
    from backend.storage import S3Store

    if not isinstance(store, S3Store):
        return []
    out: list[ObjectInfo] = []
    async for page in store.iter_pages(prefix, delimiter="/"):
        for obj in page.get("Contents", []):
            out.append(
                ObjectInfo(
                    store._rel(obj["Key"]),
                    int(obj["Size"]),
                    obj["LastModified"].timestamp(),
                    obj.get("ETag", "").strip('"'),
                )
            )
    return out


async def run_markers(
    store: ObjectStore,
    prefix: str,
    root_files: dict[str, ObjectInfo] | None = None,
    trainer_states: list[str] | None = None,
) -> RunMarkers:
    """Read the run-level commit files (each small and bounded)."""
    if root_files is None:
        root_files = {o.key.rsplit("/", 1)[-1]: o for o in await _root_files(store, prefix)}

    async def small_text(n: str) -> str | None:
        o = root_files.get(n)
        if o is None or o.size > 4096:
            return None
        return (await store.get_bytes(o.key)).decode("utf-8", "replace").strip() or None

    ds = await small_text(DEEPSPEED_LATEST)
    mg = await small_text(MEGATRON_LATEST)
    mg_num = int(mg) if mg and mg.isdigit() else None
    pointers = []
    for n in sorted(root_files):
        if n != MEGATRON_LATEST and POINTER_FILE.match(n):
            text = await small_text(n)
            if text and len(text.splitlines()) == 1:
                pointers.append((n, text.rstrip("/").rsplit("/", 1)[-1]))
    pointers += await _pointer_links(store, prefix)
    references = [(n, leaf) for n, leaf in pointers]
    if mg_num is not None:
        references.append((MEGATRON_LATEST, str(mg_num)))
    references += await _references(store, prefix)
    best = None
    for key in trainer_states or []:
        try:
            info = await store.stat(key)
            state = await read_json(store, key, info.size if info else 0) if info else None
        except CheckpointError:
            continue
        b = state.get("best_model_checkpoint") if isinstance(state, dict) else None
        if isinstance(b, str) and b:
            best = b.rstrip("/").rsplit("/", 1)[-1]
            break
    return RunMarkers(
        deepspeed_latest=ds,
        megatron_latest=mg_num,
        megatron_release=mg == "release",
        best_checkpoint=best,
        pointers=tuple(pointers),
        references=tuple(dict.fromkeys(references)),
    )


#: Run-level files that name the step a resume reads (DeepSpeed's ``latest``, a trainer's
#: ``latest_checkpoint.txt``, ``last_checkpoint``); Megatron's iteration file is read apart.
POINTER_FILE = re.compile(r"^(?:latest|last)(?:[-_][A-Za-z_]+)?(?:\.txt)?$", re.IGNORECASE)
#: Symlinks in a run folder that name the step a resume reads (``latest -> step-300``).
POINTER_LINK = re.compile(r"^(?:latest|last)(?:[-_.][A-Za-z_]+)*$", re.IGNORECASE)


async def _pointer_links(store: ObjectStore, prefix: str) -> list[tuple[str, str]]:
    """``latest``/``last`` symlinks of a local run folder that name an entry of the same folder."""
    if not isinstance(store, LocalStore):
        return []
    base = store.local_path(prefix) if prefix else store.root

    def scan() -> list[tuple[str, str]]:
        out = []
        if base.is_dir():
            for p in sorted(base.iterdir()):
                if p.is_symlink() and POINTER_LINK.match(p.name):
                    target = os.readlink(p).rstrip("/")
                    parent, _, leaf = target.rpartition("/")
                    if parent in ("", ".") or Path(parent).resolve() == base.resolve():
                        out.append((p.name, leaf))
        return out

    return await asyncio.to_thread(scan)


#: Bounds of the scan for links: entries looked at in all, and depth below the run folder.
MAX_LINK_SCAN = 20_000
MAX_LINK_DEPTH = 6


async def _references(store: ObjectStore, prefix: str) -> list[tuple[str, str]]:
    """What links and pointer files name an entry of the run folder ``prefix``: (who, the entry).

    Symlinks anywhere in the run folder (its steps included), in its parent and at the top of the
    parent's other folders (``../other/best -> ../run/step-100``), resolved; pointer files
    (``latest``...) of the parent whose text is a path into the run. A local run folder has links;
    an object store has only the pointer files."""
    out: list[tuple[str, str]] = []
    parent = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
    if prefix:
        try:
            up = await _root_files(store, parent)
        except StoreError:
            up = []
        own = prefix.rsplit("/", 1)[-1]
        for o in sorted(up, key=lambda o: o.key):
            n = o.key.rsplit("/", 1)[-1]
            if POINTER_FILE.match(n) and o.size <= 4096:
                text = (await store.get_bytes(o.key)).decode("utf-8", "replace").strip()
                parts = [p for p in text.strip("/").split("/") if p not in ("", ".")]
                if len(text.splitlines()) == 1 and len(parts) >= 2 and parts[-2] == own:
                    out.append((f"../{n}", parts[-1]))
    if not isinstance(store, LocalStore):
        return out
    base = (store.local_path(prefix) if prefix else store.root).resolve()

    def entry_of(link: Path) -> str | None:
        try:
            target = Path(os.path.realpath(link))
        except (OSError, RuntimeError):
            return None
        if target == base or base not in target.parents:
            return None
        return target.relative_to(base).parts[0]

    def scan() -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        seen = 0
        if not base.is_dir():
            return found
        for dirpath, dirs, files in os.walk(base):
            here = Path(dirpath)
            depth = len(here.relative_to(base).parts)
            if depth >= MAX_LINK_DEPTH:
                dirs[:] = []
            for n in sorted(dirs + files):
                seen += 1
                p = here / n
                if p.is_symlink() and (entry := entry_of(p)) is not None:
                    found.append((str(p.relative_to(base)), entry))
            if seen > MAX_LINK_SCAN:
                break
        up = base.parent
        if prefix and up.is_dir():
            for p in sorted(up.iterdir())[:MAX_LINK_SCAN]:
                if p.resolve() == base:
                    continue
                if p.is_symlink():
                    if (entry := entry_of(p)) is not None:
                        found.append((f"../{p.name}", entry))
                elif p.is_dir():
                    for q in sorted(p.iterdir())[:MAX_LINK_SCAN]:
                        if q.is_symlink() and (entry := entry_of(q)) is not None:
                            found.append((f"../{p.name}/{q.name}", entry))
        return found

    return out + await asyncio.to_thread(scan)


def _local_links(store: ObjectStore, prefix: str) -> set[str]:
    """The entries of a local run folder that are symlinks (a link is never a step: deleting one
    through the store would remove what it points at)."""
    if not isinstance(store, LocalStore):
        return set()
    base = store.local_path(prefix) if prefix else store.root
    return {p.name for p in base.iterdir() if p.is_symlink()} if base.is_dir() else set()


def _links_inside(store: ObjectStore, step: CheckpointStep) -> str | None:
    """A symlink inside a local step folder (its files would be deleted through it), or None."""
    if not isinstance(store, LocalStore) or step.is_file:
        return None
    base = store.local_path(step.path)
    for dirpath, dirs, files in os.walk(base):
        for n in sorted(dirs + files):
            p = Path(dirpath) / n
            if p.is_symlink():
                return f"{p.relative_to(base)} -> {os.readlink(p)}"
    return None


async def list_checkpoints(store: ObjectStore, prefix: str = "") -> Catalog:
    """List and classify every step under ``prefix`` (concurrent, paginated)."""
    prefix = prefix.strip("/")
    root = getattr(store, "root", None)
    if isinstance(root, Path) and not (root / prefix).is_dir():
        if (root / prefix).is_file():
            raise StoreError(f"{root / prefix}: a file, not a run folder (give the folder that holds the steps)")
        # A typo in a local run folder must not look like an empty run ("0 steps, nothing to do").
        raise StoreError(
            f"{root / prefix}: no such directory (a run folder is s3://bucket/prefix, "
            "a configured store name (store/run) or an existing local directory)"
        )
    links = _local_links(store, prefix)
    dirs = [
        d
        for d in await store.list_dirs(prefix)
        if not d.rsplit("/", 1)[-1].startswith(".") and d.rsplit("/", 1)[-1] not in links
    ]
    files = await _root_files(store, prefix)
    root_by_name = {o.key.rsplit("/", 1)[-1]: o for o in files}
    sem = asyncio.Semaphore(LIST_CONCURRENCY)

    async def listing(d: str) -> tuple[str, list[ObjectInfo]]:
        async with sem:
            return d, await store.list(d)

    listed = [(d, objs) for d, objs in await asyncio.gather(*(listing(d) for d in dirs)) if objs]
    # What is a step: a name of the run's step pattern that holds no run itself (step_names).
    rule = classify_names(
        {d.rsplit("/", 1)[-1]: [o.key[len(d) + 1 :] for o in objs] for d, objs in listed},
        files=[n for n in root_by_name if not n.startswith(".")],
    )
    step_dirs = [(d, objs) for d, objs in listed if rule[d.rsplit("/", 1)[-1]].step is not None]
    file_steps = [o for n, o in root_by_name.items() if n in rule and rule[n].step is not None]
    not_steps = [
        _not_a_step(d, objs, rule[d.rsplit("/", 1)[-1]].why)
        for d, objs in listed
        if rule[d.rsplit("/", 1)[-1]].step is None
    ] + [
        _not_a_step(o.key, [o], rule[n].why)
        for n, o in root_by_name.items()
        if n in rule and rule[n].step is None and any(c.isdigit() for c in n)
    ]
    # The newest trainer_state.json carries the run's best_model_checkpoint.
    states = [
        (rule[d.rsplit("/", 1)[-1]].step or -1, join_key(d, TRAINER_STATE))
        for d, objs in step_dirs
        if any(o.key == join_key(d, TRAINER_STATE) for o in objs)
    ]
    markers = await run_markers(store, prefix, root_by_name, [k for _, k in sorted(states, reverse=True)])

    async def one(d: str, objs: list[ObjectInfo]) -> CheckpointStep:
        async with sem:
            return await classify(store, d, objs, markers=markers, step=rule[d.rsplit("/", 1)[-1]].step)

    steps = list(await asyncio.gather(*(one(d, objs) for d, objs in step_dirs), *(one(o.key, [o]) for o in file_steps)))
    steps = [await _no_links_inside(store, s) for s in steps]
    own = prefix.rsplit("/", 1)[-1]
    if not steps and prefix and step_number(own) is not None and (listed or files):
        # the prefix may itself be a step folder (e.g. ``ckpt list s3://b/run1/step-100``)
        objs = await store.list(prefix)
        if objs:
            return Catalog(url=store.url, prefix=prefix, steps=(await step_catalog(store, prefix, objects=objs),))
    steps += not_steps
    return Catalog(url=store.url, prefix=prefix, steps=tuple(sorted(steps, key=_sort_key)))


async def _no_links_inside(store: ObjectStore, step: CheckpointStep) -> CheckpointStep:
    """A step holding a symlink lists as unknown: deleting or stripping it would remove, through
    the link, the files it points at (another step's, or another run's)."""
    if step.kind not in ("full", "weights"):
        return step
    link = await asyncio.to_thread(_links_inside, store, step)
    if link is None:
        return step
    note = f"holds a link ({link}): deleting it would remove what the link points at"
    return replace(step, kind="unknown", note=note)


def _not_a_step(path: str, objs: list[ObjectInfo], why: str) -> CheckpointStep:
    """A row for an entry of the run folder that the step rule refused: listed, never touched."""
    return CheckpointStep(
        step=None,
        path=path,
        layout="unknown",
        kind="unknown",
        total_bytes=sum(o.size for o in objs),
        object_count=len(objs),
        mtime=max((o.mtime for o in objs), default=0.0),
        has_bf16_export=False,
        objects=tuple(objs),
        optimizer_bytes=0,
        note=f"not a step: {why}",
    )


async def step_catalog(
    store: ObjectStore, step_path: str, *, objects: list[ObjectInfo] | None = None
) -> CheckpointStep:
    """Classify a single step folder (or a single ``.ckpt`` file), with its run's markers."""
    step_path = step_path.strip("/")
    parent = step_path.rsplit("/", 1)[0] if "/" in step_path else ""
    objs = objects if objects is not None else await store.list(step_path)
    if not objs:
        info = await store.stat(step_path)
        objs = [info] if info is not None else []
    states = (
        [join_key(step_path, TRAINER_STATE)] if any(o.key == join_key(step_path, TRAINER_STATE) for o in objs) else []
    )
    markers = await run_markers(store, parent, None, states)
    return await _no_links_inside(store, await classify(store, step_path, objs, markers=markers))
