"""The server-side MQTT state machine, paired with a small client, without sockets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.mqtt.mqtt_client import Client, answer, closed, connected, eof, feed, props, start, tick
from trimaran.mqtt.codec import encode
from trimaran.mqtt.connection import (
    ConnectionClosed,
    ConnectRequest,
    MessageAcked,
    MessageDropped,
    MessagesAcked,
    ServerConnection,
    ServerLimits,
    State,
    SubscribeRequest,
    UnsubscribeReceived,
)
from trimaran.mqtt.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
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
    UnsubAck,
    Unsubscribe,
    Will,
)
from trimaran.mqtt.reason_codes import ReasonCode
from trimaran.mqtt.session import OutboundMessage, Session

# --------------------------------------------------------------------------------------------- CONNECT


def test_first_packet_must_be_connect() -> None:
    server = ServerConnection(now=0.0)
    events = Client(server, 4).send(Publish("a", b"x"))
    assert closed(events).reason_code == 0x82
    assert server.data_to_send() == b""
    assert server.state == State.CLOSED
    assert feed(server, b"\xc0\x00", 1.0) == []  # everything after is ignored


@pytest.mark.parametrize("level", [3, 4])
def test_unsupported_legacy_level_gets_return_code_1(level: int) -> None:
    server, _, events = start(ServerLimits(supported_levels=frozenset({5})), level)
    assert closed(events).reason_code == 0x84
    assert server.data_to_send() == bytes.fromhex("20020001")


def test_unsupported_level_5_gets_0x84() -> None:
    _server, client, events = start(ServerLimits(supported_levels=frozenset({4})), 5)
    assert closed(events).reason_code == 0x84
    (ack,) = client.received()
    assert isinstance(ack, ConnAck) and ack.reason_code == 0x84


def test_unknown_protocol_level_gets_3_1_1_connack() -> None:
    server = ServerConnection(now=0.0)
    events = feed(server, bytes.fromhex("100e00044d5154540702003c00026331"), 0.0)
    assert closed(events).reason_code == 0x84
    assert server.data_to_send() == bytes.fromhex("20020001")


def test_malformed_connect_closes_without_answer() -> None:
    server = ServerConnection(now=0.0)
    events = feed(server, bytes.fromhex("100e00044d5154540403003c00026331"), 0.0)
    assert closed(events).reason_code == 0x81
    assert server.data_to_send() == b""


def test_empty_client_id_3_1_1_persistent_session_is_rejected() -> None:
    _server, client, events = start(level=4, client_id="", clean_start=False)
    assert closed(events).reason_code == 0x85
    assert client.received() == [ConnAck(False, 0x02)]


def test_empty_client_id_3_1_is_rejected() -> None:
    _, client, events = start(level=3, client_id="")
    assert closed(events).reason_code == 0x85
    assert client.received() == [ConnAck(False, 0x02)]


def test_empty_client_id_3_1_1_clean_session_gets_an_id() -> None:
    server, client, events = start(level=4, client_id="")
    (request,) = events
    assert isinstance(request, ConnectRequest) and request.client_id_assigned and request.client_id
    answer(
        server,
        server.accept,
    )
    assert client.received() == [ConnAck(False, 0)]  # 3.1.1 cannot tell the client its id
    assert server.client_id == request.client_id


def test_empty_client_id_5_is_assigned_and_returned() -> None:
    server, client, events = start(client_id="", clean_start=False)
    (request,) = events
    assert isinstance(request, ConnectRequest) and request.client_id_assigned
    answer(
        server,
        server.accept,
    )
    (ack,) = client.received()
    assert isinstance(ack, ConnAck)
    assert ack.properties.assigned_client_identifier == request.client_id


def test_client_id_too_long() -> None:
    _, client, events = start(ServerLimits(max_client_id_length=5), client_id="x" * 6)
    assert closed(events).reason_code == 0x85
    assert client.received() == [ConnAck(False, 0x85, props(reason_string="client identifier too long"))]


def test_reject_maps_to_3_1_1_return_codes() -> None:
    server, client, _ = start(level=4)
    events = answer(server, server.reject, 0x86)
    assert closed(events).reason_code == 0x86
    assert client.received() == [ConnAck(False, 4)]
    server, client, _ = start(level=5)
    answer(server, server.reject, 0x87, "go away")
    assert client.received() == [ConnAck(False, 0x87, props(reason_string="go away"))]
    assert server.closed


def test_connack_advertises_limits() -> None:
    limits = ServerLimits(
        receive_maximum=10,
        maximum_qos=1,
        retain_available=False,
        max_packet_size=1000,
        topic_alias_maximum=4,
        wildcard_subscription_available=False,
        subscription_identifier_available=False,
        shared_subscription_available=False,
    )
    _, _, ack = connected(limits)
    assert ack.properties == props(
        receive_maximum=10,
        maximum_qos=1,
        retain_available=0,
        maximum_packet_size=1000,
        topic_alias_maximum=4,
        wildcard_subscription_available=0,
        subscription_identifier_available=0,
        shared_subscription_available=0,
    )


def test_connack_with_default_limits_only_says_topic_alias_maximum() -> None:
    _, _, ack = connected()
    assert ack.properties == props(topic_alias_maximum=16)
    _, _, ack = connected(level=4)
    assert ack == ConnAck(False, 0)


def test_packets_sent_before_connack_are_read_after_accept() -> None:
    server = ServerConnection(now=0.0)
    client = Client(server, 5)
    events = client.send(Connect(protocol_level=5, client_id="c"), Publish("a", b"1"), PingReq())
    assert len(events) == 1 and isinstance(events[0], ConnectRequest)
    events = answer(
        server,
        server.accept,
    )
    assert events == [Publish("a", b"1")]
    assert [type(p) for p in client.received()] == [ConnAck, PingResp]


def test_second_connect_is_a_protocol_error() -> None:
    _server, client, _ = connected()
    events = client.send(Connect(protocol_level=5, client_id="c1"))
    assert closed(events).reason_code == 0x82
    (disconnect,) = client.received()
    assert isinstance(disconnect, Disconnect) and disconnect.reason_code == 0x82
    assert disconnect.properties.reason_string


def test_protocol_error_in_3_1_1_closes_without_bytes() -> None:
    server, client, _ = connected(level=4)
    events = client.send_bytes(bytes.fromhex("6002 0001"))  # PUBREL with flags 0
    assert closed(events).reason_code == 0x81
    assert closed(events).publish_will
    assert server.data_to_send() == b""


def test_server_only_packets_from_client_are_protocol_errors() -> None:
    _server, client, _ = connected()
    assert closed(client.send(PingResp())).reason_code == 0x82


def test_auth_is_refused() -> None:
    _, client, events = start(properties=props(authentication_method="SCRAM-SHA-1"))
    assert closed(events).reason_code == 0x8C
    (ack,) = client.received()
    assert isinstance(ack, ConnAck) and ack.reason_code == 0x8C
    _server, client, _ = connected()
    assert closed(client.send(Auth(0x19, props(authentication_method="x")))).reason_code == 0x82


def test_will_checks() -> None:
    _, _client, events = start(ServerLimits(maximum_qos=1), will=Will("w", b"", 2))
    assert closed(events).reason_code == 0x9B
    _, _, events = start(ServerLimits(retain_available=False), will=Will("w", b"", 0, True))
    assert closed(events).reason_code == 0x9A
    _, _, events = start(will=Will("w/#", b""))
    assert closed(events).reason_code == 0x90


# ------------------------------------------------------------------------------------------ keep alive


def test_keep_alive_deadline_is_one_and_a_half_times() -> None:
    server, client, _ = connected(keep_alive=10)
    assert server.next_deadline() == 15.0
    assert tick(server, 14.9) == []
    client.now = 10.0
    client.send(PingReq())
    assert client.received() == [PingResp()]
    assert server.next_deadline() == 25.0
    events = tick(server, 25.0)
    assert closed(events).reason_code == 0x8D and closed(events).publish_will
    (disconnect,) = client.received()
    assert isinstance(disconnect, Disconnect) and disconnect.reason_code == 0x8D
    assert server.next_deadline() is None


def test_a_pause_of_the_runtimes_restarts_the_keep_alive() -> None:
    """The runtime did not read the client (flow control) until ``paused``: its PINGREQ may be
    waiting in the socket, so its keep alive starts again there."""
    server, _client, _ = connected(keep_alive=10)
    server.paused(14.0)
    assert server.next_deadline() == 29.0
    assert tick(server, 28.9) == []
    assert closed(tick(server, 29.0)).reason_code == 0x8D


def test_keep_alive_zero_has_no_deadline() -> None:
    server, _, _ = connected(keep_alive=0)
    assert server.next_deadline() is None
    assert tick(server, 1e9) == []


def test_connect_timeout() -> None:
    server = ServerConnection(ServerLimits(connect_timeout=5.0), now=100.0)
    assert server.next_deadline() == 105.0
    assert tick(server, 104.0) == []
    events = tick(server, 105.0)
    assert not closed(events).publish_will
    assert server.data_to_send() == b""


@pytest.mark.parametrize(("asked", "told"), [(0, 30), (100, 30), (20, None)])
def test_server_keep_alive(asked: int, told: int | None) -> None:
    server, _, ack = connected(ServerLimits(server_keep_alive=30), keep_alive=asked)
    assert ack.properties.server_keep_alive == told
    assert server.keep_alive == (told or asked)
    assert server.next_deadline() == server.keep_alive * 1.5


def test_legacy_keep_alive_is_not_lowered_but_none_is_capped() -> None:
    server, _, _ = connected(ServerLimits(server_keep_alive=30), level=4, keep_alive=100)
    assert server.keep_alive == 100  # 3.1.1 cannot be told: lowering it would close a good client
    server, _, _ = connected(ServerLimits(server_keep_alive=30), level=4, keep_alive=0)
    assert server.keep_alive == 30  # no keep alive at all: closed after 1.5 x the cap of silence
    assert server.next_deadline() is not None


def test_a_connect_larger_than_the_unauthenticated_limit_is_refused() -> None:
    server = ServerConnection(ServerLimits(max_packet_size_unauthenticated=128), now=0.0)
    big = Connect(protocol_level=5, client_id="c", password=b"x" * 200)
    events = feed(server, encode(big, 5), 0.0)
    assert closed(events).reason_code == ReasonCode.PACKET_TOO_LARGE
    # After the login the full limit applies.
    server, client, _ = connected(ServerLimits(max_packet_size_unauthenticated=128), level=5)
    (event,) = client.send(Publish("a/b", b"x" * 1000))
    assert isinstance(event, Publish)


def test_topic_length_levels_and_subscriptions_are_bounded() -> None:
    limits = ServerLimits(max_topic_length=10, max_topic_levels=3, max_subscriptions=2)
    _, client, _ = connected(limits, level=5)
    filters = ["a/b/c/d", "x" * 11, "a", "b", "c"]
    (event,) = client.send(Subscribe(1, [(f, SubscriptionOptions(0)) for f in filters]))
    assert isinstance(event, SubscribeRequest)
    assert event.preset == [0x8F, 0x8F, None, None, 0x97]
    events = client.send(Publish("a/b/c/d", b"x"))
    assert closed(events).reason_code == ReasonCode.TOPIC_NAME_INVALID


# ------------------------------------------------------------------------------------- inbound publish


def test_plain_qos0_publishes_to_one_topic_are_one_run_when_asked() -> None:
    _, client, _ = connected(ServerLimits(publish_runs=True), level=5)
    run = [Publish("a/b", b"%d" % i) for i in range(5)]
    qos2 = Publish("a/b", b"q", qos=2, packet_id=1)
    events = client.send(*run, Publish("a/b", b"q", qos=1, packet_id=1), qos2, *run[:2])
    assert [type(e) for e in events] == [PublishRun, PublishRun, Publish, PublishRun]
    first, qos1, _, last = events
    assert isinstance(first, PublishRun) and isinstance(last, PublishRun) and isinstance(qos1, PublishRun)
    assert (first.topic, first.count, last.count, qos1.count, qos1.qos) == ("a/b", 5, 2, 1, 1)
    assert client.server.stats.packets_received == 9 + 1  # and the CONNECT


def test_a_qos1_run_is_acked_whole_once_the_hull_says_so() -> None:
    server, client, _ = connected(ServerLimits(publish_runs=True), level=4)
    (run,) = client.send(*[Publish("a/b", b"%d" % i, 1, packet_id=i + 7) for i in range(4)])
    assert isinstance(run, PublishRun) and (run.count, run.qos) == (4, 1)
    assert client.received() == []  # not before the hull routed them
    server.ack_run(run)
    assert client.received() == [PubAck(i + 7) for i in range(4)]


def test_a_walked_qos1_run_is_each_publish_on_its_own() -> None:
    server, client, _ = connected(ServerLimits(publish_runs=True), level=5)
    each = [Publish("$queue/q", b"%d" % i, 1, packet_id=i + 1) for i in range(3)]
    (run,) = client.send(*each)
    assert isinstance(run, PublishRun)
    server.walk_run(run)
    got = []
    while (event := server.next_event()) is not None:
        got.append(event)
        server.ack_publish(event.packet_id)  # type: ignore[attr-defined]
    assert got == each
    assert client.received() == [PubAck(1), PubAck(2), PubAck(3)]


def test_a_qos1_run_behind_unacknowledged_publishes_is_walked() -> None:
    """A resend of a PUBLISH still unacknowledged is delivered again (at least once), not held
    for the run's PUBACK: the run's PUBLISHes come one by one, as read alone."""
    server, client, _ = connected(ServerLimits(publish_runs=True), level=4)
    (first,) = client.send(Publish("$queue/q", b"a", 1, packet_id=1))
    assert isinstance(first, PublishRun)
    server.walk_run(first)
    assert server.next_event() == Publish("$queue/q", b"a", 1, packet_id=1)  # held: its commit runs
    assert server.next_event() is None
    events = client.send(*[Publish("a/b", b"%d" % i, 1, packet_id=i + 1) for i in range(2)])
    assert events == [Publish("a/b", b"0", 1, packet_id=1), Publish("a/b", b"1", 1, packet_id=2)]


@pytest.mark.parametrize("topic", ["a/+", "a/b/c/d"])
def test_a_run_to_a_bad_topic_closes_at_its_first_publish(topic: str) -> None:
    _, client, _ = connected(ServerLimits(publish_runs=True, max_topic_levels=3), level=5)
    events = client.send(*[Publish(topic, b"x")] * 3, PingReq())
    assert closed(events).reason_code == ReasonCode.TOPIC_NAME_INVALID
    assert len(events) == 1  # no PUBLISH of it was handed out, nor anything after it
    assert not any(isinstance(p, PingResp) for p in client.received())


def test_qos1_publish_is_acked_by_the_handler() -> None:
    server, client, _ = connected()
    (event,) = client.send(Publish("a/b", b"x", 1, packet_id=5))
    assert event == Publish("a/b", b"x", 1, packet_id=5)
    assert client.received() == []  # not before the handler says so
    server.ack_publish(5)
    assert client.received() == [PubAck(5)]
    server.ack_publish(5)  # a second ack is ignored
    assert client.received() == []


def test_qos1_refused_with_reason_code() -> None:
    server, client, _ = connected()
    client.send(Publish("a", b"x", 1, packet_id=5))
    server.ack_publish(5, 0x87, props(reason_string="no"))
    assert client.received() == [PubAck(5, 0x87, props(reason_string="no"))]


def test_request_problem_information_0_strips_reason_strings() -> None:
    server, client, _ = connected(properties=props(request_problem_information=0))
    client.send(Publish("a", b"x", 1, packet_id=5))
    server.ack_publish(5, 0x87, props(reason_string="no", user_properties=[("k", "v")]))
    assert client.received() == [PubAck(5, 0x87)]
    client.send(PingResp())  # protocol error: DISCONNECT may still carry a reason string
    (disconnect,) = client.received()
    assert isinstance(disconnect, Disconnect) and disconnect.properties.reason_string


def test_qos2_exactly_once() -> None:
    server, client, _ = connected()
    publish = Publish("a", b"x", 2, packet_id=7)
    assert client.send(publish) == [publish]
    # A resend before the handler acked: not a new message.
    assert client.send(Publish("a", b"x", 2, dup=True, packet_id=7)) == []
    server.ack_publish(7)
    assert client.received() == [PubRec(7)]
    # A resend after PUBREC: answered again, not delivered again.
    assert client.send(Publish("a", b"x", 2, dup=True, packet_id=7)) == []
    assert client.received() == [PubRec(7)]
    assert client.send(PubRel(7)) == []
    assert client.received() == [PubComp(7)]
    # The id is free again: the next PUBLISH with it is a new message.
    assert client.send(publish) == [publish]


def test_qos2_state_survives_reconnect() -> None:
    server, client, _ = connected(clean_start=False)
    client.send(Publish("a", b"x", 2, packet_id=9))
    server.ack_publish(9)
    assert client.received() == [PubRec(9)]
    assert server.session is not None
    stored = server.session.to_json()
    eof(server)
    _server2, client2, _ = connected(
        session=Session.from_json(stored), session_present=True, clean_start=False
    )
    assert client2.send(Publish("a", b"x", 2, dup=True, packet_id=9)) == []
    assert client2.received() == [PubRec(9)]
    client2.send(PubRel(9))
    assert client2.received() == [PubComp(9)]


def test_pubrel_for_unknown_id() -> None:
    _, client, _ = connected()
    client.send(PubRel(3))
    assert client.received() == [PubComp(3, 0x92)]


def test_a_qos2_resend_on_the_next_connection_waits_for_the_first_copy() -> None:
    """A QoS 2 PUBLISH whose connection ended before the hull acknowledged it (its commit runs): the
    session's next connection holds the client's resend, delivering nothing, and answers it once the
    first copy is acknowledged."""
    session = Session("c1", expiry_interval=60)
    first, client1, _ = connected(session=session)
    (event,) = client1.send(Publish("t", b"x", 2, packet_id=7))
    assert isinstance(event, Publish)
    assert [type(e) for e in eof(first)] == [ConnectionClosed]
    second, client2, _ = connected(session=session, session_present=True)
    assert client2.send(Publish("t", b"x", 2, dup=True, packet_id=7)) == []  # held, not received again
    assert client2.received() == []
    assert not second.settle_resend(8)  # nothing held under another id
    first.ack_publish(7)  # the first copy is committed, after its connection ended
    assert 7 in session.inbound_qos2 and not session.inbound_pending
    assert second.settle_resend(7)
    assert client2.received() == [PubRec(7)]
    assert client2.send(PubRel(7)) == []
    assert client2.received() == [PubComp(7)]
    assert not second.settle_resend(7)


def test_a_held_qos2_resend_whose_first_copy_is_refused_in_3_1_1_is_forgotten() -> None:
    """3.1.1 cannot refuse a PUBLISH: the held resend is dropped without an answer (the hull closes
    the connection), and the client's next resend is a new message."""
    session = Session("c1", expiry_interval=60)
    first, client1, _ = connected(level=4, session=session)
    client1.send(Publish("t", b"x", 2, packet_id=7))
    eof(first)
    second, client2, _ = connected(level=4, session=session, session_present=True)
    assert client2.send(Publish("t", b"x", 2, dup=True, packet_id=7)) == []
    first.ack_publish(7, ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
    assert second.settle_resend(7, ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
    assert client2.received() == [] and not session.inbound_pending and not session.inbound_qos2
    (again,) = client2.send(Publish("t", b"x", 2, dup=True, packet_id=7))
    assert isinstance(again, Publish)


def test_a_qos2_publish_is_pending_in_the_session_until_acknowledged() -> None:
    session = Session("c1", expiry_interval=60)
    server, client, _ = connected(session=session)
    client.send(Publish("t", b"x", 2, packet_id=3))
    assert session.inbound_pending == {3: None} and not session.inbound_qos2
    server.ack_publish(3, ReasonCode.QUOTA_EXCEEDED)  # refused: not pending, nor a duplicate later
    assert not session.inbound_pending and not session.inbound_qos2
    assert client.received() == [PubRec(3, ReasonCode.QUOTA_EXCEEDED)]


def test_qos2_refused_ends_the_flow() -> None:
    server, client, _ = connected()
    client.send(Publish("a", b"x", 2, packet_id=7))
    server.ack_publish(7, 0x97)
    assert client.received() == [PubRec(7, 0x97)]
    assert server.session is not None and not server.session.inbound_qos2


def test_receive_maximum_enforced() -> None:
    server, client, ack = connected(ServerLimits(receive_maximum=2))
    assert ack.properties.receive_maximum == 2
    client.send(Publish("a", b"", 1, packet_id=1), Publish("a", b"", 2, packet_id=2))
    server.ack_publish(1)
    client.send(Publish("a", b"", 1, packet_id=3))  # 2 and 3 unacknowledged: at the limit
    events = client.send(Publish("a", b"", 1, packet_id=4))
    assert closed(events).reason_code == 0x93
    assert client.received()[-1] == Disconnect(0x93, props(reason_string=closed(events).reason))


def test_receive_maximum_counts_qos2_until_pubcomp() -> None:
    server, client, _ = connected(ServerLimits(receive_maximum=1))
    client.send(Publish("a", b"", 2, packet_id=1))
    server.ack_publish(1)
    events = client.send(Publish("a", b"", 1, packet_id=2))
    assert closed(events).reason_code == 0x93


def test_maximum_qos_enforced_in_5_only() -> None:
    _, client, _ = connected(ServerLimits(maximum_qos=1))
    assert closed(client.send(Publish("a", b"", 2, packet_id=1))).reason_code == 0x9B
    _, client, _ = connected(ServerLimits(maximum_qos=1), level=4)
    assert client.send(Publish("a", b"", 2, packet_id=1)) == [Publish("a", b"", 2, packet_id=1)]


def test_retain_not_available() -> None:
    _, client, _ = connected(ServerLimits(retain_available=False))
    assert closed(client.send(Publish("a", b"", retain=True))).reason_code == 0x9A


def test_invalid_topic_names() -> None:
    _, client, _ = connected()
    assert closed(client.send(Publish("a/+", b""))).reason_code == 0x90
    _, client, _ = connected()
    assert closed(client.send(Publish("", b""))).reason_code == 0x82
    server, client, _ = connected(level=4)
    assert closed(client.send(Publish("", b""))).reason_code == 0x90
    assert server.data_to_send() == b""


def test_subscription_identifier_from_client_is_a_protocol_error() -> None:
    _, client, _ = connected()
    events = client.send(Publish("a", b"", properties=props(subscription_identifiers=[1])))
    assert closed(events).reason_code == 0x82


def test_inbound_topic_aliases() -> None:
    _, client, _ = connected(ServerLimits(topic_alias_maximum=2))
    (first,) = client.send(Publish("a/b", b"1", properties=props(topic_alias=1)))
    assert isinstance(first, Publish)
    assert first.topic == "a/b" and first.properties.topic_alias is None
    (second,) = client.send(Publish("", b"2", properties=props(topic_alias=1)))
    assert isinstance(second, Publish) and second.topic == "a/b"
    client.send(Publish("c", b"3", properties=props(topic_alias=1)))  # remap
    (third,) = client.send(Publish("", b"4", properties=props(topic_alias=1)))
    assert isinstance(third, Publish) and third.topic == "c"
    assert closed(client.send(Publish("", b"", properties=props(topic_alias=2)))).reason_code == 0x82


def test_topic_alias_above_maximum() -> None:
    _, client, _ = connected(ServerLimits(topic_alias_maximum=2))
    assert closed(client.send(Publish("a", b"", properties=props(topic_alias=3)))).reason_code == 0x94
    _, client, _ = connected(ServerLimits(topic_alias_maximum=0))
    assert closed(client.send(Publish("a", b"", properties=props(topic_alias=1)))).reason_code == 0x94


def test_inbound_packet_too_large() -> None:
    _server, client, ack = connected(ServerLimits(max_packet_size=100))
    assert ack.properties.maximum_packet_size == 100
    events = client.send_bytes(b"\x30\xe8\x07")  # only the header of a 1000 byte PUBLISH
    assert closed(events).reason_code == 0x95
    assert client.received() == [Disconnect(0x95, props(reason_string=closed(events).reason))]


# ------------------------------------------------------------------------------------ outbound publish


def test_qos0_publish() -> None:
    server, client, _ = connected(level=4)
    assert server.publish(OutboundMessage("a/b", b"x"))
    assert client.received() == [Publish("a/b", b"x")]


def test_outbound_window_follows_client_receive_maximum() -> None:
    server, client, _ = connected(properties=props(receive_maximum=2, topic_alias_maximum=0))
    for i in range(5):
        assert server.publish(OutboundMessage("t", bytes([i]), 1, tag=i))
    sent = client.received()
    assert [p.payload for p in sent if isinstance(p, Publish)] == [b"\x00", b"\x01"]
    first = sent[0]
    assert isinstance(first, Publish) and first.packet_id is not None
    (event,) = client.send(PubAck(first.packet_id))
    assert isinstance(event, MessagesAcked) and [m.tag for m in event.messages] == [0]
    (third,) = client.received()
    assert isinstance(third, Publish) and third.payload == b"\x02"
    assert server.session is not None
    assert len(server.session.inflight) == 2 and len(server.session.queue) == 2


def test_plain_acks_can_go_unreported() -> None:
    server, client, _ = connected(properties=props(topic_alias_maximum=0))
    server.report_plain_acks = False  # the hull settles only tagged deliveries
    assert server.publish(OutboundMessage("t", b"plain", 1))
    assert server.publish(OutboundMessage("t", b"tagged", 1, tag="q1"))
    plain, tagged = client.received()
    assert isinstance(plain, Publish) and isinstance(tagged, Publish)
    assert plain.packet_id and tagged.packet_id
    assert client.send(PubAck(plain.packet_id)) == []
    (event,) = client.send(PubAck(tagged.packet_id))
    assert isinstance(event, MessagesAcked) and [m.tag for m in event.messages] == ["q1"]
    assert server.session is not None and not server.session.inflight


def test_a_run_of_plain_pubacks_is_one_event() -> None:
    """PUBACKs read together finish their deliveries in one MessagesAcked, in the order they came;
    a PUBACK with a reason code, or any other packet, ends the run."""
    server, client, _ = connected(properties=props(topic_alias_maximum=0))
    for tag in range(6):
        assert server.publish(OutboundMessage("t", b"m", 1, tag=tag))
    ids = [p.packet_id for p in client.received() if isinstance(p, Publish)]
    assert len(ids) == 6 and all(ids)
    events = client.send(
        PubAck(ids[2]), PubAck(ids[0]), PubAck(4242), PubAck(ids[1]),  # 4242: unknown, ignored
        PingReq(),
        PubAck(ids[3], ReasonCode.UNSPECIFIED_ERROR),
        PubAck(ids[4]), PubAck(ids[4]),  # the repeat finds nothing in flight
    )  # fmt: skip
    assert [type(e) for e in events] == [MessagesAcked, MessageAcked, MessagesAcked]
    first, refused, last = events
    assert isinstance(first, MessagesAcked) and [m.tag for m in first.messages] == [2, 0, 1]
    assert isinstance(refused, MessageAcked) and refused.message.tag == 3 and refused.reason_code == 0x80
    assert isinstance(last, MessagesAcked) and [m.tag for m in last.messages] == [4]
    assert client.received() == [PingResp()]
    assert server.session is not None and list(server.session.inflight) == [ids[5]]
    assert server.stats.packets_received == 1 + 8  # the CONNECT, then every packet of the read


def test_legacy_window() -> None:
    server, client, _ = connected(ServerLimits(max_inflight_legacy=3), level=4)
    for _ in range(5):
        server.publish(OutboundMessage("t", b"", 2))
    assert len(client.received()) == 3


def test_qos2_outbound_flow() -> None:
    server, client, _ = connected()
    server.publish(OutboundMessage("t", b"x", 2, tag="m1"))
    (publish,) = client.received()
    assert isinstance(publish, Publish) and publish.qos == 2 and publish.packet_id
    pid = publish.packet_id
    assert client.send(PubRec(pid)) == []
    assert client.received() == [PubRel(pid)]
    assert client.send(PubRec(pid)) == []  # a repeated PUBREC gets the PUBREL again
    assert client.received() == [PubRel(pid)]
    (event,) = client.send(PubComp(pid))
    assert isinstance(event, MessageAcked) and event.message.tag == "m1"
    client.send(PubRec(4242))
    assert client.received() == [PubRel(4242, 0x92)]


def test_qos2_outbound_refused_by_pubrec_error() -> None:
    server, client, _ = connected()
    server.publish(OutboundMessage("t", b"x", 2))
    (publish,) = client.received()
    assert isinstance(publish, Publish) and publish.packet_id
    (event,) = client.send(PubRec(publish.packet_id, 0x80))
    assert isinstance(event, MessageAcked) and event.reason_code == 0x80
    assert client.received() == []


def test_inflight_is_resent_with_dup_on_reconnect() -> None:
    server, client, _ = connected(clean_start=False, properties=props(topic_alias_maximum=0))
    server.publish(OutboundMessage("t/1", b"one", 1, tag=1))
    server.publish(OutboundMessage("t/2", b"two", 2, properties=props(content_type="text/plain"), tag=2))
    one, two = client.received()
    assert isinstance(one, Publish) and isinstance(two, Publish)
    assert one.packet_id and two.packet_id
    client.send(PubRec(two.packet_id))
    assert client.received() == [PubRel(two.packet_id)]
    server.publish(OutboundMessage("t/3", b"three", 1, tag=3))
    three = client.received()[0]
    assert isinstance(three, Publish) and three.packet_id
    assert server.session is not None
    stored = server.session.to_dict()
    eof(server)

    server2, client2, _events = start(clean_start=False)
    assert answer(server2, server2.accept, Session.from_dict(stored), session_present=True) == []
    ack, *resent = client2.received()
    assert ack == ConnAck(True, 0, props(topic_alias_maximum=16))
    assert resent == [
        Publish("t/1", b"one", 1, dup=True, packet_id=one.packet_id),
        PubRel(two.packet_id),
        Publish("t/3", b"three", 1, dup=True, packet_id=three.packet_id),
    ]
    (event,) = client2.send(PubComp(two.packet_id))
    assert isinstance(event, MessageAcked) and event.message.tag == 2
    assert event.message.properties.content_type == "text/plain"


def test_queued_messages_wait_for_the_client() -> None:
    session = Session("c1")
    session.enqueue(OutboundMessage("t", b"queued", 1))
    server, client, _events = start(clean_start=False)
    answer(server, server.accept, session, session_present=True)
    _ack, publish = client.received()
    assert isinstance(publish, Publish) and publish.payload == b"queued" and not publish.dup


def test_session_present_false_for_3_1() -> None:
    _, client, _events = start(level=3, clean_start=False)
    server = client.server
    answer(server, server.accept, Session("c1"), session_present=True)
    assert client.received() == [ConnAck(False, 0)]


def test_outbound_packet_too_large_is_dropped_and_counted() -> None:
    server, client, _ = connected(properties=props(maximum_packet_size=50, topic_alias_maximum=0))
    assert not server.publish(OutboundMessage("t", bytes(100)))
    assert not server.publish(OutboundMessage("t", bytes(100), 1))
    assert server.publish(OutboundMessage("t", bytes(10)))
    assert server.stats.dropped_too_large == 2
    assert client.received() == [Publish("t", bytes(10))]


def test_queued_message_too_large_after_reconnect_counts_as_delivered() -> None:
    session = Session("c1")
    session.enqueue(OutboundMessage("t", bytes(100), 1, tag="big"))
    server, client, _ = start(clean_start=False, properties=props(maximum_packet_size=50))
    events = answer(server, server.accept, session, session_present=True)
    assert len(events) == 1 and isinstance(events[0], MessageDropped) and events[0].message.tag == "big"
    assert [type(p) for p in client.received()] == [ConnAck]
    assert not session.inflight and not session.queue


def test_oversized_reason_string_is_dropped_from_acks() -> None:
    server, client, _ = connected(properties=props(maximum_packet_size=20))
    client.send(Publish("a", b"", 1, packet_id=1))
    server.ack_publish(1, 0x80, props(reason_string="x" * 100))
    assert client.received() == [PubAck(1, 0x80)]


def test_outbound_topic_aliases() -> None:
    server, client, _ = connected(properties=props(topic_alias_maximum=2))
    for topic in ["a", "a", "b", "c", "a", "c"]:
        server.publish(OutboundMessage(topic, topic.encode()))
    packets = client.received()
    wire = [(p.topic, p.properties.topic_alias) for p in packets if isinstance(p, Publish)]
    assert wire == [("a", 1), ("", 1), ("b", 2), ("c", 1), ("a", 2), ("", 1)]
    # What the client resolves is what we meant.
    aliases: dict[int, str] = {}
    resolved = []
    for p in packets:
        assert isinstance(p, Publish) and p.properties.topic_alias is not None
        if p.topic:
            aliases[p.properties.topic_alias] = p.topic
        resolved.append(aliases[p.properties.topic_alias])
    assert resolved == [p.payload.decode() for p in packets if isinstance(p, Publish)]


def test_no_outbound_aliases_for_clients_without_them() -> None:
    server, client, _ = connected()
    server.publish(OutboundMessage("a", b""))
    server.publish(OutboundMessage("a", b""))
    assert client.received() == [Publish("a", b""), Publish("a", b"")]


def test_a_connected_session_queues_past_its_bound() -> None:
    """Connected, the session takes every QoS 1/2 message past its offline bound: the hull holds the
    publishers instead (handler.MqttEndpoint.deliver); only an offline session drops."""
    server, _client, _ = start(properties=props(receive_maximum=1))
    answer(server, server.accept, Session("c1", max_queued=2))
    results = [server.publish(OutboundMessage("t", b"", 1)) for _ in range(5)]
    assert results == [True] * 5  # 1 inflight + 4 queued
    assert server.stats.dropped_queue_full == 0
    assert server.session is not None and len(server.session.queue) == 4 and server.session.dropped == 0
    assert not server.session.enqueue(OutboundMessage("t", b"", 1))  # what an offline session does
    assert server.session.dropped == 1


# -------------------------------------------------------------------------------------- subscriptions


def test_subscribe_flow() -> None:
    server, client, _ = connected(ServerLimits(maximum_qos=1))
    (request,) = client.send(
        Subscribe(3, [("a/#", SubscriptionOptions(2)), ("a/#/b", SubscriptionOptions(0))],
                  props(subscription_identifiers=[7]))
    )  # fmt: skip
    assert isinstance(request, SubscribeRequest)
    assert request.preset == [None, 0x8F] and request.existed == [False, False]
    assert request.subscription_identifier == 7
    server.send_suback(3, [2, 0])
    assert client.received() == [SubAck(3, [1, 0x8F])]  # capped at maximum QoS 1; invalid filter
    assert server.session is not None
    sub = server.session.subscriptions["a/#"]
    assert sub.options.qos == 1 and sub.subscription_identifier == 7
    (again,) = client.send(Subscribe(4, [("a/#", SubscriptionOptions(0))]))
    assert isinstance(again, SubscribeRequest) and again.existed == [True]


def test_subscribe_refused_by_handler_in_3_1_1() -> None:
    server, client, _ = connected(level=4)
    client.send(Subscribe(1, [("a", SubscriptionOptions(1)), ("+/#/", SubscriptionOptions(1))]))
    server.send_suback(1, [0x87, 1])
    assert client.received() == [SubAck(1, [0x80, 0x80])]


def test_unavailable_subscription_features() -> None:
    limits = ServerLimits(
        wildcard_subscription_available=False,
        shared_subscription_available=False,
        subscription_identifier_available=False,
    )
    _server, client, _ = connected(limits)
    (request,) = client.send(
        Subscribe(1, [("a/+", SubscriptionOptions()), ("$share/g/a", SubscriptionOptions()),
                      ("a", SubscriptionOptions())])
    )  # fmt: skip
    assert isinstance(request, SubscribeRequest) and request.preset == [0xA2, 0x9E, None]
    events = client.send(Subscribe(2, [("a", SubscriptionOptions())], props(subscription_identifiers=[1])))
    assert closed(events).reason_code == 0xA1


def test_no_local_on_shared_subscription_is_a_protocol_error() -> None:
    _, client, _ = connected()
    events = client.send(Subscribe(1, [("$share/g/a", SubscriptionOptions(no_local=True))]))
    assert closed(events).reason_code == 0x82


def test_unsubscribe() -> None:
    server, client, _ = connected()
    client.send(Subscribe(1, [("a", SubscriptionOptions())]))
    server.send_suback(1, [0])
    client.received()
    (event,) = client.send(Unsubscribe(2, ["a", "b"]))
    assert event == UnsubscribeReceived(2, ["a", "b"], [True, False])
    assert client.received() == [UnsubAck(2, [0, 0x11])]
    server, client, _ = connected(level=4)
    client.send(Unsubscribe(2, ["a"]))
    assert client.received() == [UnsubAck(2)]


# ----------------------------------------------------------------------------------------- disconnect


def test_client_disconnect() -> None:
    server, client, _ = connected(will=Will("w", b"bye"))
    event = closed(client.send(Disconnect()))
    assert event.by_client and not event.publish_will and event.reason_code == 0
    assert server.closed and client.received() == []
    _, client, _ = connected(will=Will("w", b"bye"))
    assert closed(client.send(Disconnect(0x04))).publish_will


def test_disconnect_session_expiry_rules() -> None:
    server, client, _ = connected(properties=props(session_expiry_interval=60))
    client.send(Disconnect(0, props(session_expiry_interval=0)))
    assert server.session_expiry_interval == 0
    assert server.session is not None and server.session.expiry_interval == 0
    _, client, _ = connected()
    assert closed(client.send(Disconnect(0, props(session_expiry_interval=10)))).reason_code == 0x82


def test_server_disconnect() -> None:
    server, client, _ = connected()
    event = closed(answer(server, server.disconnect, 0x8E, "taken over"))
    assert event.reason_code == 0x8E and not event.by_client
    assert client.received() == [Disconnect(0x8E, props(reason_string="taken over"))]
    assert (
        answer(
            server,
            server.disconnect,
        )
        == []
    )


def test_connection_lost() -> None:
    server, _, _ = connected()
    event = closed(eof(server))
    assert event.by_client and event.publish_will
    assert eof(server) == []


def test_session_expiry_legacy() -> None:
    server, _, events = start(level=4, clean_start=False)
    assert isinstance(events[0], ConnectRequest) and events[0].session_expiry_interval == 0xFFFFFFFF
    server, _, events = start(
        ServerLimits(maximum_session_expiry=3600), properties=props(session_expiry_interval=10**6)
    )
    assert isinstance(events[0], ConnectRequest) and events[0].session_expiry_interval == 3600
    answer(
        server,
        server.accept,
    )
    _, ack = None, Client(server).received()[0]
    assert isinstance(ack, ConnAck) and ack.properties.session_expiry_interval == 3600


def test_legacy_persistent_session_is_capped_too() -> None:
    """limits.max_session_expiry also ends 3.1.1 Clean Session 0 sessions (Mosquitto's
    persistent_client_expiration): a client id that never comes back is not kept for ever."""
    _, _, events = start(ServerLimits(maximum_session_expiry=60), level=4, clean_start=False)
    assert isinstance(events[0], ConnectRequest) and events[0].session_expiry_interval == 60


# --------------------------------------------------------------------------------------------- hostile


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([3, 4, 5]), st.binary(max_size=120), st.lists(st.integers(1, 50), max_size=4))
def test_garbage_after_connect_never_raises(level: int, junk: bytes, cuts: list[int]) -> None:
    server, client, events = start(level=level)
    answer(
        server,
        server.accept,
    )
    client.received()
    pos = 0
    events = []
    for cut in [*cuts, len(junk)]:
        events += feed(server, junk[pos : pos + cut], 1.0)
        pos += cut
    events += feed(server, junk[pos:], 1.0)
    for event in events:
        if isinstance(event, ConnectionClosed):
            assert server.closed
    server.data_to_send()
    tick(server, 1e9)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=80))
