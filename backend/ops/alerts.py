"""Alert operations: the site's active alerts from Alertmanager, silences (audited), and loadmaster's own.

``ops.alerts.site()`` lists what Alertmanager holds (``GET /api/v2/alerts``), each mapped to the
inventory node and the job it names by label (``node``, or the telemetry labels ``Hostname`` /
``instance``; ``job_id``), with the link back for the alerts loadmaster sent itself.
``ops.alerts.silence(req)`` creates a silence (``POST /api/v2/silences``) with the operator as
author; it is refused in read-only mode and recorded in the audit log, like every change. A
silence is limited to loadmaster's own alerts (an exact ``alertname`` matcher naming one of its
conditions) unless the request says ``any_alert`` (``--any-alert``), which the audit records: the
site's Alertmanager pages other teams too, and ``node=gpu-01`` for a week would mute all of them.
``ops.alerts.expire(id)`` ends one. ``ops.alerts.status()`` says whether alerting is degraded: the
Alertmanager unreachable, or alert changes still queued by ``loadmaster watch``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from backend.alerts.alertmanager import (
    ActiveAlert,
    AlertmanagerClient,
    AlertmanagerError,
    Matcher,
    Silence,
)
from backend.alerts.settings import CONDITIONS, AlertSettings
from backend.errors import ConfigError, LoadmasterError
from backend.ops.base import Operation
from backend.telemetry.prometheus import NodeIndex

#: Longest silence the console makes (a forgotten silence hides the next real page).
#: What the front ends import from here: the operation, its requests and rows, and the silence
#: type both front ends list.
__all__ = [
    "MAX_SILENCE_S",
    "AlertSettings",
    "AlertingNotConfigured",
    "AlertingStatus",
    "Alerts",
    "Silence",
    "SilenceRequest",
    "SiteAlert",
    "describe",
    "own_alertname",
    "parse_matchers",
]

MAX_SILENCE_S = 7 * 24 * 3600.0
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class AlertingNotConfigured(LoadmasterError):
    """``[alerts] alertmanager_url`` is unset."""


@dataclass(frozen=True)
class SiteAlert:
    """One of Alertmanager's alerts, with the node and job it is about (None: not ours)."""

    alert: ActiveAlert
    node: str | None
    job_id: str | None
    #: ``job:<id>``, ``node:<name>``, ... when loadmaster sent it (its ``loadmaster_ref``).
    ref: str | None

    @property
    def name(self) -> str:
        return self.alert.labels.get("alertname", "?")

    @property
    def severity(self) -> str:
        return self.alert.labels.get("severity", "")

    @property
    def summary(self) -> str:
        a = self.alert.annotations
        return a.get("summary") or a.get("description") or a.get("message") or ""

    @property
    def silenced(self) -> bool:
        return bool(self.alert.silenced_by)


@dataclass(frozen=True)
class SilenceRequest:
    """A silence to make: label matchers (``name=value``), how long, and why."""

    matchers: tuple[tuple[str, str], ...]
    duration_s: float
    comment: str
    #: Regex matchers by name (``name=~value``).
    regex: frozenset[str] = field(default_factory=frozenset)
    #: The operator chose to silence alerts loadmaster did not raise (``--any-alert``, the
    #: console dialog's "Any alert" box; audited). False: limited to loadmaster's own alerts.
    any_alert: bool = False


def own_alertname(matchers: Iterable[Matcher]) -> str | None:
    """The loadmaster condition a silence is limited to (an exact ``alertname`` matcher naming
    one of :data:`CONDITIONS`), or None when it could match alerts loadmaster did not raise."""
    for m in matchers:
        if m.name == "alertname" and m.is_equal and not m.is_regex and m.value in CONDITIONS:
            return m.value
    return None


@dataclass(frozen=True)
class AlertingStatus:
    """Whether alerting works end to end, in one line when it does not."""

    configured: bool
    degraded: str | None
    queued: dict[str, int]


