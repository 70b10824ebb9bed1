"""Backpressure: a place publishers feed that has fallen behind holds the connections that fed it.

A ``Gate`` stands for one such place: a subscriber's socket and session queue (``transport.Conn``),
a queue's backlog read by an online consumer (``queue/flow.py``, given its gates by the app). What
puts a message into it calls ``hold`` while it is above its high-water mark, and the connection
whose frames are being acted on (the publisher; or the sender named instead, an AMQP 1.0 link held
by its credit) is not read again until the gate is released, which the owner does once it is back
below its low-water mark or goes away. So a publisher goes at the pace of the slowest consumer it feeds,
and none that feeds only fast ones waits. What was read before the hold still arrives: nothing
acknowledged is dropped.

Each gate is counted when it begins holding (``began``, its owner's: the runtime's counters by
place, ``RuntimeStats.holds``), not at each ``hold``: nothing is added per message.

A gate that makes no progress (``moved`` not called) for a while asks its owner what to do
(``stalled``): a QoS 0 reader is declared stuck (its publishers go on, its QoS 0 deliveries are
dropped past its outbox); a consumer that takes nothing for ``stalled_consumer_timeout_s`` is
disconnected (a queue's: its channel or link closed), its messages left with its session or queue,
and its publishers go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, Protocol

#: The places a gate stands for, as the metrics label them (``trimaran_flow_holds_total{place}``):
#: a subscriber's session queue and socket (``transport.Conn``), a queue's backlog
#: (``queue/flow.py``), this node's forwards to the others (``cluster/node.py``), a bridge's queue
#: for its remote (``bridges/mqtt.py``).
SESSION: Final = "session"
QUEUE: Final = "queue"
CLUSTER: Final = "cluster"
BRIDGE: Final = "bridge"
PLACES: Final = (SESSION, QUEUE, CLUSTER, BRIDGE)


class Held(Protocol):
    """A publisher as a gate holds it: a connection (``transport.Conn``: its socket is not read), or
    an AMQP 1.0 sending link (``amqp1.links.InLink``: no new credit)."""

    def held(self, on: bool) -> None:
        """One more gate holds this publisher (``on``), or one fewer."""
        ...


class Current(Protocol):
    """The runner as a gate sees it: whose frames are being acted on, and its loop."""

    @property
    def current(self) -> Held | None: ...

    def loop(self) -> asyncio.AbstractEventLoop: ...


# ``stalled(idle_s)``: the gate has held publishers for ``patience`` and seen no progress for
# ``idle_s`` seconds (the owner may find some and look again at ``idle_s()``). It returns True to
# keep holding (it is asked again a ``patience`` later), False when it released them.
Stalled = Callable[[float], bool]


class Gate:
    __slots__ = (
        "_began",
        "_held",
        "_mark",
        "_moved_at",
        "_patience",
        "_runner",
        "_stalled",
        "_timer",
        "stuck",
    )

    def __init__(
        self, runner: Current, patience: float, stalled: Stalled, began: Callable[[], None] | None = None
    ) -> None:
        self._runner = runner
        self._began = began  # called each time the gate begins holding (its owner counts it)
        self._patience = patience
        self._stalled = stalled
        self._held: set[Held] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._moved_at = 0.0  # loop time of the last progress, or of the first hold
        self._mark = 0  # the owner's progress mark at the last look (``saw``)
        self.stuck = False  # the owner gave up holding anyone until it drains

    @property
    def holding(self) -> bool:
        return self._held is not None

    def hold(self, source: Held | None = None) -> None:
        """Hold ``source``, by default the connection being acted on (if any), until ``release``.
        A hull whose protocol can slow one sender without pausing its connection (an AMQP 1.0 link,
        by its credit) names that sender instead."""
        if source is None:
            source = self._runner.current
        if source is None or self.stuck:
            return
        held = self._held
        if held is None:
            held = self._held = set()
            loop = self._runner.loop()
            self._moved_at = loop.time()
            self._timer = loop.call_later(self._patience, self._check)
            if self._began is not None:
                self._began()
        elif source in held:
            return
        held.add(source)
        source.held(True)

    def moved(self) -> None:
        """The consumer took something (a drained socket): it is behind, not stuck."""
        if self._held is not None:
            self._moved_at = self._runner.loop().time()

    def saw(self, mark: int) -> None:
        """The owner's progress mark (a count that grows as its consumer takes messages): a new one
        is progress."""
        if mark != self._mark:
            self._mark = mark
            self.moved()

    def release(self) -> None:
        """The consumer drained, or went: the held connections are read again."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held, self._held = self._held, None
        for source in held or ():
            source.held(False)

    def idle_s(self) -> float:
        """Seconds since the last progress (or the first hold)."""
        return self._runner.loop().time() - self._moved_at

    def _check(self) -> None:
        self._timer = None
        if self._held is None:
            return
        if self._stalled(self.idle_s()) and self._held is not None:
            self._timer = self._runner.loop().call_later(self._patience, self._check)
