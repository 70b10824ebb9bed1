"""The AMQP 0-9-1 client machine (trimaran/amqp091/client.py): paired in memory with the server's
machine and a few lines of broker, against server frames scripted here, and over real sockets
against a Trimaran server and against RabbitMQ (slow: RabbitMQ's own start)."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.amqp091.amqp091_client import one_by_one
from tests.support import rabbitmq
from tests.support.server import RunningServer, serving
from trimaran.amqp091 import spec
from trimaran.amqp091.client import (
    CLOSE_TIMEOUT,
    Blocked,
    ClientConnection,
    ClientParams,
    Closed,
    Confirmed,
    ConfirmsSelected,
    ConsumerCancelled,
    ConsumeStarted,
    Delivered,
    Event,
    Opened,
    QosSet,
    QueueBound,
    QueueDeclared,
    Returned,
    Unblocked,
)
from trimaran.amqp091.connection import ServerConnection
from trimaran.amqp091.events import (
    AuthenticationRequested,
    ConnectionClosed,
    ContentReceived,
    MethodReceived,
)
from trimaran.amqp091.events import (
    Event as ServerEvent,
)
from trimaran.amqp091.fields import decode_table_contents
from trimaran.amqp091.frames import (
    HEARTBEAT_FRAME,
    NEED_DATA,
    BodyFrame,
    Frame,
    FrameDecoder,
    HeaderFrame,
    MethodFrame,
    encode_content,
    encode_frame,
    encode_method,
)
from trimaran.amqp091.properties import BasicProperties

PROPS = BasicProperties(content_type="text/plain", delivery_mode=2, headers={"hop": 1, "via": ["a", "b"]})


def drain(conn: ClientConnection) -> list[Event]:
    events = []
    while (event := conn.next_event()) is not None:
        events.append(event)
    return events


# --------------------------------------------------------------------------------------------
# Paired with the server's machine and a small broker: queues on the default exchange, confirms,
# deliveries to one consumer, returns of unroutable mandatory publishes.


class Paired:
    def __init__(self, params: ClientParams | None = None, password: str = "guest", **server: object) -> None:
        self.now = 1000.0
        self.client = ClientConnection(params or ClientParams(), self.now)
        self.server = ServerConnection(now=self.now, **server)  # type: ignore[arg-type]
        self.password = password
        self.server_events: list[object] = []
        self.queues: dict[str, list[tuple[BasicProperties, bytes]]] = {}
        self.consumer: tuple[str, str] | None = None  # (tag, queue)
        self.delivery_tag = 0
        self.confirming = False
        self.published = 0

    def pump(self) -> list[Event]:
        """Bytes both ways until neither side has any; the client's events."""
        events: list[Event] = []
        while True:
            data = self.client.data_to_send()
            if data:
                self.server.receive_data(data, self.now)
            self._serve()
            back = self.server.data_to_send(self.now)
            if back:
                self.client.receive_data(back, self.now)
            events += drain(self.client)
            if not data and not back:
                return events

    def _serve(self) -> None:
        server = self.server
        while (read := server.next_event()) is not None:
            for event in one_by_one(read):
                self._serve_one(event)

    def _serve_one(self, event: ServerEvent) -> None:
        server = self.server
        self.server_events.append(event)
        if isinstance(event, AuthenticationRequested):
            if event.password == self.password:
                server.accept_authentication()
            else:
                server.reject_authentication("bad password")
        elif isinstance(event, ContentReceived):
            self._published(event)
        elif isinstance(event, MethodReceived):
            self._method(event.method)

    def _method(self, m: spec.Method) -> None:
        send = self.server.send_method
        if isinstance(m, spec.QueueDeclare):
            if m.queue not in self.queues and m.passive:
                self.server.close_channel(
                    1, spec.NOT_FOUND, f"NOT_FOUND - no queue '{m.queue}' in vhost '/'", 50, 10
                )
                return
            messages = self.queues.setdefault(m.queue, [])
            send(1, spec.QueueDeclareOk(m.queue, len(messages), 0))
        elif isinstance(m, spec.QueueBind):
            send(1, spec.QueueBindOk())
        elif isinstance(m, spec.BasicQos):
            send(1, spec.BasicQosOk())
        elif isinstance(m, spec.ConfirmSelect):
            self.confirming = True
            send(1, spec.ConfirmSelectOk())
        elif isinstance(m, spec.BasicConsume):
            self.consumer = (m.consumer_tag or "amq.ctag-1", m.queue)
            send(1, spec.BasicConsumeOk(self.consumer[0]))
            self._deliver()

    def _published(self, event: ContentReceived) -> None:
        m = event.method
        assert isinstance(m, spec.BasicPublish)
        if m.routing_key in self.queues:
            self.queues[m.routing_key].append((event.properties, event.body))
        elif m.mandatory:
            method = spec.BasicReturn(spec.NO_ROUTE, "NO_ROUTE", m.exchange, m.routing_key)
            self.server.send_content(1, method, event.properties, event.body)
        if self.confirming:
            self.published += 1
            self.server.send_method(1, spec.BasicAck(self.published))
        self._deliver()

    def _deliver(self) -> None:
        if self.consumer is None:
            return
        tag, queue = self.consumer
        for props, body in self.queues[queue]:
            self.delivery_tag += 1
            self.server.send_content(
                1, spec.BasicDeliver(tag, self.delivery_tag, False, "", queue), props, body
            )
        self.queues[queue].clear()

    def received(self, kind: type[spec.Method]) -> list[spec.Method]:
        """The methods of ``kind`` the server's machine handed out."""
        return [
            e.method
            for e in self.server_events
            if isinstance(e, MethodReceived) and isinstance(e.method, kind)
        ]


