"""Re-exports the operation layer's public modules load on first use (PEP 562).

The front ends import row models and value types from ``backend.ops`` modules only (an
import-linter contract keeps it so). Those types live in the feature packages; importing them
all up front would load the checkpoint, storage and telemetry code into a pull that never shows
them (``tests/jobs/test_pull_startup.py`` proves a pull does not). So each public ops module
names them under ``TYPE_CHECKING`` (what mypy and the import graph see) and resolves them here,
the first time a front end asks.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_exports(module: str, names: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``module``: ``names`` maps each re-exported name to
    ``"package.module"`` or ``"package.module:attribute"`` (when the name differs there)."""

    def __getattr__(name: str) -> object:
        target = names.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, _, attr = target.partition(":")
        return getattr(importlib.import_module(where), attr or name)

    return __getattr__
