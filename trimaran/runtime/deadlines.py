"""Every connection's next deadline, in buckets: a timing wheel the runner's one timer walks.

A deadline is held in the bucket of its step, rounded up: a step of a power of two of milliseconds,
at most an eighth of the time left until it and at most ``MAX_STEP_MS``. So a deadline is never
early and at most an eighth of its wait late, and the deadlines of many connections fall due
together: those seconds away (keep-alives, heartbeats) in a few batches a second for all of them
(issue #47's keep-alives in bulk), those near in finer steps. (With a millisecond each for all
deadlines under 2 s away, 4,000 clients of a 2 s keep-alive, each looked at again 2 s before its
deadline, woke the runner every millisecond or two.) A connection is one slot in a bucket's
list: a deadline heap of ``(deadline, seq, conn)`` tuples cost a tuple, an int and a float a
connection, and each entry taken out of it a few dozen comparisons.

An entry is not moved when its connection's deadline moves later (traffic pushing a keep-alive
forward): it falls due, the runner looks again and holds the connection anew. ``Conn.scheduled``
says which entry is the connection's own; the others are stale and are skipped, or dropped by
:meth:`Deadlines.compact`.
"""

from __future__ import annotations

import heapq
import math
from typing import Final

from trimaran.runtime.transport import GONE, NOT_SCHEDULED, Conn

MAX_STEP_MS: Final = 256  # the coarsest step: what a deadline seconds away may be late by, at most


def _due_at(key: int) -> float:
    """When the bucket ``key`` (a monotonic millisecond) falls due, in seconds."""
    return key / 1000


def step_ms(wait_s: float) -> int:
    """The step of a deadline ``wait_s`` away: the largest power of two of milliseconds at most an
    eighth of the wait, from 1 to ``MAX_STEP_MS``."""
    eighth = int(wait_s * 125)  # (an eighth of the wait, in milliseconds)
    if eighth >= MAX_STEP_MS:
        return MAX_STEP_MS
    if eighth <= 1:
        return 1
    return 1 << (eighth.bit_length() - 1)


class Deadlines:
    __slots__ = ("_buckets", "_keys", "dead", "entries")

    def __init__(self) -> None:
        self._buckets: dict[int, list[Conn]] = {}
        self._keys: list[int] = []  # a heap of the buckets' keys, each once
        self.entries = 0  # connections in the buckets, stale ones too
        self.dead = 0  # entries of connections closed since the last compaction

    def hold(self, conn: Conn, deadline: float, now: float) -> float:
        """Hold ``conn`` until ``deadline``; returns when its entry falls due, or ``NOT_SCHEDULED``
        when the entry it has falls due no later."""
        step = step_ms(deadline - now)
        key = math.ceil(deadline * 1000 / step) * step
        if _due_at(key) < deadline:
            key += step  # (the products rounded below it: never early)
        at = _due_at(key)
        if conn.scheduled <= at:
            return NOT_SCHEDULED
        conn.scheduled = at
        bucket = self._buckets.get(key)
        if bucket is None:
            self._buckets[key] = [conn]
            heapq.heappush(self._keys, key)
        else:
            bucket.append(conn)
        self.entries += 1
        return at

    def next_at(self) -> float:
        """When the first bucket falls due (``NOT_SCHEDULED``: none is held)."""
        return _due_at(self._keys[0]) if self._keys else NOT_SCHEDULED

    def due(self, now: float) -> list[Conn]:
        """Take out the buckets due by ``now``: their connections whose own entry it was, in the
        order of their deadlines; they are no longer held."""
        keys = self._keys
        buckets = self._buckets
        due: list[Conn] = []
        limit = now * 1000
        while keys and keys[0] <= limit:
            key = heapq.heappop(keys)
            bucket = buckets.pop(key)
            self.entries -= len(bucket)
            at = _due_at(key)
            for conn in bucket:
                if conn.state != GONE and conn.scheduled == at:
                    conn.scheduled = NOT_SCHEDULED
                    due.append(conn)
        return due

    def closed(self, conn: Conn) -> None:
        """``conn`` is gone: its entry is stale. Once the stale are half the entries they are
        dropped: amortised O(1) a close, and a burst of closed connections is not kept until their
        keep-alives pass."""
        if conn.scheduled != NOT_SCHEDULED:
            conn.scheduled = NOT_SCHEDULED
            self.dead += 1
            if 2 * self.dead >= self.entries:
                self.compact()

    def crowded(self, live: int) -> bool:
        """More entries than twice the ``live`` connections: mostly deadlines that moved earlier."""
        return self.entries > 2 * live + 1024

    def compact(self) -> None:
        """Keep the entries that are their connection's own."""
        buckets: dict[int, list[Conn]] = {}
        entries = 0
        for key, bucket in self._buckets.items():
            at = _due_at(key)
            kept = [conn for conn in bucket if conn.state != GONE and conn.scheduled == at]
            if kept:
                buckets[key] = kept
                entries += len(kept)
        self._buckets = buckets
        self._keys = list(buckets)
        heapq.heapify(self._keys)
        self.entries = entries
        self.dead = 0

    def held(self) -> list[tuple[float, Conn]]:
        """Every entry, stale ones too: (when it falls due, its connection)."""
        return [(_due_at(key), conn) for key, bucket in self._buckets.items() for conn in bucket]
