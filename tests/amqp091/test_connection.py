import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.amqp091.amqp091_client import Client, amqplain
from trimaran.amqp091 import spec
from trimaran.amqp091.connection import RUN_MAX, ConnectionState, ServerConnection
from trimaran.amqp091.events import (
    AuthenticationRequested,
    ChannelClosed,
    ChannelFlowChanged,
    ChannelOpened,
    ConnectionClosed,
    ConnectionClosing,
    ConnectionOpened,
    ConnectionTuned,
    ContentReceived,
    ContentRun,
    Event,
    HeartbeatTimeout,
    MethodReceived,
    ProtocolHeaderRejected,
    SecureOkReceived,
)
from trimaran.amqp091.frames import (
    HEARTBEAT_FRAME,
    BodyFrame,
    HeaderFrame,
    MethodFrame,
    ProtocolHeader,
    encode_content,
    encode_frame,
    encode_method,
)
from trimaran.amqp091.properties import BasicProperties


def opened(channel: int = 1, **kw: object) -> Client:
    c = Client(ServerConnection(now=1000.0, **kw))  # type: ignore[arg-type]
    c.handshake()
    c.open_channel(channel)
    return c


def assert_connection_closing(c: Client, events: list[Event], code: int) -> spec.ConnectionClose:
    assert isinstance(events[-1], ConnectionClosing), events
    assert events[-1].reply_code == code
    ((ch, close),) = c.methods()
    assert ch == 0 and isinstance(close, spec.ConnectionClose) and close.reply_code == code
    assert c.server.state is ConnectionState.CLOSING
    return close


def assert_channel_closed(c: Client, events: list[Event], channel: int, code: int) -> None:
    ev = events[-1]
    assert isinstance(ev, ChannelClosed)
    assert (ev.channel, ev.reply_code, ev.by_peer) == (channel, code, False)
    ((ch, close),) = c.methods()
    assert ch == channel and isinstance(close, spec.ChannelClose) and close.reply_code == code


# --------------------------------------------------------------------------------------------
# Protocol header and handshake


def test_start_announces_properties_and_capabilities() -> None:
    c = Client()
    assert c.send(spec.PROTOCOL_HEADER[:3]) == []
    assert c.frames() == []
    c.send(spec.PROTOCOL_HEADER[3:])
    ((_ch, start),) = c.methods()
    assert isinstance(start, spec.ConnectionStart)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms == b"PLAIN AMQPLAIN" and start.locales == b"en_US"
    props = start.server_properties
    assert props["product"] == "Trimaran" and "version" in props and "platform" in props
    caps = props["capabilities"]
    assert isinstance(caps, dict)
    for cap in (
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "authentication_failure_close",
        "per_consumer_qos",
    ):
        assert caps[cap] is True


@pytest.mark.parametrize(
    ("header", "kind"),
    [
        (b"AMQP\x00\x01\x00\x00", ProtocolHeader.AMQP_1_0),
        (b"AMQP\x03\x01\x00\x00", ProtocolHeader.AMQP_1_0_SASL),
        (b"GET / HTTP/1.1\r\n", ProtocolHeader.NOT_AMQP),
    ],
)
def test_wrong_protocol_header_is_answered_with_ours_and_closed(header: bytes, kind: ProtocolHeader) -> None:
    c = Client()
    events = c.send(header)
    assert events[0] == ProtocolHeaderRejected(header[:8], kind)
    assert isinstance(events[1], ConnectionClosed)
    assert c.server.data_to_send() == spec.PROTOCOL_HEADER
    assert c.server.state is ConnectionState.CLOSED
    assert c.send(b"more") == []


def test_not_amqp_is_refused_before_eight_bytes() -> None:
    c = Client()
    assert isinstance(c.send(b"GE")[0], ProtocolHeaderRejected)


def test_plain_handshake_events() -> None:
    c = Client()
    events = c.start(client_properties={"product": "pika", "capabilities": {"basic.nack": True}})
    assert events == [
        AuthenticationRequested(
            "PLAIN",
            "guest",
            "guest",
            b"\x00guest\x00guest",
            {"product": "pika", "capabilities": {"basic.nack": True}},
            "en_US",
        )
    ]
    assert c.server.client_capabilities == {"basic.nack": True}
    c.server.accept_authentication()
    assert c.methods() == [(0, spec.ConnectionTune(2047, 131072, 60))]
    events = c.method(0, spec.ConnectionTuneOk(100, 8192, 30))
    assert events == [ConnectionTuned(100, 8192, 30)]
    events = c.method(0, spec.ConnectionOpen("/"))
    assert events == [ConnectionOpened("/")]
    assert c.methods() == [(0, spec.ConnectionOpenOk())]
    assert c.server.state is ConnectionState.OPEN
    assert (c.server.channel_max, c.server.frame_max, c.server.heartbeat) == (100, 8192, 30)


