"""The management page's charts: the server's rates, connections, queue depths and bridges over the
last minutes, sampled into a bounded ring.

:meth:`History.sample` takes the counters the broker, the queues and the bridges already keep
(cumulative counts, as for ``/metrics``) and the time from its caller, and turns the difference
from the previous sample into rates: the message path pays nothing. :meth:`History.run` samples a
running server through its :class:`~trimaran.admin.view.AdminView` every
``telemetry.history_interval_s`` (5 s) and the ring keeps ``telemetry.history_samples`` (180: 15
minutes); ``GET /api/v1/history`` serves it and the page draws it (trimaran/admin/ui/app.js).
A rate needs two samples, so the first sample after a start has none (``None``), as has a queue's or
a bridge's first sample. A queue or bridge that is gone (deleted, or removed by a reload) is in no
later sample and its counters are forgotten: its series leaves the page as the ring turns over.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from trimaran.admin.view import AdminView

# Queues and bridges charted per sample, the deepest (most backlog) first: the page stays readable
# and the ring bounded.
MAX_QUEUES = 20
QUEUE_COUNTERS = ("published", "delivered", "acked")
MAX_BRIDGES = 20
BRIDGE_COUNTERS = ("sent", "received")

# Per object: its level (a depth, a backlog) and its cumulative counters, by name.
Levels = Mapping[str, tuple[int, Mapping[str, int]]]


@dataclass(frozen=True, slots=True)
class QueueSample:
    depth: int
    rates: dict[str, float | None]  # published, delivered, acked: per second since the last sample


@dataclass(frozen=True, slots=True)
class BridgeSample:
    backlog_bytes: int
    rates: dict[str, float | None]  # sent (out to the remote), received (in): per second, as a queue's


@dataclass(frozen=True, slots=True)
class Sample:
    at_ms: int
    messages_in: float | None  # per second: every protocol's publishes received
    messages_out: float | None  # per second: deliveries sent
    dropped: float | None
    connections: dict[str, int]  # open, per protocol
    queues: dict[str, QueueSample]
    bridges: dict[str, BridgeSample]


class History:
    def __init__(self, samples: int, interval_s: float) -> None:
        self.interval_s = interval_s
        self.ring: deque[Sample] = deque(maxlen=samples)
        self._last_at: float | None = None
        self._last_messages: dict[str, int] = {}
        self._last_queues: dict[str, dict[str, int]] = {}
        self._last_bridges: dict[str, dict[str, int]] = {}

    def sample(
        self,
        now: float,
        messages: Mapping[str, int],
        connections: Mapping[str, int],
        queues: Levels,
        bridges: Levels | None = None,
    ) -> Sample:
        """Record one sample. ``messages`` and each queue's and bridge's counters are cumulative;
        ``queues`` maps a name to its depth and counters, ``bridges`` to its backlog bytes and counters."""
        seconds = None if self._last_at is None else now - self._last_at

        def rate(value: int, before: int | None) -> float | None:
            if seconds is None or seconds <= 0 or before is None:
                return None
            return round(max(0, value - before) / seconds, 2)

        def series(
            objects: Levels, keys: tuple[str, ...], last: dict[str, dict[str, int]], limit: int
        ) -> list[tuple[str, int, dict[str, float | None]]]:
            # Sorting is stable: among equals, the caller's order (the bridges': the settings').
            deepest = sorted(objects.items(), key=lambda item: -item[1][0])[:limit]
            return [
                (name, level, {key: rate(stats.get(key, 0), last.get(name, {}).get(key)) for key in keys})
                for name, (level, stats) in deepest
            ]

        bridges = bridges or {}
        last = self._last_messages
        sample = Sample(
            at_ms=int(now * 1000),
            messages_in=rate(messages.get("received", 0), last.get("received")),
            messages_out=rate(messages.get("sent", 0), last.get("sent")),
            dropped=rate(messages.get("dropped", 0), last.get("dropped")),
            connections=dict(connections),
            queues={
                name: QueueSample(depth, rates)
                for name, depth, rates in series(queues, QUEUE_COUNTERS, self._last_queues, MAX_QUEUES)
            },
            bridges={
                name: BridgeSample(backlog, rates)
                for name, backlog, rates in series(bridges, BRIDGE_COUNTERS, self._last_bridges, MAX_BRIDGES)
            },
        )
        self.ring.append(sample)
        self._last_at = now
        self._last_messages = dict(messages)
        # Every object's counters, charted or not (one entering the deepest has its rate at once); only
        # these: what is gone is forgotten.
        self._last_queues = _counters(queues, QUEUE_COUNTERS)
        self._last_bridges = _counters(bridges, BRIDGE_COUNTERS)
        return sample

    def samples(self) -> list[Sample]:
        return list(self.ring)

    async def run(self, view: AdminView) -> None:
        """Sample ``view`` until cancelled (a task of the application's, started once queues run)."""
        while True:
            counts = view.counts()
            ops = view.queue_ops()
            queues = {}
            for name in list(ops.queues):
                info = ops.info(name)
                queues[name] = (info.depth, info.stats)
            bridges = {
                b.name: (b.backlog_bytes, {"sent": b.sent, "received": b.received})
                for b in view.bridge_statuses()
            }
            self.sample(time.time(), counts.messages, counts.connections, queues, bridges)
            await anyio.sleep(self.interval_s)


def _counters(objects: Levels, keys: tuple[str, ...]) -> dict[str, dict[str, int]]:
    return {name: {key: stats.get(key, 0) for key in keys} for name, (_, stats) in objects.items()}
