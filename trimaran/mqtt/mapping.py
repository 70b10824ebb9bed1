"""Between MQTT packets and the broker's protocol-neutral Message (DESIGN.md's cross-protocol table)."""

from __future__ import annotations

from typing import Any

from trimaran.broker.message import PROTOCOL_MQTT, Message, now_ms
from trimaran.broker.router import Delivery
from trimaran.mqtt.codec import NO_PROPERTIES, around_packet_id, encode, run_packets
from trimaran.mqtt.packets import MQTT_5, Publish, PublishRun, Will
from trimaran.mqtt.properties import Properties
from trimaran.mqtt.session import OutboundMessage


def message_from_publish(
    publish: Publish | Will, publisher_id: str, now: int | None = None, vhost_prefix: str = ""
) -> Message:
    """The broker's message for a PUBLISH (or will): its topic behind the client's ``vhost_prefix``
    (trimaran/vhosts.py; ``""`` for ``/``)."""
    props = publish.properties
    now = now_ms() if now is None else now
    if props is NO_PROPERTIES:
        # Most PUBLISHes carry no properties; positional arguments are half the cost of keywords.
        return Message(
            vhost_prefix + publish.topic, publish.payload, publish.qos, publish.retain,
            None, None, None, None, None, [], publisher_id, PROTOCOL_MQTT, now,
        )  # fmt: skip
    expiry = props.message_expiry_interval
    return Message(
        topic=vhost_prefix + publish.topic,
        payload=publish.payload,
        qos=publish.qos,
        retain=publish.retain,
        content_type=props.content_type,
        correlation_data=props.correlation_data,
        response_topic=props.response_topic,
        payload_format=props.payload_format_indicator,
        expires_at_ms=None if expiry is None else now + expiry * 1000,
        user_properties=props.user_properties or [],  # a list of its own, never the packet's
        publisher_id=publisher_id,
        protocol=PROTOCOL_MQTT,
        created_at_ms=now,
    )


def run_messages(run: PublishRun, prefix: str, publisher_id: str, now: int) -> list[tuple[Message, bytes]]:
    """The broker's message for each PUBLISH of a run (its topic behind the vhost's ``prefix``),
    with the PUBLISH's bytes: what `message_from_publish` makes of each."""
    qos = run.qos
    topics = run.topics
    key = prefix + run.topic
    out: list[tuple[Message, bytes]] = []
    for i, (wire, payload) in enumerate(run_packets(run)):
        if topics is not None:
            key = prefix + topics[i]
        message = Message(
            key, payload, qos, False, None, None, None, None, None, [], publisher_id, PROTOCOL_MQTT, now
        )
        out.append((message, wire))
    return out


def publish_properties(message: Message, subscription_ids: tuple[int, ...] = ()) -> Properties:
    """MQTT 5 PUBLISH properties for a message (Message Expiry is set by the connection at send)."""
    return Properties(
        payload_format_indicator=message.payload_format,
        content_type=message.content_type,
        response_topic=message.response_topic,
        correlation_data=message.correlation_data,
        user_properties=message.user_properties,
        subscription_identifiers=list(subscription_ids),
    )


SHARE_TAG = "share:"  # OutboundMessage.tag of a $share delivery: "share:<group>\x00<filter>"


def share_tag(delivery: Delivery[Any]) -> str | None:
    group = delivery.share_group
    member = delivery.member()
    if group is None or member is None:
        return None
    return f"{SHARE_TAG}{group}\x00{member.topic_filter}"


def message_from_outbound(
    out: OutboundMessage, publisher_id: str | None = None, topic: str | None = None
) -> Message:
    """Rebuild the broker message from a session's copy (to hand it to another share member);
    ``topic``: the key to give it (the copy holds the client's own topic)."""
    props = out.properties
    return Message(
        topic=out.topic if topic is None else topic,
        payload=out.payload,
        qos=out.qos,
        content_type=props.content_type,
        correlation_data=props.correlation_data,
        response_topic=props.response_topic,
        payload_format=props.payload_format_indicator,
        expires_at_ms=None if out.expires_at is None else int(out.expires_at * 1000),
        user_properties=props.user_properties,
        publisher_id=publisher_id,
        protocol=PROTOCOL_MQTT,
    )


def delivered_retain(message: Message, delivery: Delivery[Any], retained: bool) -> bool:
    """The retain flag a subscriber sees: kept only for retained-on-subscribe deliveries or Retain As
    Published."""
    return message.retain and (retained or delivery.retain_as_published)


