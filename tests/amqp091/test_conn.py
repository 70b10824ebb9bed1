"""The AMQP 0.9.1 hull on the runtime: blocked/unblocked, shutdown, what a closed connection gives
back, the handshake deadline, and bytes pipelined behind a refused login."""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import pytest

from tests.support.amqp091 import running
from tests.support.runtime import Wire, settle
from trimaran.amqp091 import spec
from trimaran.amqp091.frames import NEED_DATA, FrameDecoder, MethodFrame, encode_content, encode_method
from trimaran.amqp091.mapping import message_from_content
from trimaran.amqp091.properties import BasicProperties
from trimaran.broker.message import Message
from trimaran.config import Amqp091Settings, AuthSettings, Settings
from trimaran.runtime.memory import DISK, MEMORY
from trimaran.storage.writer import WriteBatch

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def hello(capabilities: dict[str, object] | None = None, password: str = "guest") -> bytes:
    props: dict[str, object] = {"product": "test"}
    if capabilities is not None:
        props["capabilities"] = capabilities
    response = b"\x00guest\x00" + password.encode()
    return b"".join(
        [
            spec.PROTOCOL_HEADER,
            encode_method(0, spec.ConnectionStartOk(props, "PLAIN", response, "en_US")),  # type: ignore[arg-type]
            encode_method(0, spec.ConnectionTuneOk(2047, 131072, 0)),
            encode_method(0, spec.ConnectionOpen("/")),
            encode_method(1, spec.ChannelOpen()),
        ]
    )


def methods(data: bytes) -> list[tuple[int, spec.Method]]:
    decoder = FrameDecoder(0)
    decoder.feed(data)
    out = []
    while (frame := decoder.next_frame()) is not NEED_DATA:
        if isinstance(frame, MethodFrame):
            out.append((frame.channel, frame.method))
    return out


async def test_blocked_and_unblocked_go_to_clients_that_announce_the_capability(tmp_path: Path) -> None:
    async with running(tmp_path) as deck:
        able = Wire(deck.runner, deck.open, peer=("127.0.0.1", 1))
        unable = Wire(deck.runner, deck.open, peer=("127.0.0.1", 2))
        await able.feed([hello({"connection.blocked": True})])
        await unable.feed([hello({})])
        able.transport.take()
        unable.transport.take()
        for wire in (able, unable):
            wire.conn.block(True, MEMORY)
        await settle()
        assert methods(able.transport.take()) == [(0, spec.ConnectionBlocked("low on memory"))]
        for wire in (able, unable):
            wire.conn.block(False, MEMORY)
        await settle()
        assert methods(able.transport.take()) == [(0, spec.ConnectionUnblocked())]
        assert unable.transport.take() == b""
        await able.eof()
        await unable.eof()


async def test_a_connection_that_publishes_during_the_disk_alarm_is_told_and_no_longer_read(
    tmp_path: Path,
) -> None:
    """The disk alarm pauses publishers as the memory one does, saying why; a connection that had
    not published is told at its first publish (what it sent with it is still taken)."""
    async with running(tmp_path) as deck:
        wire = Wire(deck.runner, deck.open)
        await wire.feed([hello({"connection.blocked": True})])
        wire.transport.take()
        deck.runner.alarm(DISK, True)
        deck.runner.alarm(MEMORY, True)
        await settle()
        assert wire.transport.take() == b"" and wire.transport.reading  # no publisher yet
        publish = spec.BasicPublish(routing_key="q")
        declare = encode_method(1, spec.QueueDeclare(queue="q"))
        await wire.feed([declare + encode_content(1, publish, BasicProperties(), b"x", 131072)])
        assert (0, spec.ConnectionBlocked("low on disk")) in methods(wire.transport.take())
        assert not wire.transport.reading and deck.contents("q") == [b"x"]
        deck.runner.alarm(DISK, False)
        await settle()
        assert wire.transport.take() == b"" and not wire.transport.reading  # the memory alarm holds
        deck.runner.alarm(MEMORY, False)
        await settle()
        assert methods(wire.transport.take()) == [(0, spec.ConnectionUnblocked())]
        assert wire.transport.reading
        await wire.eof()


async def test_shutdown_closes_with_320_and_waits_for_close_ok(tmp_path: Path) -> None:
    async with running(tmp_path) as deck:
        wire = Wire(deck.runner, deck.open)
        await wire.feed([hello()])
        wire.transport.take()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(deck.runner.shutdown)
            await settle()
            ((channel, close),) = methods(wire.transport.take())
            assert channel == 0 and isinstance(close, spec.ConnectionClose)
            assert close.reply_code == spec.CONNECTION_FORCED
            await wire.feed([encode_method(0, spec.ConnectionCloseOk())])
            await wire.eof()
        assert wire.transport.closed and not wire.transport.aborted
        assert not deck.front.conns


