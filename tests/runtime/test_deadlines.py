"""The runner's deadlines (runtime/deadlines.py): far ones fall due together, near ones to the
millisecond, each at its time and never before; a closed connection's entry does not stay until its
keep-alive passes; a deadline that moves earlier is held anew."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from tests.support.runtime import LineHull, LineMachine, Wire, running, settle
from trimaran.runtime.deadlines import MAX_STEP_MS, step_ms
from trimaran.runtime.runner import Runner
from trimaran.runtime.transport import GONE, NOT_SCHEDULED, Conn, Hull

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def far_deadline(io: Conn, first: bytes) -> Hull:
    """A connection whose deadline is an hour away (an MQTT keep-alive of 2400 s, say)."""
    return LineHull(io, LineMachine(deadline=time.monotonic() + 3600))


def hull_of(machine: LineMachine) -> Callable[[Conn, bytes], Hull]:
    return lambda io, first: LineHull(io, machine)


def entries(runner: Runner) -> tuple[int, int]:
    """(entries of open connections, entries of closed ones) the runner holds."""
    held = runner._deadlines.held()
    dead = sum(1 for _, conn in held if conn.state == GONE)
    return len(held) - dead, dead


async def test_closed_connections_leave_before_their_deadline() -> None:
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
        assert runner._deadlines.held() == [] and not runner.conns
        assert all(wire.conn.scheduled == NOT_SCHEDULED for wire in wires)


def test_a_step_is_a_power_of_two_of_milliseconds_at_most_an_eighth_of_the_wait() -> None:
    assert [step_ms(wait) for wait in (0.0, 0.005, 0.02, 0.1, 1.0, 2.0, 2.1, 60.0)] == [
        1,
        1,
        2,
        8,
        64,
        128,
        MAX_STEP_MS,
        MAX_STEP_MS,
    ]


async def test_deadlines_fall_due_together_far_ones_in_coarser_steps() -> None:
    """Keep-alives in bulk (issue #47): 200 idle connections whose deadlines are spread over 0.4 s,
    a little more than 2 s away, are held rounded up to the coarsest step and wake the runner a few
    times, not 200; a deadline a second away is held to 64 ms, one 5 ms away to the millisecond.
    Each ticks once it is due, never before, and at most a step late."""
    start = time.monotonic()
    far = [LineMachine(deadline=start + 2.1 + i * 0.002) for i in range(200)]
    near = LineMachine(deadline=start + 1.0)
    soon = LineMachine(deadline=start + 0.005)
    coarsest = MAX_STEP_MS / 1000
    async with running() as runner:
        for i, machine in enumerate(far):
            Wire(runner, hull_of(machine), peer=("10.0.0.1", i))
        Wire(runner, hull_of(near), peer=("10.0.0.2", 1))
        Wire(runner, hull_of(soon), peer=("10.0.0.2", 2))
        await settle()
        while not soon.ticks:
            await asyncio.sleep(0.001)
        assert soon.deadline is not None and soon.deadline <= soon.ticks[0] < soon.deadline + 0.05
        held = [(at, c.hull.machine) for at, c in runner._deadlines.held() if c.scheduled == at and c.hull]
        held = [(at, machine) for at, machine in held if machine is not soon]  # (it is closing now)
        assert len(held) == 201
        assert len({at for at, machine in held if machine is not near}) <= 3, held
        for at, held_machine in held:
            assert isinstance(held_machine, LineMachine) and held_machine.deadline is not None
            step = 0.064 if held_machine is near else coarsest
            assert at - step < held_machine.deadline <= at
        last = max(m.deadline or 0.0 for m in far)
        while time.monotonic() < last + coarsest + 0.5 and not all(m.ticks for m in far):
            await asyncio.sleep(0.05)
        for machine in [*far, near]:
            assert machine.deadline is not None
            assert machine.ticks, machine.deadline
            assert machine.deadline <= machine.ticks[0] < machine.deadline + coarsest + 0.2


async def test_a_deadline_moved_earlier_is_held_anew_and_the_stale_entries_go() -> None:
    """A keep-alive pushed later keeps its entry (it looks again when due); one brought earlier (a
    close to wait for) gets an entry of its own, and the one it had is skipped when it falls due.
    Entries that moved are dropped once they outnumber twice the connections."""
    machine = LineMachine(deadline=time.monotonic() + 3600)
    async with running() as runner:
        wire = Wire(runner, hull_of(machine))
        await settle()
        [(first, _)] = runner._deadlines.held()
        machine.deadline = time.monotonic() + 7200
        runner.watch_deadline(wire.conn)
        assert runner._deadlines.held() == [(first, wire.conn)]  # later: nothing new
        for n in range(3000):  # a deadline brought earlier again and again
            machine.deadline = time.monotonic() + 3000 - n
            runner.watch_deadline(wire.conn)
        assert len(runner._deadlines.held()) <= 2 * len(runner.conns) + 1025
        assert (wire.conn.scheduled, wire.conn) in runner._deadlines.held()
        machine.deadline = time.monotonic() + 0.2
        runner.watch_deadline(wire.conn)
        assert wire.conn.scheduled < first
        while not machine.ticks and time.monotonic() < machine.deadline + 1.0:
            await asyncio.sleep(0.02)
        assert len(machine.ticks) == 1 and machine.deadline <= machine.ticks[0]