def test_handshake_pipelined_in_one_write() -> None:
    c = Client()
    c.start()
    c.server.accept_authentication()
    c.frames()
    data = encode_method(0, spec.ConnectionTuneOk(0, 0, 0)) + encode_method(0, spec.ConnectionOpen("/"))
    data += encode_method(1, spec.ChannelOpen())
    events = c.send(data)
    assert events == [ConnectionTuned(2047, 131072, 0), ConnectionOpened("/"), ChannelOpened(1)]


def test_amqplain() -> None:
    c = Client()
    (ev,) = c.start(mechanism="AMQPLAIN", response=amqplain("bob", "s3cret"))
    assert isinstance(ev, AuthenticationRequested)
    assert (ev.mechanism, ev.username, ev.password) == ("AMQPLAIN", "bob", "s3cret")


@pytest.mark.parametrize(
    ("mechanism", "response"),
    [
        ("PLAIN", b"guest\x00guest"),
        ("PLAIN", b"\x00gu\xffest\x00guest"),
        ("AMQPLAIN", b"\x05LOGINS\x00\x00"),
        ("AMQPLAIN", amqplain("bob", "x")[:-3]),
    ],
)
def test_malformed_credentials_close_with_403_when_client_supports_it(
    mechanism: str, response: bytes
) -> None:
    c = Client()
    events = c.start(
        mechanism, response, client_properties={"capabilities": {"authentication_failure_close": True}}
    )
    assert_connection_closing(c, events, spec.ACCESS_REFUSED)
    assert c.method(0, spec.ConnectionCloseOk())[-1].reply_code == spec.ACCESS_REFUSED
    assert c.server.state is ConnectionState.CLOSED


def test_rejected_login_without_capability_just_ends() -> None:
    c = Client()
    c.start()
    c.server.reject_authentication("bad password")
    events = c.events()
    assert events == [ConnectionClosed(spec.ACCESS_REFUSED, "ACCESS_REFUSED - bad password", 0, 0)]
    assert c.frames() == []


def test_rejected_login_with_capability_sends_close() -> None:
    c = Client()
    c.start(client_properties={"capabilities": {"authentication_failure_close": True}})
    c.server.reject_authentication("bad password")
    events = c.events()
    assert_connection_closing(c, events, spec.ACCESS_REFUSED)


def test_unknown_mechanism() -> None:
    c = Client()
    events = c.start(mechanism="EXTERNAL")
    assert_connection_closing(c, events, spec.COMMAND_INVALID)


def test_other_offered_mechanism_and_secure_round() -> None:
    c = Client(ServerConnection(mechanisms=("EXTERNAL", "PLAIN"), now=1000.0))
    (ev,) = c.start(mechanism="EXTERNAL", response=b"")
    assert isinstance(ev, AuthenticationRequested) and ev.username is None and ev.password is None
    c.server.send_challenge(b"who are you?")
    assert c.methods() == [(0, spec.ConnectionSecure(b"who are you?"))]
    assert c.method(0, spec.ConnectionSecureOk(b"me")) == [SecureOkReceived(b"me")]
    c.server.accept_authentication()
    assert isinstance(c.methods()[0][1], spec.ConnectionTune)


def test_decisions_outside_authentication_are_local_errors() -> None:
    c = Client()
    with pytest.raises(spec.LocalProtocolError):
        c.server.accept_authentication()
    c.handshake()
    with pytest.raises(spec.LocalProtocolError):
        c.server.send_challenge(b"x")


@pytest.mark.parametrize(
    "tune_ok",
    [
        spec.ConnectionTuneOk(4000, 4096, 0),  # channel_max above the server's 2047
        spec.ConnectionTuneOk(0, 1024, 0),  # frame_max below 4096
        spec.ConnectionTuneOk(0, 200000, 0),  # frame_max above the server's 131072
    ],
)
def test_tune_ok_out_of_bounds_is_not_allowed(tune_ok: spec.ConnectionTuneOk) -> None:
    c = Client()
    c.start()
    c.server.accept_authentication()
    c.frames()
    close = assert_connection_closing(c, c.method(0, tune_ok), spec.NOT_ALLOWED)
    assert (close.class_id, close.method_id) == (10, 31)


def test_tune_zero_means_server_limits() -> None:
    c = Client()
    c.handshake(channel_max=0, frame_max=0, heartbeat=0)
    assert (c.server.channel_max, c.server.frame_max) == (2047, 131072)


def test_vhost_refused_unless_configured() -> None:
    c = Client()
    c.start()
    c.server.accept_authentication()
    c.frames()
    c.method(0, spec.ConnectionTuneOk(0, 4096, 0))
    assert_connection_closing(c, c.method(0, spec.ConnectionOpen("/other")), spec.NOT_ALLOWED)

    c = Client(ServerConnection(virtual_hosts={"/", "/other"}, now=1000.0))
    assert ConnectionOpened("/other") in c.handshake(vhost="/other")
    c = Client(ServerConnection(virtual_hosts=None, now=1000.0))
    assert ConnectionOpened("anything") in c.handshake(vhost="anything")
    assert c.server.virtual_host == "anything"


