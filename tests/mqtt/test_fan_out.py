"""Fan-out encodes a message once per protocol level, QoS, retain flag and subscription identifiers
(at QoS 1/2 cut around the packet id), and every subscriber still gets exactly the PUBLISH it would
have got encoded for it alone."""

from __future__ import annotations

import operator
from typing import Any

import pytest

from tests.mqtt.mqtt_client import connected
from tests.support.runtime import Wire
from trimaran.broker.core import Broker
from trimaran.broker.message import Message, now_ms
from trimaran.broker.router import SubscriptionOptions
from trimaran.config import Settings
from trimaran.mqtt.codec import Decoder, around_packet_id, encode
from trimaran.mqtt.conn import MqttConn
from trimaran.mqtt.handler import MqttEndpoint, MqttFrontEnd
from trimaran.mqtt.mapping import FanOutEncoder
from trimaran.mqtt.packets import PubAck, Publish
from trimaran.mqtt.properties import Properties
from trimaran.runtime.runner import Runner

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_encoding_is_shared_only_where_the_bytes_are_the_same() -> None:
    encoder = FanOutEncoder()
    message = Message("a/b", b"hello", retain=True, user_properties=[("k", "v")])
    v4 = encoder.qos0_publish(message, 4, False, ())
    assert encoder.qos0_publish(message, 4, False, ()) is v4
    assert encoder.qos0_publish(message, 4, False, (7,)) is v4  # 3.1.1 has no subscription ids
    assert encoder.qos0_publish(message, 4, True, ()) != v4
    v5 = encoder.qos0_publish(message, 5, False, (7,))
    assert encoder.qos0_publish(message, 5, False, (7,)) is v5
    assert encoder.qos0_publish(message, 5, False, (8,)) != v5
    other = Message("a/b", b"hello", retain=True, user_properties=[("k", "v")])
    assert encoder.qos0_publish(other, 4, False, ()) is not v4  # a new message is encoded anew


async def test_each_subscriber_gets_its_own_publish() -> None:
    broker = Broker(sys_interval=0)
    front = MqttFrontEnd(broker, Settings())
    clients: dict[str, Any] = {}

    def subscriber(name: str, level: int, sub_id: int | None = None, **connect: Any) -> None:
        server, client, _ = connected(level=level, client_id=name, **connect)
        io = Wire(Runner(), lambda io, first: None).conn  # the runtime's side, never read
        conn = MqttConn(front, server, io)
        endpoint = MqttEndpoint(front, name, level)
        endpoint.conn, conn.endpoint = conn, endpoint
        options = SubscriptionOptions(qos=1, retain_as_published=True, subscription_identifier=sub_id)
        broker.router.subscribe(endpoint, "a/+", options)
        clients[name] = client

    subscriber("v311", 4)
    subscriber("v5-id", 5, sub_id=3)
    subscriber("v5-aliases", 5, properties=Properties(topic_alias_maximum=4))
    subscriber("v5-small", 5, properties=Properties(maximum_packet_size=20))

    broker.publish(Message("a/b", b"x" * 8, retain=True))
    assert clients["v311"].received() == [Publish("a/b", b"x" * 8, 0, True)]
    assert clients["v5-id"].received() == [
        Publish("a/b", b"x" * 8, 0, True, properties=Properties(subscription_identifiers=[3]))
    ]
    assert clients["v5-aliases"].received() == [
        Publish("a/b", b"x" * 8, 0, True, properties=Properties(topic_alias=1))
    ]
    assert clients["v5-small"].received() == [Publish("a/b", b"x" * 8, 0, True)]

    broker.publish(Message("a/c", b"y" * 30))  # too large for v5-small: dropped and counted
    assert clients["v5-small"].received() == []
    assert broker.stats.messages_dropped == 1
    assert clients["v311"].received() == [Publish("a/c", b"y" * 30)]
    assert clients["v5-id"].received() == [
        Publish("a/c", b"y" * 30, properties=Properties(subscription_identifiers=[3]))
    ]
    assert clients["v5-aliases"].received() == [
        Publish("a/c", b"y" * 30, properties=Properties(topic_alias=2))
    ]

    # A message with an expiry is encoded per subscriber: its interval counts down.
    broker.publish(Message("a/d", b"z", expires_at_ms=now_ms() + 60_000))
    (publish,) = clients["v5-id"].received()
    assert isinstance(publish, Publish)
    assert publish.properties.message_expiry_interval in (59, 60)
    assert publish.properties.subscription_identifiers == [3]
    assert clients["v311"].received() == [Publish("a/d", b"z")]