def opened_pair(params: ClientParams | None = None, **server: object) -> Paired:
    pair = Paired(params, "guest", **server)
    (event,) = pair.pump()
    assert isinstance(event, Opened)
    assert pair.client.opened
    return pair


def test_handshake_with_the_server_machine() -> None:
    pair = Paired(ClientParams(connection_name="shovel orders", heartbeat=30), channel_max=100)
    events = pair.pump()
    assert len(events) == 1 and isinstance(events[0], Opened), events
    opened = events[0]
    assert (opened.frame_max, opened.heartbeat, opened.channel_max) == (131072, 30, 100)
    assert opened.server_properties["product"] == "Trimaran"
    (auth,) = [e for e in pair.server_events if isinstance(e, AuthenticationRequested)]
    assert (auth.mechanism, auth.username, auth.password, auth.locale) == ("PLAIN", "guest", "guest", "en_US")
    props = auth.client_properties
    assert props["product"] == "Trimaran" and props["platform"] == "Python"
    assert props["connection_name"] == "shovel orders"
    assert props["capabilities"] == {
        "publisher_confirms": True,
        "consumer_cancel_notify": True,
        "basic.nack": True,
        "connection.blocked": True,
        "authentication_failure_close": True,
    }
    assert (pair.server.frame_max, pair.server.heartbeat, pair.server.channel_max) == (131072, 30, 100)
    assert pair.server.open_channels == [1]
    assert pair.client.frame_max == 131072 and not pair.client.closed


def test_amqplain_when_the_server_offers_no_plain() -> None:
    pair = Paired(
        ClientParams(username="alice", password="wonderland"), password="wonderland", mechanisms=("AMQPLAIN",)
    )
    assert isinstance(pair.pump()[-1], Opened)
    (auth,) = [e for e in pair.server_events if isinstance(e, AuthenticationRequested)]
    assert (auth.mechanism, auth.username, auth.password) == ("AMQPLAIN", "alice", "wonderland")
    assert decode_table_contents(auth.response) == {"LOGIN": "alice", "PASSWORD": "wonderland"}


def test_requests_pipelined_are_answered_in_order() -> None:
    pair = opened_pair()
    c = pair.client
    c.declare_queue("orders", arguments={"x-max-length": 1000})
    c.bind_queue("orders", "amq.topic", "orders.#")
    c.qos(50)
    c.consume("orders", consumer_tag="shovel")
    assert pair.pump() == [
        QueueDeclared("orders", 0, 0),
        QueueBound("orders"),
        QosSet(50),
        ConsumeStarted("shovel"),
    ]
    (declare,) = pair.received(spec.QueueDeclare)
    assert isinstance(declare, spec.QueueDeclare)
    assert declare.durable and not declare.passive and declare.arguments == {"x-max-length": 1000}
    (bind,) = pair.received(spec.QueueBind)
    assert (bind.exchange, bind.routing_key) == ("amq.topic", "orders.#")  # type: ignore[attr-defined]
    (qos,) = pair.received(spec.BasicQos)
    assert qos.prefetch_count == 50  # type: ignore[attr-defined]
    (consume,) = pair.received(spec.BasicConsume)
    assert not consume.no_ack  # type: ignore[attr-defined]


def test_publish_confirm_consume_ack_round_trip() -> None:
    pair = opened_pair()
    c = pair.client
    c.declare_queue("q")
    assert c.publish("", "q", PROPS, b"before confirms") == 0
    c.select_confirms()
    sequences = [c.publish("", "q", PROPS, f"m{i}".encode()) for i in range(3)]
    assert sequences == [1, 2, 3] and c.unconfirmed == 3
    events = pair.pump()
    assert events == [
        QueueDeclared("q", 0, 0),
        ConfirmsSelected(),
        Confirmed(1, False, True),
        Confirmed(2, False, True),
        Confirmed(3, False, True),
    ]
    assert c.unconfirmed == 0
    c.qos(10)
    c.consume("q")
    events = pair.pump()
    assert events[:2] == [QosSet(10), ConsumeStarted("amq.ctag-1")]
    deliveries = events[2:]
    assert [d.body for d in deliveries] == [b"before confirms", b"m0", b"m1", b"m2"]  # type: ignore[union-attr]
    first = deliveries[0]
    assert isinstance(first, Delivered)
    assert (first.consumer_tag, first.delivery_tag, first.routing_key) == ("amq.ctag-1", 1, "q")
    assert first.properties == PROPS
    c.ack(1)
    c.nack(2, requeue=False)
    c.reject(3, requeue=True)
    c.ack(4, multiple=True)
    pair.pump()
    settled = [e.method for e in pair.server_events if isinstance(e, MethodReceived) and e.channel == 1]
    assert settled[-4:] == [
        spec.BasicAck(1, False),
        spec.BasicNack(2, False, False),
        spec.BasicReject(3, True),
        spec.BasicAck(4, True),
    ]