def test_methods_out_of_order_during_handshake() -> None:
    c = Client()
    c.send(spec.PROTOCOL_HEADER)
    c.frames()
    assert_connection_closing(c, c.method(0, spec.ConnectionOpen("/")), spec.COMMAND_INVALID)

    c = Client()
    c.start()
    c.server.accept_authentication()
    c.frames()
    assert_connection_closing(c, c.method(1, spec.ChannelOpen()), spec.COMMAND_INVALID)


def test_server_properties_override() -> None:
    c = Client(
        ServerConnection(server_properties={"cluster_name": "x", "capabilities": {"extra": True}}, now=1000.0)
    )
    c.send(spec.PROTOCOL_HEADER)
    ((_, start),) = c.methods()
    assert isinstance(start, spec.ConnectionStart)
    assert start.server_properties["cluster_name"] == "x"
    caps = start.server_properties["capabilities"]
    assert isinstance(caps, dict) and caps["extra"] is True and caps["basic.nack"] is True


# --------------------------------------------------------------------------------------------
# Closing the connection


def test_client_closes_connection() -> None:
    c = opened()
    events = c.method(0, spec.ConnectionClose(200, "bye", 0, 0))
    assert events == [ConnectionClosed(200, "bye", 0, 0, by_peer=True)]
    assert c.methods() == [(0, spec.ConnectionCloseOk())]
    assert c.server.state is ConnectionState.CLOSED


def test_server_closes_connection_then_only_close_ok_counts() -> None:
    c = opened()
    c.server.close(spec.CONNECTION_FORCED, "shutting down")
    assert c.events() == [ConnectionClosing(320, "shutting down", 0, 0)]
    assert c.methods() == [(0, spec.ConnectionClose(320, "shutting down", 0, 0))]
    # Anything else is discarded, even garbage semantics.
    assert c.publish(1, b"late") == []
    assert c.method(1, spec.QueueDeclare()) == []
    assert c.method(5, spec.BasicAck()) == []
    assert c.frames() == []
    events = c.method(0, spec.ConnectionCloseOk())
    assert events == [ConnectionClosed(320, "shutting down", 0, 0, by_peer=False)]
    assert c.server.send_method(1, spec.BasicAck()) is False


def test_close_ok_follows_what_the_caller_sends_for_the_close_event() -> None:
    c = opened()
    c.server.receive_data(encode_method(0, spec.ConnectionClose(200, "bye", 0, 0)), c.now)
    event = c.server.next_event()
    assert event == ConnectionClosed(200, "bye", 0, 0, by_peer=True)
    assert not c.server.closed  # close-ok not queued yet: a confirm may still go first
    assert c.server.send_method(1, spec.BasicAck(1, False))
    assert c.server.next_event() is None
    assert c.server.closed
    assert c.methods() == [(1, spec.BasicAck(1, False)), (0, spec.ConnectionCloseOk())]


def test_crossing_connection_close() -> None:
    c = opened()
    c.server.close(spec.CONNECTION_FORCED, "bye")
    c.frames()
    events = c.method(0, spec.ConnectionClose(200, "me too", 0, 0))
    assert c.methods() == [(0, spec.ConnectionCloseOk())]
    assert isinstance(events[-1], ConnectionClosed) and c.server.state is ConnectionState.CLOSED


def test_close_ok_timeout() -> None:
    c = opened()
    c.server.close(spec.CONNECTION_FORCED, "bye")
    assert c.events() == [ConnectionClosing(320, "bye", 0, 0)]
    c.frames()
    deadline = c.server.next_deadline()
    assert deadline is not None
    assert c.tick(deadline - 0.1) == []
    assert c.tick(deadline) == [ConnectionClosed(320, "bye", 0, 0, by_peer=False)]


def test_end_of_stream() -> None:
    c = opened()
    c.server.receive_eof()
    (ev,) = c.events()
    assert isinstance(ev, ConnectionClosed) and ev.by_peer
    assert c.server.closed


def test_end_of_stream_comes_after_the_frames_already_buffered() -> None:
    c = opened()
    c.server.receive_data(encode_method(1, spec.BasicQos(0, 5, False)), c.now)
    c.server.receive_eof()
    events = c.events()
    assert events[0] == MethodReceived(1, spec.BasicQos(0, 5, False))
    assert isinstance(events[1], ConnectionClosed) and events[1].by_peer


