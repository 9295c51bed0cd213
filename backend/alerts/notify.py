"""Delivery of the alerts table to Alertmanager (API v2) and to a plain webhook, with retries.

Each round (:meth:`Notifier.deliver`):

* **Alertmanager** gets every firing alert again, with ``endsAt`` pushed ahead
  (:func:`ends_ahead`: Prometheus's rule, 4 x the larger of the interval and a minute), and every
  resolved one it has not yet taken, with its real ``endsAt``. ``startsAt`` is the condition's
  first sighting as stored, so a restarted or second watcher sends an identical alert and
  Alertmanager pages once. When the post fails the rows stay queued (the table is the queue) and
  the round reports "alerting degraded"; the next round sends them again, resolved ones included.
* **The webhook** gets each change once: the alerts whose state it has not acknowledged, in
  Alertmanager's webhook payload (version 4) so receivers written for Alertmanager read it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from backend.alerts.alertmanager import AlertmanagerClient, AlertmanagerError, AmAlert, format_time
from backend.alerts.settings import AlertSettings
from backend.alerts.store import AlertStore, StoredAlert
from backend.errors import LoadmasterError
from backend.http import HttpClient


def shown_url(url: str) -> str:
    """A webhook URL as it may be shown or logged: scheme and host only (Slack, PagerDuty and most
    chat webhooks carry their token in the path or the query)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    tail = "/..." if (parts.path.strip("/") or parts.query) else ""
    return f"{parts.scheme}://{parts.netloc}{tail}"


def ends_ahead(settings: AlertSettings) -> float:
    """How far ahead a firing alert's endsAt is set: Alertmanager resolves it by itself only after
    this long without a re-send (a watcher that died)."""
    return 4 * max(settings.interval, 60.0)


def _dt(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def generator_url(settings: AlertSettings, alert: StoredAlert) -> str | None:
    ref = alert.annotations.get("loadmaster_ref", "")
    if not settings.console_url:
        return None
    kind, _, key = ref.partition(":")
    from urllib.parse import quote

    return f"{settings.console_url}/{quote(kind)}/{quote(key, safe='')}" if kind and key else settings.console_url


def to_am(settings: AlertSettings, alert: StoredAlert, now: float) -> AmAlert:
    ends = alert.ends_at if alert.state == "resolved" and alert.ends_at is not None else now + ends_ahead(settings)
    return AmAlert(
        labels=dict(alert.labels),
        annotations=dict(alert.annotations),
        starts_at=_dt(alert.starts_at),
        ends_at=_dt(ends),
        generator_url=generator_url(settings, alert),
    )


def webhook_payload(settings: AlertSettings, alerts: list[StoredAlert]) -> dict[str, Any]:
    """Alertmanager's webhook payload (version 4) for these alerts."""
    status = "firing" if any(a.state == "firing" for a in alerts) else "resolved"
    return {
        "version": "4",
        "groupKey": "loadmaster",
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "loadmaster",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": settings.console_url,
        "alerts": [
            {
                "status": a.state,
                "labels": a.labels,
                "annotations": a.annotations,
                "startsAt": format_time(_dt(a.starts_at)),
                "endsAt": format_time(_dt(a.ends_at)) if a.ends_at is not None else "0001-01-01T00:00:00Z",
                "generatorURL": generator_url(settings, a) or "",
                "fingerprint": a.fingerprint,
            }
            for a in alerts
        ],
    }


#: The part of a webhook's answer read (its error text).
_HOOK_ANSWER_BYTES = 2048


class WebhookError(LoadmasterError):
    """The webhook did not take the alerts (one line, naming the URL)."""


@dataclass(frozen=True)
class Delivery:
    """One round: what each sink took, and why a sink is degraded (None: it is fine)."""

    am_sent: int = 0
    hook_sent: int = 0
    am_error: str | None = None
    hook_error: str | None = None
    queued: int = 0

    @property
    def degraded(self) -> str | None:
        errs = [e for e in (self.am_error, self.hook_error) if e]
        if not errs:
            return None
        return f"alerting degraded: {'; '.join(errs)} ({self.queued} alert change(s) queued, retried each round)"


class Notifier:
    """Sends the alerts table to the configured sinks."""

    def __init__(self, store: AlertStore, settings: AlertSettings) -> None:
        self.store = store
        self.settings = settings
        self.am = AlertmanagerClient(settings.alertmanager_url, settings.timeout) if settings.alertmanager_url else None
        self._hook: HttpClient | None = None

    async def deliver(self, now: float | None = None) -> Delivery:
        now = time.time() if now is None else now
        am_sent = hook_sent = 0
        am_error = hook_error = None
        if self.am is not None:
            batch = self.store.firing() + [a for a in self.store.pending("am") if a.state == "resolved"]
            if batch:
                try:
                    await self.am.post_alerts([to_am(self.settings, a, now) for a in batch])
                except AlertmanagerError as exc:
                    am_error = str(exc)
                    self.store.note_error("am", batch, am_error)
                else:
                    self.store.acknowledge("am", batch, now)
                    am_sent = len(batch)
        if self.settings.webhook_url:
            batch = self.store.pending("hook")
            if batch:
                try:
                    await self._post_hook(webhook_payload(self.settings, batch))
                except WebhookError as exc:
                    hook_error = str(exc)
                    self.store.note_error("hook", batch, hook_error)
                else:
                    self.store.acknowledge("hook", batch, now)
                    hook_sent = len(batch)
        q = self.store.queued()
        queued = (q["am"] if self.am is not None else 0) + (q["hook"] if self.settings.webhook_url else 0)
        return Delivery(am_sent, hook_sent, am_error, hook_error, queued)

    async def _post_hook(self, payload: dict[str, Any]) -> None:
        url = self.settings.webhook_url
        if self._hook is None:
            self._hook = HttpClient(
                url,
                name="webhook",
                shown=shown_url(url),
                timeout=self.settings.timeout,
                max_body=_HOOK_ANSWER_BYTES,
                error=WebhookError,
            )
        answer = await self._hook.post_json("", payload, cut=True)
        if answer.status >= 300:
            # The server may echo the path (its token): removed before it is shown or stored.
            said = answer.body.decode(errors="replace") or answer.reason
            raise WebhookError(
                f"webhook {self._hook.shown} answered HTTP {answer.status} {self._hook.reason(said)}".rstrip()
            )

    async def close(self) -> None:
        if self.am is not None:
            await self.am.close()
        if self._hook is not None:
            await self._hook.close()
            self._hook = None
