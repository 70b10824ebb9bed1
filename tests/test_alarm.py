"""trimaran/alarm.py: a task's sleep until a time, or until it is rung sooner."""

from __future__ import annotations

import math
import time

import anyio
import pytest

from trimaran.alarm import Alarm

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_sleep_ends_at_its_time() -> None:
    alarm = Alarm()
    started = time.monotonic()
    await alarm.sleep(0.05)
    assert 0.045 <= time.monotonic() - started < 1.0
    assert alarm.until == -math.inf  # awake


async def test_a_ring_ends_a_sleep_early_and_a_sleep_without_a_time_waits_for_it() -> None:
    for seconds in (None, 30.0):
        alarm = Alarm()
        woke: list[float] = []

        async def sleeper(
            alarm: Alarm = alarm, seconds: float | None = seconds, woke: list[float] = woke
        ) -> None:
            await alarm.sleep(seconds)
            woke.append(time.monotonic())

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(sleeper)
            await anyio.sleep(0.05)
            assert not woke and alarm.until > time.monotonic() + 10
            rung = time.monotonic()
            alarm.ring()
        assert woke and woke[0] - rung < 1.0


async def test_ring_by_wakes_only_a_sleep_that_would_go_past_it() -> None:
    alarm = Alarm()
    woke: list[float] = []

    async def sleeper() -> None:
        await alarm.sleep(0.5)
        woke.append(time.monotonic())

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(sleeper)
        await anyio.sleep(0.02)
        alarm.ring_by(time.monotonic() + 5)  # later than the sleep's end: it sleeps on
        await anyio.sleep(0.05)
        assert not woke
        alarm.ring_by(time.monotonic() + 0.01)  # sooner: it wakes (its owner then sleeps again)
        await anyio.sleep(0.1)
        assert woke
    alarm.ring()  # awake, no sleep: nothing to do
    alarm.ring_by(0.0)


async def test_cancelling_the_sleeper_ends_the_sleep() -> None:
    alarm = Alarm()
    with anyio.move_on_after(0.05):
        await alarm.sleep(None)
    assert alarm.until == -math.inf
    alarm.ring()  # the cancelled sleep's waiter is gone
    await alarm.sleep(0.001)  # and the alarm sleeps again
