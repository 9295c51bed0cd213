"""``LOADMASTER_TRACE=1``: timestamped debug lines from loadmaster's own loggers on stderr.

Each line shows the milliseconds since ``LOADMASTER_TRACE_T0`` (a ``time.time()`` the caller
sets just before starting the process, so interpreter start-up shows too), else since this
module was imported. Used to measure where a command's time goes (bench/pull_overhead.py).
"""

from __future__ import annotations

import logging
import os
import sys
import time

_T0 = time.time()


class _Since(logging.Formatter):
    def __init__(self, t0: float) -> None:
        super().__init__()
        self.t0 = t0

    def format(self, record: logging.LogRecord) -> str:
        return f"[trace {1000 * (record.created - self.t0):8.1f} ms] {record.name}: {record.getMessage()}"


def enable_trace() -> bool:
    """Turn tracing on when ``LOADMASTER_TRACE`` is set (idempotent); whether it is on."""
    if not os.environ.get("LOADMASTER_TRACE"):
        return False
    try:
        t0 = float(os.environ.get("LOADMASTER_TRACE_T0") or _T0)
    except ValueError:
        t0 = _T0
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Since(t0))
    for name in ("backend", "tui"):
        lg = logging.getLogger(name)
        if not lg.handlers:
            lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    logging.getLogger("backend").debug("trace on (pid %d)", os.getpid())
    return True