def test_a_plain_qos0_publish_is_forwarded_as_received() -> None:
    """Fan-in: the PUBLISH bytes a QoS 0 publisher sent (no retain, no properties) are what same-family
    subscribers get, without a new encoding; other subscribers get their own."""
    for level in (4, 5):
        decoder = Decoder()
        decoder.protocol_level = level
        decoder.feed(encode(Publish("a/b", b"payload"), level))
        packet = decoder.next_packet()
        assert isinstance(packet, Publish) and packet.wire == encode(Publish("a/b", b"payload"), level)
        encoder = FanOutEncoder()
        message = Message("a/b", b"payload")
        encoder.received(message, packet.wire, level)
        same_family = (3, 4) if level == 4 else (5,)
        for subscriber_level in (3, 4, 5):
            data = encoder.qos0_publish(message, subscriber_level, False, ())
            assert (data is packet.wire) == (subscriber_level in same_family)
            assert data == encode(Publish("a/b", b"payload"), subscriber_level)
        with_id = encoder.qos0_publish(message, 5, False, (9,))
        assert with_id == encode(
            Publish("a/b", b"payload", properties=Properties(subscription_identifiers=[9])), 5
        )
        assert encoder.qos0_publish(message, level, True, ()) == encode(
            Publish("a/b", b"payload", retain=True), level
        )


def test_only_plain_publishes_keep_their_bytes() -> None:
    for publish, level in [
        (Publish("a/b", b"x", qos=1, dup=True, packet_id=1), 4),
        (Publish("a/b", b"x", retain=True), 4),
        (Publish("a/b", b"x", qos=1, retain=True, packet_id=1), 4),
        (Publish("a/b", b"x", properties=Properties(content_type="t")), 5),
    ]:
        decoder = Decoder()
        decoder.protocol_level = level
        decoder.feed(encode(publish, level))
        packet = decoder.next_packet()
        assert isinstance(packet, Publish) and packet.wire is None


@pytest.mark.parametrize("level", [3, 4, 5])
@pytest.mark.parametrize("size", [0, 100, 20_000, 3_000_000])
def test_any_packet_id_joined_around_makes_the_same_publish(level: int, size: int) -> None:
    props = Properties(content_type="t", subscription_identifiers=[300]) if level == 5 else Properties()
    for topic in ("a", "ä/" * 70):
        head, tail = around_packet_id(encode(Publish(topic, b"p" * size, 1, False, False, 1, props), level))
        for packet_id in (1, 0x1234, 0xFFFF):
            joined = head + packet_id.to_bytes(2, "big") + tail
            assert joined == encode(Publish(topic, b"p" * size, 1, False, False, packet_id, props), level)


def test_qos1_encoding_is_shared_only_where_the_bytes_are_the_same() -> None:
    encoder = FanOutEncoder()
    message = Message("v/a/b", b"hello", qos=2, user_properties=[("k", "v")])
    v4 = encoder.publish_around_id(message, 4, 1, False, (), cut=2)
    # The same bytes, shared (compared part by part: mypyc's compiled code rebuilds a returned tuple).
    assert all(map(operator.is_, encoder.publish_around_id(message, 3, 1, False, (7,), cut=2), v4))
    assert b"".join((v4[0], b"\x00\x05", v4[1])) == encode(Publish("a/b", b"hello", 1, False, False, 5), 4)
    assert encoder.publish_around_id(message, 4, 2, False, (), cut=2) != v4
    assert encoder.publish_around_id(message, 4, 1, True, (), cut=2) != v4
    v5 = encoder.publish_around_id(message, 5, 1, False, (7,), cut=2)
    assert all(map(operator.is_, encoder.publish_around_id(message, 5, 1, False, (7,), cut=2), v5))
    props = Properties(user_properties=[("k", "v")], subscription_identifiers=[7])
    assert b"".join((v5[0], b"\x00\x05", v5[1])) == encode(
        Publish("a/b", b"hello", 1, False, False, 5, props), 5
    )


