"""What AMQP 0.9.1 clients rely on (issue 18), the same test against us and RabbitMQ where the
behaviour is RabbitMQ's: message counts, connection.update-secret, field-table types, plain
names unroutable; and our cross-protocol ``$queue/`` namespace through the default exchange."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pika
import pytest
from pamqp import commands, frame
from pamqp.base import Frame
from pika.adapters.blocking_connection import BlockingChannel

from tests.support.names import unique
from tests.support.server import RunningServer

F = TypeVar("F", bound=Frame)


@pytest.fixture
def connection(amqp_port: int) -> Iterator[pika.BlockingConnection]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    try:
        yield conn
    finally:
        if conn.is_open:
            conn.close()


@pytest.fixture
def channel(connection: pika.BlockingConnection) -> BlockingChannel:
    return connection.channel()


# -- $queue/ through the default exchange (ours) --------------------------------------------------


def test_queue_namespace_is_created_on_first_publish(amqp_server: RunningServer) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_server.ports["amqp"]))
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        name = unique("made")
        # Confirmed (and not returned, though mandatory): the queue is made on first use.
        channel.basic_publish("", f"$queue/{name}", b"first", mandatory=True)
        channel.basic_publish("", f"$queue/{name}/eu/paris", b"keyed", mandatory=True)
        got = [channel.basic_get(name, auto_ack=True) for _ in range(2)]
        assert [body for _m, _p, body in got] == [b"first", b"keyed"]
        with pytest.raises(pika.exceptions.NackError):  # not a queue name: returned and nacked
            channel.basic_publish("", "$queue/a+b", b"bad", mandatory=True)
    finally:
        conn.close()


def test_a_plain_unknown_name_is_unroutable(channel: BlockingChannel) -> None:
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("", unique("nowhere"), b"x", mandatory=True)
    channel.basic_publish("", unique("nowhere"), b"x")  # not mandatory: confirmed, dropped


# -- message counts -------------------------------------------------------------------------------


def ready(channel: BlockingChannel, name: str, expected: int) -> int:
    """message_count once the count settles at ``expected`` (acks and nacks have no reply: a broker
    may answer the declare before it applied them), else the last count seen."""
    deadline = time.monotonic() + 3
    while True:
        count = int(channel.queue_declare(name, passive=True).method.message_count)
        if count == expected or time.monotonic() > deadline:
            return count
        time.sleep(0.02)


def test_message_count_is_the_ready_messages(channel: BlockingChannel) -> None:
    channel.confirm_delivery()  # the publishes are in the queue before we count
    name = channel.queue_declare("", exclusive=True).method.queue
    for i in range(4):
        channel.basic_publish("", name, b"%d" % i)
    assert ready(channel, name, 4) == 4
    first = channel.basic_get(name)[0]
    assert first.message_count == 3  # without the one returned
    second = channel.basic_get(name)[0]
    assert second.message_count == 2
    assert ready(channel, name, 2) == 2  # unacked are out
    channel.basic_nack(first.delivery_tag, requeue=True)
    assert ready(channel, name, 3) == 3
    channel.basic_reject(second.delivery_tag, requeue=False)
    assert ready(channel, name, 3) == 3
    channel.basic_ack(channel.basic_get(name)[0].delivery_tag)
    assert ready(channel, name, 2) == 2


def test_message_count_after_cancel_and_channel_close(connection: pika.BlockingConnection) -> None:
    channel = connection.channel()
    channel.confirm_delivery()
    name = channel.queue_declare("", exclusive=True).method.queue
    for i in range(3):
        channel.basic_publish("", name, b"%d" % i)
    other = connection.channel()
    other.basic_qos(prefetch_count=2)
    tag = other.basic_consume(name, lambda *_: None)
    connection.process_data_events(0.3)
    assert ready(channel, name, 1) == 1
    other.basic_cancel(tag)  # the unacked stay with the channel
    assert ready(channel, name, 1) == 1
    other.close()  # now they are back
    assert ready(channel, name, 3) == 3


# -- connection.update-secret ---------------------------------------------------------------------


def test_update_secret_is_answered(connection: pika.BlockingConnection) -> None:
    connection.update_secret("guest", "token refreshed")
    channel = connection.channel()  # the connection is still good
    assert channel.queue_declare("", exclusive=True).method.queue


def test_update_secret_checks_a_configured_user(amqp_server: RunningServer) -> None:
    port = amqp_server.ports["amqp"]
    creds = pika.PlainCredentials("alice", "wonderland")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, credentials=creds))
    conn.update_secret("wonderland", "same password")
    conn.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        conn.update_secret("wrong", "bad token")
    assert err.value.reply_code == 530


# -- field tables ---------------------------------------------------------------------------------

# One value of every type RabbitMQ defines, as raw tag + bytes: what comes back must be the same.
TYPED = [
    ("t", b"t\x01"),
    ("b", b"b" + struct.pack(">b", -5)),
    ("B", b"B" + struct.pack(">B", 200)),
    ("s", b"s" + struct.pack(">h", -300)),
    ("u", b"u" + struct.pack(">H", 60000)),
    ("I", b"I" + struct.pack(">i", -70000)),
    ("i", b"i" + struct.pack(">I", 4_000_000_000)),
    ("l", b"l" + struct.pack(">q", -(2**40))),
    ("f", b"f" + struct.pack(">f", 1.5)),
    ("d", b"d" + struct.pack(">d", 2.25)),
    ("D", b"D" + struct.pack(">Bi", 2, 12345)),
    ("S", b"S" + struct.pack(">I", 4) + b"text"),
    ("x", b"x" + struct.pack(">I", 3) + b"\x00\xff\x10"),
    ("A", b"A" + struct.pack(">I", 10) + b"I" + struct.pack(">i", 1) + b"S" + struct.pack(">I", 0)),
    ("F", b"F" + struct.pack(">I", 8) + b"\x01kS" + struct.pack(">I", 1) + b"v"),
    ("T", b"T" + struct.pack(">Q", 1_700_000_000)),
    ("V", b"V"),
]
_FIXED = dict(zip("tbBsuIilfdDTV", (1, 1, 1, 2, 2, 4, 4, 8, 4, 8, 5, 8, 0), strict=True))


def split_table(data: bytes) -> dict[str, bytes]:
    """A table's entries as key -> tag + raw value bytes (no decoding: tags are compared)."""
    out: dict[str, bytes] = {}
    off = 0
    while off < len(data):
        n = data[off]
        key = data[off + 1 : off + 1 + n].decode()
        off += 1 + n
        tag = chr(data[off])
        size = _FIXED.get(tag)
        if size is None:  # S x A F: a 32-bit length
            size = 4 + struct.unpack_from(">I", data, off + 1)[0]
        out[key] = data[off : off + 1 + size]
        off += 1 + size
    return out


