"""loadmaster's themes: Textual ``Theme`` objects with the semantic variables the screens use.

Screens colour things by meaning (``$node-down``, ``$action-delete``, ``$gauge-over``), never by
hue, so a theme is the one place a colour is chosen. Every theme defines every name in
:data:`SEMANTIC_VARIABLES`; :func:`semantic_defaults` supplies them for Textual's built-in themes
so any theme the operator picks still parses the stylesheets.
"""

from __future__ import annotations

from textual.theme import Theme  # noqa: TID251 - themes/ is console-side, not backend

#: The semantic colour variables every loadmaster theme defines (use them as ``$name`` in tcss).
SEMANTIC_VARIABLES: tuple[str, ...] = (
    "node-up",
    "node-down",
    "node-stale",
    "job-running",
    "job-failed",
    "job-succeeded",
    "alert",
    "action-keep",
    "action-strip",
    "action-delete",
    "action-skip",
    "gauge-ok",
    "gauge-warn",
    "gauge-over",
)

DEFAULT_THEME = "loadmaster-dark"

_DARK = Theme(
    name="loadmaster-dark",
    primary="#4C9BE8",
    secondary="#7E8FB3",
    accent="#E8A33D",
    warning="#E8A33D",
    error="#E5534B",
    success="#57AB5A",
    foreground="#D8DEE9",
    background="#11151C",
    surface="#1A202A",
    panel="#232B38",
    dark=True,
    variables={
        "node-up": "#57AB5A",
        "node-down": "#E5534B",
        "node-stale": "#8B949E",
        "job-running": "#4C9BE8",
        "job-failed": "#E5534B",
        "job-succeeded": "#57AB5A",
        "alert": "#F0883E",
        "action-keep": "#57AB5A",
        "action-strip": "#D4A72C",
        "action-delete": "#E5534B",
        "action-skip": "#8B949E",
        "gauge-ok": "#57AB5A",
        "gauge-warn": "#D4A72C",
        "gauge-over": "#E5534B",
        "footer-key-foreground": "#E8A33D",
    },
)

_LIGHT = Theme(
    name="loadmaster-light",
    primary="#0A5AB8",
    secondary="#4A5A7A",
    accent="#9A5B00",
    warning="#9A5B00",
    error="#B3261E",
    success="#1E7B34",
    foreground="#1B1F24",
    background="#F6F8FA",
    surface="#FFFFFF",
    panel="#E4E9F0",
    dark=False,
    variables={
        "node-up": "#1E7B34",
        "node-down": "#B3261E",
        "node-stale": "#6E7781",
        "job-running": "#0A5AB8",
        "job-failed": "#B3261E",
        "job-succeeded": "#1E7B34",
        "alert": "#BC4C00",
        "action-keep": "#1E7B34",
        "action-strip": "#8A6100",
        "action-delete": "#B3261E",
        "action-skip": "#6E7781",
        "gauge-ok": "#1E7B34",
        "gauge-warn": "#8A6100",
        "gauge-over": "#B3261E",
        "footer-key-foreground": "#0A5AB8",
    },
)

# High contrast: pure black and white, saturated signal colours, no translucency, so states stay
# readable on washed-out projectors and for operators with low vision.
_CONTRAST = Theme(
    name="loadmaster-contrast",
    primary="#00FFFF",
    secondary="#FFFFFF",
    accent="#FFFF00",
    warning="#FFFF00",
    error="#FF3030",
    success="#00FF00",
    foreground="#FFFFFF",
    background="#000000",
    surface="#000000",
    panel="#1C1C1C",
    boost="#FFFFFF",
    dark=True,
    luminosity_spread=0.3,
    text_alpha=1.0,
    variables={
        "node-up": "#00FF00",
        "node-down": "#FF3030",
        "node-stale": "#C0C0C0",
        "job-running": "#00FFFF",
        "job-failed": "#FF3030",
        "job-succeeded": "#00FF00",
        "alert": "#FF00FF",
        "action-keep": "#00FF00",
        "action-strip": "#FFFF00",
        "action-delete": "#FF3030",
        "action-skip": "#C0C0C0",
        "gauge-ok": "#00FF00",
        "gauge-warn": "#FFFF00",
        "gauge-over": "#FF3030",
        "text-muted": "#FFFFFF",
        "footer-key-foreground": "#FFFF00",
        "footer-description-foreground": "#FFFFFF",
        "block-cursor-background": "#FFFF00",
        "block-cursor-foreground": "#000000",
        "input-selection-background": "#00FFFF 50%",
    },
)

#: Every loadmaster theme by name, in the order ``ctrl+t`` cycles through them.
THEMES: dict[str, Theme] = {t.name: t for t in (_DARK, _LIGHT, _CONTRAST)}


def semantic_defaults() -> dict[str, str]:
    """Fallback values for the semantic variables (the dark theme's), for non-loadmaster themes."""
    return {name: _DARK.variables[name] for name in SEMANTIC_VARIABLES}
