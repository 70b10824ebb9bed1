"""The runner: work at the end of a read leaves in that read's flush."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.support.runtime import LineHull, Wire, settle
from trimaran.runtime.runner import Runner
from trimaran.runtime.transport import Conn

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


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
    assert scheduled.count(runner.end_turn) == 1


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
