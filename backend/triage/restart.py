"""How fast the run can restart: the newest step proven resumable, and what was lost since.

Deny by default: a step is picked only when :func:`backend.retention.apply.prove_steps` says
``verified`` (its files whole and matching its commit marker, its upload job, if any, succeeded).
Full steps are proven newest first, at most :data:`PROVE_AT_MOST` of them; no proof, no pick.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backend.config import Config
    from backend.jobs.manager import JobManager
    from backend.storage import StoreRegistry
    from backend.triage.goodput import StepTime

#: Full steps proven (newest first) before giving up.
PROVE_AT_MOST = 3


async def newest_resumable(config: Config, stores: StoreRegistry, jobs: JobManager, ref: str) -> dict[str, Any]:
    """``{"url", "step", "path", "bytes", "saved_at", "newer_unusable": [...], "steps_lost_at_least"}``;
    ``step`` None (with ``why``) when no step proves resumable."""
    return (await resumable_and_history(config, stores, jobs, ref))[0]


async def resumable_and_history(
    config: Config, stores: StoreRegistry, jobs: JobManager, ref: str
) -> tuple[dict[str, Any], list[StepTime]]:
    """:func:`newest_resumable`'s answer and the run's full steps with their times (for goodput),
    from one listing of the run (``jobs``: the upload jobs a step loadmaster uploaded needs succeeded)."""
    from backend.retention.apply import fetch_catalog, prove_steps
    from backend.retention.marks import canonical_run
    from backend.triage.goodput import StepTime

    url, _ = canonical_run(config, ref)
    refused: list[dict[str, Any]] = []
    pick = None
    async with stores.open(url) as store:
        catalog = await fetch_catalog(store)
        numbered = [s for s in catalog.steps if s.step is not None]
        full = [s for s in numbered if s.kind == "full"]
        for s in reversed(full[-PROVE_AT_MOST:]):
            proof = (await prove_steps(jobs, store, catalog, url, [s.path])).get(s.path, "not proven")
            if proof == "verified":
                pick = s
                break
            refused.append({"path": s.path, "step": s.step, "kind": s.kind, "why": proof})
    newest = max((s.step for s in numbered if s.step is not None), default=None)
    after = pick.step if pick is not None and pick.step is not None else -1
    newer = [
        {"path": s.path, "step": s.step, "kind": s.kind, "why": s.note or s.kind}
        for s in numbered
        if s.step is not None and s.step > after and s.kind != "full"
    ]
    history = [
        StepTime(s.step, s.mtime, _span([o.mtime for o in s.objects]))
        for s in numbered
        if s.step is not None and s.kind == "full"
    ]
    out: dict[str, Any] = {"url": url, "newer_unusable": refused + newer}
    if pick is None:
        out.update(step=None, why="no step proves resumable (deny by default: no proof, no pick)")
        return out, history
    out.update(
        step=pick.step,
        path=pick.path,
        bytes=pick.total_bytes,
        saved_at=pick.mtime,
        proof="verified",
        steps_lost_at_least=(newest - pick.step) if newest is not None and pick.step is not None else None,
    )
    return out, history


def _span(times: list[float]) -> float | None:
    """How long a step's files took to write, as far as their times tell (None: not measurable)."""
    return max(times) - min(times) if len(times) >= 2 and max(times) > min(times) else None


def restart_lines(ck: dict[str, Any]) -> list[str]:
    """The restart point as lines for a terminal or a screen (text from the store sanitised)."""
    from datetime import UTC, datetime

    from backend.textfmt import safe_text

    if ck.get("step") is None:
        out = [f"restart: {safe_text(ck.get('why', ''), 200)} in {safe_text(ck.get('url', ''), 120)}"]
    else:
        lost = ck.get("steps_lost_at_least")
        saved = ck.get("saved_at")
        when = datetime.fromtimestamp(saved, UTC).strftime("%Y-%m-%d %H:%M:%SZ") if saved else "?"
        out = [
            f"restart from step {ck['step']} ({safe_text(ck['path'], 120)}, {ck['bytes'] / 1e9:.2f} GB, "
            f"saved {when}, proven resumable)" + (f"; at least {lost} steps lost since" if lost else "")
        ]
    out.extend(
        f"   not usable: {safe_text(u['path'], 120)}: {safe_text(u['why'], 120)}" for u in ck.get("newer_unusable", [])
    )
    return out


def restage_command(ck: dict[str, Any], nodes: list[str]) -> str | None:
    """The command that stages the picked step on the nodes that will resume (``loadmaster
    restage``: pulled once from the store, relayed between them, verified), shown and not run;
    None without a pick, nodes or an s3:// run."""
    import shlex

    url = str(ck.get("url") or "")
    if ck.get("step") is None or not nodes or not url.startswith("s3://"):
        return None
    return shlex.join(["loadmaster", "restage", url, "--nodes", ",".join(nodes)])