class RawClient:
    """Just enough AMQP 0.9.1 to send and read a content header byte for byte."""

    def __init__(self, port: int, heartbeat: int = 0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.expect(commands.Connection.Start)
        self.send(0, commands.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest"))
        tune = self.expect(commands.Connection.Tune)
        self.send(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, heartbeat))
        self.send(0, commands.Connection.Open("/"))
        self.expect(commands.Connection.OpenOk)
        self.send(1, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)

    def send(self, channel: int, value: Frame) -> None:
        self.sock.sendall(frame.marshal(value, channel))

    def raw_frame(self) -> tuple[int, bytes, bytes]:
        """(type, payload, the whole frame)."""
        while True:
            if len(self.buf) >= 7:
                size = struct.unpack_from(">I", self.buf, 3)[0]
                if len(self.buf) >= 8 + size:
                    whole, self.buf = self.buf[: 8 + size], self.buf[8 + size :]
                    return whole[0], whole[7:-1], whole
            data = self.sock.recv(65536)
            assert data, "connection closed"
            self.buf += data

    def expect(self, kind: type[F]) -> F:
        kind_, _payload, whole = self.raw_frame()
        assert kind_ == 1
        value = frame.unmarshal(whole)[2]
        assert isinstance(value, kind), value
        return value

    def close(self) -> None:
        self.sock.close()


def test_field_table_types_round_trip(amqp_port: int) -> None:
    client = RawClient(amqp_port)
    try:
        client.send(1, commands.Queue.Declare(queue="", exclusive=True))
        queue = client.expect(commands.Queue.DeclareOk).queue
        assert queue
        table = b"".join(bytes([len(k)]) + k.encode() + v for k, v in TYPED)
        body = b"typed"
        properties = struct.pack(">H", 0x2000) + struct.pack(">I", len(table)) + table
        payload = struct.pack(">HHQ", 60, 0, len(body)) + properties
        client.send(1, commands.Basic.Publish(exchange="", routing_key=queue))
        client.sock.sendall(struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce")
        client.sock.sendall(struct.pack(">BHI", 3, 1, len(body)) + body + b"\xce")
        client.send(1, commands.Basic.Get(queue=queue, no_ack=True))
        client.expect(commands.Basic.GetOk)
        kind, got, _ = client.raw_frame()
        assert kind == 2
        flags = struct.unpack_from(">H", got, 12)[0]
        assert flags == 0x2000
        size = struct.unpack_from(">I", got, 14)[0]
        assert split_table(got[18 : 18 + size]) == dict(TYPED)
    finally:
        client.close()


# -- channel and connection errors ----------------------------------------------------------------

LOCKED = (
    "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{q}' in vhost '/'. It could be "
    "originally declared on another connection or the exclusive property value does not match that of "
    "the original declaration."
)


def closed_with(client: RawClient, timeout: float = 5.0) -> tuple[int, int, str, int, int]:
    """(channel, reply code, text, class id, method id) of the first close the server sends."""
    client.sock.settimeout(timeout)
    while True:
        kind, _payload, whole = client.raw_frame()
        if kind != 1:
            continue
        value = frame.unmarshal(whole)[2]
        if isinstance(value, commands.Connection.Close | commands.Channel.Close):
            channel = struct.unpack_from(">H", whole, 1)[0]
            code, class_id, method_id = value.reply_code, value.class_id, value.method_id
            assert code is not None and class_id is not None and method_id is not None
            return channel, code, value.reply_text, class_id, method_id


def test_second_channel_open_is_a_connection_error(amqp_port: int) -> None:
    client = RawClient(amqp_port)
    try:
        client.send(1, commands.Channel.Open())
        assert closed_with(client) == (0, 504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)
    finally:
        client.close()


def test_a_method_on_a_channel_not_open_is_a_connection_error(amqp_port: int) -> None:
    client = RawClient(amqp_port)
    try:
        client.send(2, commands.Queue.Declare(queue="x"))
        assert closed_with(client) == (0, 504, "CHANNEL_ERROR - expected 'channel.open'", 50, 10)
    finally:
        client.close()


class TwoChannels(RawClient):
    """A client that tunes channel_max down to 2."""

    def send(self, channel: int, value: Frame) -> None:
        if isinstance(value, commands.Connection.TuneOk):
            value = commands.Connection.TuneOk(2, value.frame_max, 0)
        super().send(channel, value)


def test_channel_max_counts_open_channels(amqp_port: int) -> None:
    client = TwoChannels(amqp_port)  # channel 1 is open
    try:
        client.send(3000, commands.Channel.Open())  # a number past channel_max is fine
        client.expect(commands.Channel.OpenOk)
        client.send(7, commands.Channel.Open())
        text = "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)"
        assert closed_with(client) == (0, 530, text, 0, 0)
    finally:
        client.close()


def test_an_invalid_exchange_type_closes_the_connection(amqp_port: int) -> None:
    client = RawClient(amqp_port)
    try:
        client.send(1, commands.Exchange.Declare(exchange=unique("x"), exchange_type="foo"))
        assert closed_with(client) == (0, 503, "COMMAND_INVALID - invalid exchange type 'foo'", 40, 10)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("method", "ids"),
    [
        (lambda q: commands.Basic.Consume(queue=q), (60, 20)),
        (lambda q: commands.Basic.Get(queue=q), (60, 70)),
        (lambda q: commands.Queue.Declare(queue=q, passive=True), (50, 10)),
        (lambda q: commands.Queue.Declare(queue=q), (50, 10)),
        (lambda q: commands.Queue.Delete(queue=q), (50, 40)),
    ],
)
def test_an_exclusive_queue_of_another_connection_is_locked(
    amqp_port: int, method: Callable[[str], Frame], ids: tuple[int, int]
) -> None:
    owner = RawClient(amqp_port)
    other = RawClient(amqp_port)
    try:
        queue = unique("mine")
        owner.send(1, commands.Queue.Declare(queue=queue, exclusive=True))
        owner.expect(commands.Queue.DeclareOk)
        other.send(1, method(queue))
        assert closed_with(other) == (1, 405, LOCKED.format(q=queue), *ids)  # the channel only
        other.send(2, commands.Channel.Open())
        other.expect(commands.Channel.OpenOk)
    finally:
        owner.close()
        other.close()


def test_publish_then_get_on_one_channel_sees_the_message(channel: BlockingChannel) -> None:
    """A channel's publish to a durable queue is visible to its own later basic.get, as RabbitMQ
    orders them per channel (no confirms: nothing else waits for the commit)."""
    name = unique("own-get")
    channel.queue_declare(name, durable=True)
    persistent = pika.BasicProperties(delivery_mode=2)
    try:
        for i in range(20):
            channel.basic_publish("", name, f"m{i}".encode(), persistent)
            method, _props, body = channel.basic_get(name, auto_ack=True)
            assert method is not None, f"publish {i} not visible to the channel's own basic.get"
            assert body == f"m{i}".encode()
    finally:
        channel.queue_delete(name)


def test_a_queue_unused_for_its_x_expires_is_deleted(connection: pika.BlockingConnection) -> None:
    """RabbitMQ's x-expires: a queue with no consumer, no basic.get and no redeclare (a passive one
    too) for that many milliseconds is deleted, on a server with nothing else to do (the front end's
    housekeeping sleeps until a queue with x-expires is declared, then looks once a second)."""
    name = unique("expires")
    channel = connection.channel()
    channel.queue_declare(name, arguments={"x-expires": 500})
    time.sleep(0.3)
    channel.queue_declare(name, passive=True)  # still there, and its lease renewed
    time.sleep(2.5)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        connection.channel().queue_declare(name, passive=True)
    assert closed.value.reply_code == 404
