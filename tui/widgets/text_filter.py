"""The ``/`` filter every console table shares: a glob or a case-insensitive substring."""

from __future__ import annotations

import fnmatch


def text_matches(pattern: str, *hay: str) -> bool:
    """Whether a row with the texts ``hay`` passes ``pattern``: a glob (``gpu-0*``) matching one
    text whole, or a case-insensitive substring of any; an empty pattern matches everything."""
    if not pattern:
        return True
    p = pattern.lower()
    texts = [h.lower() for h in hay if h]
    if any(c in p for c in "*?["):
        return any(fnmatch.fnmatchcase(h, p) for h in texts)
    return any(p in h for h in texts)