def test_garbage_instead_of_connect_never_raises(junk: bytes) -> None:
    server = ServerConnection(now=0.0)
    feed(server, junk, 0.0)
    server.data_to_send()


def test_encoded_connect_vector_is_what_the_client_sends() -> None:
    assert encode(Connect(client_id="c1"), 4).hex() == "100e00044d5154540402003c00026331"


def test_publish_encoded_for_fan_out() -> None:
    server, client, _ = connected(properties=props(maximum_packet_size=30))
    data = encode(Publish("a/b", b"shared"), 5)
    assert server.publish_encoded(data)
    assert not server.publish_encoded(encode(Publish("a/b", bytes(40)), 5))
    assert server.stats.dropped_too_large == 1
    assert client.received() == [Publish("a/b", b"shared")]
    answer(
        server,
        server.disconnect,
    )
    assert not server.publish_encoded(data)


class FakeClock:
    def __init__(self) -> None:
        self.time = 1000.0

    def __call__(self) -> float:
        return self.time


def _connected_with_clock(**connect: object) -> tuple[ServerConnection, Client, FakeClock]:
    clock = FakeClock()
    server = ServerConnection(now=0.0, clock=clock)
    client = Client(server, 5)
    client.send(Connect(protocol_level=5, client_id="c", **connect))  # type: ignore[arg-type]
    answer(
        server,
        server.accept,
    )
    client.received()
    return server, client, clock


