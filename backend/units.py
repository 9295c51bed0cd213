"""The text of a quantity, one function per quantity, for the CLI, the console and backend messages alike.

Rules every function here keeps:

* **Decimal units, as clouds bill and NICs count**: 1 kB = 10^3 bytes, 1 GB = 10^9 bytes, 1 Gbps = 10^9
  bits per second. Binary units appear only beside them (:func:`bytes_gib_text`, ``16.0 GB (14.9 GiB)``).
* **Unknown reads ``?``**: every function takes ``None`` for a value nobody knows and writes
  :data:`UNKNOWN`. A caller whose cell is *not applicable* (a finished job has no ETA) writes its own
  ``-``; ``?`` always means "there is a value and we do not know it".
* **A positive amount never reads as zero**: a dollar amount, rate or duration below the smallest step
  shown reads ``<`` that step (``<$0.01``, ``<0.01 Gbps``, ``<1s``). An exact zero reads as zero
  (``$0.00``, ``0.00 Gbps``, ``0s``). Byte counts are whole; ages round down (``age_text``).
* **Bounded width**: any finite input gives a short text; magnitudes past the largest unit (10^33 bytes,
  $10^12, 10^4 days) are written in scientific notation rather than as a long row of digits.
* **Negative values** (a delta, a refund) read as ``-`` before the text of their magnitude.
* No function raises on a finite number; NaN and infinities read :data:`UNKNOWN`.

Small dollar amounts: an amount under one cent reads ``<$0.01`` everywhere (the Egress screen, the
Shards preview, the CLI), never ``$0.00`` and never a run of zeros such as ``$0.00400``. From one cent
amounts are rounded to cents (``$0.0149`` reads ``$0.01``). Unit prices (``$0.0900/GB``,
``$0.0004/1k GETs``) are rates, not amounts, and keep the digits of the price list.

humanize does the byte scaling (:func:`humanize.naturalsize`); the rest is fixed-format text that
humanize has no compact form for (``3d`` ages, ``1h02m`` ETAs, ``<$0.01``).
"""

from __future__ import annotations

import math
import time
from decimal import Decimal

import humanize

#: The text of a value nobody knows.
UNKNOWN = "?"

_GB = 10**9
#: Bytes from which :func:`bytes_text` writes scientific notation (past humanize's largest prefix, Q).
_BYTES_SCI = 10**33
#: Dollars from which :func:`usd_text` writes scientific notation.
_USD_SCI = 10**12
#: Seconds from which ages and durations are written as scientific-notation days (about 27 years).
_DAYS_SCI = 10**4 * 86400

_AGE_UNITS = (("d", 86400), ("h", 3600), ("m", 60))


def bytes_text(n: float | None) -> str:
    """``0 B``, ``1 B``, ``999 B``, ``1.0 kB``, ``12.6 GB``, ``200.0 TB``: decimal units, one decimal.

    Below 1 kB the whole byte count (fractions of a byte dropped). From 1 kB humanize's
    ``naturalsize`` (kB, MB, GB, TB, PB, EB, ZB, YB, RB, QB).
    """
    if n is None or not math.isfinite(n):
        return UNKNOWN
    if n < 0:
        return "-" + bytes_text(-n)
    if n < 1000:
        return f"{int(n)} B"
    if n >= _BYTES_SCI:
        return f"{n:.1e} B"
    return humanize.naturalsize(n, format="%.1f")


def bytes_gib_text(n: float | None) -> str:
    """``16.0 GB (14.9 GiB)``: :func:`bytes_text` with the binary size beside it (GiB = 2^30 bytes).

    Under 1 kB, where both read the same byte count, just :func:`bytes_text`.
    """
    if n is None or not math.isfinite(n) or abs(n) < 1000 or abs(n) >= _BYTES_SCI:
        return bytes_text(n)
    binary = f"{int(n)} B" if abs(n) < 1024 else humanize.naturalsize(n, binary=True, format="%.1f")
    return f"{bytes_text(n)} ({binary})"


