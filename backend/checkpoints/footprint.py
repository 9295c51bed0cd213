"""Checkpoint footprint math (pure): BF16 weights vs full AdamW training state.

Per parameter: BF16 weights 2 bytes; full AdamW state = BF16 weights (2) + FP32 master copy (4)
+ FP32 first moment m (4) + FP32 second moment v (4) = 14 bytes. GB = 10^9 bytes; GiB = 2^30.
Also: the upload-backlog alert computed from job records.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from backend.units import bytes_gib_text

BF16_BYTES_PER_PARAM = 2
FP32_BYTES = 4
FULL_ADAMW_BYTES_PER_PARAM = BF16_BYTES_PER_PARAM + 3 * FP32_BYTES  # weights + master + m + v = 14
GB = 10**9
GiB = 2**30


@dataclass(frozen=True)
class Footprint:
    """Sizes of one checkpoint and of ``retained`` checkpoints, full vs weights only."""

    params: int
    retained: int
    weights_bytes: int  # BF16 weights of one checkpoint
    full_bytes: int  # full AdamW training state of one checkpoint
    saving_bytes: int  # what keeping weights only saves per checkpoint
    saving_fraction: float  # saving_bytes / full_bytes (0.857 for AdamW)
    retained_weights_bytes: int
    retained_full_bytes: int
    retained_saving_bytes: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready figures (bytes, plus GB and GiB)."""
        d: dict[str, Any] = dict(self.__dict__)
        for k in (
            "weights_bytes",
            "full_bytes",
            "saving_bytes",
            "retained_weights_bytes",
            "retained_full_bytes",
            "retained_saving_bytes",
        ):
            d[k.replace("_bytes", "_gb")] = self.__dict__[k] / GB
            d[k.replace("_bytes", "_gib")] = self.__dict__[k] / GiB
        d["units"] = "GB = 10^9 bytes; GiB = 2^30 bytes"
        return d

    def rows(self) -> list[tuple[str, int, int]]:
        """(label, one checkpoint bytes, retained checkpoints bytes) for tables."""
        return [
            ("BF16 weights (2 B/param)", self.weights_bytes, self.retained_weights_bytes),
            ("Full AdamW state (14 B/param)", self.full_bytes, self.retained_full_bytes),
            ("Saved by keeping weights only", self.saving_bytes, self.retained_saving_bytes),
        ]


def footprint(params: float, retained: int = 1) -> Footprint:
    """Footprint of a model with ``params`` parameters, for ``retained`` checkpoints."""
    if params <= 0:
        raise ValueError(f"params must be positive, got {params!r}")
    if retained < 0:
        raise ValueError(f"retained must be >= 0, got {retained!r}")
    p = int(params)
    w = p * BF16_BYTES_PER_PARAM
    f = p * FULL_ADAMW_BYTES_PER_PARAM
    return Footprint(
        params=p,
        retained=retained,
        weights_bytes=w,
        full_bytes=f,
        saving_bytes=f - w,
        saving_fraction=(f - w) / f,
        retained_weights_bytes=w * retained,
        retained_full_bytes=f * retained,
        retained_saving_bytes=(f - w) * retained,
    )


def footprint_table(fp: Footprint) -> str:
    """A markdown table of the footprint (one checkpoint and the retained set)."""
    lines = [
        f"Model: {fp.params / 1e9:g}B parameters; {fp.retained} retained checkpoint(s); "
        "GB = 10^9 bytes, GiB = 2^30 bytes",
        "",
        f"| | one checkpoint | {fp.retained} retained |",
        "|---|---:|---:|",
    ]
    for label, one, many in fp.rows():
        lines.append(f"| {label} | {bytes_gib_text(one)} | {bytes_gib_text(many)} |")
    lines.append(f"| Saving | {fp.saving_fraction:.1%} | {fp.saving_fraction:.1%} |")
    return "\n".join(lines)


# -- upload backlog ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BacklogAlert:
    """An upload still running when the run's next checkpoint is due (or several queued)."""

    run: str
    job_id: str
    node: str
    step: int | None
    running_s: float
    interval_s: float
    in_flight: int
    message: str


def _run_of(params: dict[str, Any]) -> str:
    dest = str(params.get("run") or params.get("dest") or "")
    return dest.rstrip("/").rsplit("/", 1)[0] if "/" in dest.rstrip("/") else dest


def upload_backlog(
    records: Iterable[Any], *, interval_s: float | None = None, now: float | None = None
) -> list[BacklogAlert]:
    """Alerts for runs whose upload is still running when the next checkpoint is due.

    ``records`` are job records (``kind``, ``state``, ``created``, ``started``, ``params``,
    ``id``, ``node``, ``terminal``). The checkpoint interval is ``interval_s`` or, when None,
    the median gap between that run's recent upload jobs.
    """
    now = time.time() if now is None else now
    by_run: dict[str, list[Any]] = {}
    for r in records:
        if getattr(r, "kind", None) == "upload":
            by_run.setdefault(_run_of(getattr(r, "params", {}) or {}), []).append(r)
    alerts = []
    for run, recs in sorted(by_run.items()):
        recs.sort(key=lambda r: r.created)
        gaps = sorted(b.created - a.created for a, b in zip(recs, recs[1:], strict=False) if b.created > a.created)
        interval = interval_s if interval_s is not None else (gaps[len(gaps) // 2] if gaps else None)
        running = [r for r in recs if not r.terminal]
        if not running or not interval:
            continue
        oldest = running[0]
        started = oldest.started or oldest.created
        age = now - started
        if age >= interval or len(running) > 1:
            step = oldest.params.get("step")
            alerts.append(
                BacklogAlert(
                    run=run,
                    job_id=oldest.id,
                    node=oldest.node,
                    step=step,
                    running_s=age,
                    interval_s=interval,
                    in_flight=len(running),
                    message=(
                        f"{run}: upload of step {step if step is not None else '?'} on {oldest.node} has run "
                        f"{age:.0f}s, past the {interval:.0f}s checkpoint interval; {len(running)} upload(s) in "
                        "flight: uploads are falling behind checkpoints"
                    ),
                )
            )
    return alerts
