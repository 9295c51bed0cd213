"""The ``[alerts]`` config section: where ``loadmaster watch`` sends alerts, and when it raises them.

[alerts]
alertmanager_url = "http://alertmanager.example:9093"   # API v2; no credentials in the URL
webhook_url = ""                   # also POST each change (firing / resolved) here, optional
interval = "15s"                   # how often watch evaluates the conditions
stall_after = "5m"                 # a running transfer with no new bytes for this long
held_for = "6h"                    # lost jobs, failed verifications, new Xids stay alerted this long
conditions = ["GPUStarved", ...]   # which are on (default: all of CONDITIONS)
console_url = ""                   # generatorURL prefix for the alerts (a link back), optional
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.schema import parse_duration

#: Every condition watch evaluates, by its ``alertname``.
CONDITIONS = (
    "GPUStarved",
    "GPUXid",
    "UploadBacklog",
    "TransferStalled",
    "JobLost",
    "VerificationFailed",
    "EgressBudgetWarning",
    "EgressBudgetExceeded",
    "RetentionApplyInterrupted",
    "NodeUnreachable",
)


def _url(value: str) -> str:
    from urllib.parse import urlsplit

    if not isinstance(value, str):
        raise ValueError(f"expected a URL string, got {value!r}")
    if not value:
        return value
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http(s)://host[:port] URL, got {value!r}")
    if parts.password is not None or parts.username is not None:
        raise ValueError("a URL here must not carry credentials (user:password@); they would reach logs")
    return value.rstrip("/")


def _conditions(value: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"expected a list of condition names, got {value!r}")
    unknown = [v for v in value if v not in CONDITIONS]
    if unknown:
        raise ValueError(f"unknown condition {unknown[0]!r} (known: {', '.join(CONDITIONS)})")
    return tuple(value)


@dataclass(frozen=True)
class AlertSettings:
    """Where alerts go and the thresholds of loadmaster's own conditions."""

    #: Alertmanager's base URL (API v2 is under /api/v2); empty: alerts go nowhere but the log.
    alertmanager_url: str = field(default="", metadata={"parse": _url})
    #: A plain webhook receiving every change as Alertmanager's webhook payload (version 4).
    webhook_url: str = field(default="", metadata={"parse": _url})
    #: Seconds between evaluations.
    interval: float = field(default=15.0, metadata={"parse": parse_duration})
    #: A running transfer whose bytes have not moved for this long is stalled.
    stall_after: float = field(default=300.0, metadata={"parse": parse_duration})
    #: Events that do not clear by themselves (a lost job, a failed verification, an Xid) stay
    #: firing this long after they happened.
    held_for: float = field(default=6 * 3600.0, metadata={"parse": parse_duration})
    #: The conditions that are on.
    conditions: tuple[str, ...] = field(default=CONDITIONS, metadata={"parse": _conditions})
    #: Prefix of each alert's generatorURL (e.g. a wiki page or a dashboard); empty: none.
    console_url: str = field(default="", metadata={"parse": _url})
    #: Seconds a request to Alertmanager or the webhook may take.
    timeout: float = field(default=10.0, metadata={"parse": parse_duration})

    def __post_init__(self) -> None:
        if self.interval < 1:
            raise ValueError(f"interval must be at least 1s, got {self.interval:g}s")
        if self.stall_after <= 0 or self.held_for <= 0:
            raise ValueError("stall_after and held_for must be positive durations")
