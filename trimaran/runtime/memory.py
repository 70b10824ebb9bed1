"""Byte accounting for what waits to be written, and the global watermark that pauses publishers.

Each connection's socket buffer is looked at when the runtime writes to it and when the socket
drains; the sum is the memory the broker holds for slow readers. Above the high-water mark the
runtime stops reading from connections that publish (MQTT: the socket is not read; AMQP 0.9.1:
``connection.blocked`` as well; AMQP 1.0: no new link credit), below the low-water mark it reads them
again. Subscribers keep being written to at full speed, which is what brings the total down.
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

    def block(self, on: bool) -> None: ...


class Memory:
    __slots__ = ("_publishers", "blocked", "high", "low", "times_blocked", "total")

    def __init__(self, high: int, low: int, publishers: Callable[[], Iterable[Buffered]]) -> None:
        if low > high:
            raise ValueError("the low-water mark must not be above the high-water mark")
        self.high = high
        self.low = low
        self.total = 0
        self.blocked = False
        self.times_blocked = 0
        self._publishers = publishers

    def changed(self, conn: Buffered, size: int) -> None:
        """``conn``'s write buffer now holds ``size`` bytes."""
        self.total += size - conn.write_buffered
        conn.write_buffered = size
        if self.high <= 0:
            return
        if not self.blocked and self.total > self.high:
            self.blocked = True
            self.times_blocked += 1
            log.warning(
                "memory high-water mark reached (%d bytes waiting for slow readers, mark %d): "
                "publishers paused",
                self.total,
                self.high,
            )
            for publisher in self._publishers():
                publisher.block(True)
        elif self.blocked and self.total < self.low:
            self.blocked = False
            log.info("memory below the low-water mark (%d bytes): publishers resumed", self.total)
            for publisher in self._publishers():
                publisher.block(False)

    def blocking(self, conn: Buffered) -> bool:
        """Whether ``conn`` must not be read now."""
        return self.blocked and conn.publisher
