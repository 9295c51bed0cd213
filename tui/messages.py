"""Messages more than one screen handles (a message one screen posts to itself lives with it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from backend.ops.types import FleetSnapshot


class FleetSampled(Message):
    """A new FleetSnapshot was published by the telemetry hub (Fleet and node detail render it)."""

    def __init__(self, snapshot: FleetSnapshot) -> None:
        self.snapshot = snapshot
        super().__init__()

    def can_replace(self, message: Message) -> bool:
        # A newer tick supersedes an older one still queued: render only the latest.
        return isinstance(message, FleetSampled)
