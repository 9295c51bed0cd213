"""The operator's console preferences (theme, the run each screen opens on): a local file.

Read and written by the front ends only; nothing here reaches the fleet or the state database.
"""

from __future__ import annotations

from backend.ui_prefs import forget_config, load_ui_prefs, update_ui_prefs

__all__ = ["forget_config", "load_ui_prefs", "update_ui_prefs"]
