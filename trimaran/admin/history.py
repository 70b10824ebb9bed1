"""The management page's charts: the server's rates, connections and queue depths over the last
minutes, sampled into a bounded ring.

:meth:`History.sample` takes the counters the broker and the queues already keep (cumulative counts,
as for ``/metrics``) and the time from its caller, and turns the difference from the previous sample
into rates: the message path pays nothing. :meth:`History.run` samples a running server every
``telemetry.history_interval_s`` (5 s) and the ring keeps ``telemetry.history_samples`` (180: 15
minutes); ``GET /api/v1/history`` serves it and the page draws it (trimaran/admin/ui/app.js).
A rate needs two samples, so the first sample after a start has none (``None``), as has a queue's
first sample.
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

# Queues charted per sample, the deepest first: the page stays readable and the ring bounded.
MAX_QUEUES = 20
QUEUE_COUNTERS = ("published", "delivered", "acked")


@dataclass(frozen=True, slots=True)
class QueueSample:
    depth: int
    rates: dict[str, float | None]  # published, delivered, acked: per second since the last sample


@dataclass(frozen=True, slots=True)
class Sample:
    at_ms: int
    messages_in: float | None  # per second: every protocol's publishes received
    messages_out: float | None  # per second: deliveries sent
    dropped: float | None
    connections: dict[str, int]  # open, per protocol
    queues: dict[str, QueueSample]


class History:
    def __init__(self, samples: int, interval_s: float) -> None:
        self.interval_s = interval_s
        self.ring: deque[Sample] = deque(maxlen=samples)
        self._last_at: float | None = None
        self._last_messages: dict[str, int] = {}
        self._last_queues: dict[str, dict[str, int]] = {}

    def sample(
        self,
        now: float,
        messages: Mapping[str, int],
        connections: Mapping[str, int],
        queues: Mapping[str, tuple[int, Mapping[str, int]]],
    ) -> Sample:
        """Record one sample. ``messages`` and each queue's counters are cumulative; ``queues`` maps
        a name to its depth and counters."""
        seconds = None if self._last_at is None else now - self._last_at

        def rate(value: int, before: int | None) -> float | None:
            if seconds is None or seconds <= 0 or before is None:
                return None
            return round(max(0, value - before) / seconds, 2)

        last = self._last_messages
        deepest = sorted(queues.items(), key=lambda item: -item[1][0])[:MAX_QUEUES]
        queue_samples = {}
        for name, (depth, stats) in deepest:
            before = self._last_queues.get(name, {})
            counts = {key: stats.get(key, 0) for key in QUEUE_COUNTERS}
            rates = {key: rate(counts[key], before.get(key)) for key in QUEUE_COUNTERS}
            queue_samples[name] = QueueSample(depth, rates)
        sample = Sample(
            at_ms=int(now * 1000),
            messages_in=rate(messages.get("received", 0), last.get("received")),
            messages_out=rate(messages.get("sent", 0), last.get("sent")),
            dropped=rate(messages.get("dropped", 0), last.get("dropped")),
            connections=dict(connections),
            queues=queue_samples,
        )
        self.ring.append(sample)
        self._last_at = now
        self._last_messages = dict(messages)
        self._last_queues = {
            name: {key: stats.get(key, 0) for key in QUEUE_COUNTERS} for name, (_, stats) in queues.items()
        }
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
            self.sample(time.time(), counts.messages, counts.connections, queues)
            await anyio.sleep(self.interval_s)
