"""Byte accounting for what waits to be written, and the alarms that pause publishers.

Each connection's socket buffer is looked at when the runtime writes to it and when the socket
drains; the sum is the memory the broker holds for slow readers. Above the high-water mark the
memory alarm is raised: the runtime stops reading from connections that publish (MQTT: the socket is
not read; AMQP 0.9.1: ``connection.blocked`` as well; AMQP 1.0: no new link credit), below the
low-water mark it reads them again. Subscribers keep being written to at full speed, which is what
brings the total down. The disk alarm (the data directory's disk below ``storage.min_free_bytes``,
told by the app) pauses them the same way while it lasts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

log = logging.getLogger(__name__)


class Buffered(Protocol):
    """A connection as the accounting sees it (``transport.Conn``): its buffered bytes at the last
    look, whether it has published, and the switch that stops reading it."""

    write_buffered: int

    @property
    def publisher(self) -> bool: ...

    def block(self, on: bool, why: str) -> None: ...


#: The alarms, as AMQP 0.9.1's connection.blocked says them.
MEMORY = "low on memory"
DISK = "low on disk"


class Memory:
    __slots__ = ("_publishers", "alarms", "high", "low", "over", "times_blocked", "total")

    def __init__(self, high: int, low: int, publishers: Callable[[], Iterable[Buffered]]) -> None:
        if low > high:
            raise ValueError("the low-water mark must not be above the high-water mark")
        self.high = high
        self.low = low
        self.total = 0
        self.over = False  # above the high-water mark, until below the low one
        self.alarms: list[str] = []  # raised, first first: why publishers are paused (MEMORY, DISK)
        self.times_blocked = 0
        self._publishers = publishers

    def changed(self, conn: Buffered, size: int) -> None:
        """``conn``'s write buffer now holds ``size`` bytes."""
        self.total += size - conn.write_buffered
        conn.write_buffered = size
        if self.high <= 0:
            return
        if not self.over and self.total > self.high:
            self.over = True
            self.times_blocked += 1
            log.warning(
                "memory high-water mark reached (%d bytes waiting for slow readers, mark %d): "
                "publishers paused",
                self.total,
                self.high,
            )
            self.alarm(MEMORY, True)
        elif self.over and self.total < self.low:
            self.over = False
            log.info("memory below the low-water mark (%d bytes): publishers resumed", self.total)
            self.alarm(MEMORY, False)

    def alarm(self, why: str, on: bool) -> None:
        """An alarm (``MEMORY``, ``DISK``) is raised or cleared: publishers are paused while any is
        raised (each told why, its hull's way, when the first is) and read again when the last
        clears, as RabbitMQ blocks publishing connections at its memory and disk alarms."""
        alarms = self.alarms
        if on == (why in alarms):
            return
        if on:
            alarms.append(why)
            if len(alarms) > 1:
                return  # paused already
        else:
            alarms.remove(why)
            if alarms:
                return  # another alarm still holds them
        for publisher in self._publishers():
            publisher.block(on, why)

    @property
    def blocked(self) -> bool:
        """An alarm is raised: publishers are not read."""
        return bool(self.alarms)

    def blocking(self, conn: Buffered) -> bool:
        """Whether ``conn`` must not be read now."""
        return self.blocked and conn.publisher