def test_mandatory_publish_unroutable_is_returned_then_confirmed() -> None:
    pair = opened_pair()
    c = pair.client
    c.select_confirms()
    pair.pump()
    assert c.publish("", "nowhere", PROPS, b"lost", mandatory=True) == 1
    assert pair.pump() == [
        Returned(spec.NO_ROUTE, "NO_ROUTE", "", "nowhere", PROPS, b"lost"),
        Confirmed(1, False, True),
    ]


def test_body_over_frame_max_goes_in_several_body_frames() -> None:
    pair = opened_pair(frame_max=4096)
    c = pair.client
    assert c.frame_max == 4096
    c.declare_queue("big")
    pair.pump()
    body = bytes(range(256)) * 40  # 10,240 bytes: three body frames of at most 4,088
    c.publish("", "big", PROPS, body)
    data = c.data_to_send()
    frames = frames_of(data)
    assert [type(f) for f in frames] == [MethodFrame, HeaderFrame, BodyFrame, BodyFrame, BodyFrame]
    assert [len(f.payload) for f in frames[2:]] == [4088, 4088, 2064]  # type: ignore[union-attr]
    pair.server.receive_data(data, pair.now)
    pair._serve()
    (content,) = [e for e in pair.server_events if isinstance(e, ContentReceived)]
    assert content.body == body and content.properties == PROPS


def test_passive_declare_of_a_missing_queue_closes_the_connection() -> None:
    pair = opened_pair()
    c = pair.client
    c.declare_queue("missing", passive=True)
    c.qos(1)  # pipelined behind it: never answered
    (closed,) = pair.pump()
    assert closed == Closed("NOT_FOUND 404: no queue 'missing' in vhost '/'", 404, True)
    assert c.closed and not c.opened
    # The client answered channel.close-ok and closed the connection; the server took both.
    assert isinstance(pair.server_events[-1], ConnectionClosed)
    assert pair.server_events[-1].reply_code == spec.REPLY_SUCCESS
    assert pair.server.closed


def test_wrong_password_is_an_authentication_failure() -> None:
    pair = Paired(ClientParams(password="nope"))
    (closed,) = pair.pump()
    assert isinstance(closed, Closed)
    assert closed.reason == "authentication failed: ACCESS_REFUSED 403: bad password"
    assert (closed.reply_code, closed.by_peer) == (403, True)
    assert pair.server.closed  # the client's close-ok ended the server's side


# --------------------------------------------------------------------------------------------
# Against scripted server frames.


def frames_of(data: bytes) -> list[Frame]:
    decoder = FrameDecoder(0)
    decoder.feed(data)
    frames = []
    while (frame := decoder.next_frame()) is not NEED_DATA:
        frames.append(frame)
    return frames


class Scripted:
    """The client and the frames a test writes for the server."""

    def __init__(self, params: ClientParams | None = None, now: float = 0.0) -> None:
        self.client = ClientConnection(params or ClientParams(heartbeat=0), now)
        assert self.client.data_to_send() == spec.PROTOCOL_HEADER

    def feed(self, data: bytes, now: float = 0.0) -> list[Event]:
        self.client.receive_data(data, now)
        return drain(self.client)

    def method(self, channel: int, method: spec.Method, now: float = 0.0) -> list[Event]:
        return self.feed(encode_method(channel, method), now)

    def sent(self) -> list[Frame]:
        return frames_of(self.client.data_to_send())

    def methods(self) -> list[tuple[int, spec.Method]]:
        return [(f.channel, f.method) for f in self.sent() if isinstance(f, MethodFrame)]

    def start(self, mechanisms: bytes = b"PLAIN AMQPLAIN") -> list[Event]:
        return self.method(0, spec.ConnectionStart(0, 9, {"product": "scripted"}, mechanisms, b"en_US"))


def opened(params: ClientParams | None = None, tune: tuple[int, int, int] = (2047, 131072, 0)) -> Scripted:
    s = Scripted(params)
    assert s.start() == []
    assert s.method(0, spec.ConnectionTune(*tune)) == []
    assert s.method(0, spec.ConnectionOpenOk()) == []
    (event,) = s.method(1, spec.ChannelOpenOk())
    assert isinstance(event, Opened)
    s.client.data_to_send()
    return s