def test_one_frame_at_a_time_a_method_before_channel_close_is_answered_first() -> None:
    c = opened()
    declare = spec.QueueDeclare(queue="q")
    c.server.receive_data(
        encode_method(1, declare) + encode_method(1, spec.ChannelClose(200, "", 0, 0)), c.now
    )
    assert c.server.next_event() == MethodReceived(1, declare)
    # The close is not read yet: the channel is still open for the answer.
    assert c.server.is_channel_open(1)
    assert c.server.send_method(1, spec.QueueDeclareOk("q", 0, 0))
    assert c.server.next_event() == ChannelClosed(1, 200, "", 0, 0)
    assert c.server.next_event() is None
    assert c.methods() == [(1, spec.QueueDeclareOk("q", 0, 0)), (1, spec.ChannelCloseOk())]


def test_frames_behind_start_ok_wait_for_the_login_decision() -> None:
    c = Client()
    c.send(spec.PROTOCOL_HEADER)
    c.frames()
    c.server.receive_data(
        encode_method(0, spec.ConnectionStartOk({}, "PLAIN", b"\x00guest\x00guest", "en_US"))
        + encode_method(0, spec.ConnectionTuneOk(0, 4096, 0)),
        c.now,
    )
    assert isinstance(c.server.next_event(), AuthenticationRequested)
    assert c.server.next_event() is None  # tune-ok waits until the login is decided
    c.server.accept_authentication()
    assert c.events() == [ConnectionTuned(2047, 4096, 0)]


def test_large_frame_before_authentication_is_refused() -> None:
    c = Client(ServerConnection(max_packet_size_unauthenticated=8192, now=1000.0))
    c.send(spec.PROTOCOL_HEADER)
    c.frames()
    big = spec.ConnectionStartOk({"x": "y" * 9000}, "PLAIN", b"\x00guest\x00guest", "en_US")
    events = c.method(0, big)
    assert isinstance(events[0], ConnectionClosing) and events[0].reply_code == spec.FRAME_ERROR
    assert c.server.closed


def test_large_frame_after_authentication_is_accepted() -> None:
    c = Client(ServerConnection(max_packet_size_unauthenticated=8192, now=1000.0))
    c.handshake(frame_max=131072)
    c.open_channel(1)
    events = c.publish(1, b"x" * 20000, frame_max=131072)
    assert isinstance(events[0], ContentReceived) and len(events[0].body) == 20000


def test_publishes_read_together_with_one_method_are_one_run() -> None:
    """Whole publishes of one channel with the same arguments, buffered together, are one event
    (up to RUN_MAX), in order, each with its own properties; another key, another channel or a
    publish not yet whole ends the run."""
    c = Client()
    c.handshake(frame_max=131072)
    c.open_channel(1)
    c.open_channel(2)
    to_q = spec.BasicPublish(routing_key="q")
    props = [BasicProperties(), BasicProperties(priority=1), BasicProperties()]

    def content(
        channel: int, body: bytes, method: spec.Method = to_q, p: BasicProperties | None = None
    ) -> bytes:
        return encode_content(channel, method, p or BasicProperties(), body, 131072)

    data = b"".join(content(1, b"a%d" % i, p=p) for i, p in enumerate(props))
    data += (
        content(1, b"other", spec.BasicPublish(routing_key="r")) + content(2, b"two") + content(1, b"last")
    )
    events = c.send(data)
    assert [type(e) for e in events] == [ContentRun, ContentReceived, ContentReceived, ContentReceived]
    run = events[0]
    assert isinstance(run, ContentRun) and run.channel == 1 and run.method == to_q
    assert [(p, b) for p, b, _e in run.contents] == [(p, b"a%d" % i) for i, p in enumerate(props)]
    assert [e.body for e in events[1:] if isinstance(e, ContentReceived)] == [b"other", b"two", b"last"]
    assert [e.body for e in run.each()] == [b"a0", b"a1", b"a2"]

    many = b"".join(content(1, b"%d" % i) for i in range(RUN_MAX + 1))
    whole, cut = many + content(1, b"x"), content(1, b"y")
    events = c.send(whole + cut[:-1])
    assert [len(e.contents) if isinstance(e, ContentRun) else 1 for e in events] == [RUN_MAX, 2]
    assert c.send(cut[-1:])[0] == ContentReceived(1, to_q, BasicProperties(), b"y")


def test_handshake_deadline() -> None:
    c = Client(ServerConnection(handshake_timeout=10, now=1000.0))
    c.start()
    assert c.server.next_deadline() == 1010.0
    assert c.tick(1009.9) == []
    (ev,) = c.tick(1010.0)
    assert isinstance(ev, ConnectionClosed) and "handshake" in ev.reply_text
    c = Client(ServerConnection(handshake_timeout=10, now=1000.0))
    c.handshake()
    assert c.server.next_deadline() is None


def test_frame_error_closes_at_once() -> None:
    c = opened()
    bad = encode_method(1, spec.BasicAck())[:-1] + b"\x00"
    events = c.send(bad + encode_method(1, spec.BasicAck()))
    assert isinstance(events[0], ConnectionClosing) and events[0].reply_code == spec.FRAME_ERROR
    assert isinstance(events[1], ConnectionClosed)
    assert [type(m) for _, m in c.methods()] == [spec.ConnectionClose]


