"""Frames take effect in the order they arrived, however the bytes were cut (AMQP 0.9.1).

Recorded client byte streams drive the real front end (broker, queue manager on SQLite, exchange
store) through the real runtime with a fake transport: fed whole, frame by frame, byte by byte and
cut in two at every frame boundary, the queue holds the same messages and the client reads the same
frames every time: a method before channel.close is answered, then close-ok, and the connection
and its other channels stay usable.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.support.amqp091 import Deck, running
from tests.support.runtime import Wire, settle
from trimaran.amqp091 import spec
from trimaran.amqp091.conn import Amqp091Conn
from trimaran.amqp091.events import ContentRun
from trimaran.amqp091.frames import (
    NEED_DATA,
    BodyFrame,
    FrameDecoder,
    HeaderFrame,
    MethodFrame,
    encode_content,
    encode_method,
)
from trimaran.amqp091.handler import Amqp091FrontEnd
from trimaran.amqp091.properties import BasicProperties

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- recorded client streams --------------------------------------------------------------------

HANDSHAKE = [
    spec.PROTOCOL_HEADER,
    encode_method(0, spec.ConnectionStartOk({"product": "test"}, "PLAIN", b"\x00guest\x00guest", "en_US")),
    encode_method(0, spec.ConnectionTuneOk(2047, 131072, 0)),
    encode_method(0, spec.ConnectionOpen("/")),
    encode_method(1, spec.ChannelOpen()),
    encode_method(2, spec.ChannelOpen()),
]
CLOSE = [encode_method(0, spec.ConnectionClose(200, "bye", 0, 0))]


def publish(channel: int, queue: str, body: bytes, props: BasicProperties | None = None) -> list[bytes]:
    """basic.publish to the default exchange: method, header and body frames, one item each."""
    data = encode_content(
        channel, spec.BasicPublish(routing_key=queue), props or BasicProperties(), body, 131072
    )
    method = encode_method(channel, spec.BasicPublish(routing_key=queue))
    rest = data[len(method) :]
    header_size = 7 + int.from_bytes(rest[3:7], "big") + 1
    return [method, rest[:header_size], rest[header_size:]]


def ways(frames: list[bytes]) -> Iterator[tuple[str, list[bytes]]]:
    """Whole, frame by frame, byte by byte, and cut in two at every frame boundary."""
    data = b"".join(frames)
    yield "whole", [data]
    yield "frames", list(frames)
    yield "bytes", [data[i : i + 1] for i in range(len(data))]
    at = 0
    for frame in frames[:-1]:
        at += len(frame)
        yield f"cut@{at}", [data[:at], data[at:]]


async def feed(wire: Wire, chunks: list[bytes]) -> None:
    """Each chunk as one read; the runtime may hold reading while a method waits (as a socket)."""
    transport = wire.transport
    for chunk in chunks:
        with anyio.fail_after(5):
            while not transport.reading and not transport.closed:
                await anyio.sleep(0.001)
        if transport.closed:
            break
        wire.conn.data_received(chunk)
        await anyio.sleep(0)
    await settle()


def read(data: bytes) -> list[tuple[int, object]]:
    """What the client reads: (channel, method) and content, acks expanded to one per tag."""
    decoder = FrameDecoder(0)
    decoder.feed(data)
    out: list[tuple[int, object]] = []
    confirmed = 0
    while (frame := decoder.next_frame()) is not NEED_DATA:
        if isinstance(frame, MethodFrame) and isinstance(frame.method, spec.BasicAck):
            upto = frame.method.delivery_tag
            tags = range(confirmed + 1, upto + 1) if frame.method.multiple else [upto]
            out += [(frame.channel, ("ack", tag)) for tag in tags]
            confirmed = upto
        elif isinstance(frame, MethodFrame):
            out.append((frame.channel, frame.method))
        elif isinstance(frame, HeaderFrame | BodyFrame):
            out.append((frame.channel, frame))
    return out


async def session(deck: Deck, chunks: list[bytes]) -> tuple[list[tuple[int, object]], Wire]:
    wire = Wire(deck.runner, deck.open)
    await feed(wire, chunks)
    with anyio.fail_after(5):  # the stream ends with connection.close: wait for close-ok
        while not wire.closing:
            await anyio.sleep(0.001)
    output = read(wire.transport.take())
    await wire.eof()
    await settle()
    return output, wire


def methods(output: list[tuple[int, object]]) -> list[tuple[int, str]]:
    return [(ch, m.NAME if isinstance(m, spec.Method) else repr(m)) for ch, m in output]


# -- the scenarios ------------------------------------------------------------------------------


async def test_declare_and_publish_before_channel_close_take_effect(tmp_path: Path) -> None:
    """queue.declare + basic.publish + channel.close in one piece: declared, published, answered,
    closed; channel 2 then sees the message, and the connection closes cleanly."""
    stream = [
        *HANDSHAKE,
        encode_method(1, spec.QueueDeclare(queue="q")),
        *publish(1, "q", b"hello"),
        encode_method(1, spec.ChannelClose(200, "", 0, 0)),
        encode_method(2, spec.QueueDeclare(queue="q", passive=True)),
        *CLOSE,
    ]
    async with running(tmp_path) as deck:
        first: list[tuple[int, object]] | None = None
        for how, chunks in ways(stream):
            output, wire = await session(deck, chunks)
            assert deck.contents("q") == [b"hello"], how
            if first is None:
                first = output
                assert methods(output)[3:] == [
                    (1, "channel.open-ok"),
                    (2, "channel.open-ok"),
                    (1, "queue.declare-ok"),
                    (1, "channel.close-ok"),
                    (2, "queue.declare-ok"),
                    (0, "connection.close-ok"),
                ]
                assert output[-2] == (2, spec.QueueDeclareOk("q", 1, 0))
            assert output == first, how
            assert wire.closing, how
            assert not wire.transport.aborted, how
            await deck.front.ops.delete_queue("q")


async def test_qos_and_consume_before_channel_close(tmp_path: Path) -> None:
    """basic.qos + basic.consume + channel.close: qos-ok, consume-ok, the delivery the consumer was
    given, close-ok; the consumer is gone afterwards and the message is back on the queue."""
    stream = [
        *HANDSHAKE,
        encode_method(1, spec.QueueDeclare(queue="c")),
        *publish(1, "c", b"m1"),
        encode_method(1, spec.BasicQos(0, 1, False)),
        encode_method(1, spec.BasicConsume(queue="c", consumer_tag="t")),
        encode_method(1, spec.ChannelClose(200, "", 0, 0)),
        encode_method(2, spec.QueueDeclare(queue="c", passive=True)),
        *CLOSE,
    ]
    async with running(tmp_path) as deck:
        first: list[tuple[int, object]] | None = None
        for how, chunks in ways(stream):
            output, _wire = await session(deck, chunks)
            assert deck.contents("c") == [b"m1"], how
            assert not deck.front.consumers.get("c"), how
            if first is None:
                first = output
                assert methods(output)[6:] == [
                    (1, "basic.qos-ok"),
                    (1, "basic.consume-ok"),
                    (1, "basic.deliver"),
                    (1, repr(output[9][1])),
                    (1, repr(output[10][1])),
                    (1, "channel.close-ok"),
                    (2, "queue.declare-ok"),
                    (0, "connection.close-ok"),
                ]
                assert output[8] == (1, spec.BasicDeliver("t", 1, False, "", "c"))
                assert output[-2] == (2, spec.QueueDeclareOk("c", 1, 0))
            assert output == first, how
            await deck.front.ops.delete_queue("c")


async def test_confirmed_publishes_before_connection_close_are_confirmed_first(tmp_path: Path) -> None:
    """confirm.select, two publishes to a durable queue, connection.close in one piece: both
    committed, both confirmed, then close-ok."""
    stream = [
        *HANDSHAKE,
        encode_method(1, spec.QueueDeclare(queue="d", durable=True)),
        encode_method(1, spec.ConfirmSelect()),
        *publish(1, "d", b"one"),
        *publish(1, "d", b"two"),
        *CLOSE,
    ]
    async with running(tmp_path) as deck:
        first: list[tuple[int, object]] | None = None
        for how, chunks in ways(stream):
            output, _wire = await session(deck, chunks)
            assert deck.contents("d") == [b"one", b"two"], how
            if first is None:
                first = output
                assert output[-4:] == [
                    (1, spec.ConfirmSelectOk()),
                    (1, ("ack", 1)),
                    (1, ("ack", 2)),
                    (0, spec.ConnectionCloseOk()),
                ]
            assert output == first, how
            await deck.front.ops.delete_queue("d")


async def test_an_unsent_delivery_racing_a_channel_close_is_not_redelivered(tmp_path: Path) -> None:
    """The consumer's channel closes, and in the same loop turn another connection publishes to its
    queue: the delivery handed to the closing channel is never sent, so it goes back to the queue
    as a first delivery, not a redelivery."""
    async with running(tmp_path) as deck:
        consumer = Wire(deck.runner, deck.open, peer=("127.0.0.1", 40001))
        await feed(
            consumer,
            [
                b"".join(HANDSHAKE),
                encode_method(1, spec.QueueDeclare(queue="r")),
                encode_method(1, spec.BasicConsume(queue="r", consumer_tag="t")),
            ],
        )
        publisher = Wire(deck.runner, deck.open, peer=("127.0.0.1", 40002))
        await feed(publisher, [b"".join(HANDSHAKE)])
        consumer.transport.take()
        publisher.transport.take()
        # Both in one loop turn: the channel is closing when the message reaches its consumer.
        consumer.conn.data_received(encode_method(1, spec.ChannelClose(200, "", 0, 0)))
        publisher.conn.data_received(b"".join(publish(1, "r", b"raced")))
        await settle()
        assert [m for _, m in read(consumer.transport.take())] == [spec.ChannelCloseOk()]
        assert deck.contents("r") == [b"raced"]
        publisher.conn.data_received(encode_method(1, spec.BasicGet(queue="r", no_ack=True)))
        await settle()
        got = read(publisher.transport.take())
        assert got[0] == (1, spec.BasicGetOk(1, False, "", "r", 0))
        await consumer.eof()
        await publisher.eof()


async def test_a_run_of_publishes_is_taken_as_each_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publishes read together (``ContentRun``) do what each does alone, in order: to a consumed
    in-memory queue, broken by another key and another channel, with other properties on one,
    mandatory to no queue (returned, each), to a durable queue, and one whose expiration is not a
    number (406: the ones before it are in, the channel closes)."""
    mandatory = spec.BasicPublish(routing_key="nope", mandatory=True)
    stream = [
        *HANDSHAKE,
        encode_method(2, spec.QueueDeclare(queue="r")),
        encode_method(2, spec.QueueDeclare(queue="s")),
        encode_method(2, spec.QueueDeclare(queue="d", durable=True)),
        encode_method(2, spec.BasicConsume(queue="r", consumer_tag="t", no_ack=True)),
        *publish(1, "r", b"r1"),
        *publish(1, "r", b"r2", BasicProperties(content_type="text/plain", priority=3)),
        *publish(1, "r", b"r3"),
        *publish(1, "s", b"s1"),
        *publish(1, "r", b"r4"),
        *publish(2, "s", b"s2"),
        *publish(1, "r", b"r5"),
        encode_content(1, mandatory, BasicProperties(), b"n1", 131072),
        encode_content(1, mandatory, BasicProperties(), b"n2", 131072),
        *publish(1, "d", b"d1"),
        *publish(1, "d", b"d2"),
        *publish(1, "s", b"s3"),
        *publish(1, "s", b"s4", BasicProperties(expiration="soon")),
        *publish(1, "s", b"s5"),
        encode_method(2, spec.QueueDeclare(queue="s", passive=True)),
        *CLOSE,
    ]
    runs: list[int] = []
    content_run = Amqp091FrontEnd.content_run

    def counted(self: Amqp091FrontEnd, conn: Amqp091Conn, event: ContentRun) -> None:
        runs.append(len(event.contents))
        content_run(self, conn, event)

    monkeypatch.setattr(Amqp091FrontEnd, "content_run", counted)
    async with running(tmp_path) as deck:
        first: list[tuple[int, object]] | None = None
        for how, chunks in ways(stream):
            runs.clear()
            output, _wire = await session(deck, chunks)
            if how == "whole":
                assert runs == [3, 2, 2, 3], runs
            assert deck.contents("d") == [b"d1", b"d2"], how
            assert deck.contents("s") == [b"s1", b"s2", b"s3"], how
            if first is None:
                first = output
                bodies = [f.payload for ch, f in output if isinstance(f, BodyFrame)]
                assert bodies == [b"r1", b"r2", b"r3", b"r4", b"r5", b"n1", b"n2"]
                delivered = [m for _, m in output if isinstance(m, spec.BasicDeliver)]
                assert [d.delivery_tag for d in delivered] == [1, 2, 3, 4, 5]
                returned = [m for _, m in output if isinstance(m, spec.BasicReturn)]
                assert [(r.reply_code, r.routing_key) for r in returned] == [(312, "nope")] * 2
                headers = [f for _, f in output if isinstance(f, HeaderFrame)]
                assert headers[1].properties == BasicProperties(content_type="text/plain", priority=3)
                closed = [m for _, m in output if isinstance(m, spec.ChannelClose)]
                assert [c.reply_code for c in closed] == [406]
                assert output[-2] == (2, spec.QueueDeclareOk("s", 3, 0))
            assert output == first, how
            for queue in ("r", "s", "d"):
                await deck.front.ops.delete_queue(queue)
