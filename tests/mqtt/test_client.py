"""The sans-IO MQTT client machine, paired with the server machine or fed its packets, without sockets."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.mqtt.mqtt_client import feed
from trimaran.mqtt.client import (
    Acknowledged,
    ClientConnection,
    ClientSession,
    Closed,
    Connected,
    Event,
    Received,
    Subscribed,
)
from trimaran.mqtt.codec import NEED_DATA, Decoder, encode
from trimaran.mqtt.connection import (
    ConnectRequest,
    MessageAcked,
    ServerConnection,
    ServerLimits,
    SubscribeRequest,
)
from trimaran.mqtt.events import Event as ServerEvent
from trimaran.mqtt.packets import (
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PublishRun,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionOptions,
)
from trimaran.mqtt.properties import Properties
from trimaran.mqtt.session import OutboundMessage

LEVELS = pytest.mark.parametrize("level", [4, 5])


def new_client(
    level: int,
    session: ClientSession | None = None,
    *,
    keep_alive: int = 60,
    clean_start: bool = False,  # a bridge's default: a session the remote may keep
    **options: Any,
) -> ClientConnection:
    connect = Connect(
        protocol_level=level, clean_start=clean_start, client_id="bridge", keep_alive=keep_alive
    )
    return ClientConnection(connect, session or ClientSession(), 0.0, **options)


def events(client: ClientConnection) -> list[Event]:
    found: list[Event] = []
    while (event := client.next_event()) is not None:
        found.append(event)
    return found


def remote(client: ClientConnection, *packets: Packet, now: float = 0.0) -> list[Event]:
    """The remote broker's packets in (encoded here), the client's events out."""
    client.receive_data(b"".join(encode(packet, client.level) for packet in packets), now)
    return events(client)


def sent(client: ClientConnection) -> list[Packet]:
    """What the client has queued, decoded."""
    decoder = Decoder(protocol_level=client.level)
    decoder.feed(client.data_to_send())
    packets: list[Packet] = []
    while (packet := decoder.next_packet()) is not NEED_DATA:
        assert not isinstance(packet, PublishRun)  # the decoder makes runs only when asked
        packets.append(packet)
    return packets


def connected(
    level: int, session: ClientSession | None = None, ack: ConnAck | None = None, **options: Any
) -> ClientConnection:
    """A client past its CONNACK (``ack``, a plain one by default), its CONNECT taken."""
    client = new_client(level, session, **options)
    client.data_to_send()
    (event,) = remote(client, ack or ConnAck())
    assert isinstance(event, Connected) and client.connected
    return client


def to_server(client: ClientConnection, server: ServerConnection, now: float = 0.0) -> list[ServerEvent]:
    return feed(server, client.data_to_send(), now)


def to_client(server: ServerConnection, client: ClientConnection, now: float = 0.0) -> list[Event]:
    client.receive_data(server.data_to_send(), now)
    return events(client)


def paired(
    level: int, limits: ServerLimits | None = None, **options: Any
) -> tuple[ClientConnection, ServerConnection]:
    """A client connected to the project's own server machine."""
    client = new_client(level, **options)
    server = ServerConnection(limits, now=0.0)
    (request,) = to_server(client, server)
    assert isinstance(request, ConnectRequest) and request.client_id == "bridge"
    server.accept()
    (event,) = to_client(server, client)
    assert isinstance(event, Connected) and not event.session_present
    return client, server


def closed(found: list[Event]) -> Closed:
    assert found and isinstance(found[-1], Closed), found
    return found[-1]


# --------------------------------------------------------------------------------------------- CONNECT


@LEVELS
def test_connect_is_queued_at_construction(level: int) -> None:
    connect = Connect(
        protocol_level=level, clean_start=False, keep_alive=30, client_id="b1", username="u", password=b"p"
    )
    client = ClientConnection(connect, ClientSession(), 0.0)
    assert not client.connected and not client.closed
    assert sent(client) == [connect]
    assert sent(client) == []  # taken once


@LEVELS
def test_connack_gives_connected(level: int) -> None:
    client = new_client(level)
    client.data_to_send()
    properties = Properties(assigned_client_identifier="x") if level == 5 else Properties()
    assert remote(client, ConnAck(True, 0, properties)) == [Connected(True, properties)]
    assert client.connected and client.next_event() is None