def outbound(
    message: Message,
    delivery: Delivery[Any],
    cut: int = 0,
    *,
    retained: bool = False,
    qos: int | None = None,
    wire: tuple[bytes, bytes] | None = None,
) -> OutboundMessage:
    """The message as this subscriber gets it: its own topic (the key without its vhost prefix,
    ``cut`` characters), QoS capped by its subscription (``qos`` when the caller has it), the retain
    flag as `delivered_retain` says, its subscription identifiers; ``wire``: its bytes for this
    subscriber's connection (`FanOutEncoder.publish_around_id`)."""
    # Positional, and the one-line helpers written out: this runs once per QoS 1/2 delivery.
    ids = delivery.subscription_identifiers
    if (
        ids
        or message.user_properties
        or message.content_type is not None
        or message.response_topic is not None
        or message.correlation_data is not None
        or message.payload_format is not None
    ):
        props = publish_properties(message, ids)
    else:
        props = NO_PROPERTIES  # most messages: the connection copies it before any change
    return OutboundMessage(
        message.topic[cut:],
        message.payload,
        min(message.qos, delivery.qos) if qos is None else qos,
        message.retain and (retained or delivery.retain_as_published),  # delivered_retain
        props,
        None if delivery.share_group is None else share_tag(delivery),
        None if message.expires_at_ms is None else message.expires_at_ms / 1000,
        False,
        wire,
    )


class FanOutEncoder:
    """PUBLISH bytes of the message being fanned out, encoded once per protocol family, QoS, retain
    flag and (5.0) subscription identifiers, and shared by every subscriber for which those are the
    same (DESIGN.md: encode a fan-out message once); at QoS 1/2 cut around the packet identifier,
    which each subscriber's connection puts in. Only for messages without an expiry, whose bytes do
    not depend on when they are sent; the last message is kept until the next one."""

    __slots__ = (
        "_around",
        "_encoded",
        "_message",
        "arrived",
        "arrived_v5",
        "arrived_wire",
    )

    def __init__(self) -> None:
        self._message: Message | None = None
        self._encoded: dict[tuple[int, bool, tuple[int, ...]], bytes] = {}
        # (5.0?, QoS, retain, subscription identifiers) -> the bytes before and after the id
        self._around: dict[tuple[bool, int, bool, tuple[int, ...]], tuple[bytes, bytes]] = {}
        # The message last read with bytes subscribers may get as they are (`received`; the
        # handler writes the three fields itself, a call per message saved), read at its first
        # delivery.
        self.arrived: Message | None = None
        self.arrived_wire = b""
        self.arrived_v5 = False

    def received(self, message: Message, wire: bytes, level: int) -> None:
        """``message`` came in as ``wire`` (a PUBLISH without retain, DUP or properties, at
        ``level``): subscribers of the same family and QoS get those bytes as they are (at QoS 1/2
        with their own packet id)."""
        self.arrived = message
        self.arrived_wire = wire
        self.arrived_v5 = level == MQTT_5

    def _start(self, message: Message) -> None:
        self._message = message
        self._encoded = {}
        self._around = {}
        if message is self.arrived:
            wire = self.arrived_wire
            qos = (wire[0] >> 1) & 0x03
            if qos:
                self._around[(self.arrived_v5, qos, False, ())] = around_packet_id(wire)

    def qos0_publish(
        self, message: Message, level: int, retain: bool, subscription_ids: tuple[int, ...], cut: int = 0
    ) -> bytes:
        """The PUBLISH bytes; ``cut``: the length of the vhost prefix the subscribers' topic loses
        (the same for every subscriber of one message: they share its vhost)."""
        if (
            message is self.arrived
            and not retain
            and not self.arrived_wire[0] & 0x06  # it came at QoS 0
            and (level == MQTT_5) is self.arrived_v5
            and not (subscription_ids and level == MQTT_5)
        ):
            return self.arrived_wire  # 3.1 and 3.1.1 PUBLISHes are the same bytes
        if message is not self._message:
            self._start(message)
        if level != MQTT_5:
            subscription_ids = ()  # properties exist only in 5.0
        key = (level, retain, subscription_ids)
        data = self._encoded.get(key)
        if data is None:
            props = publish_properties(message, subscription_ids)
            publish = Publish(message.topic[cut:], message.payload, 0, retain, False, None, props)
            data = self._encoded[key] = encode(publish, level)
        return data

    def publish_around_id(
        self,
        message: Message,
        level: int,
        qos: int,
        retain: bool,
        subscription_ids: tuple[int, ...],
        cut: int = 0,
    ) -> tuple[bytes, bytes]:
        """A QoS 1/2 PUBLISH's bytes cut around its packet identifier (``OutboundMessage.wire``)."""
        if message is not self._message:  # _start() written out: once per message
            self._message = message
            self._encoded = {}
            self._around = {}
            if message is self.arrived:
                wire = self.arrived_wire
                if wire[0] & 0x06:
                    self._around[(self.arrived_v5, (wire[0] >> 1) & 0x03, False, ())] = around_packet_id(wire)
        v5 = level == MQTT_5
        if not v5:
            subscription_ids = ()  # properties exist only in 5.0
        key = (v5, qos, retain, subscription_ids)
        around = self._around.get(key)
        if around is None:
            props = publish_properties(message, subscription_ids)
            publish = Publish(message.topic[cut:], message.payload, qos, retain, False, 1, props)
            around = self._around[key] = around_packet_id(encode(publish, level))
        return around
