"""The connection runtime in-process: a fake asyncio transport under a real ``Conn`` and ``Runner``.

``Wire`` records what the runtime writes, half-closes and closes, and lets a test feed bytes cut
however it likes, then wait until the runtime has nothing left to do (flushes, hull steps).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import anyio

from trimaran.runtime.machine import Machine
from trimaran.runtime.runner import Runner
from trimaran.runtime.transport import OPEN, Conn, Hull, HullFactory, Listening


class FakeTransport(asyncio.Transport):
    def __init__(self, peer: tuple[str, int] = ("127.0.0.1", 40000)) -> None:
        super().__init__()
        self.peer = peer
        self.written = bytearray()
        self.eof_written = False
        self.closed = False
        self.aborted = False
        self.reading = True
        self.buffered = 0  # what get_write_buffer_size() reports
        self.protocol: Conn | None = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self.peer}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "write after close"
        self.written += data

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof_written = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self._lose()

    def abort(self) -> None:
        self.aborted = True
        self._lose()

    def _lose(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.protocol is not None:
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def take(self) -> bytes:
        data = bytes(self.written)
        self.written.clear()
        return data


class Wire:
    """One connection through the runtime, driven by the test."""

    def __init__(self, runner: Runner, factory: HullFactory, peer: tuple[str, int] = ("127.0.0.1", 40000)):
        self.runner = runner
        self.transport = FakeTransport(peer)
        self.conn = Conn(runner, Listening("test", factory))
        self.transport.protocol = self.conn
        self.conn.connection_made(self.transport)

    async def feed(self, chunks: Iterable[bytes]) -> None:
        """Each chunk as one ``data_received``, letting the loop run between them as a socket would."""
        for chunk in chunks:
            if self.transport.closed:
                break
            while not self.transport.reading and not self.transport.closed:
                await settle()  # a hull step holds the connection's later frames
            self.conn.data_received(chunk)
            await settle()

    @property
    def closing(self) -> bool:
        """The machine's last bytes are written: the runtime half-closed, waits for the peer to close
        (``peer_close_s``), or closed."""
        return self.conn.state != OPEN

    async def eof(self) -> None:
        if not self.transport.closed and self.conn.eof_received() is False:
            self.transport.close()
        await settle()


#: the real time settle() gives the loop between its rounds; tests that count settles as time (a
#: deadline passes within 20 of them) rely on the 10 ms
SETTLE_S = 0.01


async def settle(rounds: int = 20) -> None:
    """Let the loop run flushes, timers at zero and hull steps until nothing moves."""
    for _ in range(rounds):
        await anyio.sleep(0)
    await anyio.sleep(SETTLE_S)
    for _ in range(rounds):
        await anyio.sleep(0)


def cuts(data: bytes) -> Iterator[list[bytes]]:
    """The ways a recorded stream is fed: whole, byte by byte, and cut once at every position."""
    yield [data]
    yield [data[i : i + 1] for i in range(len(data))]
    for i in range(1, len(data)):
        yield [data[:i], data[i:]]


class LineMachine(Machine):
    """A tiny machine for runtime tests: each ``\\n``-ended line is one event; ``close`` closes,
    ``boom`` makes the hull raise; every line is echoed back upper-cased by the hull."""

    # Plain attributes where Machine has properties: a test sets them.
    closed = False
    peer_close_s = 0.0

    def __init__(self, deadline: float | None = None) -> None:
        self.buffer = b""
        self.out: list[bytes] = []
        self.closed = False
        self.eof = False
        self.deadline = deadline
        self.ticks: list[float] = []
        self.pauses: list[float] = []  # Machine.paused: the runtime had not been reading us until then
        self.peer_close_s = 0.0  # a test may leave the end of the connection to the peer

    def receive_data(self, data: bytes, now: float) -> None:
        if not self.closed:
            self.buffer += data

    def receive_eof(self) -> None:
        self.eof = self.closed = True

    def next_event(self) -> bytes | None:
        if self.closed or b"\n" not in self.buffer:
            return None
        line, self.buffer = self.buffer.split(b"\n", 1)
        if line == b"close":
            self.out.append(b"BYE\n")
            self.closed = True
        return line

    def data_to_send(self) -> bytes:
        data = b"".join(self.out)
        self.out.clear()
        return data

    def next_deadline(self) -> float | None:
        return None if self.closed else self.deadline

    def paused(self, now: float) -> None:
        self.pauses.append(now)

    def tick(self, now: float) -> None:
        self.ticks.append(now)
        if self.deadline is not None and now >= self.deadline:
            self.out.append(b"TIMEOUT\n")
            self.closed = True


class LineHull(Hull):
    machine: LineMachine

    def __init__(self, io: Conn, machine: LineMachine | None = None) -> None:
        self.io = io
        self.machine = machine or LineMachine()
        self.seen: list[bytes] = []
        self.finished = False
        self.shut_down = False
        self.blocks: list[bool] = []
        self.whys: list[str] = []
        self.backlog_mark: int | None = None  # what behind() says: set by a test
        self.stalls: list[float] = []

    def handle(self, event: object) -> None:
        assert isinstance(event, bytes)
        if event == b"boom":
            raise RuntimeError("a bug in the hull")
        self.seen.append(event)
        self.machine.out.append(event.upper() + b"\n")

    def before_write(self) -> None:
        pass

    def written(self) -> None:
        pass

    def shutdown(self) -> None:
        self.machine.out.append(b"SHUTDOWN\n")
        self.machine.closed = True

    def blocked(self, on: bool, why: str) -> None:
        self.blocks.append(on)
        self.whys.append(why)

    def behind(self) -> int | None:
        return self.backlog_mark

    def stalled(self, idle_s: float) -> None:
        self.stalls.append(idle_s)

    def finish(self) -> None:
        self.finished = True


@contextlib.asynccontextmanager
async def running(runner: Runner | None = None) -> AsyncIterator[Runner]:
    """A runner whose task group is up (hull steps and clean-ups run), cancelled at the end."""
    runner = runner or Runner()
    async with anyio.create_task_group() as tg:
        await tg.start(runner.run)
        yield runner
        tg.cancel_scope.cancel()
