"""argparse ``type=`` converters shared by the CLI modules: a bad value is a one-line usage error."""

from __future__ import annotations

import argparse

from backend.ops.types import parse_duration, parse_size


def size_arg(text: str) -> int:
    """A size like ``512MB`` or ``40TB`` (decimal units) in bytes."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def duration_arg(text: str) -> float:
    """A duration like ``30s`` or ``2h`` in seconds."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
