"""The connection runtime in-process: a fake asyncio transport under a real ``Conn`` and ``Runner``.

``Wire`` records what the runtime writes, half-closes and closes, and lets a test feed bytes cut
however it likes, then wait until the runtime has nothing left to do (flushes, hull steps).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from typing import Any

import anyio

from trimaran.runtime.runner import Runner
from trimaran.runtime.transport import Conn, HullFactory


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
        self.conn = Conn(runner, "test", factory)
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

    async def eof(self) -> None:
        if not self.transport.closed and self.conn.eof_received() is False:
            self.transport.close()
        await settle()


async def settle(rounds: int = 20) -> None:
    """Let the loop run flushes, timers at zero and hull steps until nothing moves."""
    for _ in range(rounds):
        await anyio.sleep(0)
    await anyio.sleep(0.01)
    for _ in range(rounds):
        await anyio.sleep(0)


def cuts(data: bytes) -> Iterator[list[bytes]]:
    """The ways a recorded stream is fed: whole, byte by byte, and cut once at every position."""
    yield [data]
    yield [data[i : i + 1] for i in range(len(data))]
    for i in range(1, len(data)):
        yield [data[:i], data[i:]]