@pytest.mark.parametrize(
    ("level", "reason"),
    [
        (4, "the remote refused the connection: not authorized (0x05)"),
        (5, "the remote refused the connection: not authorized (0x87), no bridges here"),
    ],
)
def test_refused_connack_closes_naming_the_reason(level: int, reason: str) -> None:
    client = new_client(level)
    server = ServerConnection(now=0.0)
    to_server(client, server)
    server.reject(0x87, "no bridges here")
    assert to_client(server, client) == [Closed(reason, refused=True)]
    assert client.closed and client.next_event() is None


def test_no_connack_in_time_closes() -> None:
    client = new_client(4, connect_timeout=5.0)
    assert client.next_deadline() == 5.0
    client.tick(4.9)
    assert events(client) == []
    client.tick(5.0)
    assert events(client) == [Closed("no CONNACK in time")]
    assert client.next_deadline() is None


def test_packet_before_connack_closes() -> None:
    client = new_client(5)
    client.data_to_send()
    assert "before its CONNACK" in closed(remote(client, Publish("t", b"x"))).reason
    assert client.data_to_send() == b""


def test_v5_connack_limits_are_kept() -> None:
    limits = Properties(maximum_packet_size=30, maximum_qos=1, retain_available=0)
    client = connected(5, ack=ConnAck(False, 0, limits))
    assert (client.remote_max_packet_size, client.remote_maximum_qos) == (30, 1)
    assert not client.remote_retain_available
    assert client.fits(Publish("t", b"x" * 10)) and not client.fits(Publish("t", b"x" * 30))
    # A QoS 1 message before it has its packet identifier: its two bytes are counted.
    publish = Publish("t", b"x" * 19, qos=1)  # 2 fixed + 3 topic + 2 id + 1 properties + 19 = 27 <= 30
    assert client.fits(publish) and publish.packet_id is None
    assert not client.fits(Publish("t", b"x" * 23, qos=1))  # 31 > 30


@pytest.mark.parametrize("client_id", ["b", "b" * 200])  # remaining length in one byte, and two
def test_bridge_sets_bit_7_of_the_3_1_1_level_byte(client_id: str) -> None:
    connect = Connect(protocol_level=4, client_id=client_id)
    plain = encode(connect, 4)
    data = ClientConnection(connect, ClientSession(), 0.0, bridge=True).data_to_send()
    at = plain.index(b"\x00\x04MQTT") + 6
    assert plain[at] == 0x04 and data[at] == 0x84
    assert data[:at] == plain[:at] and data[at + 1 :] == plain[at + 1 :]
    assert ClientConnection(connect, ClientSession(), 0.0).data_to_send() == plain


# ---------------------------------------------------------------------------------- outbound QoS 1


@LEVELS
def test_qos1_publish_is_acknowledged_by_the_server(level: int) -> None:
    client, server = paired(level)
    packet_id = client.publish(Publish("a/b", b"x", qos=1), 1.0)
    assert packet_id == 1 and list(client.session.unacknowledged) == [1]
    (publish,) = to_server(client, server)
    assert isinstance(publish, Publish) and (publish.packet_id, publish.payload) == (1, b"x")
    server.ack_publish(1)
    assert to_client(server, client) == [Acknowledged(1, 0)]
    assert client.session.unacknowledged == {}


@LEVELS
def test_window_closes_at_max_inflight(level: int) -> None:
    client = connected(level, max_inflight=2)
    assert [client.publish(Publish("t", b"", qos=1), 0.0) for _ in range(2)] == [1, 2]
    assert not client.can_publish
    assert client.publish(Publish("t", b"q0"), 0.0) is None  # QoS 0 takes no place
    assert [p.packet_id for p in sent(client) if isinstance(p, Publish)] == [1, 2, None]
    assert remote(client, PubAck(2)) == [Acknowledged(2, 0)]
    assert client.can_publish and list(client.session.unacknowledged) == [1]
    assert remote(client, PubAck(2)) == []  # not ours any more


def test_v5_puback_refusal_is_reported() -> None:
    client = connected(5)
    client.publish(Publish("t", b"x", qos=1), 0.0)
    assert remote(client, PubAck(1, 0x87)) == [Acknowledged(1, 0x87)]
    assert client.session.in_flight == 0


