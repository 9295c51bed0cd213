"""UI preferences the console remembers across runs (the chosen theme), as a small JSON file.

The file lives in :func:`backend.config.config_dir` (``$LOADMASTER_CONFIG_DIR`` wins) beside
``loadmaster.toml``, but it is not configuration: the console writes it, the operator never has
to. A missing, unreadable or corrupt file means "nothing remembered", never a failed start.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.config import config_dir
from backend.errors import ConfigError

if TYPE_CHECKING:
    from backend.config import Config

PREFS_FILENAME = "ui-prefs.json"


def config_key(config: Config) -> str:
    """The key what the console remembers for ``config`` is kept under (the run the screens open
    on): the config file, and the run the config says to open on (``[ui] opening_run``) where it
    names one. A sandbox lab's names its demo run in the lab's own bucket, new each ``lab up``, so
    a new lab written to the same path never opens on the old lab's run."""
    source = config.source or ""
    return f"{source}|run={config.ui.opening_run}" if config.ui.opening_run else source


def forget_config(prefs: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``prefs`` without what is remembered for the config file ``source`` (any lab's identity)."""
    return {k: v for k, v in prefs.items() if k != source and not k.startswith(f"{source}|")}


def prefs_path() -> Path:
    """Where the UI preferences file lives."""
    return config_dir() / PREFS_FILENAME


def load_ui_prefs(path: Path | None = None) -> dict[str, Any]:
    """The remembered preferences; an empty dict when none (or the file is unusable)."""
    path = path or prefs_path()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        # A preference file is a convenience: losing it must not keep the console from opening.
        return {}
    return raw if isinstance(raw, dict) else {}


def save_ui_prefs(prefs: Mapping[str, Any], path: Path | None = None) -> None:
    """Write all preferences atomically (temp file in the same dir, then rename)."""
    path = path or prefs_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(dict(prefs), fh, indent=2, sort_keys=True)
                fh.write("\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ConfigError(
            f"cannot save UI preferences: {exc.strerror or exc} (set $LOADMASTER_CONFIG_DIR to a writable directory)",
            file=str(path),
        ) from None


def update_ui_prefs(path: Path | None = None, **changes: Any) -> dict[str, Any]:
    """Merge ``changes`` into the remembered preferences, save, and return the result."""
    prefs = load_ui_prefs(path)
    prefs.update(changes)
    save_ui_prefs(prefs, path)
    return prefs