def test_oversized_frame_refused_from_its_header() -> None:
    c = opened()  # frame_max 4096 negotiated by the test client
    events = c.send(b"\x03\x00\x01\x00\x01\x00\x00")  # body frame claiming 65536 bytes
    assert events[0].reply_code == spec.FRAME_ERROR


def test_syntax_error_in_arguments_is_a_connection_exception() -> None:
    c = opened()
    payload = encode_method(1, spec.BasicAck())[7:-1] + b"\x00"
    data = b"\x01\x00\x01" + len(payload).to_bytes(4, "big") + payload + b"\xce"
    close = assert_connection_closing(c, c.send(data), spec.SYNTAX_ERROR)
    assert (close.class_id, close.method_id) == (60, 80)


# --------------------------------------------------------------------------------------------
# Channels


def test_channel_open_close_by_client() -> None:
    c = opened(1)
    assert c.server.open_channels == [1]
    events = c.method(1, spec.ChannelClose(200, "done", 0, 0))
    assert events == [ChannelClosed(1, 200, "done", 0, 0, by_peer=True)]
    assert c.methods() == [(1, spec.ChannelCloseOk())]
    assert c.server.open_channels == []
    # The number can be used again.
    assert c.open_channel(1) == [ChannelOpened(1)]


def test_channel_open_twice_is_channel_error() -> None:
    c = opened(1)
    assert_connection_closing(c, c.method(1, spec.ChannelOpen()), spec.CHANNEL_ERROR)


@pytest.mark.parametrize(
    "data",
    [
        encode_method(3, spec.QueueDeclare()),
        encode_frame(HeaderFrame(3, 60, 1, BasicProperties())),
        encode_frame(BodyFrame(3, b"x")),
        encode_method(3, spec.ChannelCloseOk()),
    ],
)
def test_frames_on_a_channel_never_opened_are_channel_errors(data: bytes) -> None:
    c = opened(1)
    assert_connection_closing(c, c.send(data), spec.CHANNEL_ERROR)


def test_channel_max_limits_open_channels_not_their_numbers() -> None:
    """RabbitMQ's rule: channel_max is how many channels may be open; any number 1-65535 is fine."""
    c = Client()
    c.handshake(channel_max=2)
    assert c.open_channel(10) == [ChannelOpened(10)]
    assert c.open_channel(3000) == [ChannelOpened(3000)]
    assert_connection_closing(c, c.method(11, spec.ChannelOpen()), spec.NOT_ALLOWED)


def test_connection_method_on_a_channel_and_channel_method_on_zero() -> None:
    c = opened(1)
    assert_connection_closing(c, c.method(1, spec.ConnectionOpen()), spec.COMMAND_INVALID)
    c = opened(1)
    assert_connection_closing(c, c.method(0, spec.QueueDeclare()), spec.COMMAND_INVALID)
    c = opened(1)
    assert_connection_closing(c, c.send(encode_frame(BodyFrame(0, b"x"))), spec.UNEXPECTED_FRAME)


def test_server_only_methods_from_the_client_are_invalid() -> None:
    for method in (spec.QueueDeclareOk(), spec.ConnectionBlocked("x")):
        c = opened(1)
        assert_connection_closing(c, c.method(1, method), spec.COMMAND_INVALID)
    c = opened(1)
    assert_connection_closing(
        c, c.send(encode_content(1, spec.BasicDeliver(), None, b"")), spec.COMMAND_INVALID
    )


def test_methods_for_the_handler() -> None:
    c = opened(1)
    qd = spec.QueueDeclare(queue="q", durable=True, arguments={"x-max-length": 10})
    assert c.method(1, qd) == [MethodReceived(1, qd)]
    assert c.method(0, spec.ConnectionUpdateSecret(b"tok", "refresh")) == [
        MethodReceived(0, spec.ConnectionUpdateSecret(b"tok", "refresh"))
    ]
    assert c.server.send_method(1, spec.QueueDeclareOk("q", 0, 0))
    assert c.server.send_method(0, spec.ConnectionUpdateSecretOk())
    assert c.server.send_method(0, spec.ConnectionBlocked("low memory"))
    assert c.methods() == [
        (1, spec.QueueDeclareOk("q", 0, 0)),
        (0, spec.ConnectionUpdateSecretOk()),
        (0, spec.ConnectionBlocked("low memory")),
    ]


def test_channel_flow_from_client() -> None:
    c = opened(1)
    assert c.method(1, spec.ChannelFlow(active=False)) == [ChannelFlowChanged(1, False)]
    assert c.methods() == [(1, spec.ChannelFlowOk(active=False))]
    ch = c.server.channel(1)
    assert ch is not None and ch.flow_active is False


