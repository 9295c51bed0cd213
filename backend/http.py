"""The one HTTP client of the backend (aiohttp): JSON get and post against a service's API, the
body read capped, every failure one line naming the service, secrets in the URL never shown.

Callers (the Prometheus source, the Alertmanager client, the webhook) keep their own error class
(``error=``) and their own reading of a status; this module owns the session, the timeout, the
cap and the wording of "unreachable", "not HTTP" and "too large". aiohttp is imported on first use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backend.errors import LoadmasterError
from backend.nodes.untrusted import loads_bounded
from backend.textfmt import redact_known, safe_text

#: Longest reason kept from a failure (it reaches the screen).
REASON_LIMIT = 200
_CHUNK = 1 << 20

Params = Mapping[str, str] | Sequence[tuple[str, str]]


class HttpFailure(LoadmasterError):
    """A request got no usable answer (unreachable, timed out, not HTTP, too large): one line."""


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n:,} bytes"


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: its status and its body (at most the client's ``max_body`` bytes)."""

    status: int
    body: bytes
    reason: str = ""


class HttpClient:
    """One service's API at ``url``: one aiohttp session, opened on first use; ``close()`` it.

    ``name`` and ``shown`` (the URL as messages may show it; by default ``url`` with its
    credentials redacted) start every error; ``error`` is the class raised."""

    def __init__(
        self,
        url: str,
        *,
        name: str,
        timeout: float,
        max_body: int,
        shown: str | None = None,
        error: type[LoadmasterError] = HttpFailure,
        follow_redirects: bool = True,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.url = url
        self.name = name
        self.shown = shown if shown is not None else safe_text(self.url, REASON_LIMIT)
        self.timeout = float(timeout)
        self.max_body = int(max_body)
        self.error = error
        self.follow_redirects = follow_redirects
        self.headers = dict(headers or {})
        self._session: Any = None

    def reason(self, text: str, limit: int = REASON_LIMIT) -> str:
        """``text`` (from the server or the network) as one line without the URL's secrets."""
        return safe_text(" ".join(redact_known(text.replace(self.url, self.shown), [self.url]).split()), limit)

    async def request(
        self,
        method: str,
        path: str = "",
        *,
        params: Params | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        cut: bool = False,
    ) -> Answer:
        """One request (``body`` sent as JSON unless None); the answer, whatever its status. A body
        over ``max_body`` is refused, or with ``cut`` read only that far (a sink's error text)."""
        import aiohttp

        what = f"{method} {path}" if path else method
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        sent = {**self.headers, **(headers or {})}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            sent.setdefault("Content-Type", "application/json")
        try:
            async with self._session.request(
                method,
                f"{self.url.rstrip('/')}{path}" if path else self.url,
                params=params,
                data=data,
                headers=sent,
                allow_redirects=self.follow_redirects,
            ) as resp:
                got = bytearray()
                async for chunk in resp.content.iter_chunked(_CHUNK):
                    got += chunk
                    if len(got) > self.max_body and cut:
                        del got[self.max_body :]
                        break
                    if len(got) > self.max_body:
                        raise self.error(
                            f"{self.name} {self.shown} answered {what} with more than {_size(self.max_body)}; not read"
                        )
                return Answer(resp.status, bytes(got), resp.reason or "")
        except LoadmasterError:
            raise
        except (aiohttp.ClientResponseError, aiohttp.ClientPayloadError) as exc:
            # It answered, but not with HTTP (a bad status line, a header too long, a body cut short).
            why = exc.message if isinstance(exc, aiohttp.ClientResponseError) else str(exc)
            raise self.error(
                f"{self.name} {self.shown} answered {what} with something that is not HTTP ({self.reason(why, 160)})"
            ) from None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            why = "timed out" if isinstance(exc, TimeoutError) else self.reason(str(exc) or type(exc).__name__)
            raise self.error(f"{self.name} {self.shown} unreachable ({why})") from None

    def decode(self, answer: Answer, what: str, *, check_depth: bool = True) -> Any:
        """The answer's body as JSON; one line naming ``what`` if it is not. ``check_depth=False``
        skips the nesting walk for large answers of a known flat shape (still no RecursionError)."""
        try:
            if not check_depth:
                return json.loads(answer.body)
            return loads_bounded(answer.body, what="the answer", max_bytes=self.max_body)
        except (ValueError, RecursionError):
            raise self.error(
                f"{self.name} {self.shown} answered {what} (HTTP {answer.status}) with something that is not JSON"
            ) from None

    async def get_json(self, path: str = "", params: Params | None = None, *, check_depth: bool = True) -> Any:
        """``GET`` and the decoded JSON, whatever the status (APIs answer their errors in JSON)."""
        answer = await self.request("GET", path, params=params)
        return self.decode(answer, f"GET {path}", check_depth=check_depth)

    async def post_json(self, path: str, body: Any, *, cut: bool = False) -> Answer:
        """``POST`` ``body`` as JSON; the answer, for the caller to judge its status."""
        return await self.request("POST", path, body=body, cut=cut)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
