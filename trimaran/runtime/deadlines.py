"""Every connection's next deadline, in buckets: a timing wheel the runner's one timer walks.

A deadline is held in the bucket of its millisecond, rounded up; one more than ``COALESCE_AFTER_S``
away (keep-alives, heartbeats) in the bucket of its ``COALESCE_S`` step instead, so idle
connections fall due together, a few wake-ups a second for all of them (issue #47's keep-alives in
bulk), at most a step late. A connection is one slot in a bucket's list: a deadline heap of
``(deadline, seq, conn)`` tuples cost a tuple, an int and a float a connection, and each entry
taken out of it a few dozen comparisons.

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

COALESCE_AFTER_S: Final = 2.0
COALESCE_S: Final = 0.25
_STEP_MS: Final = 250  # COALESCE_S in milliseconds


def _due_at(key: int) -> float:
    """When the bucket ``key`` (a monotonic millisecond) falls due, in seconds."""
    return key / 1000


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
        step = _STEP_MS if deadline - now > COALESCE_AFTER_S else 1
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