def test_channel_flow_from_server() -> None:
    c = opened(1)
    assert c.server.send_method(1, spec.ChannelFlow(active=False))
    assert c.methods() == [(1, spec.ChannelFlow(active=False))]
    assert c.method(1, spec.ChannelFlowOk(False)) == [MethodReceived(1, spec.ChannelFlowOk(False))]


def test_channel_exception_by_handler_discards_until_close_ok() -> None:
    c = opened(1)
    assert c.server.close_channel(1, spec.NOT_FOUND, "NOT_FOUND - no queue 'q'", 50, 10)
    assert c.methods() == [(1, spec.ChannelClose(404, "NOT_FOUND - no queue 'q'", 50, 10))]
    assert not c.server.is_channel_open(1)
    assert c.server.send_method(1, spec.BasicAck()) is False
    assert c.server.send_content(1, spec.BasicDeliver(), None, b"x") is False
    # Everything the client had in flight is dropped, content frames included.
    assert c.publish(1, b"x" * 10000) == []
    assert c.method(1, spec.QueueDeclare()) == []
    assert c.frames() == []
    assert c.method(1, spec.ChannelCloseOk()) == []
    assert 1 not in c.server.open_channels
    assert c.open_channel(1) == [ChannelOpened(1)]


def test_crossing_channel_close() -> None:
    c = opened(1)
    c.server.close_channel(1, spec.PRECONDITION_FAILED, "x")
    c.frames()
    assert c.method(1, spec.ChannelClose(200, "", 0, 0)) == []
    assert c.methods() == [(1, spec.ChannelCloseOk())]
    assert c.method(1, spec.ChannelCloseOk()) == []
    assert c.open_channel(1) == [ChannelOpened(1)]


def test_raise_error_routes_soft_and_hard() -> None:
    c = opened(1)
    c.server.raise_error(
        spec.ProtocolError(spec.NOT_FOUND, "no queue 'q'", channel=1, class_id=50, method_id=10)
    )
    assert c.methods() == [(1, spec.ChannelClose(404, "NOT_FOUND - no queue 'q'", 50, 10))]
    c.server.raise_error(spec.ProtocolError(spec.NOT_IMPLEMENTED, "immediate=true", channel=1))
    assert c.methods() == [(0, spec.ConnectionClose(540, "NOT_IMPLEMENTED - immediate=true", 0, 0))]


def test_send_misuse() -> None:
    c = opened(1)
    with pytest.raises(spec.LocalProtocolError):
        c.server.send_method(2, spec.BasicAck())  # never opened
    with pytest.raises(spec.LocalProtocolError):
        c.server.send_method(1, spec.QueueDeclare())  # client-only
    with pytest.raises(spec.LocalProtocolError):
        c.server.send_method(1, spec.BasicDeliver())  # has content
    with pytest.raises(spec.LocalProtocolError):
        c.server.send_content(1, spec.BasicAck(), None, b"")  # no content
    with pytest.raises(spec.LocalProtocolError):
        c.server.send_method(0, spec.BasicAck())
    with pytest.raises(spec.LocalProtocolError):
        c.server.send_method(1, spec.ConnectionBlocked())
    with pytest.raises(spec.EncodeError):
        c.server.send_method(1, spec.BasicConsumeOk("x" * 300))
    assert c.frames() == []


# --------------------------------------------------------------------------------------------
# Content


def test_publish_multi_frame_body() -> None:
    c = opened(1)
    body = bytes(range(256)) * 100  # 25600 bytes -> 7 body frames at frame_max 4096
    props = BasicProperties(content_type="application/json", headers={"h": 1}, delivery_mode=2)
    data = encode_content(1, spec.BasicPublish(exchange="amq.topic", routing_key="a.b"), props, body, 4096)
    assert data.count(b"\x03\x00\x01") >= 7
    events = c.send(data)
    assert events == [
        ContentReceived(1, spec.BasicPublish(exchange="amq.topic", routing_key="a.b"), props, body)
    ]


def test_publish_fed_byte_by_byte_and_interleaved_channels() -> None:
    c = opened(1)
    c.open_channel(2)
    a = encode_content(1, spec.BasicPublish(routing_key="a"), None, b"A" * 5000, 4096)
    b = encode_content(2, spec.BasicPublish(routing_key="b"), None, b"B" * 5000, 4096)
    # Split both into frames and interleave them frame by frame: legal across channels.
    from tests.amqp091.test_frames import decode_all

    fa, fb = decode_all(a), decode_all(b)
    data = b"".join(encode_frame(f) for pair in zip(fa, fb, strict=True) for f in pair)
    events = []
    for i in range(len(data)):
        events += c.send(data[i : i + 1])
    assert [(e.channel, e.method.routing_key, len(e.body)) for e in events] == [
        (1, "a", 5000),
        (2, "b", 5000),
    ]


