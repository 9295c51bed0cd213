"""The retry loops that use backend/backoff.py wait what their hand-written loops waited.

Each loop's former formula is written here once, as the reference: the SSH connect backoff after a
failed handshake (``min(ceiling, first * 2 ** (failures - 1))``), the jittered reconnect of a
dropped connection (``uniform(0.5, 1) * base * 2 ** attempt``), a refused channel open
(``0.02 * 2 ** attempt``) and a failed multipart part (``min(8, 0.2 * 2 ** attempt)``).
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from backend.backoff import Backoff
from backend.nodes.ssh import CHANNEL_OPEN_TRIES, CHANNEL_OPEN_WAIT, CONNECT_RETRY_BASE, CONNECT_TRIES
from backend.nodes.transport import DEFAULT_BACKOFF
from backend.storage.multipart import PART_RETRY_FIRST, PART_RETRY_MAX


@given(first=st.floats(0.01, 10), ceiling_factor=st.floats(1, 100), failures=st.integers(1, 40))
def test_the_connect_backoff_is_the_capped_doubling(first: float, ceiling_factor: float, failures: int) -> None:
    ceiling = first * ceiling_factor
    b = Backoff(first, ceiling)
    waits = [b.failed() for _ in range(failures)]
    assert waits == [min(ceiling, first * 2 ** (n - 1)) for n in range(1, failures + 1)]
    b.reset()  # a connect succeeded (or the keeper forgot the failure): the next waits ``first``
    assert b.failed() == first


def test_the_default_connect_backoff() -> None:
    b = Backoff(*DEFAULT_BACKOFF)
    assert [b.failed() for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_a_dropped_connect_waits_a_full_jitter_of_the_doubling() -> None:
    for _ in range(200):
        b = Backoff(CONNECT_RETRY_BASE, math.inf, jitter=0.5)
        for attempt in range(CONNECT_TRIES - 1):
            base = CONNECT_RETRY_BASE * 2**attempt
            assert 0.5 * base - 1e-12 <= b.failed() <= base + 1e-12


def test_a_refused_channel_and_a_failed_part_wait_the_doubling() -> None:
    ch = Backoff(CHANNEL_OPEN_WAIT, math.inf)
    assert [ch.failed() for _ in range(CHANNEL_OPEN_TRIES - 1)] == [
        0.02 * 2**attempt for attempt in range(CHANNEL_OPEN_TRIES - 1)
    ]
    part = Backoff(PART_RETRY_FIRST, PART_RETRY_MAX)
    assert [part.failed() for _ in range(10)] == [min(8.0, 0.2 * 2**attempt) for attempt in range(10)]
