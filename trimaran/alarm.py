"""A task's sleep until the next thing it has to do, or until it is told of something sooner.

The housekeeping tasks (MQTT's delayed wills, session expiry and persistence; AMQP 0.9.1's
``x-expires``; the queue timers) each sleep until what they hold next falls due, and not at all
while they hold nothing: a server with nothing to do wakes for nothing (issue 47). An idle task that
woke on a fixed period, through anyio's ``sleep`` or an event under ``move_on_after``, cost a cancel
scope's machinery each time, interpreted: together about half a millisecond of CPU per wake-up, five
a second, on a server that held nothing.

:class:`Alarm` is one loop timer and one future per sleep. Cancelling the task that sleeps (its task
group's scope) cancels the future, as any await. Under another anyio backend than asyncio (the queue
manager runs under trio too) it is an anyio event under a time-out.

The ground floor: imports nothing of the package.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Final

import anyio

# The shortest sleep: a timer under a millisecond spins under uvloop, whose clock counts whole ones.
SHORTEST_S: Final = 0.001


class Alarm:
    """The sleep of one task at a time (the task that owns it)."""

    __slots__ = ("_waiter", "until")

    def __init__(self) -> None:
        self._waiter: asyncio.Future[None] | anyio.Event | None = None
        # When the current sleep ends (``time.monotonic()``); ``math.inf``: only when rung. -inf
        # while awake: its owner looks at everything again before it sleeps.
        self.until = -math.inf

    async def sleep(self, seconds: float | None) -> None:
        """Sleep ``seconds`` (``None``: until rung), or until :meth:`ring` or :meth:`ring_by`."""
        if seconds is not None:
            seconds = max(seconds, SHORTEST_S)
        self.until = math.inf if seconds is None else time.monotonic() + seconds
        try:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                await self._sleep_anyio(seconds)
            else:
                await self._sleep_asyncio(loop, seconds)
        finally:
            self._waiter = None
            self.until = -math.inf

    async def _sleep_asyncio(self, loop: asyncio.AbstractEventLoop, seconds: float | None) -> None:
        waiter = self._waiter = loop.create_future()
        timer = None if seconds is None else loop.call_later(seconds, _wake, waiter)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()

    async def _sleep_anyio(self, seconds: float | None) -> None:
        event = self._waiter = anyio.Event()
        with anyio.move_on_after(math.inf if seconds is None else seconds):
            await event.wait()

    def ring(self) -> None:
        """End the sleep now (nothing happens while the owner is awake)."""
        waiter = self._waiter
        if isinstance(waiter, anyio.Event):
            waiter.set()
        elif waiter is not None:
            _wake(waiter)

    def ring_by(self, at: float) -> None:
        """Something falls due at ``at`` (``time.monotonic()``): end a sleep that would go past it."""
        if at < self.until:
            self.ring()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
