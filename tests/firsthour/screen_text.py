"""What a running console shows, as plain text lines with columns kept (for size checks)."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from textual.widgets import Input, Select


def screen_render(app: Any, **console_options: Any) -> tuple[Console, Any]:
    """A terminal-sized Rich console and the whole current screen's update, as Textual would
    send it to the terminal (for reading what is shown, or every segment sent)."""
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        legacy_windows=False,
        **console_options,
    )
    return console, app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)


def screen_lines(app: Any) -> list[str]:
    """The current screen as text, one string per terminal row, every column in place."""
    height = app.size[1]
    console, update = screen_render(app, record=True, safe_box=False)
    console.print(update)
    lines = console.export_text(styles=False).split("\n")
    return (lines + [""] * height)[:height]


def shown_text(widget: Any) -> str:
    """The text a form field holds: an Input's value, a Select's chosen option's label."""
    if isinstance(widget, Input):
        return widget.value
    if isinstance(widget, Select):
        for prompt, value in widget._options:
            if value == widget.value:
                return str(prompt)
        return ""
    raise TypeError(f"not a form field: {widget!r}")


def field_problem(app: Any, widget: Any) -> str | None:
    """Why ``widget``'s full text is not on screen (cut, scrolled away, hidden), or None."""
    text = shown_text(widget)
    if not text:
        return None
    region = widget.content_region
    if region.width <= 0 or region.height <= 0:
        return f"#{widget.id} has no room on screen ({region})"
    lines = screen_lines(app)
    if not 0 <= region.y < len(lines):
        return f"#{widget.id} is below the screen (row {region.y})"
    shown = lines[region.y][region.x : region.x + region.width]
    if text not in shown:
        return f"#{widget.id} shows {shown.strip()!r} of {text!r}"
    return None