@pytest.mark.parametrize(
    ("ours", "theirs", "expected"),
    [
        # (heartbeat, frame_max) asked for by the client, proposed by the server, negotiated
        ((60, 131072), (60, 131072), (60, 131072)),
        ((10, 131072), (60, 4096), (10, 4096)),
        ((60, 8192), (30, 131072), (30, 8192)),
        ((0, 0), (30, 131072), (30, 131072)),
        ((20, 65536), (0, 0), (20, 65536)),
        ((0, 0), (0, 0), (0, 0)),
    ],
)
def test_tune_negotiates_the_lower_non_zero_values(
    ours: tuple[int, int], theirs: tuple[int, int], expected: tuple[int, int]
) -> None:
    s = Scripted(ClientParams(heartbeat=ours[0], frame_max=ours[1]))
    s.start()
    s.client.data_to_send()
    s.method(0, spec.ConnectionTune(0, theirs[1], theirs[0]))
    assert s.methods() == [
        (0, spec.ConnectionTuneOk(2047, expected[1], expected[0])),
        (0, spec.ConnectionOpen("/", "", False)),
    ]
    s.method(0, spec.ConnectionOpenOk())
    assert s.methods() == [(1, spec.ChannelOpen())]
    (event,) = s.method(1, spec.ChannelOpenOk())
    assert event == Opened({"product": "scripted"}, expected[1], expected[0], 2047)
    assert (s.client.heartbeat, s.client.frame_max) == expected


@pytest.mark.parametrize(("server", "sent"), [(0, 2047), (100, 100), (65535, 2047)])
def test_tune_channel_max(server: int, sent: int) -> None:
    s = Scripted()
    s.start()
    s.client.data_to_send()
    s.method(0, spec.ConnectionTune(server, 131072, 0))
    (_, tune_ok), _open = s.methods()
    assert isinstance(tune_ok, spec.ConnectionTuneOk) and tune_ok.channel_max == sent


def test_start_ok_carries_plain_credentials_and_vhost() -> None:
    s = Scripted(ClientParams(username="alice", password="wonderland", vhost="plant"))
    s.start()
    ((channel, start_ok),) = s.methods()
    assert channel == 0 and isinstance(start_ok, spec.ConnectionStartOk)
    assert (start_ok.mechanism, start_ok.response, start_ok.locale) == (
        "PLAIN",
        b"\x00alice\x00wonderland",
        "en_US",
    )
    s.method(0, spec.ConnectionTune(0, 0, 0))
    assert s.methods()[1] == (0, spec.ConnectionOpen("plant", "", False))


def test_no_plain_nor_amqplain_closes_with_a_reason() -> None:
    s = Scripted()
    (closed,) = s.start(mechanisms=b"EXTERNAL")
    assert (
        isinstance(closed, Closed)
        and "neither PLAIN nor AMQPLAIN" in closed.reason
        and "EXTERNAL" in closed.reason
    )
    assert s.client.closed and s.client.data_to_send() == b""


def test_eof_after_start_ok_is_an_authentication_failure() -> None:
    s = Scripted()
    s.start()
    s.client.receive_eof()
    (closed,) = drain(s.client)
    assert isinstance(closed, Closed) and closed.reason.startswith("authentication failed")
    assert (closed.reply_code, closed.by_peer) == (None, True)


def test_vhost_refused_is_not_called_an_authentication_failure() -> None:
    s = Scripted()
    s.start()
    s.method(0, spec.ConnectionTune(0, 131072, 0))
    s.client.data_to_send()
    (closed,) = s.method(0, spec.ConnectionClose(530, "NOT_ALLOWED - vhost plant not found", 10, 40))
    assert closed == Closed("NOT_ALLOWED 530: vhost plant not found", 530, True)
    assert s.methods() == [(0, spec.ConnectionCloseOk())]


def test_a_server_that_refuses_the_protocol_header() -> None:
    s = Scripted()
    (closed,) = s.feed(b"AMQP\x00\x00\x09\x01")
    assert isinstance(closed, Closed) and "refused AMQP 0-9-1" in closed.reason
    assert s.client.data_to_send() == b""


@pytest.mark.parametrize("params", [ClientParams(frame_max=4095), ClientParams(heartbeat=65536)])
def test_params_out_of_range_are_refused(params: ClientParams) -> None:
    with pytest.raises(ValueError):
        ClientConnection(params, 0.0)


def test_calls_before_opened_raise_and_after_close_are_dropped() -> None:
    s = Scripted()
    with pytest.raises(spec.LocalProtocolError):
        s.client.publish("", "q", PROPS, b"x")
    with pytest.raises(spec.LocalProtocolError):
        s.client.declare_queue("q")
    s = opened()
    s.client.close(0.0)
    s.client.data_to_send()
    assert s.client.publish("", "q", PROPS, b"x") == 0
    s.client.ack(1)
    s.client.declare_queue("q")
    assert s.client.data_to_send() == b""


def delivery(tag: int, body: bytes, frame_max: int = 131072, props: BasicProperties = PROPS) -> bytes:
    return encode_content(
        1, spec.BasicDeliver("ctag", tag, tag % 2 == 0, "amq.topic", f"k.{tag}"), props, body, frame_max
    )


def stream() -> bytes:
    """Frames of every kind a consumer and publisher see, for cutting."""
    return b"".join(
        [
            delivery(1, b"hello"),
            HEARTBEAT_FRAME,
            delivery(2, b"", props=BasicProperties()),
            encode_content(1, spec.BasicReturn(312, "NO_ROUTE", "", "nowhere"), BasicProperties(), b"back"),
            encode_method(0, spec.ConnectionBlocked("low on memory")),
            encode_method(1, spec.BasicAck(2, True)),
            encode_method(0, spec.ConnectionUnblocked()),
            delivery(3, b"x" * 50),
        ]
    )


