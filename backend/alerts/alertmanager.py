"""The Alertmanager API v2 client (through backend.http): post alerts, read them, silence them, check health.

Shapes as Alertmanager's own OpenAPI spec gives them (``api/v2/openapi.yaml``, checked against
v0.25.0, Debian's build): ``postableAlert`` (``labels``, ``annotations``, ``startsAt``, ``endsAt``,
``generatorURL``), ``gettableAlert`` (also ``fingerprint``, ``updatedAt``, ``receivers[].name``,
``status.state`` / ``silencedBy`` / ``inhibitedBy``), ``postableSilence`` / ``gettableSilence``
(``matchers[]`` of ``name``, ``value``, ``isRegex``, ``isEqual``; ``startsAt``, ``endsAt``,
``createdBy``, ``comment``; ``id``, ``status.state``, ``updatedAt``), the ``silenceID`` answer of
``POST /silences`` and ``alertmanagerStatus`` (``versionInfo.version``, ``cluster.status``,
``uptime``). Alertmanager writes times in RFC 3339 with milliseconds; we send microseconds in UTC.

What Alertmanager does with what we post (v0.25.0 ``api/v2/api.go`` postAlertsHandler): an alert
without ``startsAt`` starts now; one without ``endsAt`` ends ``resolve_timeout`` (5 m) after its
last post, so a firing alert is posted again well within that; one whose ``endsAt`` is past is
resolved at once. The same label set posted twice (by anyone) is one alert, so one page.

Errors are one line naming the Alertmanager: :class:`AlertmanagerUnavailable` (unreachable, timed
out, HTTP 5xx / 408 / 429, an answer that is not its API's JSON or is too large: worth retrying)
and :class:`AlertmanagerRefused` (HTTP 4xx: the request is wrong, e.g. a bad matcher; Alertmanager's
own text, cleaned and cut short: not worth retrying). Nothing else escapes, whatever the server
answers. A URL with a user or password in it is refused when the client is made.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from backend.errors import ConfigError, LoadmasterError
from backend.http import HttpClient
from backend.nodes.untrusted import clean_text, loads_bounded
from backend.textfmt import safe_text

#: Largest answer read from Alertmanager (a fleet-wide list of alerts is a few MB).
MAX_ANSWER_BYTES = 32 * 1024 * 1024
#: Longest piece of Alertmanager's error text kept in a message.
ERROR_LIMIT = 200
#: Go's zero time, which Alertmanager writes for "not set".
_ZERO_YEAR = "0001-01-01"
#: A silence id (``format: uuid`` in the spec).
_SILENCE_ID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})$")


class AlertmanagerError(LoadmasterError):
    """An Alertmanager API call failed; ``retryable`` says whether trying again may help."""

    retryable = False


class AlertmanagerUnavailable(AlertmanagerError):
    """Alertmanager did not answer, or not with its API (retryable)."""

    retryable = True


class AlertmanagerRefused(AlertmanagerError):
    """Alertmanager refused the request as wrong (HTTP 4xx): fix the request, do not retry."""

    retryable = False


# -- times --------------------------------------------------------------------------------------


def format_time(when: datetime) -> str:
    """``when`` in RFC 3339, UTC, microseconds (``2024-05-01T12:00:00.000000Z``). A naive datetime
    is refused (ValueError): its zone would be a guess."""
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"datetime {when.isoformat()} has no time zone")
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime | None:
    """An RFC 3339 time as Go writes it (up to nanoseconds, ``Z`` or an offset) as an aware
    datetime (cut to microseconds); None for Go's zero time. ValueError if it is not one."""
    m = _RFC3339.match(text)
    if not m:
        raise ValueError(f"not an RFC 3339 time: {clean_text(text, 40)!r}")
    date, clock, frac, zone = m.groups()
    if date.startswith(_ZERO_YEAR):
        return None
    micro = (frac or "")[:6].ljust(6, "0")
    zone = "+00:00" if zone in ("Z", "z") else zone
    return datetime.fromisoformat(f"{date}T{clock}.{micro}{zone}")


# -- the API's shapes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AmAlert:
    """An alert to post (``postableAlert``). ``starts_at`` None: now; ``ends_at`` None: firing until
    ``resolve_timeout`` after the last post; ``ends_at`` in the past: resolved."""

    labels: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    generator_url: str | None = None

    def __post_init__(self) -> None:
        for when in (self.starts_at, self.ends_at):
            if when is not None and (when.tzinfo is None or when.utcoffset() is None):
                raise ValueError(f"alert time {when.isoformat()} has no time zone")

    def to_api(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"labels": dict(self.labels), "annotations": dict(self.annotations)}
        if self.starts_at is not None:
            doc["startsAt"] = format_time(self.starts_at)
        if self.ends_at is not None:
            doc["endsAt"] = format_time(self.ends_at)
        if self.generator_url is not None:
            doc["generatorURL"] = self.generator_url
        return doc


