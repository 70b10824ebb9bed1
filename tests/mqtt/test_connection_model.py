"""Random conversations between a client and the server machine.

Whatever the client sends and whatever the handler does, the server must never raise, and every byte
it sends must be a valid packet for the client's protocol level that respects the client's limits:
Maximum Packet Size, Receive Maximum, Topic Alias Maximum.
"""

from __future__ import annotations

from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.mqtt.mqtt_client import answer, feed, tick
from tests.mqtt.mqtt_client import events as events_of
from tests.mqtt.mqtt_strategies import packet_ids, publishes, subscribes, texts
from trimaran.mqtt import reason_codes as rc
from trimaran.mqtt.codec import NEED_DATA, Decoder, encode
from trimaran.mqtt.connection import (
    ConnectionClosed,
    ConnectRequest,
    ServerConnection,
    ServerLimits,
    SubscribeRequest,
)
from trimaran.mqtt.packets import (
    Auth,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Unsubscribe,
)
from trimaran.mqtt.properties import Properties
from trimaran.mqtt.session import OutboundMessage


def client_packets(level: int) -> st.SearchStrategy[Packet]:
    acks = [
        st.builds(PubAck, packet_ids, st.sampled_from(sorted(rc.PUBACK_CODES)) if level == 5 else st.just(0)),
        st.builds(PubRec, packet_ids, st.sampled_from(sorted(rc.PUBREC_CODES)) if level == 5 else st.just(0)),
        st.builds(PubRel, packet_ids),
        st.builds(PubComp, packet_ids),
    ]
    options = [
        publishes(level),
        publishes(level),
        subscribes(level),
        st.builds(Unsubscribe, packet_ids, st.lists(texts, min_size=1, max_size=2)),
        st.just(PingReq()),
        *acks,
    ]
    rare: list[st.SearchStrategy[Packet]] = [st.just(Disconnect())]
    if level == 5:
        rare.append(st.builds(Disconnect, st.sampled_from(sorted(rc.DISCONNECT_CODES))))
        rare.append(st.just(Auth()))
    common, uncommon = st.one_of(*options), st.one_of(*rare)
    # About one packet in twelve ends or breaks the conversation.
    return st.integers(0, 11).flatmap(lambda i: uncommon if i == 0 else common)


actions = st.one_of(
    st.tuples(st.just("client"), st.integers(0, 2**32)),
    st.tuples(st.just("ack"), st.integers(0, 2**32)),
    st.tuples(st.just("suback"), st.integers(0, 2**32)),
    st.tuples(st.just("publish"), st.tuples(texts, st.binary(max_size=80), st.integers(0, 2))),
    st.tuples(st.just("time"), st.floats(0, 20)),
)