def test_receive_maximum_lowers_the_window() -> None:
    client, _server = paired(5, ServerLimits(receive_maximum=1), max_inflight=10)
    assert client.max_inflight == 1
    client.publish(Publish("t", b"x", qos=1), 0.0)
    assert not client.can_publish


def test_not_connected_cannot_publish() -> None:
    client = new_client(4)
    assert not client.can_publish
    client.receive_eof()
    assert not client.can_publish


# ---------------------------------------------------------------------------------- outbound QoS 2


@LEVELS
def test_qos2_publish_with_the_server(level: int) -> None:
    client, server = paired(level)
    client.publish(Publish("t", b"x", qos=2), 0.0)
    (publish,) = to_server(client, server)
    assert isinstance(publish, Publish) and publish.qos == 2
    server.ack_publish(1)  # PUBREC
    assert to_client(server, client) == [Acknowledged(1, 0)]  # the message is the remote's now
    assert client.session.released == {1: None} and client.session.in_flight == 1
    assert to_server(client, server) == []  # the PUBREL; the server answers PUBCOMP
    assert to_client(server, client) == []
    assert client.session.released == {} and client.session.in_flight == 0


def test_repeated_pubrec_resends_pubrel_without_an_event() -> None:
    client = connected(5)
    client.publish(Publish("t", b"x", qos=2), 0.0)
    client.data_to_send()
    assert remote(client, PubRec(1)) == [Acknowledged(1, 0)]
    assert sent(client) == [PubRel(1)]
    assert remote(client, PubRec(1)) == []
    assert sent(client) == [PubRel(1)]
    assert remote(client, PubComp(1)) == []
    assert client.session.released == {} and sent(client) == []


def test_v5_pubrec_refusal_ends_the_exchange() -> None:
    client = connected(5)
    client.publish(Publish("t", b"x", qos=2), 0.0)
    client.data_to_send()
    assert remote(client, PubRec(1, 0x97)) == [Acknowledged(1, 0x97)]
    assert sent(client) == [] and client.session.in_flight == 0


# --------------------------------------------------------------------------------------- reconnect


@LEVELS
def test_session_present_resends_with_dup_in_the_order_first_sent(level: int) -> None:
    session = ClientSession(last_id=65534)  # ids 65535, 1, 2: the order sent is not the ids' order
    first = connected(level, session)
    for qos in (1, 2, 1):
        first.publish(Publish("t", bytes([qos]), qos=qos), 0.0)
    first.data_to_send()
    assert remote(first, PubRec(1)) == [Acknowledged(1, 0)]
    first.receive_eof()
    assert events(first) == [Closed("the remote closed the connection")]

    second = new_client(level, session)
    assert [type(p) for p in sent(second)] == [Connect]
    assert remote(second, ConnAck(True)) == [Connected(True, Properties())]
    assert sent(second) == [
        Publish("t", b"\x01", qos=1, dup=True, packet_id=65535),
        Publish("t", b"\x01", qos=1, dup=True, packet_id=2),
        PubRel(1),
    ]
    assert remote(second, PubAck(65535), PubAck(2), PubComp(1)) == [
        Acknowledged(65535, 0),
        Acknowledged(2, 0),
    ]
    assert session.in_flight == 0


@LEVELS
def test_new_session_resends_without_dup_and_forgets_qos2_state(level: int) -> None:
    session = ClientSession()
    first = connected(level, session)
    first.publish(Publish("t", b"a", qos=1), 0.0)
    first.publish(Publish("t", b"b", qos=2), 0.0)
    assert remote(first, PubRec(2))[0] == Acknowledged(2, 0)
    (received,) = remote(first, Publish("in", b"z", qos=2, packet_id=9))
    assert isinstance(received, Received) and session.receiving == {9: False}
    first.receive_eof()

    second = connected(level, session, ack=ConnAck(True))  # DUP set on the resend
    assert sent(second) == [Publish("t", b"a", qos=1, dup=True, packet_id=1), PubRel(2)]
    second.receive_eof()

    third = connected(level, session, ack=ConnAck(False))
    assert sent(third) == [Publish("t", b"a", qos=1, dup=False, packet_id=1)]
    assert session.released == {} and session.receiving == {}
    assert list(session.unacknowledged) == [1]


