"""MQTT onto the durable queue manager: ``$queue/<q>`` topics (DESIGN.md, "Cross-protocol model").

- PUBLISH to ``$queue/<q>[/<key>]`` appends; the PUBACK/PUBREC leaves only after the commit, and in
  the order the PUBLISHes arrived.
- PUBLISH to ``$queue/<q>/$ack|$nack|$reject|$commit`` with user property ``message-id`` (and
  ``reason``, ``consumer-group``) settles a delivery; it is never enqueued.
- SUBSCRIBE to ``$queue/<q>[/<key filter>]`` consumes in the default group; ``$share/<g>/$queue/<q>``
  or user property ``consumer-group`` names a group; ``stream-offset`` picks a stream start.
  Credit is the client's Receive Maximum, so the queue never parks messages in an MQTT session.
- PUBACK / PUBCOMP acks; 5.0 PUBACK 0x80 nacks, 0x83 and 0x99 reject. A QoS 0 subscription
  consumes at most once (settled when sent).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from trimaran.broker.message import Message
from trimaran.broker.topics import TopicError, split_shared
from trimaran.mqtt.mapping import publish_properties
from trimaran.mqtt.packets import MQTT_5, SubscriptionOptions
from trimaran.mqtt.properties import Properties
from trimaran.mqtt.reason_codes import ReasonCode
from trimaran.mqtt.session import OutboundMessage
from trimaran.queue.manager import (
    ConsumerHandle,
    QueueDelivery,
    QueueManager,
    ack_by_id,
    commit_by_id,
    nack_by_id,
    reject_by_id,
)
from trimaran.queue.policy import QUEUE_PREFIX, QueueError, parse_queue_topic

if TYPE_CHECKING:
    from trimaran.mqtt.handler import Link

log = logging.getLogger(__name__)

NACK_CODES = frozenset({ReasonCode.UNSPECIFIED_ERROR})
REJECT_CODES = frozenset({ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, ReasonCode.PAYLOAD_FORMAT_INVALID})
QOS0_CREDIT = 256


def is_queue_filter(topic_filter: str) -> bool:
    try:
        return split_shared(topic_filter).topic_filter.startswith(QUEUE_PREFIX)
    except TopicError:
        return False


def _property(message: Message, name: str) -> str | None:
    for key, value in message.user_properties:
        if key == name:
            return value
    return None


@dataclass(slots=True, eq=False)
class Ticket:
    """One queue PUBLISH waiting for its commit, acknowledged in arrival order."""

    packet_id: int | None
    done: anyio.Event = field(default_factory=anyio.Event)
    reason_code: int = 0
    reason: str | None = None


class QueueSubscription:
    """A consumer of one queue for one MQTT subscription (the queue manager's QueueConsumer)."""

    __slots__ = ("handle", "id", "link", "qos", "topic_filter")

    def __init__(self, link: Link, topic_filter: str, qos: int) -> None:
        assert link.endpoint is not None
        self.id = link.endpoint.client_id
        self.link = link
        self.topic_filter = topic_filter
        self.qos = qos
        self.handle: ConsumerHandle | None = None

    def deliver(self, delivery: QueueDelivery) -> None:
        message = delivery.message
        props = publish_properties(message)
        if self.link.conn.protocol_level == MQTT_5:
            props.user_properties = [*message.user_properties, *delivery.headers()]
        out = OutboundMessage(
            topic=message.topic,
            payload=message.payload,
            qos=self.qos,
            properties=props,
            tag=delivery.message_id if self.qos else None,
            expires_at=None if message.expires_at_ms is None else message.expires_at_ms / 1000,
        )
        bindings = self.link.queue_bindings
        if self.qos:
            bindings.deliveries[delivery.message_id] = (self, delivery.offset)
        if self.link.conn.publish(out):
            self.link.wake()
            if not self.qos:
                bindings.qos0_sent.append(self)
        elif self.qos:
            # Too large for this client or the session is full: let another consumer have it.
            bindings.deliveries.pop(delivery.message_id, None)
            if self.handle is not None:
                self.handle.nack_nowait(delivery.offset, 0)


@dataclass(slots=True)
class LinkQueues:
    """Per connection: queue subscriptions, deliveries awaiting PUBACK, publishes awaiting commit."""

    subscriptions: dict[str, QueueSubscription] = field(default_factory=dict)
    deliveries: dict[str, tuple[QueueSubscription, int]] = field(default_factory=dict)
    qos0_sent: list[QueueSubscription] = field(default_factory=list)
    tickets: deque[Ticket] = field(default_factory=deque)
    tickets_ready: anyio.Event = field(default_factory=anyio.Event)


class MqttQueues:
    def __init__(self, manager: QueueManager) -> None:
        self.manager = manager

    # -- publishing -------------------------------------------------------------------------------

    def publish(self, link: Link, message: Message, packet_id: int | None) -> None:
        """Start a queue publish; its ack goes out (in order) once committed."""
        ticket = Ticket(packet_id)
        bindings = link.queue_bindings
        bindings.tickets.append(ticket)
        bindings.tickets_ready.set()
        assert link.tasks is not None
        link.tasks.start_soon(self._append, link, message, ticket)

    async def _append(self, link: Link, message: Message, ticket: Ticket) -> None:
        parsed = parse_queue_topic(message.topic)
        client = link.endpoint.client_id if link.endpoint else "?"
        try:
            if parsed is None:
                raise QueueError("bad-topic", f"{message.topic!r} is not a valid queue topic")
            queue, routing_key, control = parsed
            if control is not None:
                await self._control(queue, control, message, client)
            else:
                await self.manager.publish(queue, message, routing_key)
        except QueueError as exc:
            log.info("mqtt: queue publish from %r to %r refused: %s", client, message.topic, exc)
            ticket.reason_code = _refusal_code(exc)
            ticket.reason = str(exc)
        ticket.done.set()

    async def _control(self, queue: str, control: str, message: Message, client: str) -> None:
        message_id = _property(message, "message-id") or message.payload.decode(errors="replace").strip()
        if not message_id:
            raise QueueError("bad-request", f"${control} needs a message-id user property")
        group = _property(message, "consumer-group")
        if not message_id.startswith(f"{queue}:"):
            message_id = f"{queue}:{message_id}"
        try:
            if control == "ack":
                done = await ack_by_id(self.manager, message_id, group)
            elif control == "nack":
                done = await nack_by_id(self.manager, message_id, group)
            elif control == "reject":
                reason = _property(message, "reason") or f"rejected by {client}"
                done = await reject_by_id(self.manager, message_id, group, reason=reason)
            else:
                done = await commit_by_id(self.manager, message_id, group)
        except (KeyError, ValueError) as exc:
            raise QueueError("not-found", f"no delivery {message_id}: {exc}") from None
        if not done:
            raise QueueError("not-found", f"no pending delivery {message_id}")

    async def acknowledge_in_order(self, link: Link) -> None:
        """Runs per connection: sends PUBACK/PUBREC for queue publishes as their commits finish."""
        bindings = link.queue_bindings
        while True:
            while not bindings.tickets:
                await bindings.tickets_ready.wait()
                bindings.tickets_ready = anyio.Event()
            ticket = bindings.tickets[0]
            await ticket.done.wait()
            bindings.tickets.popleft()
            if ticket.packet_id is not None:
                code = ticket.reason_code
                if code and link.conn.protocol_level < MQTT_5:
                    # 3.1.1 cannot refuse a PUBLISH: closing the connection is how it says no.
                    link.close(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, ticket.reason or "refused")
                    return
                link.conn.ack_publish(ticket.packet_id, code, _reason_props(ticket.reason) if code else None)
                link.wake()

    # -- consuming --------------------------------------------------------------------------------

    def subscribe(
        self,
        link: Link,
        topic_filter: str,
        options: SubscriptionOptions,
        user_properties: list[tuple[str, str]],
    ) -> int:
        """Attach a consumer for ``[$share/<g>/]$queue/<q>[/<filter>]``; returns the SUBACK code."""
        group, plain = split_shared(topic_filter)
        parsed = parse_queue_topic(plain)
        if parsed is None or parsed[2] is not None:
            return ReasonCode.TOPIC_FILTER_INVALID
        queue, key_filter, _ = parsed
        props = dict(user_properties)
        group = props.get("consumer-group", group)
        start: str | int | None = props.get("stream-offset")
        bindings = link.queue_bindings
        old = bindings.subscriptions.pop(topic_filter, None)
        if old is not None and old.handle is not None:
            link.spawn(old.handle.cancel)
        subscription = QueueSubscription(link, topic_filter, options.qos)
        try:
            subscription.handle = self.manager.consume(
                queue,
                subscription,
                group=group,
                routing_filter=key_filter or None,
                start=start,
                auto_ack=options.qos == 0,
            )
        except QueueError as exc:
            log.info("mqtt: queue subscription %r refused: %s", topic_filter, exc)
            return ReasonCode.NOT_AUTHORIZED if exc.reason == "no-queue" else ReasonCode.UNSPECIFIED_ERROR
        bindings.subscriptions[topic_filter] = subscription
        return options.qos

    def grant_initial_credit(self, link: Link, subscription: QueueSubscription) -> None:
        if subscription.handle is None:
            return
        window = QOS0_CREDIT if not subscription.qos else max(1, link.conn.client_receive_maximum)
        subscription.handle.add_credit(window)

    def unsubscribe(self, link: Link, topic_filter: str) -> None:
        subscription = link.queue_bindings.subscriptions.pop(topic_filter, None)
        if subscription is not None and subscription.handle is not None:
            link.spawn(subscription.handle.cancel)

    def settled(self, link: Link, tag: object, reason_code: int) -> None:
        """A PUBACK/PUBCOMP (or a failed PUBREC) for a queue delivery."""
        entry = link.queue_bindings.deliveries.pop(str(tag), None)
        if entry is None:
            return
        subscription, offset = entry
        handle = subscription.handle
        if handle is None or handle.closed:
            return
        if reason_code in NACK_CODES:
            handle.nack_nowait(offset)
        elif reason_code in REJECT_CODES:
            handle.reject_nowait(offset, f"client reason code 0x{reason_code:02X}")
        else:
            handle.ack_nowait(offset)
        handle.add_credit(1)

    def after_write(self, link: Link) -> None:
        """QoS 0 deliveries are settled once written: give their credit back."""
        sent = link.queue_bindings.qos0_sent
        if sent:
            link.queue_bindings.qos0_sent = []
            for subscription in sent:
                if subscription.handle is not None:
                    subscription.handle.add_credit(1)

    async def detach(self, link: Link) -> None:
        """The connection is gone: its held deliveries become available to other consumers at once."""
        bindings = link.queue_bindings
        subscriptions = list(bindings.subscriptions.values())
        bindings.subscriptions.clear()
        bindings.deliveries.clear()
        with anyio.CancelScope(shield=True):
            for subscription in subscriptions:
                if subscription.handle is not None:
                    await subscription.handle.cancel()


def _refusal_code(exc: QueueError) -> int:
    if exc.reason in ("full", "overflow"):
        return ReasonCode.QUOTA_EXCEEDED
    if exc.reason in ("bad-topic", "bad-name"):
        return ReasonCode.TOPIC_NAME_INVALID
    if exc.reason == "no-queue":
        return ReasonCode.NOT_AUTHORIZED
    return ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR


def _reason_props(reason: str | None) -> Properties:

    return Properties(reason_string=reason)