def test_empty_body_completes_with_the_header() -> None:
    c = opened(1)
    (ev,) = c.publish(1, b"")
    assert isinstance(ev, ContentReceived) and ev.body == b""


@pytest.mark.parametrize(
    "after_publish",
    [
        encode_method(1, spec.BasicAck()),  # method instead of header
        encode_frame(BodyFrame(1, b"x")),  # body instead of header
    ],
)
def test_out_of_order_content_is_unexpected_frame(after_publish: bytes) -> None:
    c = opened(1)
    events = c.send(encode_method(1, spec.BasicPublish()) + after_publish)
    assert_connection_closing(c, events, spec.UNEXPECTED_FRAME)


def test_method_during_body_is_unexpected_frame() -> None:
    c = opened(1)
    data = encode_content(1, spec.BasicPublish(), None, b"x" * 10, 4096)[:-18]  # body frame missing
    close = assert_connection_closing(
        c, c.send(data + encode_method(1, spec.BasicAck())), spec.UNEXPECTED_FRAME
    )
    assert (close.class_id, close.method_id) == (60, 40)


def test_header_or_body_without_a_method() -> None:
    for f in (HeaderFrame(1, 60, 1, BasicProperties()), BodyFrame(1, b"x")):
        c = opened(1)
        assert_connection_closing(c, c.send(encode_frame(f)), spec.UNEXPECTED_FRAME)


def test_header_for_another_class() -> None:
    c = opened(1)
    data = encode_method(1, spec.BasicPublish()) + encode_frame(HeaderFrame(1, 50, 1, BasicProperties()))
    assert_connection_closing(c, c.send(data), spec.UNEXPECTED_FRAME)


def test_body_longer_than_announced() -> None:
    c = opened(1)
    data = encode_method(1, spec.BasicPublish()) + encode_frame(HeaderFrame(1, 60, 3, BasicProperties()))
    data += encode_frame(BodyFrame(1, b"ab")) + encode_frame(BodyFrame(1, b"cd"))
    assert_connection_closing(c, c.send(data), spec.FRAME_ERROR)


def test_body_above_max_size_is_a_channel_exception() -> None:
    c = opened(1, max_body_size=1000)
    c.open_channel(2)
    events = c.publish(1, b"x" * 5000)
    assert_channel_closed(c, events, 1, spec.PRECONDITION_FAILED)
    # The other channel is unaffected, the closed one discards until close-ok.
    assert c.publish(2, b"ok") == [
        ContentReceived(2, spec.BasicPublish(routing_key="rk"), BasicProperties(), b"ok")
    ]
    assert c.publish(1, b"y") == []
    c.method(1, spec.ChannelCloseOk())
    assert c.open_channel(1) == [ChannelOpened(1)]
    assert len(c.publish(1, b"z" * 1000)) == 1


def test_send_content_splits_by_negotiated_frame_max() -> None:
    c = opened(1)
    body = b"d" * 10000
    deliver = spec.BasicDeliver("ctag", 1, False, "", "q")
    assert c.server.send_content(1, deliver, BasicProperties(delivery_mode=2), body)
    frames = c.frames()
    assert frames[0] == MethodFrame(1, deliver)
    assert frames[1] == HeaderFrame(1, 60, 10000, BasicProperties(delivery_mode=2))
    sizes = [len(f.payload) for f in frames[2:] if isinstance(f, BodyFrame)]
    assert sizes == [4088, 4088, 1824]


# --------------------------------------------------------------------------------------------
# Heartbeats


def test_heartbeats_both_ways() -> None:
    c = Client()
    c.handshake(heartbeat=10)
    t0 = c.now
    server = c.server
    assert server.next_deadline() == t0 + 5  # send after heartbeat / 2 of silence
    assert c.tick(t0 + 4.9) == [] and server.data_to_send(t0 + 4.9) == b""
    assert c.tick(t0 + 5) == []
    assert server.data_to_send(t0 + 5) == HEARTBEAT_FRAME
    # The client's heartbeat keeps us alive.
    c.now = t0 + 15
    assert c.send(HEARTBEAT_FRAME) == []
    assert c.tick(t0 + 30) == []
    server.data_to_send(t0 + 30)
    events = c.tick(t0 + 35)
    assert isinstance(events[0], HeartbeatTimeout) and events[0].silent_for == 20
    assert isinstance(events[1], ConnectionClosed)
    assert server.next_deadline() is None


def test_a_pause_of_the_runtimes_restarts_the_missed_heartbeats_clock() -> None:
    """The runtime did not read the client (flow control): its heartbeats wait in the socket, so
    the clock starts again where the pause is said (``paused``); ours go out as before."""
    c = Client()
    c.handshake(heartbeat=10)
    t0 = c.now
    server = c.server
    server.paused(t0 + 19)
    assert c.tick(t0 + 25) == []  # 20 s after the last bytes, 6 s after the pause
    assert server.data_to_send(t0 + 25) == HEARTBEAT_FRAME
    server.paused(t0 + 1)  # an older time changes nothing
    events = c.tick(t0 + 39)
    assert isinstance(events[0], HeartbeatTimeout) and events[0].silent_for == 20