@LEVELS
def test_qos2_exactly_once_across_a_reconnect_with_the_server(level: int) -> None:
    client, server = paired(level, clean_start=False)
    client.publish(Publish("t", b"x", qos=2), 0.0)
    (publish,) = to_server(client, server)
    assert isinstance(publish, Publish)
    server.ack_publish(1)
    server.data_to_send()  # the PUBREC is lost with the connection
    server.receive_eof()
    client.receive_eof()
    stored = server.session

    again = new_client(level, client.session, clean_start=False)
    server = ServerConnection(now=1.0)
    (request,) = to_server(again, server, 1.0)
    assert isinstance(request, ConnectRequest)
    server.accept(stored, session_present=True)
    (event,) = to_client(server, again, 1.0)
    assert isinstance(event, Connected) and event.session_present
    assert to_server(again, server, 1.0) == []  # the DUP resend: known, answered PUBREC, not routed
    assert to_client(server, again, 1.0) == [Acknowledged(1, 0)]
    assert to_server(again, server, 1.0) == []  # PUBREL, answered PUBCOMP
    assert to_client(server, again, 1.0) == [] and again.session.in_flight == 0


# ----------------------------------------------------------------------------------------- inbound


@LEVELS
def test_inbound_qos1_is_acknowledged_when_the_caller_says(level: int) -> None:
    client = connected(level)
    (event,) = remote(client, Publish("t", b"x", qos=1, packet_id=5))
    assert isinstance(event, Received) and event.publish.payload == b"x"
    assert sent(client) == []
    client.acknowledge(event.publish, 1.0)
    assert sent(client) == [PubAck(5)]


@LEVELS
def test_inbound_qos2_with_the_server(level: int) -> None:
    client, server = paired(level)
    message = OutboundMessage("t", b"x", qos=2, tag="m")
    assert server.publish(message)
    (event,) = to_client(server, client)
    assert isinstance(event, Received) and event.publish.qos == 2
    packet_id = event.publish.packet_id
    assert packet_id is not None and client.session.receiving == {packet_id: False}
    assert client.data_to_send() == b""
    client.acknowledge(event.publish, 1.0)
    assert to_server(client, server) == []  # PUBREC; the server sends PUBREL
    assert to_client(server, client) == []  # PUBCOMP
    assert client.session.receiving == {}
    assert to_server(client, server) == [MessageAcked(packet_id, message, 0)]


def test_inbound_qos2_resend_is_not_handed_out_twice() -> None:
    client = connected(5)
    (event,) = remote(client, Publish("t", b"x", qos=2, packet_id=7))
    assert isinstance(event, Received)
    resend = Publish("t", b"x", qos=2, dup=True, packet_id=7)
    assert remote(client, resend) == [] and sent(client) == []  # not held yet: no answer
    client.acknowledge(event.publish, 0.0)
    assert sent(client) == [PubRec(7)]
    assert remote(client, resend) == [] and sent(client) == [PubRec(7)]  # held: PUBREC again
    assert remote(client, PubRel(7)) == [] and sent(client) == [PubComp(7)]
    assert client.session.receiving == {}
    (again,) = remote(client, Publish("t", b"y", qos=2, packet_id=7))  # a new message
    assert isinstance(again, Received) and again.publish.payload == b"y"


def test_late_qos2_acknowledge_in_a_new_session_is_not_sent() -> None:
    session = ClientSession()
    first = connected(4, session)
    (event,) = remote(first, Publish("t", b"old", qos=2, packet_id=7))
    assert isinstance(event, Received)
    first.receive_eof()
    second = connected(4, session, ack=ConnAck(False))  # the remote forgot the message
    second.acknowledge(event.publish, 1.0)  # held only now
    assert sent(second) == [] and session.receiving == {}
    (new,) = remote(second, Publish("t", b"new", qos=2, packet_id=7))  # not taken for the old one
    assert isinstance(new, Received) and new.publish.payload == b"new"


def test_acknowledge_while_reconnecting_answers_the_resend() -> None:
    session = ClientSession()
    first = connected(4, session)
    (event,) = remote(first, Publish("t", b"x", qos=2, packet_id=3))
    assert isinstance(event, Received)
    first.receive_eof()
    second = new_client(4, session)
    second.data_to_send()
    second.acknowledge(event.publish, 1.0)  # no CONNACK yet: nothing sent
    assert second.data_to_send() == b""
    assert remote(second, ConnAck(True), Publish("t", b"x", qos=2, dup=True, packet_id=3)) == [
        Connected(True, Properties())
    ]
    assert sent(second) == [PubRec(3)]