class Peer:
    """The client's view: decodes the server's bytes and checks the limits it announced."""

    def __init__(self, level: int, max_packet_size: int, receive_maximum: int, alias_maximum: int) -> None:
        self.level = level
        self.decoder = Decoder(max_packet_size, protocol_level=level)
        self.receive_maximum = receive_maximum
        self.alias_maximum = alias_maximum
        self.aliases: dict[int, str] = {}
        self.unacked: set[int] = set()

    def take(self, data: bytes) -> list[Packet]:
        self.decoder.feed(data)  # raises ProtocolError for anything invalid or too large
        out = []
        while (packet := self.decoder.next_packet()) is not NEED_DATA:
            out.append(packet)
            if isinstance(packet, Publish):
                self._check_publish(packet)
        return out

    def _check_publish(self, packet: Publish) -> None:
        alias = packet.properties.topic_alias
        if alias is not None:
            assert 1 <= alias <= self.alias_maximum
            if packet.topic:
                self.aliases[alias] = packet.topic
            else:
                assert alias in self.aliases
        else:
            assert packet.topic
        if packet.qos and not packet.dup:
            assert packet.packet_id is not None
            self.unacked.add(packet.packet_id)
            if self.level == 5:
                assert len(self.unacked) <= self.receive_maximum

    def sent(self, packet: Packet) -> None:
        if isinstance(packet, PubAck | PubComp) or (
            isinstance(packet, PubRec) and packet.reason_code >= 0x80
        ):
            self.unacked.discard(packet.packet_id)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_random_conversations(data: st.DataObject) -> None:
    level = data.draw(st.sampled_from([3, 4, 5]), "level")
    limits = ServerLimits(
        receive_maximum=data.draw(st.integers(1, 4)),
        maximum_qos=data.draw(st.integers(0, 2)),
        retain_available=data.draw(st.booleans()),
        topic_alias_maximum=data.draw(st.integers(0, 3)),
        max_packet_size=data.draw(st.sampled_from([40, 200, 10_000])),
        wildcard_subscription_available=data.draw(st.booleans()),
        shared_subscription_available=data.draw(st.booleans()),
        subscription_identifier_available=data.draw(st.booleans()),
        max_inflight_legacy=3,
    )
    client_props = Properties()
    receive_maximum, max_size, alias_max = 3, 268_435_460, 0
    if level == 5:
        receive_maximum = data.draw(st.integers(1, 4))
        max_size = data.draw(st.sampled_from([30, 100, 268_435_460]))
        alias_max = data.draw(st.integers(0, 3))
        client_props = Properties(
            receive_maximum=receive_maximum,
            maximum_packet_size=max_size,
            topic_alias_maximum=alias_max,
            request_problem_information=data.draw(st.sampled_from([None, 0, 1])),
        )
    server = ServerConnection(limits, now=0.0)
    peer = Peer(level, max_size, receive_maximum, alias_max)
    connect = Connect(
        protocol_name="MQIsdp" if level == 3 else "MQTT",
        protocol_level=level,
        keep_alive=data.draw(st.integers(0, 100)),
        client_id="c",
        properties=client_props,
    )
    now = 0.0
    events: list[Any] = feed(server, encode(connect, level), now)
    assert isinstance(events[0], ConnectRequest)
    events = answer(
        server,
        server.accept,
    )
    peer.take(server.data_to_send())
    received: list[int] = []
    pending_subs: list[int] = []
    subscribe_requests: dict[int, SubscribeRequest] = {}
    closed = False
    for _ in range(data.draw(st.integers(1, 25), "steps")):
        step: Any = data.draw(actions)
        kind, arg = step
        new: list[Any] = []
        if kind == "client":
            packet = data.draw(client_packets(level))
            peer.sent(packet)
            try:
                wire = encode(packet, level)
            except ValueError:
                continue
            new = feed(server, wire, now)
        elif kind == "ack" and received:
            pid = received.pop(arg % len(received))
            server.ack_publish(pid, data.draw(st.sampled_from([0, 0, 0x10, 0x80, 0x97])))
        elif kind == "suback" and pending_subs:
            pid = pending_subs.pop(arg % len(pending_subs))
            request = subscribe_requests[pid]
            server.send_suback(
                pid, [data.draw(st.sampled_from([0, 1, 2, 0x87])) for _ in request.subscriptions]
            )
        elif kind == "publish":
            topic, payload, qos = arg
            server.publish(OutboundMessage(topic or "t", payload, qos))
            new = events_of(server)
        elif kind == "time":
            now += arg
            new = tick(server, now)
        for ev in new:
            assert not closed, "events after the connection closed"
            if isinstance(ev, Publish) and ev.qos:
                assert ev.packet_id is not None
                received.append(ev.packet_id)
            elif isinstance(ev, SubscribeRequest):
                pending_subs.append(ev.packet_id)
                subscribe_requests[ev.packet_id] = ev
            elif isinstance(ev, ConnectionClosed):
                event(f"closed 0x{ev.reason_code:02X}")
                closed = True
                assert server.closed
        for packet in peer.take(server.data_to_send()):
            if isinstance(packet, Publish) and packet.qos:
                event("server sent a QoS 1/2 PUBLISH")
        if closed:
            assert feed(server, encode(PingReq(), level), now) == []
            assert server.data_to_send() == b""