def test_has_data_to_send() -> None:
    c = Client()
    c.handshake()
    c.open_channel(1)
    server = c.server
    assert not server.has_data_to_send
    c.publish(1, b"hello")  # a plain publish is answered by nothing
    assert not server.has_data_to_send and server.data_to_send() == b""
    server.send_method(1, spec.BasicAck(1, False))
    assert server.has_data_to_send
    assert server.data_to_send() and not server.has_data_to_send


def test_no_heartbeat_when_disabled() -> None:
    c = Client()
    c.handshake(heartbeat=0)
    assert c.server.next_deadline() is None
    assert c.tick(c.now + 10_000) == []


# --------------------------------------------------------------------------------------------
# Fuzzing the machine: only events come out, never exceptions


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200), st.integers(1, 64))
def test_random_bytes_after_handshake_never_raise(data: bytes, chunk: int) -> None:
    c = opened(1)
    for i in range(0, len(data), chunk):
        c.send(data[i : i + chunk])
    c.server.data_to_send()


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_mutated_session_never_raises(data: st.DataObject) -> None:
    c = opened(1)
    script = encode_content(1, spec.BasicPublish(routing_key="x"), BasicProperties(), b"b" * 5000, 4096)
    script += encode_method(1, spec.BasicAck(3)) + encode_method(1, spec.ChannelClose(200, "", 0, 0))
    script += encode_method(0, spec.ConnectionClose(200, "", 0, 0))
    raw = bytearray(script)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    events = c.send(bytes(raw))
    c.server.data_to_send()
    closed = [e for e in events if isinstance(e, ConnectionClosed)]
    assert len(closed) <= 1


def test_long_non_ascii_error_texts_are_cut_to_a_shortstr() -> None:
    c = Client()
    c.start()
    c.server.accept_authentication()
    c.frames()
    c.method(0, spec.ConnectionTuneOk(0, 4096, 0))
    events = c.method(0, spec.ConnectionOpen("\u00e9" * 120))  # 240 bytes of vhost name
    close = assert_connection_closing(c, events, spec.NOT_ALLOWED)
    assert len(close.reply_text.encode()) <= 255

    c = opened(1)
    assert c.server.close_channel(1, spec.NOT_FOUND, "\u00e9" * 200)
    ((_, chclose),) = c.methods()
    assert isinstance(chclose, spec.ChannelClose) and chclose.reply_text == "\u00e9" * 127


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=120), st.sampled_from(["header", "start-ok", "tune-ok"]))
def test_random_bytes_during_handshake_never_raise(data: bytes, stage: str) -> None:
    c = Client()
    c.send(spec.PROTOCOL_HEADER)
    if stage != "header":
        c.method(0, spec.ConnectionStartOk({}, "PLAIN", b"\x00u\x00p", "en_US"))
        c.server.accept_authentication()
    if stage == "tune-ok":
        c.method(0, spec.ConnectionTuneOk(0, 4096, 0))
    c.send(data)
    c.server.data_to_send()


def test_send_dispatches_on_content() -> None:
    c = opened(1)
    assert c.server.send(1, spec.BasicQosOk())
    assert c.server.send(1, spec.BasicGetOk(1, False, "", "q", 0), BasicProperties(), b"abc")
    frames = c.frames()
    assert frames[0] == MethodFrame(1, spec.BasicQosOk())
    assert frames[-1] == BodyFrame(1, b"abc")


CLIENT_METHODS = sorted(
    (
        cls
        for cls in spec.METHODS.values()
        if cls.SENDER != "server" and cls.CLASS_ID not in (10, 20) and not cls.HAS_CONTENT
    ),
    key=lambda cls: cls.INDEX,
)


@pytest.mark.parametrize("cls", CLIENT_METHODS, ids=[cls.NAME for cls in CLIENT_METHODS])
def test_every_client_method_reaches_the_handler(cls: type[spec.Method]) -> None:
    c = opened(7)
    method = cls()
    assert c.method(7, method) == [MethodReceived(7, method)]
    assert c.frames() == []


def test_an_ack_is_read_as_any_method_wherever_it_comes() -> None:
    """basic.ack has a path of its own through the decoder (FrameDecoder.next_ack): the same
    event on an open channel, the same errors elsewhere."""
    c = opened(1)
    assert c.send(encode_method(1, spec.BasicAck(9, True))) == [MethodReceived(1, spec.BasicAck(9, True))]
    c = opened(1)
    assert_connection_closing(c, c.send(encode_method(3, spec.BasicAck(1))), spec.CHANNEL_ERROR)
    c = opened(1)
    assert_connection_closing(c, c.send(encode_method(0, spec.BasicAck(1))), spec.COMMAND_INVALID)