def test_a_plain_qos1_publish_is_forwarded_as_received_with_another_id() -> None:
    for level in (4, 5):
        decoder = Decoder()
        decoder.protocol_level = level
        decoder.feed(encode(Publish("a/b", b"payload", 1, packet_id=77), level))
        packet = decoder.next_packet()
        assert isinstance(packet, Publish) and packet.wire is not None
        encoder = FanOutEncoder()
        message = Message("a/b", b"payload", qos=1)
        encoder.received(message, packet.wire, level)
        head, tail = encoder.publish_around_id(message, level, 1, False, ())
        assert packet.wire.startswith(head) and packet.wire.endswith(tail)
        assert head + b"\x00\x09" + tail == encode(Publish("a/b", b"payload", 1, packet_id=9), level)
        # A QoS 0 subscriber of the same message gets a QoS 0 PUBLISH, not the received bytes.
        assert encoder.qos0_publish(message, level, False, ()) == encode(Publish("a/b", b"payload"), level)


async def test_each_qos1_subscriber_gets_its_own_packet_id() -> None:
    broker = Broker(sys_interval=0)
    front = MqttFrontEnd(broker, Settings())
    clients: dict[str, Any] = {}

    def subscriber(name: str, level: int, first_id: int, sub_id: int | None = None, **connect: Any) -> None:
        server, client, _ = connected(level=level, client_id=name, **connect)
        io = Wire(Runner(), lambda io, first: None).conn  # the runtime's side, never read
        conn = MqttConn(front, server, io)
        endpoint = MqttEndpoint(front, name, level)
        endpoint.next_packet_id = first_id
        server.session = endpoint
        endpoint.conn, conn.endpoint = conn, endpoint
        options = SubscriptionOptions(qos=2, subscription_identifier=sub_id)
        broker.router.subscribe(endpoint, "a/+", options)
        clients[name] = client

    subscriber("v311-a", 4, 1)
    subscriber("v311-b", 4, 500)
    subscriber("v5-id", 5, 65535, sub_id=3)
    subscriber("v5-aliases", 5, 9, properties=Properties(topic_alias_maximum=4))

    broker.publish(Message("a/b", b"x" * 200, qos=1, retain=True))
    assert clients["v311-a"].received() == [Publish("a/b", b"x" * 200, 1, False, False, 1)]
    assert clients["v311-b"].received() == [Publish("a/b", b"x" * 200, 1, False, False, 500)]
    assert clients["v5-id"].received() == [
        Publish("a/b", b"x" * 200, 1, False, False, 65535, Properties(subscription_identifiers=[3]))
    ]
    assert clients["v5-aliases"].received() == [
        Publish("a/b", b"x" * 200, 1, False, False, 9, Properties(topic_alias=1))
    ]
    broker.publish(Message("a/c", b"y", qos=2))
    assert clients["v311-a"].received() == [Publish("a/c", b"y", 2, False, False, 2)]
    assert clients["v5-id"].received() == [
        Publish("a/c", b"y", 2, False, False, 1, Properties(subscription_identifiers=[3]))
    ]


async def test_a_queued_qos1_delivery_is_encoded_at_its_turn() -> None:
    """Past the client's Receive Maximum a delivery waits in the session, without the fan-out's
    bytes (it may go out on a later connection of another level); the PUBACK sends it."""
    broker = Broker(sys_interval=0)
    front = MqttFrontEnd(broker, Settings())
    server, client, _ = connected(level=5, client_id="c", properties=Properties(receive_maximum=1))
    conn = MqttConn(front, server, Wire(Runner(), lambda io, first: None).conn)
    endpoint = server.session = MqttEndpoint(front, "c", 5)
    endpoint.conn, conn.endpoint = conn, endpoint
    broker.router.subscribe(endpoint, "a/+", SubscriptionOptions(qos=1, subscription_identifier=4))
    broker.publish(Message("a/b", b"one", qos=1))
    broker.publish(Message("a/c", b"two", qos=1))
    ids = Properties(subscription_identifiers=[4])
    assert client.received() == [Publish("a/b", b"one", 1, False, False, 1, ids)]
    assert all(m.wire is None for m in endpoint.queue) and len(endpoint.queue) == 1
    client.send(PubAck(1))
    assert client.received() == [Publish("a/c", b"two", 1, False, False, 2, ids)]