def confirming() -> Scripted:
    s = opened()
    s.client.select_confirms()
    assert s.method(1, spec.ConfirmSelectOk()) == [ConfirmsSelected()]
    for _ in range(2):
        s.client.publish("", "q", PROPS, b"p")
    s.client.data_to_send()
    return s


EXPECTED = [
    Delivered("ctag", 1, False, "amq.topic", "k.1", PROPS, b"hello"),
    Delivered("ctag", 2, True, "amq.topic", "k.2", BasicProperties(), b""),
    Returned(312, "NO_ROUTE", "", "nowhere", BasicProperties(), b"back"),
    Blocked("low on memory"),
    Confirmed(2, True, True),
    Unblocked(),
    Delivered("ctag", 3, False, "amq.topic", "k.3", PROPS, b"x" * 50),
]


def test_stream_in_one_piece() -> None:
    s = confirming()
    assert s.feed(stream()) == EXPECTED
    assert s.client.unconfirmed == 0 and not s.client.blocked


def test_stream_cut_at_every_byte() -> None:
    data = stream()
    for cut in range(len(data) + 1):
        s = confirming()
        assert s.feed(data[:cut]) + s.feed(data[cut:]) == EXPECTED, cut


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=12000), max_size=12))
def test_deliveries_over_several_body_frames_cut_anywhere(cuts: list[int]) -> None:
    body = bytes(range(256)) * 40
    data = delivery(1, body, frame_max=4096) + delivery(2, body[:5000], frame_max=4096)
    s = opened(tune=(0, 4096, 0))
    events: list[Event] = []
    start = 0
    for cut in [*sorted({min(c, len(data)) for c in cuts}), len(data)]:
        events += s.feed(data[start:cut])
        start = cut
    assert [(e.delivery_tag, e.body) for e in events] == [(1, body), (2, body[:5000])]  # type: ignore[union-attr]


def test_delivery_byte_by_byte() -> None:
    data = delivery(7, b"z" * 9000, frame_max=4096)
    s = opened(tune=(0, 4096, 0))
    events: list[Event] = []
    for i in range(len(data)):
        events += s.feed(data[i : i + 1])
    assert events == [Delivered("ctag", 7, False, "amq.topic", "k.7", PROPS, b"z" * 9000)]


def test_ack_nack_reject_frames() -> None:
    s = opened()
    c = s.client
    c.ack(5)
    c.ack(9, multiple=True)
    c.nack(10, multiple=True, requeue=False)
    c.nack(11)
    c.reject(12, requeue=False)
    assert s.methods() == [
        (1, spec.BasicAck(5, False)),
        (1, spec.BasicAck(9, True)),
        (1, spec.BasicNack(10, True, False)),
        (1, spec.BasicNack(11, False, True)),
        (1, spec.BasicReject(12, False)),
    ]
    with pytest.raises(spec.EncodeError):
        c.ack(-1)
    assert c.data_to_send() == b""


def test_confirm_sequence_numbers_single_multiple_and_nacks() -> None:
    s = opened()
    c = s.client
    c.select_confirms()
    assert [c.publish("", "q", PROPS, b"m") for _ in range(7)] == [1, 2, 3, 4, 5, 6, 7]
    assert c.unconfirmed == 7
    assert s.method(1, spec.ConfirmSelectOk()) == [ConfirmsSelected()]
    assert s.method(1, spec.BasicAck(2, True)) == [Confirmed(2, True, True)]
    assert c.unconfirmed == 5
    assert s.method(1, spec.BasicNack(5, False, False)) == [Confirmed(5, False, False)]  # out of order
    assert c.unconfirmed == 4
    assert s.method(1, spec.BasicAck(3, False)) == [Confirmed(3, False, True)]
    assert s.method(1, spec.BasicAck(3, False)) == []  # again: nothing new
    assert s.method(1, spec.BasicAck(1, True)) == []
    assert c.unconfirmed == 3
    assert s.method(1, spec.BasicNack(6, True, False)) == [Confirmed(6, True, False)]  # 4 and 6
    assert c.unconfirmed == 1
    assert s.method(1, spec.BasicAck(7, False)) == [Confirmed(7, False, True)]
    assert c.unconfirmed == 0
    assert c.publish("", "q", PROPS, b"m") == 8 and c.unconfirmed == 1


def test_a_confirm_of_a_publish_never_made_is_a_protocol_error() -> None:
    s = opened()
    s.client.select_confirms()
    s.client.publish("", "q", PROPS, b"m")
    s.method(1, spec.ConfirmSelectOk())
    s.client.data_to_send()
    (closed,) = s.method(1, spec.BasicAck(2, False))
    assert isinstance(closed, Closed) and closed.reply_code == spec.COMMAND_INVALID
    ((_, close),) = s.methods()
    assert isinstance(close, spec.ConnectionClose) and close.reply_code == spec.COMMAND_INVALID


