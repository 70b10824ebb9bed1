"""The runner: its deadline heap keeps nothing of a connection that is gone; work at the end of a
read leaves in that read's flush."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from tests.support.runtime import LineHull, LineMachine, Wire, running, settle
from trimaran.runtime.runner import COALESCE_AFTER_S, COALESCE_S, Runner
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


async def test_far_deadlines_fall_due_together_near_ones_to_the_millisecond() -> None:
    """Keep-alives in bulk (issue #47): deadlines more than COALESCE_AFTER_S away are held rounded
    up to a COALESCE_S step, so 200 idle connections whose deadlines are spread over 0.4 s wake the
    runner a few times, not 200; a deadline a second away keeps its own time. Each ticks once it
    is due, never before, and at most a step late."""
    start = time.monotonic()
    far = [LineMachine(deadline=start + COALESCE_AFTER_S + 0.05 + i * 0.002) for i in range(200)]
    near = LineMachine(deadline=start + 1.0)

    def hull_of(machine: LineMachine) -> Callable[[Conn, bytes], Hull]:
        return lambda io, first: LineHull(io, machine)

    async with running() as runner:
        for i, machine in enumerate(far):
            Wire(runner, hull_of(machine), peer=("10.0.0.1", i))
        Wire(runner, hull_of(near), peer=("10.0.0.2", 1))
        await settle()
        held = [(at, c.hull.machine) for at, _, c in runner._heap if c.hull is not None and c.scheduled == at]
        assert len(held) == 201
        assert (near.deadline, near) in held  # to the millisecond
        assert len({at for at, _ in held}) <= 4, held  # the near one and at most three steps
        for at, machine in held:
            assert isinstance(machine, LineMachine) and machine.deadline is not None
            assert at - COALESCE_S < machine.deadline <= at
        last = max(m.deadline or 0.0 for m in far)
        while time.monotonic() < last + COALESCE_S + 0.5 and not all(m.ticks for m in far):
            await asyncio.sleep(0.05)
        for machine in [*far, near]:
            assert machine.deadline is not None
            assert machine.ticks, machine.deadline
            assert machine.deadline <= machine.ticks[0] < machine.deadline + COALESCE_S + 0.2


class Relaying(LineHull):
    """Each line read is also handed to ``to`` at the end of the read (as the queues deliver an
    early message once the read's publishes are submitted)."""

    def __init__(self, io: Conn, runner: Runner, to: list[LineHull]) -> None:
        super().__init__(io)
        self.runner, self.to = runner, to

    def handle(self, event: object) -> None:
        super().handle(event)
        assert isinstance(event, bytes)
        self.runner.after_read(lambda: self.relay(event))

    def relay(self, line: bytes) -> None:
        if line == b"fail":
            raise RuntimeError("a bug in the work")
        for hull in self.to:
            hull.machine.out.append(b"got " + line + b"\n")
            hull.io.wake()


def watch_call_soon(monkeypatch: pytest.MonkeyPatch) -> list[Callable[..., object]]:
    scheduled: list[Callable[..., object]] = []
    loop = asyncio.get_running_loop()
    original = loop.call_soon
    monkeypatch.setattr(
        loop, "call_soon", lambda cb, *args, **kw: scheduled.append(cb) or original(cb, *args, **kw)
    )
    return scheduled


async def test_work_at_the_end_of_a_turn_leaves_in_that_turns_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the reads of a turn ask for at its end (the queues' turn: submit, then deliver) runs
    before the turn's flush: a delivery leaves in the turn of the loop its publish arrived in, and
    the reads of one turn share one callback and one write to each connection they fed."""
    runner = Runner()
    subscribers: list[LineHull] = []
    subscriber = Wire(runner, lambda io, first: subscribers.append(LineHull(io)) or subscribers[-1])
    publishers = [Wire(runner, lambda io, first: Relaying(io, runner, subscribers)) for _ in range(2)]
    await settle()
    scheduled = watch_call_soon(monkeypatch)
    writes: list[bytes] = []
    original = subscriber.transport.write
    # None, as Transport.write returns (the compiled runtime checks what it is given).
    subscriber.transport.write = lambda data: writes.append(bytes(data)) or original(data)  # type: ignore[method-assign]
    publishers[0].conn.data_received(b"a\nb\n")
    publishers[1].conn.data_received(b"c\n")
    assert writes == [] and len(scheduled) == 1
    await settle()
    assert writes == [b"got a\ngot b\ngot c\n"]
    assert publishers[0].transport.take() == b"A\nB\n"
    assert publishers[1].transport.take() == b"C\n"
    assert scheduled.count(runner._end_turn) == 1


async def test_failed_work_at_the_end_of_a_turn_is_logged_and_the_turn_still_flushed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runner = Runner()
    subscribers: list[LineHull] = []
    subscriber = Wire(runner, lambda io, first: subscribers.append(LineHull(io)) or subscribers[-1])
    publisher = Wire(runner, lambda io, first: Relaying(io, runner, subscribers))
    await settle()
    publisher.conn.data_received(b"fail\nc\n")
    await settle()
    assert publisher.transport.take() == b"FAIL\nC\n" and not publisher.transport.closed
    assert subscriber.transport.take() == b"got c\n"
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "work at the end of a turn failed"
    ]
