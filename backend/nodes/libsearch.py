"""A quicker ``ctypes.util.find_library`` while asyncssh is imported.

asyncssh looks for liboqs (post-quantum key exchange) at import time with
``ctypes.util.find_library``, which on Linux runs ``ldconfig -p`` and then, for a library that is
not installed, ``gcc`` and ``ld`` too: six processes for its two names, 20 ms on an idle machine
and 40-90 ms on a busy one, paid by every CLI command that reaches a node. Here the ldconfig
cache answers first; only when a ``lib<name>.so*`` file exists in a directory the full search
could find it in does the original run, so the answer is the same either way.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import glob
import os
import sys
from collections.abc import Callable, Iterator


def _dirs() -> list[str]:
    machine = f"{os.uname().machine}-linux-gnu"
    bases = ["/lib", "/usr/lib", "/lib64", "/usr/lib64", "/usr/local/lib", "/usr/local/lib64"]
    out = [d for var in ("LD_LIBRARY_PATH", "LIBRARY_PATH") for d in os.environ.get(var, "").split(":") if d]
    for b in bases:
        out += [b, f"{b}/{machine}"]
    return out


def quick_find_library(name: str, original: Callable[[str], str | None]) -> str | None:
    """What ``original(name)`` returns, without its compiler and linker runs when nothing is there."""
    ldconfig = getattr(ctypes.util, "_findSoname_ldconfig", None)
    if ldconfig is not None:
        found = ldconfig(name)
        if found:
            return str(found)
    if ldconfig is None or any(glob.glob(os.path.join(glob.escape(d), f"lib{glob.escape(name)}.so*")) for d in _dirs()):
        return original(name)
    return None


@contextlib.contextmanager
def quick_library_search() -> Iterator[None]:
    """Within the block, ``ctypes.util.find_library`` is :func:`quick_find_library` (Linux only)."""
    original = ctypes.util.find_library
    if not sys.platform.startswith("linux"):
        yield
        return
    ctypes.util.find_library = lambda name: quick_find_library(name, original)
    try:
        yield
    finally:
        ctypes.util.find_library = original
