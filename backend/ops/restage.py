"""Stage the restart: the pick (the newest step proven resumable), the pull that brings it to the
nodes that will resume (pulled once from the store, relayed between them), and what it did.

The records here are what :meth:`backend.ops.triage.Triage.restage_plan` and
:meth:`~backend.ops.triage.Triage.restage` hand the CLI and the Triage screen: operation results
(the plan carries the pull's :class:`~backend.ops.pull.PullPreview`), so they live in ``ops``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backend.jobs.records import JobRecord
    from backend.ops.pull import PullPreview


@dataclass(frozen=True)
class RestagePlan:
    """The pick and the pull (None with ``refused`` saying why: no proof, no pick)."""

    run: str
    nodes: str
    checkpoint: dict[str, object]
    preview: PullPreview | None
    refused: str | None = None

    @property
    def startable(self) -> bool:
        return self.preview is not None and self.preview.startable and self.refused is None

    def lines(self) -> list[str]:
        """The pick, then the pull's plan (listing, quote, fan-out, the store's bytes)."""
        from backend.triage.restart import restart_lines

        out = restart_lines(self.checkpoint)
        if self.refused:
            out.append(f"not restaged: {self.refused}")
        if self.preview is not None:
            out.extend(self.preview.lines())
        return out

    def as_json(self) -> dict[str, object]:
        plan = self.preview.plan if self.preview is not None else None
        return {
            "run": self.run,
            "nodes": self.nodes,
            "checkpoint": self.checkpoint,
            "refused": self.refused,
            "blockers": list(self.preview.blockers) if self.preview is not None else [],
            "plan": plan.as_dict() if plan is not None else None,
        }


@dataclass(frozen=True)
class RestageResult:
    """What the pull did: every node's job, how long until all were resume-ready, the egress saved."""

    plan: RestagePlan
    records: tuple[JobRecord, ...]
    #: Seconds from the launch until every node held the step, verified (None: not all did).
    ready_s: float | None
    elapsed_s: float
    #: What the store sent and what a direct pull to every node would have made it send.
    store_bytes: int | None
    direct_bytes: int | None
    saved_usd: float | None
    audit_id: int

    @property
    def ok(self) -> bool:
        return self.ready_s is not None

    @property
    def saved_bytes(self) -> int | None:
        if self.store_bytes is None or self.direct_bytes is None:
            return None
        return self.direct_bytes - self.store_bytes

    def lines(self) -> list[str]:
        from backend.textfmt import safe_text
        from backend.units import bytes_text, usd_text

        out = []
        for r in self.records:
            line = f"{r.node}: {r.state}"
            if r.state == "succeeded" and r.result:
                line += f" ({bytes_text(r.result.get('bytes'))}; {r.result.get('verified_text') or 'verified'})"
            if r.error:
                line += f": {safe_text(r.error, 160)}"
            out.append(line)
        step = self.plan.checkpoint.get("step")
        if self.ready_s is not None:
            out.append(f"resume-ready: step {step} on {len(self.records)} node(s) in {self.ready_s:.1f}s")
        else:
            out.append(f"not resume-ready after {self.elapsed_s:.1f}s: see the nodes above")
        if self.saved_bytes is not None:
            usd = f" ({usd_text(self.saved_usd)})" if self.saved_usd else ""
            out.append(
                f"egress: the store sent {bytes_text(self.store_bytes)} instead of "
                f"{bytes_text(self.direct_bytes)}; saved {bytes_text(self.saved_bytes)}{usd}"
            )
        return out

    def as_json(self) -> dict[str, object]:
        return {
            **self.plan.as_json(),
            "jobs": [{"id": r.id, "node": r.node, "state": r.state, "error": r.error} for r in self.records],
            "ready_s": self.ready_s,
            "elapsed_s": self.elapsed_s,
            "store_bytes": self.store_bytes,
            "direct_bytes": self.direct_bytes,
            "saved_bytes": self.saved_bytes,
            "saved_usd": self.saved_usd,
            "audit_id": self.audit_id,
        }
