"""The runtime's gate (trimaran/runtime/flow.py) on its own: whom it holds, and when it asks."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.gates import Publisher, Runner
from trimaran.runtime.flow import Gate

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_it_holds_the_connection_acted_on_or_the_source_named() -> None:
    runner = Runner()
    gate = Gate(runner, 60.0, lambda _idle: True)
    gate.hold()  # nobody is being acted on: nobody is held
    assert not gate.holding
    connection, link = Publisher(), Publisher()
    runner.current = connection
    gate.hold(link)  # a hull that slows one sender alone names it
    gate.hold(link)
    assert (connection.holds, link.holds) == (0, 1) and gate.holding
    gate.hold()
    assert connection.holds == 1
    gate.release()
    assert (connection.holds, link.holds) == (0, 0) and not gate.holding
    gate.stuck = True  # its owner gave up: nobody is held until it says otherwise
    gate.hold(link)
    assert link.holds == 0


async def test_without_progress_it_asks_its_owner_until_told_to_stop() -> None:
    runner = Runner()
    asked: list[float] = []
    done = asyncio.Event()

    def stalled(idle_s: float) -> bool:
        asked.append(idle_s)
        if len(asked) < 3:
            return True
        gate.release()
        done.set()
        return False

    gate = Gate(runner, 0.01, stalled)
    source = Publisher()
    gate.hold(source)
    await asyncio.wait_for(done.wait(), 10)
    assert len(asked) == 3 and asked == sorted(asked) and source.holds == 0