@LEVELS
def test_subscribe_gets_subscribed(level: int) -> None:
    client, server = paired(level)
    packet_id = client.subscribe([("a/#", SubscriptionOptions(1))], 0.0)
    (request,) = to_server(client, server)
    assert isinstance(request, SubscribeRequest) and request.packet_id == packet_id
    server.send_suback(packet_id, [1])
    assert to_client(server, client) == [Subscribed(packet_id, [1])]


# -------------------------------------------------------------------------------------- keep-alive


@LEVELS
def test_keep_alive_pings_and_closes_without_an_answer(level: int) -> None:
    client = connected(level, keep_alive=10)
    assert client.next_deadline() == 10.0
    client.publish(Publish("t", b"x"), 4.0)  # a packet sent puts the ping off
    client.data_to_send()
    assert client.next_deadline() == 14.0
    client.tick(13.9)
    assert client.data_to_send() == b""
    client.tick(14.0)
    assert sent(client) == [PingReq()]
    assert client.next_deadline() == 24.0
    assert remote(client, PingResp(), now=15.0) == []  # answered
    client.tick(24.0)
    assert sent(client) == [PingReq()] and events(client) == []
    client.tick(33.9)
    assert events(client) == []
    client.tick(34.0)
    assert "keep-alive" in closed(events(client)).reason
    assert client.next_deadline() is None


def test_any_bytes_received_clear_the_ping() -> None:
    client = connected(4, keep_alive=10)
    client.tick(10.0)
    assert sent(client) == [PingReq()]
    remote(client, Publish("t", b"x"), now=19.0)
    client.tick(20.0)
    assert sent(client) == [PingReq()] and not client.closed


def test_server_keep_alive_replaces_the_clients() -> None:
    client, _server = paired(5, ServerLimits(server_keep_alive=3), keep_alive=10)
    assert client.keep_alive == 3 and client.next_deadline() == 3.0


def test_keep_alive_0_never_pings() -> None:
    client = connected(4, keep_alive=0)
    assert client.next_deadline() is None
    client.tick(1e6)
    assert client.data_to_send() == b"" and not client.closed


# ----------------------------------------------------------------------------------------- closing


def test_remote_disconnect_names_its_code() -> None:
    client = connected(5)
    found = remote(client, Disconnect(0x8B, Properties(reason_string="shutting down")))
    assert found == [Closed("the remote disconnected (reason code 0x8B: shutting down)")]
    assert client.closed and client.data_to_send() == b""


def test_server_disconnect_closes_the_client() -> None:
    client, server = paired(5)
    server.disconnect(0x8B, "bye")
    assert to_client(server, client) == [Closed("the remote disconnected (reason code 0x8B: bye)")]


@LEVELS
def test_malformed_bytes_close(level: int) -> None:
    client = connected(level)
    client.receive_data(b"\x36\x02\x00\x00", 0.0)  # a PUBLISH at QoS 3
    assert closed(events(client)).reason.startswith("malformed packet from the remote")
    assert sent(client) == ([Disconnect(0x81)] if level == 5 else [])


@LEVELS
@pytest.mark.parametrize(
    "packet", [Connect(client_id="x"), Subscribe(1, [("a", SubscriptionOptions())]), PingReq()]
)
def test_packet_a_server_never_sends_closes(level: int, packet: Packet) -> None:
    client = connected(level)
    reason = closed(remote(client, packet)).reason
    assert reason == f"the remote sent {type(packet).__name__}, which a server never sends"
    assert sent(client) == ([Disconnect(0x82)] if level == 5 else [])


def test_too_large_packet_from_the_remote_closes() -> None:
    client = connected(5, max_packet_size=64)
    assert "malformed packet" in closed(remote(client, Publish("t", b"x" * 100))).reason
    assert sent(client) == [Disconnect(0x95)]


def test_eof_closes_and_nothing_follows() -> None:
    client = connected(4)
    client.receive_eof()
    assert events(client) == [Closed("the remote closed the connection")]
    assert client.closed and client.next_event() is None
    assert remote(client, Publish("t", b"x")) == []
    client.receive_eof()
    assert events(client) == []


