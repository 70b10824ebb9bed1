"""The shared AMQP port: the 8-byte header picks AMQP 0.9.1 or 1.0; anything else gets our header."""

from __future__ import annotations

import pytest

from tests.support.runtime import LineHull, Wire, settle
from trimaran.amqp091.spec import PROTOCOL_HEADER as AMQP091_HEADER
from trimaran.net.listeners import amqp_port
from trimaran.runtime.runner import Runner
from trimaran.runtime.transport import Conn

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (b"AMQP\x00\x00\x09\x01", "0-9-1"),
        (b"AMQP\x01\x01\x00\x09", "0-9-1"),
        (b"AMQP\x00\x01\x00\x00", "1.0"),
        (b"AMQP\x03\x01\x00\x00", "1.0"),
        (b"AMQP\x02\x01\x00\x00", "1.0"),
    ],
)
async def test_header_picks_the_front_end(header: bytes, expected: str) -> None:
    opened: list[tuple[str, LineHull]] = []

    def front(name: str):  # type: ignore[no-untyped-def]
        def open_hull(io: Conn) -> LineHull:
            hull = LineHull(io)
            opened.append((name, hull))
            return hull

        return open_hull

    wire = Wire(Runner(), amqp_port(front("0-9-1"), front("1.0")))
    # The header split, and a frame's first bytes after it: the machine gets them all.
    await wire.feed([header[:3], header[3:] + b"\x01\x02"])
    assert [name for name, _ in opened] == [expected]
    assert opened[0][1].machine.buffer == header + b"\x01\x02"


@pytest.mark.parametrize(
    "junk", [b"GET / HTTP/1.1\r\n\r\n", b"AMQP\x01\x01\x08\x00", b"AMQP\x09\x09\x09\x09"]
)
async def test_unknown_header_is_answered_with_ours_and_closed(junk: bytes) -> None:
    wire = Wire(Runner(), amqp_port(LineHull, LineHull))
    await wire.feed([junk])
    assert wire.transport.take() == AMQP091_HEADER
    assert wire.transport.eof_written
    await wire.eof()
    await settle()
    assert wire.transport.closed
