"""The manager's timers sleep until something is due instead of waking every 20 ms."""

from __future__ import annotations

import time

import anyio
import pytest

from tests.queue.conftest import Collector, Factory, wait_until
from trimaran.broker.message import Message
from trimaran.config import QueuePolicySettings
from trimaran.queue.manager import QueueManager

pytestmark = pytest.mark.anyio


def msg(payload: bytes) -> Message:
    return Message(topic="$queue/q", payload=payload, qos=1)


def count_ticks(manager: QueueManager) -> list[float]:
    """Each run of the timers (``_tick``) polls the disk first: counted there, as a compiled
    manager's own methods cannot be replaced."""
    ticks: list[float] = []
    poll = manager.disk.poll

    def counted(now: float | None = None) -> None:
        ticks.append(time.monotonic())
        poll(now)

    manager.disk.poll = counted  # type: ignore[method-assign]
    return ticks


async def test_an_idle_manager_wakes_about_once_a_second(make_manager: Factory) -> None:
    manager = make_manager()
    ticks = count_ticks(manager)
    async with manager.running():
        await manager.publish("q", msg(b"x"))  # a queue, no consumer: nothing is due
        ticks.clear()
        await anyio.sleep(1.2)
    assert 1 <= len(ticks) <= 3  # polling every 20 ms made it ~60


async def test_a_manager_without_queues_sleeps_until_one_is_declared(make_manager: Factory) -> None:
    """Nothing to sweep, nothing due: the timers do not wake (the disk watermark's next measurement
    is ten seconds off this far from it). The first queue starts the sweeps: a message's TTL ends on
    time."""
    manager = make_manager()
    ticks = count_ticks(manager)
    async with manager.running():
        await anyio.sleep(0.1)
        ticks.clear()
        await anyio.sleep(1.2)
        assert ticks == []
        await manager.declare("t", QueuePolicySettings(ttl_s=0.2))
        await manager.publish("t", msg(b"x"))
        await wait_until(lambda: manager.info("t").depth == 0, timeout=2)
        assert ticks


async def test_a_retry_sooner_than_the_sleep_wakes_the_timers(make_manager: Factory) -> None:
    manager = make_manager(visibility_timeout_s=60)
    ticks = count_ticks(manager)
    async with manager.running():
        c = Collector("c")
        h = manager.consume("q", c)
        h.add_credit(5)
        await manager.publish("q", msg(b"x"))
        await wait_until(lambda: len(c.deliveries) == 1)
        await anyio.sleep(0.05)  # the timers now sleep up to a second (the time-out is a minute off)
        started = time.monotonic()
        assert await h.nack(0, delay_s=0.1)
        await wait_until(lambda: len(c.deliveries) == 2, timeout=2)
        took = time.monotonic() - started
        assert 0.09 <= took < 0.6
        assert c.deliveries[1].redelivered
    assert len(ticks) < 20


async def test_visibility_timeout_is_kept_to_the_tick(make_manager: Factory) -> None:
    manager = make_manager(visibility_timeout_s=0.3)
    async with manager.running():
        c = Collector("c")
        at: list[float] = []  # when each delivery was made, not when the test noticed it
        c.deliver = lambda d: (at.append(time.monotonic()), c.deliveries.append(d))  # type: ignore[method-assign]
        h = manager.consume("q", c)
        h.add_credit(5)
        await manager.publish("q", msg(b"x"))
        await wait_until(lambda: len(c.deliveries) == 2, timeout=3)
        assert 0.25 <= at[1] - at[0] < 0.8
