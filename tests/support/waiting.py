"""Waiting on events in the flow-control tests: a condition met, or a count that stopped moving."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def plateau(value: Callable[[], int], settle_s: float = 0.5, limit_s: float = 30.0) -> int:
    """The value once it has not moved for ``settle_s`` (or ``limit_s`` passed). A held publisher's
    count stops; a slower host only makes the plateau lower, so the tests' bounds still hold."""
    deadline = time.monotonic() + limit_s
    last, since = value(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = value()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= settle_s:
            break
    return last