async def test_a_closed_connection_gives_back_its_exclusive_queues_and_deliveries(tmp_path: Path) -> None:
    async with running(tmp_path) as deck:
        wire = Wire(deck.runner, deck.open)
        await wire.feed(
            [
                hello(),
                encode_method(1, spec.QueueDeclare(queue="excl", exclusive=True)),
                encode_method(1, spec.QueueDeclare(queue="shared")),
                encode_method(1, spec.BasicConsume(queue="shared", consumer_tag="c")),
            ]
        )
        deck.manager.publish_nowait("shared", _message("shared"))
        await settle()
        assert any(isinstance(m, spec.BasicDeliver) for _, m in methods(wire.transport.take()))
        await wire.eof()  # the socket goes without a close
        await settle()
        assert not deck.manager.exists("excl")
        assert not deck.front.consumers.get("shared")
        assert deck.contents("shared") == [b"payload"]  # unacknowledged: back on the queue
        assert not deck.front.conns


async def test_a_silent_connection_is_closed_at_the_handshake_deadline(tmp_path: Path) -> None:
    settings = Settings(amqp091=Amqp091Settings(handshake_timeout=0.05))
    async with running(tmp_path, settings) as deck:
        wire = Wire(deck.runner, deck.open)
        await wire.feed([spec.PROTOCOL_HEADER])
        with anyio.fail_after(2):  # the runtime half-closes, then lingers for the peer's end
            while not wire.closing:
                await anyio.sleep(0.01)
        await wire.eof()
        assert wire.transport.closed
        assert deck.runner.stats.crashes == 0


async def test_frames_pipelined_behind_a_refused_login_get_the_protocols_answer(tmp_path: Path) -> None:
    settings = Settings(auth=AuthSettings(allow_anonymous=False))
    async with running(tmp_path, settings) as deck:
        wire = Wire(deck.runner, deck.open)
        await wire.feed([hello({"authentication_failure_close": True}, password="wrong")])
        with anyio.fail_after(10):  # the password check runs in a thread: slow on a loaded machine
            while not any(
                isinstance(m, spec.ConnectionClose) for _, m in methods(bytes(wire.transport.written))
            ):
                await anyio.sleep(0.01)
        got = methods(wire.transport.take())
        assert isinstance(got[-1][1], spec.ConnectionClose)
        assert got[-1][1].reply_code == spec.ACCESS_REFUSED
        await wire.eof()
        assert deck.runner.stats.crashes == 0


def _message(queue: str) -> Message:
    return message_from_content(
        BasicProperties(), b"payload", f"$queue/{queue}", exchange="", routing_key=queue, publisher_id="t"
    )


async def test_a_refused_tx_commit_holds_back_no_other_confirm(tmp_path: Path) -> None:
    """tx.commit of a publish to a missing exchange closes its channel (404); confirms on another
    channel and the close-ok after them still go out."""
    publish = spec.BasicPublish(exchange="nope", routing_key="k")
    confirmed = spec.BasicPublish(routing_key="q")
    async with running(tmp_path) as deck:
        wire = Wire(deck.runner, deck.open)
        await wire.feed(
            [
                hello(),
                encode_method(2, spec.ChannelOpen()),
                encode_method(2, spec.QueueDeclare(queue="q", durable=True)),
                encode_method(1, spec.TxSelect()),
                encode_content(1, publish, BasicProperties(), b"lost", 131072),
                encode_method(1, spec.TxCommit()),
                encode_method(2, spec.ConfirmSelect()),
                encode_content(2, confirmed, BasicProperties(), b"kept", 131072),
                encode_method(0, spec.ConnectionClose(200, "", 0, 0)),
            ]
        )
        with anyio.fail_after(5):
            while not wire.closing:
                await anyio.sleep(0.005)
        got = methods(wire.transport.take())
        closes = [m for ch, m in got if ch == 1 and isinstance(m, spec.ChannelClose)]
        assert closes and closes[0].reply_code == spec.NOT_FOUND
        assert got[-2:] == [(2, spec.BasicAck(1, False)), (0, spec.ConnectionCloseOk())]
        assert deck.contents("q") == [b"kept"]
        await wire.eof()


async def test_the_publishes_of_one_commit_are_confirmed_by_one_multiple_ack(tmp_path: Path) -> None:
    """Confirms leave once per write, not once per publish: a commit of 50 publishes is one
    ``basic.ack`` with ``multiple`` (RabbitMQ coalesces the same way), and sent after the commit."""
    publish = spec.BasicPublish(routing_key="q")
    persistent = BasicProperties(delivery_mode=2)
    async with running(tmp_path) as deck:
        wire = Wire(deck.runner, deck.open)
        await wire.feed(
            [
                hello(),
                encode_method(1, spec.QueueDeclare(queue="q", durable=True)),
                encode_method(1, spec.ConfirmSelect()),
            ]
        )
        await settle()
        wire.transport.take()
        gate = threading.Event()
        deck.manager.journal.send(WriteBatch(calls=[lambda _connection: gate.wait(10)]))  # the disk stalls
        await settle()
        await wire.feed(
            [b"".join(encode_content(1, publish, persistent, b"%d" % i, 131072) for i in range(50))]
        )
        await settle()
        assert not any(isinstance(m, spec.BasicAck) for _, m in methods(wire.transport.take()))
        gate.set()
        with anyio.fail_after(5):
            while not (got := methods(wire.transport.take())):
                await anyio.sleep(0.005)
        assert got == [(1, spec.BasicAck(50, True))]
        assert len(deck.contents("q")) == 50
        await wire.eof()
