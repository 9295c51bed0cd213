"""Bytes loadmaster does not trust (node output, manifests, journals) turned into bounded data.

A node is a machine someone else may control: what it prints can be huge, have no newline, hold
terminal escape sequences or nest JSON thousands deep. Everything read from one goes through
these helpers, so its cost is bounded (bytes per line, bytes per output, JSON size and depth)
and what reaches a terminal or the console is printable text.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any, Protocol

from backend.errors import NodeError

#: Longest line a stream yields; a longer one is replaced by :data:`CUT_LINE` (telemetry lines
#: are a few hundred bytes: nvidia-smi rows, /proc/net/dev lines).
MAX_LINE_BYTES = 64 * 1024
#: Most bytes one command's stdout (or stderr) may print; a job scan with many large specs is
#: tens of MB, so this only stops a flood.
MAX_OUTPUT_BYTES = 256 * 1024 * 1024
#: What a stream yields instead of a line over its limit (a node printing this only flags itself).
CUT_LINE = "\x00lm-line-cut\x00"
#: A message from a node shown to the operator (sshd's disconnect reason or banner, the command
#: server's last words): one printable line of at most this many characters.
REASON_LIMIT = 300
#: Largest JSON document a decoder here accepts by default, and its deepest nesting.
MAX_JSON_BYTES = 64 * 1024 * 1024
MAX_JSON_DEPTH = 64

_READ_CHUNK = 64 * 1024

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), other two-byte escapes, then single C0/C1
# controls (tab and newline kept by clean_block) and the Unicode bidi overrides/isolates that can
# make a line read differently than it is.
_ESCAPES = (
    r"\x1b\[[0-?]*[ -/]*[@-~]?|\x9b[0-?]*[ -/]*[@-~]?|\x1b\][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[PX^_][^\x1b\x9c]*(?:\x1b\\|\x9c)?|\x1b[ -/]*[0-~]?"
)
_CONTROLS_LINE = re.compile(_ESCAPES + "|[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROLS_BLOCK = re.compile(_ESCAPES + "|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


class OutputTooLarge(NodeError):
    """A node printed more than loadmaster reads from one command (the command was stopped)."""


class _Reader(Protocol):
    async def read(self, n: int = -1) -> Any: ...


def clean_text(text: str, limit: int | None = None) -> str:
    """``text`` as one printable line: escape sequences and control characters removed, cut to ``limit``."""
    if limit is not None and len(text) > limit * 4:
        text = text[: limit * 4]  # bound the cleaning work too
    out = _CONTROLS_LINE.sub("", text) if not text.isprintable() else text
    if limit is not None and len(out) > limit:
        out = out[: max(0, limit - 1)] + "…"
    return out


def clean_block(text: str) -> str:
    """Multi-line ``text`` with escape sequences and control characters removed (tab and newline kept)."""
    return _CONTROLS_BLOCK.sub("", text) if _CONTROLS_BLOCK.search(text) else text


async def read_capped(reader: _Reader, limit: int, *, node: str, what: str) -> bytes:
    """Everything ``reader`` yields up to EOF; :class:`OutputTooLarge` beyond ``limit`` bytes."""
    buf = bytearray()
    while True:
        chunk = await reader.read(_READ_CHUNK)
        if not chunk:
            return bytes(buf)
        buf += chunk
        if len(buf) > limit:
            raise OutputTooLarge(node, f"{what} printed more than {limit:,} bytes; stopped it")


class bounded_lines:  # noqa: N801 - used like the generator function it replaced
    """Lines (without the newline) read from ``reader``; a line over ``max_line`` bytes is yielded
    as ``CUT_LINE`` (encoded) and its bytes are skipped, so memory stays within ``max_line`` plus
    one read, and the work is linear in the bytes read. ``max_line`` may be changed between lines
    (a reply channel allows long lines only once its server is known to be talking)."""

    def __init__(self, reader: _Reader, max_line: int = MAX_LINE_BYTES) -> None:
        self.reader = reader
        self.max_line = max_line

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[bytes]:
        buf = bytearray()
        skipping = False
        cut = CUT_LINE.encode()
        while True:
            chunk = await self.reader.read(_READ_CHUNK)
            if not chunk:
                if buf and not skipping:
                    yield bytes(buf)
                return
            start = 0
            while True:
                nl = chunk.find(b"\n", start)
                if nl < 0:
                    if not skipping:
                        buf += chunk[start:]
                        if len(buf) > self.max_line:
                            buf.clear()
                            skipping = True
                            yield cut
                    break
                if skipping:
                    skipping = False
                else:
                    buf += chunk[start:nl]
                    yield cut if len(buf) > self.max_line else bytes(buf)
                buf.clear()
                start = nl + 1


def loads_bounded(
    data: str | bytes, *, what: str, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """Decode JSON from an untrusted source; ValueError naming ``what`` if it is too large,
    nested deeper than ``max_depth`` or not JSON (never RecursionError)."""
    if len(data) > max_bytes:
        raise ValueError(f"{what} is {len(data):,} bytes, more than the {max_bytes:,} accepted")
    try:
        doc = json.loads(data)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply to be a real document") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError, bad UTF-8, huge int literals
        raise ValueError(f"{what} is not valid JSON ({exc})") from None
    if _depth_over(doc, max_depth):
        raise ValueError(f"{what} is nested more than {max_depth} levels deep")
    return doc


def _depth_over(doc: Any, limit: int) -> bool:
    """Whether ``doc`` nests containers more than ``limit`` deep (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False