def gbps_text(gbps: float | None) -> str:
    """A network rate: ``9.10 Gbps`` below 10 Gbps, ``100.0 Gbps`` from 10 (about three significant
    digits at NIC scale); ``<0.01 Gbps`` for a positive rate under 0.01 Gbps."""
    if gbps is None or not math.isfinite(gbps):
        return UNKNOWN
    if gbps < 0:
        return "-" + gbps_text(-gbps)
    if 0 < gbps < 0.01:
        return "<0.01 Gbps"
    if gbps >= 1e6:
        return f"{gbps:.1e} Gbps"
    return f"{gbps:.1f} Gbps" if round(gbps, 2) >= 10 else f"{gbps:.2f} Gbps"


def rate_text(bytes_per_s: float | None) -> str:
    """A transfer rate given in bytes per second, written in bits as :func:`gbps_text` does."""
    return gbps_text(None if bytes_per_s is None else bytes_per_s * 8 / _GB)


def usd_text(dollars: float | None) -> str:
    """A dollar amount: ``$13,791.00``, ``$0.50``, ``<$0.01`` under one cent, ``$0.00`` for exactly zero."""
    if dollars is None or not math.isfinite(dollars):
        return UNKNOWN
    if dollars < 0:
        return "-" + usd_text(-dollars)
    if dollars == 0:
        return "$0.00"
    if dollars < 0.01:  # under a cent: say it is there, and how small (never "$0.00")
        return "<$0.01"
    if dollars >= _USD_SCI:
        return f"${dollars:.2e}"
    return f"${dollars:,.2f}"


def age_text(seconds: float | None) -> str:
    """How long ago, coarsely, in the largest whole unit: ``40s``, ``12m``, ``5h``, ``3d``.

    Rounded down (59 minutes is ``59m``, an hour ``1h``); a negative age (a clock ahead of this one)
    reads ``0s``.
    """
    if seconds is None or not math.isfinite(seconds):
        return UNKNOWN
    s = max(0.0, seconds)
    if s >= _DAYS_SCI:
        return f"{s / 86400:.1e}d"
    for unit, size in _AGE_UNITS:
        if s >= size:
            return f"{int(s // size)}{unit}"
    return f"{int(s)}s"


def age_of(timestamp: float | None, now: float | None = None) -> str:
    """:func:`age_text` of an epoch ``timestamp`` at ``now`` (default: the clock now); 0 or None (never
    set) reads ``?``."""
    if not timestamp:
        return UNKNOWN
    return age_text((time.time() if now is None else now) - timestamp)


def duration_text(seconds: float | None) -> str:
    """A duration to the second in its two largest units, as an ETA reads: ``1d02h``, ``1h02m``,
    ``3m05s``, ``12s`` (rounded to the second); ``<1s`` for a positive duration under a second."""
    if seconds is None or not math.isfinite(seconds):
        return UNKNOWN
    if seconds < 0:
        return "-" + duration_text(-seconds)
    if 0 < seconds < 1:
        return "<1s"  # a fast pull's estimate is not "0s"
    if seconds >= _DAYS_SCI:
        return f"{seconds / 86400:.1e}d"
    s = int(round(seconds))
    if s >= 86400:
        return f"{s // 86400}d{(s % 86400) // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def duration_spec(seconds: float) -> str:
    """A duration setting as an operator types it, exactly: ``7d``, ``2h``, ``90s``, ``1.5s``.

    The largest unit (d, h, m) the value is a whole number of, else seconds written out in full, so
    :func:`backend.schema.parse_duration` reads back the same number (no exponent, no rounding).
    """
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a duration setting is a finite number of seconds >= 0, got {seconds!r}")
    for unit, size in _AGE_UNITS:
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    text = f"{Decimal(repr(float(seconds))):f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) + "s"


__all__ = [
    "UNKNOWN",
    "age_of",
    "age_text",
    "bytes_gib_text",
    "bytes_text",
    "duration_spec",
    "duration_text",
    "gbps_text",
    "rate_text",
    "usd_text",
]