def test_disconnect_sends_disconnect_and_closes() -> None:
    client = connected(5)
    client.disconnect(1.0)
    assert events(client) == [Closed("disconnected")]
    assert sent(client) == [Disconnect()]


# -------------------------------------------------------------------------------------- packet ids


def test_packet_ids_wrap_and_skip_those_in_flight() -> None:
    assert ClientSession(last_id=65535).next_id() == 1
    session = ClientSession(last_id=65534)
    session.unacknowledged[65535] = Publish("t", qos=1, packet_id=65535)
    session.unacknowledged[1] = Publish("t", qos=1, packet_id=1)
    session.released[2] = None
    assert session.next_id() == 3 and session.last_id == 3
    assert session.next_id() == 4


# ------------------------------------------------------------------------------------- byte splits


def remote_stream(level: int) -> bytes:
    properties = Properties(receive_maximum=5) if level == 5 else Properties()
    packets: list[Packet] = [
        ConnAck(False, 0, properties),
        Publish("in/" + "x" * 150, b"y" * 200, qos=1, packet_id=4),  # remaining length in two bytes
        PubAck(1),
        PubRec(2),
        Publish("in", b"", qos=2, packet_id=5),
        Publish("in", b"", qos=2, dup=True, packet_id=5),
        PubComp(2),
        SubAck(3, [0, 1]),
        PingResp(),
        Publish("in", b"0"),
        Disconnect(0x8B) if level == 5 else Disconnect(),
    ]
    return b"".join(encode(packet, level) for packet in packets)


def run_split(level: int, cuts: set[int]) -> tuple[list[Event], bytes]:
    """The remote's stream fed in pieces cut at ``cuts``, answered as a bridge would."""
    client = new_client(level)
    stream = remote_stream(level)
    found: list[Event] = []
    start = 0
    for end in [*sorted(cuts), len(stream)]:
        client.receive_data(stream[start:end], 0.0)
        while (event := client.next_event()) is not None:  # one at a time, answered as it comes
            found.append(event)
            if isinstance(event, Connected):  # ids 1, 2 and 3, which the acks name
                client.publish(Publish("out", b"1", qos=1), 0.0)
                client.publish(Publish("out", b"2", qos=2), 0.0)
                client.subscribe([("in/#", SubscriptionOptions(1))], 0.0)
            elif isinstance(event, Received):
                client.acknowledge(event.publish, 0.0)
        start = end
    return found, client.data_to_send()


@LEVELS
def test_one_byte_at_a_time_gives_the_same_events(level: int) -> None:
    whole = run_split(level, set())
    assert [type(event) for event in whole[0]] == [
        Connected,
        Received,
        Acknowledged,
        Acknowledged,
        Received,
        Subscribed,
        Received,
        Closed,
    ]
    assert run_split(level, set(range(1, len(remote_stream(level))))) == whole


@settings(max_examples=40, deadline=None)
@given(level=st.sampled_from([4, 5]), cuts=st.sets(st.integers(1, 600), max_size=40))
@example(level=5, cuts=set())
def test_any_byte_split_gives_the_same_events(level: int, cuts: set[int]) -> None:
    size = len(remote_stream(level))
    assert run_split(level, {cut for cut in cuts if cut < size}) == run_split(level, set())


def test_a_session_present_to_a_clean_start_closes() -> None:
    """MQTT-3.2.2-4: a client that asked for a new session and is told of an old one closes."""
    client = new_client(5, clean_start=True)
    client.data_to_send()
    (event,) = remote(client, ConnAck(True))
    assert isinstance(event, Closed) and "afresh" in event.reason
    assert client.closed


def test_a_publish_while_connecting_goes_once_at_the_connack() -> None:
    client = new_client(4)
    client.data_to_send()
    assert client.publish(Publish("t", b"x", qos=1), 0.0) == 1
    assert client.data_to_send() == b""
    remote(client, ConnAck(False))
    decoder = Decoder(protocol_level=4)
    decoder.feed(client.data_to_send())
    assert decoder.next_packet() == Publish("t", b"x", qos=1, packet_id=1)
    assert decoder.next_packet() is NEED_DATA