def test_server_channel_close_answers_and_closes_the_connection() -> None:
    s = opened()
    s.client.declare_queue("q", passive=True)
    s.client.data_to_send()
    (closed,) = s.method(1, spec.ChannelClose(404, "NOT_FOUND - no queue 'q' in vhost '/'", 50, 10))
    assert closed == Closed("NOT_FOUND 404: no queue 'q' in vhost '/'", 404, True)
    assert s.methods() == [
        (1, spec.ChannelCloseOk()),
        (0, spec.ConnectionClose(200, "channel 1 closed by the server", 0, 0)),
    ]
    assert s.client.closed and s.client.next_deadline() is None
    assert s.method(0, spec.ConnectionCloseOk()) == []


def test_server_connection_close() -> None:
    s = opened()
    s.feed(delivery(1, b"first"))
    events = s.method(
        0, spec.ConnectionClose(320, "CONNECTION_FORCED - broker forced connection closure", 0, 0)
    )
    assert events == [Closed("CONNECTION_FORCED 320: broker forced connection closure", 320, True)]
    assert s.methods() == [(0, spec.ConnectionCloseOk())]
    s.client.receive_eof()
    assert drain(s.client) == []


def test_own_close_completes_with_close_ok() -> None:
    s = opened()
    s.client.close(50.0, 200, "shovel stopped")
    assert s.methods() == [(0, spec.ConnectionClose(200, "shovel stopped", 0, 0))]
    assert not s.client.opened and not s.client.closed
    assert s.client.next_deadline() == 50.0 + CLOSE_TIMEOUT
    assert s.feed(delivery(1, b"late")) == []  # discarded while closing
    assert s.method(0, spec.ConnectionCloseOk()) == [Closed("shovel stopped", 200, False)]
    assert s.client.closed


def test_own_close_without_close_ok_ends_on_time_or_eof() -> None:
    s = opened()
    s.client.close(50.0)
    s.client.tick(50.0 + CLOSE_TIMEOUT - 0.1)
    assert drain(s.client) == []
    s.client.tick(50.0 + CLOSE_TIMEOUT)
    (closed,) = drain(s.client)
    assert isinstance(closed, Closed) and "no close-ok" in closed.reason and closed.reply_code == 200
    s = opened()
    s.client.close(50.0)
    s.client.receive_eof()
    assert drain(s.client) == [Closed("closed", 200, False)]


def test_heartbeats_out_on_write_silence_and_time_out_on_read_silence() -> None:
    s = opened(ClientParams(heartbeat=10), tune=(0, 131072, 60))
    c = s.client
    assert c.heartbeat == 10 and c.next_deadline() == 5.0  # bytes last taken at 0
    c.tick(4.9)
    assert c.data_to_send() == b""
    c.tick(5.0)
    assert c.data_to_send() == HEARTBEAT_FRAME
    assert c.next_deadline() == 10.0
    assert s.feed(HEARTBEAT_FRAME, now=8.0) == []  # the server's beat: read silence from 8
    c.publish("", "q", PROPS, b"busy")  # written at 8, the caller's last time
    c.data_to_send()
    assert c.next_deadline() == 13.0
    c.tick(13.0)
    assert c.data_to_send() == HEARTBEAT_FRAME
    for now in (18.0, 23.0):
        c.tick(now)
        assert c.data_to_send() == HEARTBEAT_FRAME
    assert c.next_deadline() == 28.0  # 2 x 10 s after the server's last byte
    c.tick(27.9)
    assert drain(c) == [] and c.data_to_send() == b""
    c.tick(28.0)
    (closed,) = drain(c)
    assert isinstance(closed, Closed) and closed.reason.startswith("missed heartbeats")
    assert (closed.reply_code, closed.by_peer) == (None, False)
    assert c.next_deadline() is None


def test_no_heartbeats_when_negotiated_off() -> None:
    s = opened(ClientParams(heartbeat=0), tune=(0, 131072, 0))
    assert s.client.next_deadline() is None
    s.client.tick(1e6)
    assert s.client.data_to_send() == b"" and drain(s.client) == []


def test_open_deadline() -> None:
    s = Scripted(ClientParams(connect_timeout=10.0), now=100.0)
    assert s.client.next_deadline() == 110.0
    s.start()
    s.client.tick(109.9)
    assert drain(s.client) == []
    s.client.tick(110.0)
    (closed,) = drain(s.client)
    assert isinstance(closed, Closed) and "timed out opening" in closed.reason
    # Opened in time: no deadline left without heartbeats.
    assert opened().client.next_deadline() is None


def test_receive_eof_after_the_buffered_frames() -> None:
    s = opened()
    s.client.receive_data(delivery(1, b"last") + delivery(2, b"cut")[:10], 0.0)
    s.client.receive_eof("connection reset by peer")
    s.client.receive_eof()
    events = drain(s.client)
    assert events == [
        Delivered("ctag", 1, False, "amq.topic", "k.1", PROPS, b"last"),
        Closed("connection reset by peer", None, True),
    ]
    s = opened()
    s.client.receive_eof()
    assert drain(s.client) == [Closed("connection lost", None, True)]
    assert s.client.closed and drain(s.client) == []