def test_message_expiry_interval_is_the_time_left() -> None:
    server, client, clock = _connected_with_clock()
    assert server.publish(OutboundMessage("t", b"", 1, expires_at=clock.time + 59.2))
    (publish,) = client.received()
    assert isinstance(publish, Publish) and publish.properties.message_expiry_interval == 60


def test_expired_messages_are_not_sent() -> None:
    server, client, clock = _connected_with_clock(properties=props(receive_maximum=1))
    assert not server.publish(OutboundMessage("t", b"", 0, expires_at=clock.time - 1))
    assert server.publish(OutboundMessage("t", b"first", 1))
    assert server.publish(OutboundMessage("t", b"second", 1, expires_at=clock.time + 5, tag="late"))
    (first,) = client.received()
    assert isinstance(first, Publish) and first.packet_id
    clock.time += 10  # the queued message expires while waiting for the window
    acked, dropped = client.send(PubAck(first.packet_id))
    assert isinstance(acked, MessagesAcked)
    assert isinstance(dropped, MessageDropped) and dropped.message.tag == "late"
    assert dropped.reason == "expired"
    assert client.received() == []
    assert server.stats.dropped_expired == 2


def test_expired_inflight_message_is_still_resent() -> None:
    clock = FakeClock()
    session = Session("c")
    session.enqueue(OutboundMessage("t", b"x", 1, expires_at=clock.time + 1))
    entry = session.next_to_send(1)
    assert entry is not None
    entry.sent = True
    clock.time += 100
    server = ServerConnection(now=0.0, clock=clock)
    client = Client(server, 5)
    client.send(Connect(protocol_level=5, client_id="c", clean_start=False))
    answer(server, server.accept, session, session_present=True)
    _, resent = client.received()
    assert isinstance(resent, Publish) and resent.dup


def test_accept_after_the_client_left_is_harmless() -> None:
    server, _, _ = start()
    eof(server)
    assert (
        answer(
            server,
            server.accept,
        )
        == []
    )
    assert answer(server, server.reject, 0x87) == []
    assert server.data_to_send() == b""


def test_too_much_data_before_connack() -> None:
    _, client, _ = start(ServerLimits(max_early_data=100))
    events = client.send(Publish("t", bytes(200)))
    assert closed(events).reason_code == 0x97
    (ack,) = client.received()
    assert isinstance(ack, ConnAck) and ack.reason_code == 0x97
