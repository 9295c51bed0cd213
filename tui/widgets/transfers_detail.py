"""One job in detail: what, where, progress, a live throughput plot (Sparkline) and its log tail."""

from __future__ import annotations

import time
from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Sparkline, Static

from backend.ops.types import JobProgress, JobRecord, proof_text
from backend.textfmt import safe_text
from backend.units import bytes_text, duration_text, gbps_text
from tui.widgets.plain import PlainStatic
from tui.widgets.transfers_format import bar


class TransferDetail(Vertical):
    """The selected job: facts, throughput over time (Gbps) and the last lines of its log."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.job_id: str | None = None

    def compose(self) -> ComposeResult:
        yield PlainStatic("Select a job to see its detail.", id="transfers-detail-info")
        yield Label("Throughput (Gbps)", classes="transfers-caption")
        yield Sparkline([], id="transfers-spark", summary_function=max)
        yield Label("Log", classes="transfers-caption")
        yield PlainStatic("", id="transfers-log")

    def show(
        self, rec: JobRecord, history: Sequence[JobProgress], log_tail: str, line_rate_gbps: float | None = None
    ) -> None:
        """Render ``rec`` with its throughput history and log tail."""
        self.job_id = rec.id
        p = rec.progress
        lines = [f"{rec.kind} job {rec.id} on {rec.node}: {rec.state}" + (f" ({rec.note})" if rec.note else "")]
        if rec.source:
            lines.append(f"{rec.source} -> {rec.destination}")
        if p is not None:
            lines.append(
                f"{bar(p.fraction, 30)}  {bytes_text(p.bytes_done)} of {bytes_text(p.bytes_total)}"
                + (f", {p.items_done}/{p.items_total} objects" if p.items_total is not None else "")
            )
            if rec.state in ("running", "cancelling") and p.gbps is not None:
                pct = f" ({p.gbps / line_rate_gbps * 100:.0f}% of line rate)" if line_rate_gbps else ""
                lines.append(f"{gbps_text(p.gbps)}{pct}, ETA {duration_text(p.eta_s)}")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.created))
        lines.append(f"launched {when} by {rec.launched_by} from {rec.launched_from}")
        if rec.slurm_job:
            lines.append(f"for Slurm job {safe_text(rec.slurm_job, 24)}")
        if rec.error:
            lines.append(f"error: {rec.error}")
        if rec.result:
            r = rec.result
            if "bytes" in r:
                lines.append(
                    f"result: {r.get('objects', '?')} objects, {bytes_text(r.get('bytes'))}"
                    + (f", {gbps_text(r['gbps'])}" if r.get("gbps") is not None else "")
                    + f"; {proof_text(r)}"
                )
        self.query_one("#transfers-detail-info", Static).update("\n".join(lines))
        self.query_one("#transfers-spark", Sparkline).data = [pt.gbps or 0.0 for pt in history] or [0.0]
        self.query_one("#transfers-log", Static).update(log_tail.rstrip() or "(empty log)")
