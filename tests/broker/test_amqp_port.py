"""The shared AMQP port: the 8-byte header picks AMQP 0.9.1 or 1.0; anything else gets our header."""

from __future__ import annotations

import anyio
import pytest
from anyio.abc import ByteStream, SocketAttribute, SocketListener

from trimaran.broker.listeners import AmqpHandler, AmqpPort

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def serve_once(port: AmqpPort, client_bytes: list[bytes]) -> bytes:
    """Run ``port`` on one real connection, send ``client_bytes`` and return what the server sent."""
    received = b""
    multi = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    async with multi:
        listener = multi.listeners[0]
        assert isinstance(listener, SocketListener)
        bound = listener.extra(SocketAttribute.local_port)
        async with anyio.create_task_group() as tg:

            async def accept() -> None:
                server_side = await listener.accept()
                async with server_side:
                    await port.handle(server_side, "test")

            tg.start_soon(accept)
            async with await anyio.connect_tcp("127.0.0.1", bound) as client:
                for chunk in client_bytes:
                    await client.send(chunk)
                    await anyio.sleep(0.01)
                with anyio.fail_after(5):
                    while True:
                        try:
                            received += await client.receive()
                        except (anyio.EndOfStream, anyio.BrokenResourceError):
                            break
    return received


def recording(name: str, seen: list[tuple[str, bytes]]) -> AmqpHandler:
    async def handler(stream: ByteStream, peer: str, initial: bytes) -> None:
        seen.append((name, initial))
        await stream.send(name.encode())

    return handler


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
    seen: list[tuple[str, bytes]] = []
    port = AmqpPort(recording("0-9-1", seen), recording("1.0", seen))
    # Split the header and send a frame's first bytes after it: the handler gets them all.
    received = await serve_once(port, [header[:3], header[3:] + b"\x01\x02"])
    assert received == expected.encode()
    assert seen == [(expected, header + b"\x01\x02")]


JUNK = [b"GET / HTTP/1.1\r\n\r\n", b"AMQP\x01\x01\x08\x00", b"AMQP\x09\x09\x09\x09"]


@pytest.mark.parametrize("junk", JUNK)
async def test_unknown_header_is_answered_with_ours_and_closed(junk: bytes) -> None:
    seen: list[tuple[str, bytes]] = []
    port = AmqpPort(recording("0-9-1", seen), recording("1.0", seen))
    assert await serve_once(port, [junk]) == b"AMQP\x00\x00\x09\x01"
    assert seen == []


async def test_a_front_end_that_is_off_is_refused_like_an_unknown_header() -> None:
    seen: list[tuple[str, bytes]] = []
    port = AmqpPort(recording("0-9-1", seen), None)
    assert await serve_once(port, [b"AMQP\x00\x01\x00\x00"]) == b"AMQP\x00\x00\x09\x01"
    assert seen == []


async def test_silent_client_is_closed_after_the_header_timeout() -> None:
    port = AmqpPort(None, None, header_timeout=0.2)
    assert await serve_once(port, [b"AM"]) == b""