@dataclass(frozen=True)
class ActiveAlert:
    """An alert as Alertmanager holds it (``gettableAlert``). ``state``: unprocessed, active or
    suppressed (silenced or inhibited: ``silenced_by`` / ``inhibited_by`` hold the ids)."""

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime | None
    ends_at: datetime | None
    updated_at: datetime | None
    fingerprint: str
    state: str
    silenced_by: tuple[str, ...]
    inhibited_by: tuple[str, ...]
    receivers: tuple[str, ...]
    generator_url: str | None = None


_OPS = {(False, True): "=", (False, False): "!=", (True, True): "=~", (True, False): "!~"}


@dataclass(frozen=True)
class Matcher:
    """One label matcher of a silence or a filter (``matcher``: name, value, isRegex, isEqual)."""

    name: str
    value: str
    is_regex: bool = False
    is_equal: bool = True

    def to_api(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "isRegex": self.is_regex, "isEqual": self.is_equal}

    def text(self) -> str:
        """The matcher in Alertmanager's filter syntax (``name="value"``, ``=~``, ``!=``, ``!~``),
        the value quoted with OpenMetrics escapes (``\\\\``, ``\\"``, ``\\n``)."""
        value = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.name}{_OPS[(self.is_regex, self.is_equal)]}"{value}"'


@dataclass(frozen=True)
class Silence:
    """A silence (``gettableSilence``); ``state``: expired, active or pending."""

    id: str
    matchers: tuple[Matcher, ...]
    starts_at: datetime | None
    ends_at: datetime | None
    updated_at: datetime | None
    created_by: str
    comment: str
    state: str


@dataclass(frozen=True)
class AmStatus:
    """What ``GET /api/v2/status`` says (``versionInfo.version``, ``cluster.status``, ``uptime``)."""

    version: str
    cluster: str  # ready | settling | disabled
    uptime: datetime | None


class _Malformed(ValueError):
    """An answer that is JSON but not the API's shape."""