def test_blocked_and_unblocked() -> None:
    s = opened()
    assert s.method(0, spec.ConnectionBlocked("low on memory")) == [Blocked("low on memory")]
    assert s.client.blocked and s.client.opened
    assert s.method(0, spec.ConnectionUnblocked()) == [Unblocked()]
    assert not s.client.blocked


def test_consumer_cancelled_by_the_broker() -> None:
    s = opened()
    assert s.method(1, spec.BasicCancel("ctag", False)) == [ConsumerCancelled("ctag")]
    assert s.methods() == [(1, spec.BasicCancelOk("ctag"))]
    assert s.method(1, spec.BasicCancel("other", True)) == [ConsumerCancelled("other")]
    assert s.methods() == []


def test_channel_flow_is_answered() -> None:
    s = opened()
    assert s.method(1, spec.ChannelFlow(False)) == []
    assert s.methods() == [(1, spec.ChannelFlowOk(False))]
    assert s.client.opened


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\x09\x00\x00\x00\x00\x00\x00\xce", spec.FRAME_ERROR),  # unknown frame type
        (b"\x01\x00\x01\x00\x00\x00\x04\x00\x3c\x00\x50\x00", spec.FRAME_ERROR),  # bad frame end
        (encode_method(1, spec.QueueDeclareOk("q", 0, 0)), spec.COMMAND_INVALID),  # nothing asked
        (encode_method(2, spec.ChannelOpenOk()), spec.CHANNEL_ERROR),  # a channel never opened
        (encode_method(0, spec.ConnectionStart()), spec.COMMAND_INVALID),  # not now
        (b"\x01\x00\x01\x00\x00\x00\x06\x00\x32\x00\x0b\x05q\xce", spec.SYNTAX_ERROR),  # truncated
        # a method where the content header belongs
        (
            encode_method(1, spec.BasicDeliver("c", 1)) + encode_method(1, spec.BasicAck(1)),
            spec.UNEXPECTED_FRAME,
        ),
        (
            encode_frame(HeaderFrame(0, 60, 0, BasicProperties())),
            spec.UNEXPECTED_FRAME,
        ),  # content on channel 0
        (encode_frame(BodyFrame(1, b"stray")), spec.UNEXPECTED_FRAME),  # a body without its method
    ],
)
def test_protocol_errors_close_the_connection(data: bytes, code: int) -> None:
    s = opened()
    events = s.feed(data)
    assert len(events) == 1 and isinstance(events[0], Closed), events
    closed = events[0]
    assert (closed.reply_code, closed.by_peer) == (code, False) and closed.reason.startswith("protocol error")
    ((channel, close),) = s.methods()
    assert channel == 0 and isinstance(close, spec.ConnectionClose) and close.reply_code == code
    assert s.feed(delivery(1, b"more")) == []


def test_a_body_longer_than_announced_is_a_frame_error() -> None:
    s = opened()
    method = encode_method(1, spec.BasicDeliver("c", 1, False, "", "k"))
    header = encode_frame(HeaderFrame(1, 60, 5, BasicProperties()))
    body = b"\x03\x00\x01\x00\x00\x00\x06abcdef\xce"
    (closed,) = s.feed(method + header + body)
    assert isinstance(closed, Closed) and closed.reply_code == spec.FRAME_ERROR
    assert "exceeds the announced 5" in closed.reason


def test_heartbeat_frame_on_the_wire_is_read_past() -> None:
    s = opened()
    assert s.feed(HEARTBEAT_FRAME * 3 + delivery(5, b"after")) == [
        Delivered("ctag", 5, False, "amq.topic", "k.5", PROPS, b"after")
    ]


# --------------------------------------------------------------------------------------------
# Over real sockets: a blocking driver feeding the machine.


class Driver:
    def __init__(self, port: int, params: ClientParams) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.conn = ClientConnection(params, time.monotonic())
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def wait(self, until: Callable[[list[Event]], bool], timeout: float = 15.0) -> list[Event]:
        """Events until ``until`` says enough (or the connection closed); the machine's timers run."""
        got = self._run(until, timeout)
        assert self.conn.closed or until(got), f"timed out waiting; got {got[-3:]}"
        return got

    def quiet(self, seconds: float) -> list[Event]:
        """The events of the next ``seconds``."""
        return self._run(lambda _got: False, seconds)

    def _run(self, until: Callable[[list[Event]], bool], timeout: float) -> list[Event]:
        got: list[Event] = []
        deadline = time.monotonic() + timeout
        while True:
            while (event := self.conn.next_event()) is not None:
                got.append(event)
            self.flush()
            now = time.monotonic()
            if self.conn.closed or until(got) or now >= deadline:
                return got
            wait = deadline - now
            timer = self.conn.next_deadline()
            if timer is not None:
                wait = max(0.0, min(wait, timer - now))
            readable, _, _ = select.select([self.sock], [], [], wait)
            if readable:
                try:
                    data = self.sock.recv(65536)
                except ConnectionError as exc:
                    self.conn.receive_eof(f"connection lost: {exc}")
                else:
                    if data:
                        self.conn.receive_data(data, time.monotonic())
                    else:
                        self.conn.receive_eof()
            self.conn.tick(time.monotonic())

    def close(self) -> list[Event]:
        self.conn.close(time.monotonic())
        events = self.wait(lambda got: any(isinstance(e, Closed) for e in got))
        self.sock.close()
        return events


