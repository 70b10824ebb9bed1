"""The runner's deadline heap keeps nothing of a connection that is gone."""

from __future__ import annotations

import time

import pytest

from tests.support.runtime import LineHull, LineMachine, Wire, running, settle
from trimaran.runtime.runner import Runner
from trimaran.runtime.transport import GONE, Conn, Hull

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def far_deadline(io: Conn, first: bytes) -> Hull:
    """A connection whose deadline is an hour away (an MQTT keep-alive of 2400 s, say)."""
    return LineHull(io, LineMachine(deadline=time.monotonic() + 3600))


def entries(runner: Runner) -> tuple[int, int]:
    """(entries of open connections, entries of closed ones) in the runner's deadline heap."""
    dead = sum(1 for _, _, conn in runner._heap if conn.state == GONE)
    return len(runner._heap) - dead, dead


async def test_closed_connections_leave_the_deadline_heap_before_their_deadline() -> None:
    """A closed connection's entry used to stay until its deadline passed or the heap outgrew
    2 x open + 1024: the fuzzer's 200 closed connections were all still held an hour later."""
    async with running() as runner:
        wires = [Wire(runner, far_deadline, peer=("10.0.0.1", i)) for i in range(200)]
        await settle()
        assert entries(runner) == (200, 0)
        for wire in wires[2:]:
            wire.transport.close()  # the peer resets: connection_lost
        await settle()
        live, dead = entries(runner)
        assert live == 2 and dead <= live, (live, dead)
        for wire in wires[:2]:
            wire.transport.close()
        await settle()
        assert runner._heap == [] and not runner.conns