def _obj(doc: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(doc, dict):
        raise _Malformed(f"{what} is not an object")
    return doc


def _str(doc: Mapping[str, Any], key: str, *, optional: bool = False) -> str:
    v = doc.get(key)
    if v is None and optional:
        return ""
    if not isinstance(v, str):
        raise _Malformed(f"{key} is not a string")
    return v


def _bool(doc: Mapping[str, Any], key: str, default: bool) -> bool:
    v = doc.get(key, default)
    if not isinstance(v, bool):
        raise _Malformed(f"{key} is not a boolean")
    return v


#: Longest label value, annotation and comment kept from Alertmanager (each is shown).
LABEL_LIMIT = 1024
TEXT_LIMIT = 4096


def _shown(text: str, limit: int = LABEL_LIMIT) -> str:
    """Text Alertmanager holds (anyone who can post an alert or a silence wrote it) as it may be
    shown: the project's one sanitiser (escape codes, clipboard writes, controls, bidi overrides,
    secrets in URLs), parsed once here so the CLI and the console both get clean text."""
    return safe_text(text, limit)


def _labels(doc: Mapping[str, Any], key: str, limit: int = LABEL_LIMIT) -> dict[str, str]:
    v = doc.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        raise _Malformed(f"{key} is not a set of labels")
    return {_shown(k, 256): _shown(x, limit) for k, x in v.items()}


def _strs(doc: Mapping[str, Any], key: str) -> tuple[str, ...]:
    v = doc.get(key)
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _Malformed(f"{key} is not a list of strings")
    return tuple(_shown(x, 128) for x in v)


def _time(doc: Mapping[str, Any], key: str) -> datetime | None:
    v = doc.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise _Malformed(f"{key} is not a time")
    try:
        return parse_time(v)
    except ValueError as exc:
        raise _Malformed(f"{key}: {exc}") from None


def _list(doc: Any, what: str) -> list[Any]:
    if not isinstance(doc, list):
        raise _Malformed(f"the answer is not a list of {what}")
    return doc


def parse_alert(doc: Any) -> ActiveAlert:
    a = _obj(doc, "an alert")
    status = _obj(a.get("status"), "an alert's status")
    receivers = tuple(
        _shown(_str(_obj(r, "a receiver"), "name"), 128) for r in _list(a.get("receivers") or [], "receivers")
    )
    return ActiveAlert(
        labels=_labels(a, "labels"),
        annotations=_labels(a, "annotations", TEXT_LIMIT),
        starts_at=_time(a, "startsAt"),
        ends_at=_time(a, "endsAt"),
        updated_at=_time(a, "updatedAt"),
        fingerprint=_shown(_str(a, "fingerprint"), 64),
        state=_shown(_str(status, "state"), 32),
        silenced_by=_strs(status, "silencedBy"),
        inhibited_by=_strs(status, "inhibitedBy"),
        receivers=receivers,
        generator_url=_shown(_str(a, "generatorURL", optional=True)) or None,
    )


def parse_silence(doc: Any) -> Silence:
    s = _obj(doc, "a silence")
    matchers = tuple(
        Matcher(
            name=_shown(_str(m, "name"), 256),
            value=_shown(_str(m, "value")),
            is_regex=_bool(m, "isRegex", False),
            is_equal=_bool(m, "isEqual", True),
        )
        for m in (_obj(x, "a matcher") for x in _list(s.get("matchers"), "matchers"))
    )
    return Silence(
        id=_shown(_str(s, "id"), 64),
        matchers=matchers,
        starts_at=_time(s, "startsAt"),
        ends_at=_time(s, "endsAt"),
        updated_at=_time(s, "updatedAt"),
        created_by=_shown(_str(s, "createdBy", optional=True), 256),
        comment=_shown(_str(s, "comment", optional=True), TEXT_LIMIT),
        state=_shown(_str(_obj(s.get("status"), "a silence's status"), "state"), 32),
    )


# -- the client ---------------------------------------------------------------------------------


def _check_url(url: str) -> str:
    """The base URL without a trailing slash; ConfigError for one that is not http(s)://host[:port]
    or that carries a user or password (never repeated in the message)."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError:
        raise ConfigError("Alertmanager URL is not a valid URL (expected http://host:port)") from None
    host = parts.hostname or ""
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        shown = f"{parts.scheme}://{host}{f':{port}' if port else ''}"
        raise ConfigError(
            f"Alertmanager URL {shown} has a user or password in it: credentials in a URL end up in logs "
            "and on screen, so they are refused; give the URL without them and keep credentials in a file"
        )
    if parts.scheme not in ("http", "https") or not host:
        raise ConfigError(f"Alertmanager URL {clean_text(url, 80)!r} is not http(s)://host:port")
    if parts.query or parts.fragment:
        raise ConfigError(f"Alertmanager URL {clean_text(url, 80)!r} has a query or fragment; give its base URL")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def _error_text(body: bytes) -> str:
    """Alertmanager's error text: its answer is a JSON string, or go-swagger's ``{code, message}``."""
    text: Any
    try:
        doc = loads_bounded(body, what="the error", max_bytes=1 << 20)
    except ValueError:
        text = body[: ERROR_LIMIT * 4].decode("utf-8", errors="replace")
    else:
        if isinstance(doc, dict) and isinstance(doc.get("message"), str):
            text = doc["message"]
        elif isinstance(doc, str):
            text = doc
        else:
            text = body[: ERROR_LIMIT * 4].decode("utf-8", errors="replace")
    return _one_line(str(text), ERROR_LIMIT) or "no error text"


def _one_line(text: str, limit: int) -> str:
    """``text`` as one printable line: controls removed, runs of whitespace (newlines) one space,
    secrets in URLs redacted."""
    return safe_text(" ".join(text[: limit * 4].split()), limit)


class AlertmanagerClient:
    """The Alertmanager API v2 calls loadmaster makes. One HTTP session (backend.http), opened on first use;
    ``close()`` it (or use ``async with``)."""

    def __init__(self, url: str, timeout: float = 10.0, *, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.url = _check_url(url)
        if not timeout > 0:
            raise ConfigError(f"Alertmanager timeout must be more than 0 seconds, not {timeout}")
        self.timeout = float(timeout)
        self.max_bytes = int(max_bytes)
        self.http = HttpClient(
            self.url,
            name="Alertmanager",
            shown=self.url,
            timeout=self.timeout,
            max_body=self.max_bytes,
            error=AlertmanagerUnavailable,
            follow_redirects=False,
            headers={"Accept": "application/json"},
        )

    async def __aenter__(self) -> AlertmanagerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.close()

    # -- transport ----------------------------------------------------------------------------
    async def _call(
        self,
        method: str,
        path: str,
        *,
        params: Sequence[tuple[str, str]] | None = None,
        body: Any = None,
        not_found: str | None = None,
    ) -> Any:
        """One request; the decoded JSON answer (None for an empty one). ``not_found``: the text of
        Alertmanager's HTTP 500 that means the thing asked for does not exist (refused, not down)."""
        what = f"{method} /api/v2{path}"
        answer = await self.http.request(method, f"/api/v2{path}", params=list(params or ()), body=body)
        status = answer.status
        if 200 <= status < 300:
            if not answer.body.strip():
                return None
            return self.http.decode(answer, what)
        text = _error_text(answer.body)
        if not_found is not None and status == 500 and text == not_found:
            raise AlertmanagerRefused(f"Alertmanager {self.url} refused {what}: {text}")
        if 400 <= status < 500 and status not in (408, 429):
            raise AlertmanagerRefused(f"Alertmanager {self.url} refused {what} (HTTP {status}): {text}")
        raise AlertmanagerUnavailable(f"Alertmanager {self.url} answered {what} with HTTP {status}: {text}")

    def _malformed(self, what: str, exc: ValueError) -> AlertmanagerUnavailable:
        return AlertmanagerUnavailable(
            f"Alertmanager {self.url} answered {what} with something that is not its API's shape ({exc})"
        )

    # -- alerts ----------------------------------------------------------------------------------
    async def post_alerts(self, alerts: Sequence[AmAlert]) -> None:
        """``POST /api/v2/alerts``. Alertmanager keeps the valid ones of a batch even when it
        refuses others (the refusal names them)."""
        if not alerts:
            return
        await self._call("POST", "/alerts", body=[a.to_api() for a in alerts])

    async def alerts(
        self,
        *,
        active: bool = True,
        silenced: bool = True,
        inhibited: bool = True,
        unprocessed: bool = True,
        filter: Iterable[str | Matcher] = (),  # noqa: A002 - the API's name
        receiver: str | None = None,
    ) -> list[ActiveAlert]:
        """``GET /api/v2/alerts``: the alerts Alertmanager holds that are not resolved, narrowed by
        state and by ``filter`` (matchers, as text like ``alertname="X"`` or :class:`Matcher`)."""
        params = [
            ("active", _flag(active)),
            ("silenced", _flag(silenced)),
            ("inhibited", _flag(inhibited)),
            ("unprocessed", _flag(unprocessed)),
            *(("filter", f.text() if isinstance(f, Matcher) else f) for f in filter),
        ]
        if receiver is not None:
            params.append(("receiver", receiver))
        doc = await self._call("GET", "/alerts", params=params)
        try:
            return [parse_alert(a) for a in _list(doc, "alerts")]
        except _Malformed as exc:
            raise self._malformed("GET /api/v2/alerts", exc) from None

    # -- silences --------------------------------------------------------------------------------
    async def create_silence(
        self,
        matchers: Sequence[Matcher],
        starts_at: datetime,
        ends_at: datetime,
        created_by: str,
        comment: str,
    ) -> str:
        """``POST /api/v2/silences``: a new silence; its id."""
        if not matchers:
            raise AlertmanagerRefused(f"Alertmanager {self.url}: a silence needs at least one matcher")
        body = {
            "matchers": [m.to_api() for m in matchers],
            "startsAt": format_time(starts_at),
            "endsAt": format_time(ends_at),
            "createdBy": created_by,
            "comment": comment,
        }
        doc = await self._call("POST", "/silences", body=body)
        sid = doc.get("silenceID") if isinstance(doc, dict) else None
        if not isinstance(sid, str) or not sid:
            raise self._malformed("POST /api/v2/silences", _Malformed("no silenceID"))
        return sid

    async def silences(self, filter: Iterable[str | Matcher] = ()) -> list[Silence]:  # noqa: A002 - the API's name
        """``GET /api/v2/silences``: every silence Alertmanager still holds, expired ones included."""
        params = [("filter", f.text() if isinstance(f, Matcher) else f) for f in filter]
        doc = await self._call("GET", "/silences", params=params)
        try:
            return [parse_silence(s) for s in _list(doc, "silences")]
        except _Malformed as exc:
            raise self._malformed("GET /api/v2/silences", exc) from None

    async def expire_silence(self, silence_id: str) -> None:
        """``DELETE /api/v2/silence/{id}``: end it now (an expired one stays expired). An unknown id
        is refused, and so is one that is not a silence id (a UUID) without asking."""
        if not _SILENCE_ID.match(silence_id):
            shown = clean_text(silence_id, 60)
            raise AlertmanagerRefused(f"Alertmanager {self.url}: {shown!r} is not a silence id (a UUID)")
        await self._call("DELETE", f"/silence/{silence_id}", not_found="silence not found")

    # -- health ----------------------------------------------------------------------------------
    async def status(self) -> AmStatus:
        """``GET /api/v2/status``: Alertmanager's version, cluster state and start time."""
        doc = await self._call("GET", "/status")
        try:
            d = _obj(doc, "the status")
            return AmStatus(
                version=_str(_obj(d.get("versionInfo"), "versionInfo"), "version"),
                cluster=_str(_obj(d.get("cluster"), "cluster"), "status"),
                uptime=_time(d, "uptime"),
            )
        except _Malformed as exc:
            raise self._malformed("GET /api/v2/status", exc) from None


def _flag(value: bool) -> str:
    return "true" if value else "false"