class Alerts(Operation):
    """Alertmanager's alerts and silences, for both front ends."""

    @property
    def settings(self) -> AlertSettings:
        return self.services.config.section(AlertSettings)

    def _client(self) -> AlertmanagerClient:
        url = self.settings.alertmanager_url
        if not url:
            raise AlertingNotConfigured(
                "[alerts] alertmanager_url is not set: point it at the site's Alertmanager (http://host:9093)"
            )
        return AlertmanagerClient(url, self.settings.timeout)

    async def site(self) -> list[SiteAlert]:
        """Alertmanager's alerts (active, silenced and inhibited), mapped to nodes and jobs."""
        client = self._client()
        try:
            got = await client.alerts()
        finally:
            await client.close()
        index = NodeIndex(self.services.config.nodes)
        out = []
        for a in got:
            node = None
            for key in ("node", "Hostname", "hostname", "instance", "host"):
                node = index.find(a.labels.get(key))
                if node:
                    break
            ref = a.annotations.get("loadmaster_ref") or None
            out.append(SiteAlert(a, node, a.labels.get("job_id") or None, ref))
        sev = {"critical": 0, "page": 0, "error": 1, "warning": 2}
        out.sort(key=lambda s: (s.silenced, sev.get(s.severity, 3), s.node or "~", s.name))
        return out

    async def silences(self) -> list[Silence]:
        client = self._client()
        try:
            return await client.silences()
        finally:
            await client.close()

    async def silence(self, req: SilenceRequest) -> str:
        """Create the silence (author: the operator); audited; its id."""
        from backend.state import actor

        self.refuse_if_readonly("create a silence")
        if not req.matchers:
            raise ConfigError("a silence needs at least one label matcher (e.g. node=node-02)", key="matchers")
        for name, _value in req.matchers:
            if not _LABEL.match(name):
                raise ConfigError(f"{name!r} is not a label name", key="matchers")
        if not 0 < req.duration_s <= MAX_SILENCE_S:
            raise ConfigError("a silence lasts more than 0 and at most 7 days", key="duration")
        if not req.comment.strip():
            raise ConfigError("say why (the comment is what the next on-call reads)", key="comment")
        matchers = [Matcher(n, v, is_regex=n in req.regex) for n, v in req.matchers]
        own = own_alertname(matchers)
        if own is None and req.any_alert is not True:
            raise ConfigError(
                "this silence could match alerts loadmaster did not raise (the site's, other teams'): add "
                f"alertname=<one of {', '.join(CONDITIONS)}>, or allow any alert (--any-alert, or the "
                "dialog's 'Any alert' box; recorded in the audit log)",
                key="matchers",
            )
        scope = "loadmaster" if own is not None else "any-alert"
        start = datetime.now(UTC)
        end = start + timedelta(seconds=req.duration_s)
        who = actor()
        target = ",".join(m.text() for m in matchers)
        client = self._client()
        try:
            sid = await client.create_silence(matchers, start, end, who, req.comment.strip())
        except AlertmanagerError as exc:
            self.audit(
                "alerts.silence", target, "failed", detail={"error": str(exc), "scope": scope}, reason=req.comment
            )
            raise
        finally:
            await client.close()
        self.audit(
            "alerts.silence",
            target,
            "ok",
            detail={
                "silence_id": sid,
                "ends_at": end.isoformat(),
                "url": self.settings.alertmanager_url,
                "scope": scope,
            },
            reason=req.comment.strip(),
        )
        return sid

    async def expire(self, silence_id: str, *, reason: str = "") -> None:
        self.refuse_if_readonly("expire a silence")
        client = self._client()
        try:
            await client.expire_silence(silence_id)
        finally:
            await client.close()
        self.audit("alerts.unsilence", silence_id, "ok", reason=reason or None)

    def status(self, site_error: str | None = None) -> AlertingStatus:
        """Alerting's state: ``site_error`` (the console's last Alertmanager read failing) or
        alert changes ``loadmaster watch`` has queued for a sink that is down."""
        from backend.alerts.store import AlertStore

        s = self.settings
        configured = bool(s.alertmanager_url or s.webhook_url)
        queued: dict[str, int] = {}
        parts = [site_error] if site_error else []
        try:
            queued = AlertStore(self.services.db).queued()
        except LoadmasterError as exc:
            parts.append(f"alert queue unreadable ({exc})")
        waiting = (queued.get("am", 0) if s.alertmanager_url else 0) + (queued.get("hook", 0) if s.webhook_url else 0)
        if waiting:
            parts.append(f"{waiting} alert change(s) queued by loadmaster watch, not yet delivered")
        return AlertingStatus(configured, ("alerting degraded: " + "; ".join(parts)) if parts else None, queued)


def parse_matchers(text: str) -> tuple[tuple[tuple[str, str], ...], frozenset[str]]:
    """``node=node-02, alertname=~GPU.*`` -> matchers and the names that are regexes."""
    out: list[tuple[str, str]] = []
    regex: set[str] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = re.match(r'^([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|=)\s*"?(.*?)"?$', part)
        if not m:
            raise ConfigError(f"{part!r}: expected name=value or name=~regex", key="matchers")
        name, op, value = m.groups()
        out.append((name, value))
        if op == "=~":
            regex.add(name)
    return tuple(out), frozenset(regex)


def describe(a: SiteAlert) -> dict[str, object]:
    """An alert as JSON (the CLI's --json)."""
    return {
        "alertname": a.name,
        "severity": a.severity,
        "node": a.node,
        "job_id": a.job_id,
        "ref": a.ref,
        "summary": a.summary,
        "labels": a.alert.labels,
        "state": a.alert.state,
        "silenced_by": list(a.alert.silenced_by),
        "starts_at": a.alert.starts_at.isoformat() if a.alert.starts_at else None,
        "fingerprint": a.alert.fingerprint,
    }
