"""The one exponential backoff: a delay that starts at ``first``, doubles on each failure up to
``ceiling``, and returns to ``first`` when the loop succeeds. Optional jitter spreads a fleet's
retries (each delay drawn from ``[(1 - jitter) * d, d]``)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """``delay()`` is the wait before the next try; ``failed()`` doubles it, ``reset()`` restores it."""

    first: float
    ceiling: float
    factor: float = 2.0
    jitter: float = 0.0
    _next: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.ceiling:
            raise ValueError(f"backoff needs 0 < first <= ceiling, got first={self.first:g}, ceiling={self.ceiling:g}")
        if self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ValueError("backoff needs factor >= 1 and jitter in [0, 1]")
        self._next = self.first

    def delay(self) -> float:
        """The wait before the next try (with jitter)."""
        return self._next * (1 - random.uniform(0, self.jitter)) if self.jitter else self._next

    def failed(self) -> float:
        """A try failed: the wait before the next one, and the one after grows (capped)."""
        wait = self.delay()
        self._next = min(self._next * self.factor, self.ceiling)
        return wait

    def reset(self) -> None:
        """A try succeeded: the next failure waits ``first`` again."""
        self._next = self.first

    async def sleep(self) -> None:
        """Wait :meth:`failed`'s delay."""
        await asyncio.sleep(self.failed())
