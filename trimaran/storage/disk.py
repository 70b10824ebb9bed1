"""The disk-free watermark: durable publishes are refused before the data directory's disk fills.

A full disk fails a commit after the publisher was accepted into the batch, and may leave SQLite unable
to write even the deletes that would free space. Below ``storage.min_free_bytes`` new durable
publishes are refused with each protocol's "quota" error instead; settling, dead-lettering and reading
go on, so consumers can drain the queues. The app also raises the runtime's disk alarm meanwhile
(``on_change``): publishers are not read (AMQP 0.9.1 hears connection.blocked), as at RabbitMQ's disk
alarm, and the refusal is for what they had sent already. Measured by ``statvfs``, never per
message: once a second near the watermark, less often the further from it, up to every ten seconds,
as RabbitMQ's disk monitor does (the time the disk would take to fill that far at 250 MB/s).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0  # the shortest interval: near or below the watermark
LONGEST_INTERVAL_S = 10.0  # far above it
FILL_BYTES_PER_S = 250 * 1024 * 1024  # how fast the disk is taken to fill, to judge how near it is


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


class DiskWatch:
    def __init__(
        self,
        directory: Path | None,
        min_free_bytes: int,
        *,
        measure: Callable[[Path], int] = free_bytes,
        interval_s: float = CHECK_INTERVAL_S,
    ) -> None:
        self.directory = directory
        self.min_free_bytes = min_free_bytes
        self.measure = measure
        self.interval_s = interval_s
        self.low = False  # below the watermark: durable publishes are refused
        # Told when ``low`` changes (the app pauses publishers while it is low: the disk alarm).
        self.on_change: Callable[[bool], None] | None = None
        self.free: int | None = None
        self.refused = 0  # durable publishes refused for the watermark
        self._next = 0.0

    @property
    def enabled(self) -> bool:
        return self.directory is not None and self.min_free_bytes > 0

    def poll(self, now: float | None = None) -> None:
        """Measure if the interval has passed since the last measurement (cheap to call every tick)."""
        now = time.monotonic() if now is None else now
        if not self.enabled or now < self._next:
            return
        self.check()
        self._next = now + self._interval()

    def wait_s(self, now: float) -> float | None:
        """Seconds until :meth:`poll` measures again; None: it never does (no watermark)."""
        return max(0.0, self._next - now) if self.enabled else None

    def _interval(self) -> float:
        free = self.free
        if free is None or self.low:
            return self.interval_s
        fill_s = (free - self.min_free_bytes) / FILL_BYTES_PER_S
        return min(max(fill_s, self.interval_s), max(LONGEST_INTERVAL_S, self.interval_s))

    def check(self) -> bool:
        """Measure now; log when the watermark is crossed either way. Returns ``low``."""
        if not self.enabled:
            return False
        assert self.directory is not None
        try:
            self.free = free = self.measure(self.directory)
        except OSError as exc:
            log.warning("cannot measure free disk space of %s: %s", self.directory, exc)
            return self.low
        low = free < self.min_free_bytes
        if low and not self.low:
            log.error(
                "disk free %d bytes on %s is below storage.min_free_bytes %d: refusing new durable "
                "publishes until space is freed",
                free,
                self.directory,
                self.min_free_bytes,
            )
        elif self.low and not low:
            log.warning(
                "disk free %d bytes on %s is above storage.min_free_bytes again: accepting durable "
                "publishes (%d were refused)",
                free,
                self.directory,
                self.refused,
            )
        changed = low != self.low
        self.low = low
        if changed and self.on_change is not None:
            self.on_change(low)
        return low