def _last(kind: type[Event]) -> Callable[[list[Event]], bool]:
    return lambda got: bool(got) and isinstance(got[-1], kind)


@pytest.fixture(scope="module")
def trimaran_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    args = ["--mqtt", "off", "--mqtt-ws", "off", "--amqp", "127.0.0.1:0", "--http", "off"]
    workdir: Path = tmp_path_factory.mktemp("amqp091-client")
    with serving(RunningServer(args, cwd=workdir).start()) as server:
        yield server.ports["amqp"]


@pytest.fixture(scope="module")
def rabbitmq_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    why = rabbitmq.available()
    if why is not None:
        pytest.skip(why)
    try:
        with rabbitmq.rabbitmq_node(tmp_path_factory.mktemp("rabbitmq-client")) as port:
            yield port
    except RuntimeError as exc:
        pytest.skip(f"RabbitMQ did not start: {str(exc)[:200]}")


# RabbitMQ takes about 10 s to start: its side is in the slow suite.
@pytest.fixture(params=["trimaran", pytest.param("rabbitmq", marks=pytest.mark.slow)])
def broker_port(request: pytest.FixtureRequest) -> int:
    return int(request.getfixturevalue(f"{request.param}_port"))


def connect(port: int, **params: object) -> Driver:
    driver = Driver(port, ClientParams(connection_name="test_client", heartbeat=10, **params))  # type: ignore[arg-type]
    events = driver.wait(_last(Opened))
    assert isinstance(events[-1], Opened), events
    return driver


def test_publish_confirmed_then_consumed_in_order(broker_port: int) -> None:
    queue = f"client-{time.monotonic_ns()}"
    count = 500
    publisher = connect(broker_port)
    c = publisher.conn
    c.declare_queue(queue, durable=False)
    c.select_confirms()
    assert publisher.wait(_last(ConfirmsSelected))[-2:] == [QueueDeclared(queue, 0, 0), ConfirmsSelected()]
    props = BasicProperties(content_type="text/plain", delivery_mode=2, headers={"n": 1})
    sequences = [c.publish("", queue, props, f"message {i}".encode()) for i in range(count)]
    assert sequences == list(range(1, count + 1))
    confirms = publisher.wait(lambda _got: c.unconfirmed == 0)
    assert confirms and all(isinstance(e, Confirmed) and e.ok for e in confirms)
    assert max(e.sequence for e in confirms) == count  # type: ignore[union-attr]
    assert c.publish("", f"{queue}-nowhere", props, b"back", mandatory=True) == count + 1
    returned = publisher.wait(lambda _got: c.unconfirmed == 0)
    assert returned == [
        Returned(spec.NO_ROUTE, "NO_ROUTE", "", f"{queue}-nowhere", props, b"back"),
        Confirmed(count + 1, False, True),
    ]
    publisher.close()

    consumer = connect(broker_port)
    c = consumer.conn
    c.qos(50)
    c.consume(queue)
    events = consumer.wait(lambda got: sum(isinstance(e, Delivered) for e in got) >= 50)
    assert events[:2] == [QosSet(50), ConsumeStarted(events[1].consumer_tag)]  # type: ignore[union-attr]
    events += consumer.quiet(0.3)  # the prefetch holds the 51st back until an ack
    delivered = [e for e in events if isinstance(e, Delivered)]
    assert len(delivered) == 50
    c.ack(delivered[-1].delivery_tag, multiple=True)
    while len(delivered) < count:
        for event in consumer.wait(lambda got: bool(got)):
            assert isinstance(event, Delivered), event
            delivered.append(event)
            c.ack(event.delivery_tag)
    assert [d.body for d in delivered] == [f"message {i}".encode() for i in range(count)]
    assert all(d.properties.headers == {"n": 1} and not d.redelivered for d in delivered)
    c.declare_queue(queue, passive=True)  # every ack taken: the queue is empty
    (declared,) = consumer.wait(_last(QueueDeclared))
    assert declared == QueueDeclared(queue, 0, 1)
    closed = consumer.close()
    assert closed[-1] == Closed("closed", 200, False)


def test_wrong_password_is_refused_in_words(broker_port: int) -> None:
    driver = Driver(broker_port, ClientParams(password="not the password"))
    (closed,) = driver.wait(_last(Closed))
    assert isinstance(closed, Closed) and closed.reason.startswith("authentication failed"), closed
    assert closed.reply_code in (403, None)
    driver.sock.close()


def test_passive_declare_of_a_missing_queue(broker_port: int) -> None:
    driver = connect(broker_port)
    driver.conn.declare_queue("no-such-queue", passive=True)
    (closed,) = driver.wait(_last(Closed))
    assert isinstance(closed, Closed) and closed.reply_code == 404
    assert closed.reason.startswith("NOT_FOUND 404:") and "no-such-queue" in closed.reason, closed
    driver.sock.close()
