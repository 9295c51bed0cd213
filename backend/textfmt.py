"""Text for the operator's terminal: the one sanitiser for text from outside, and plain-text tables.

Everything loadmaster shows that it did not write itself (what a node, Alertmanager, Prometheus or
a store said, an error carrying any of it) goes through :func:`safe_text` (one line) or
:func:`safe_block` (lines kept) on its way to the CLI or the console:

- terminal escape sequences are removed (CSI colours and cursor moves, OSC titles, hyperlinks and
  OSC 52 clipboard writes, DCS/APC strings), with C0 and C1 control characters and the Unicode
  bidi overrides, isolates and marks that make a line read differently than it is;
- secrets in URLs are redacted (:func:`redact`): a password or token in the user part
  (``postgresql://bob:***@db``), token-like query parameters (``?token=***``, S3 presigned
  signatures), in http(s) URLs webhook paths (``/services/***``, ``/webhooks/***``) and long
  token-like path segments (32 characters or more, no dot: object keys and file names stay),
  bearer tokens and cloud access key ids;
- the text is cut to a length, so a flood costs a bounded amount of work and screen.

A secret loadmaster knows exactly (the configured webhook URL) is removed by
:func:`redact_known` before that, wherever the outside text echoes it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

import hostlist

from backend.nodes.untrusted import clean_block, clean_text

#: What replaces a secret.
MASK = "***"
#: Longest line :func:`safe_text` returns when not told otherwise.
LINE_LIMIT = 2000

# The escape sequences and C0/C1/bidi characters are those of backend.nodes.untrusted (one list
# for the whole project); here: the bidi *marks* too, and whitespace controls become spaces.
_MARKS = re.compile("[\u061c\u200e\u200f]")
_SPACES = re.compile(r"[\t\n\r\v\f]+")

_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<user>[^\s/@:?#]*)(?P<pw>:[^\s/@?#]*)?@")
_SECRET_PARAM = re.compile(
    r"(?P<name>[?&;](?:[^=&\s#]*?)"
    r"(?:token|key|secret|sig|signature|password|passwd|pwd|auth|credential|session|code|apikey)"
    r"[^=&\s#]*=)(?P<value>[^&\s#\"'<>]+)",
    re.IGNORECASE,
)
_URL = re.compile(r"(?P<base>(?:https?|wss?)://[^\s/?#\"'<>]+)(?P<path>/[^\s?#\"'<>]*)")
#: Path parts after which a webhook's token follows (Slack, Discord, Teams, generic hooks).
_HOOK_PART = re.compile(r"^(services|webhooks?|hooks|webhookb2|integrations|api/v\d+/webhooks)$", re.IGNORECASE)
_TOKENISH = re.compile(r"^(?=[^/]*[0-9])(?=[^/]*[A-Za-z])[A-Za-z0-9_\-~%=+]{32,}$")
#: An Authorization value: the scheme as HTTP writes it, then a credential (a digit or '=' in it,
#: or 20 characters), so "Basic authentication required" stays as it is.
_BEARER = re.compile(
    r"\b(?P<scheme>Bearer|Basic|Token|bearer|token)\s+"
    r"(?:(?=[A-Za-z0-9_\-.~+/]*[0-9=])[A-Za-z0-9_\-.~+/=]{8,}|[A-Za-z0-9_\-.~+/=]{20,})"
)
_AUTH_HEADER = re.compile(r"(?i)\b(?P<head>(?:proxy-)?authorization\s*[:=]\s*[A-Za-z]+\s+)\S+")
_KEY_IDS = re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b|\bxox[abprs]-[A-Za-z0-9\-]{10,}")


def _userinfo(m: re.Match[str]) -> str:
    """``user:***@`` when there is a password; ``***@`` when the user part alone looks like a token
    (a plain user name, ``ssh://root@node-01``, is kept)."""
    if m.group("pw") is not None:
        return f"{m.group('scheme')}{m.group('user')}:{MASK}@"
    if len(m.group("user")) < 16:
        return m.group(0)
    return f"{m.group('scheme')}{MASK}@"


def _path(m: re.Match[str]) -> str:
    parts = m.group("path").split("/")
    out: list[str] = []
    hidden = False
    for part in parts:
        if hidden and part:
            if out[-1] != MASK:
                out.append(MASK)
            continue
        out.append(MASK if _TOKENISH.match(part) else part)
        hidden = hidden or bool(_HOOK_PART.match(part))
    return m.group("base") + "/".join(out)


#: Text without any of these (lower-cased) holds nothing :func:`redact` masks: a quick check.
_MARKERS = ("://", "=", "bearer", "basic", "token", "authoriz", "akia", "asia", "xox")


def redact(text: str) -> str:
    """``text`` with credentials and tokens in URLs (and bearer tokens, access key ids) masked."""
    low = text.lower()
    if not any(m in low for m in _MARKERS):
        return text
    if "://" in text:
        text = _USERINFO.sub(_userinfo, text)
        text = _URL.sub(_path, text)
    if "=" in text:
        text = _SECRET_PARAM.sub(lambda m: m.group("name") + MASK, text)
    text = _AUTH_HEADER.sub(lambda m: m.group("head") + MASK, text)
    text = _BEARER.sub(lambda m: f"{m.group('scheme')} {MASK}", text)
    return _KEY_IDS.sub(MASK, text)


def redact_known(text: str, secrets: Iterable[str]) -> str:
    """``text`` without any of ``secrets`` (URLs: the URL, its path and query, and every path part
    or query value of eight characters or more), wherever the text echoes them."""
    pieces: set[str] = set()
    for secret in secrets:
        if not secret:
            continue
        pieces.add(secret)
        if "://" in secret:
            parts = urlsplit(secret)
            pieces.update(x for x in (parts.path, parts.query, parts.password or "") if len(x) >= 4)
            pieces.update(x for x in parts.path.split("/") if len(x) >= 8)
            pieces.update(x.split("=", 1)[-1] for x in parts.query.split("&") if len(x.split("=", 1)[-1]) >= 8)
    for piece in sorted(pieces, key=len, reverse=True):  # the longest first: no partial leftovers
        text = text.replace(piece, MASK)
    return text


def _bounded(text: str, limit: int | None) -> str:
    """``text`` cut to ``limit`` (the cleaning's work is bounded too); a cut drops the last word
    whole, so no half of a URL (its password before the ``@``) escapes redaction."""
    if limit is None or len(text) <= limit:
        return text
    return text[:limit].rsplit(None, 1)[0] + "…" if " " in text[:limit] else "…"


def safe_text(value: Any, limit: int | None = LINE_LIMIT) -> str:
    """Text from outside as one printable line: secrets redacted, escape sequences, control
    characters and bidi overrides removed (line breaks and tabs become spaces), cut to ``limit``."""
    text = _bounded(value if isinstance(value, str) else str(value), None if limit is None else limit * 4)
    if not text.isprintable():
        text = clean_text(_SPACES.sub(" ", text))
    text = redact(_MARKS.sub("", text))
    if limit is not None and len(text) > limit:
        text = text[: max(0, limit - 1)] + "…"
    return text


def safe_block(value: Any, limit: int | None = 64 * LINE_LIMIT) -> str:
    """Multi-line text from outside: as :func:`safe_text`, but newlines and tabs are kept."""
    text = _bounded(value if isinstance(value, str) else str(value), limit)
    return redact(_MARKS.sub("", clean_block(text.replace("\r\n", "\n"))))


def align_columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """One line per row, each column left-aligned to its widest cell (trailing spaces dropped).

    A cell may hold text from outside (a Slurm reason, an object key, an alert's summary): each is
    made one printable line by :func:`safe_text` before it is measured, so no table the CLI prints
    carries an escape sequence, a clipboard write or a bidi override, and its columns line up."""
    if not rows:
        return []
    rows = [[safe_text(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def gpu_ranges(gpus: Iterable[int]) -> str:
    """GPU indices as sorted ranges: ``0-7``, ``0-2,5`` (a list ``0,1,2,3,4,5,`` cut by a narrow
    column read as GPUs 0-5 when all 8 starve). Python-hostlist's compressor, which Slurm's node
    lists use, without its brackets; empty for no GPU."""
    text: str = hostlist.collect_hostlist([str(g) for g in gpus])
    return text.removeprefix("[").removesuffix("]")
